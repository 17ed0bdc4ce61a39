"""``python -m framejit``: framejit's command line.

    python -m framejit report DIR [-o page.html]     # a dump folder as one HTML page
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m framejit",
        description="framejit's tools. Dumps come from FRAMEJIT_DUMP=DIR or "
                    "framejit.compile(..., options={'dump_dir': DIR}).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    report = commands.add_parser(
        "report", help="turn a dump folder into one self-contained HTML page (works offline)",
        description="Turn a dump folder into one self-contained HTML page: compiled functions "
                    "with their frames, graphs (drawn, fused groups marked) and graph breaks; "
                    "guards; recompiles over time; kernels; compile time per stage.")
    report.add_argument("dir", help="a dump folder (FRAMEJIT_DUMP's) or one run folder inside it")
    report.add_argument("-o", "--output", help="where to write the page "
                                               "(default: report.html in the run folder)")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "report":
        from .debug.report import write_report

        try:
            path = write_report(args.dir, args.output)
        except FileNotFoundError as e:
            print(f"python -m framejit report: {e}", file=sys.stderr)
            return 1
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
