"""``python -m framejit report DIR``: one self-contained HTML page from a dump folder.

The page reads the run's ``record.json`` (see dump.py) and shows each compiled function with its
frames, graphs and graph breaks; each graph drawn as SVG (made here, no library) with its fused
groups marked; guards; recompiles over time; kernels with syntax highlighting; and the compile
time of each stage. It needs no network: styles, pictures and the small script are inline.
"""

from __future__ import annotations

import html
import json
import os
import re

from .summary import STAGES

_PALETTE = ("#e6550d", "#3182bd", "#31a354", "#756bb1", "#d6616b", "#17becf", "#bcbd22",
            "#8c6d31", "#e377c2", "#636363")


def find_run(folder: str) -> str:
    """The run folder ``folder`` means: itself if it holds record.json, else the run its
    ``latest`` file names (a dump_dir), else the newest run inside it. ``folder`` may also be
    that ``latest`` file itself."""
    if os.path.isfile(folder) and os.path.basename(folder) == "latest":
        folder = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder} is not a folder; give the dump folder "
                                f"(FRAMEJIT_DUMP's) or a run folder inside it")
    if os.path.exists(os.path.join(folder, "record.json")):
        return folder
    latest = os.path.join(folder, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            run = os.path.join(folder, f.read().strip())
        if os.path.exists(os.path.join(run, "record.json")):
            return run
    runs = sorted((d for d in os.listdir(folder) if os.path.exists(os.path.join(folder, d, "record.json"))),
                  key=lambda d: os.path.getmtime(os.path.join(folder, d)))
    if not runs:
        raise FileNotFoundError(
            f"{folder} holds no framejit dump (no record.json in it or in a run folder inside it); "
            f"make one with FRAMEJIT_DUMP={folder} or compile(..., options={{'dump_dir': ...}})")
    return os.path.join(folder, runs[-1])


def write_report(folder: str, out: str | None = None) -> str:
    """Write the page for the dump in ``folder`` (to ``<run>/report.html`` unless ``out``)."""
    run = find_run(folder)
    with open(os.path.join(run, "record.json")) as f:
        data = json.load(f)
    page = render(data, title=os.path.basename(os.path.abspath(run)))
    out = out or os.path.join(run, "report.html")
    with open(out, "w") as f:
        f.write(page)
    return out


# -- pieces ---------------------------------------------------------------------------------------

e = html.escape


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


_KEYWORDS = frozenset("""
    def return if else elif for while in not and or is None True False import from as with try
    except finally raise lambda pass break continue class global nonlocal yield assert del
    void int float double char long unsigned signed const static inline struct typedef sizeof
    int64_t int32_t uint8_t _Bool bool restrict extern
""".split())
_TOKEN = re.compile(r"""(?P<comment>\#[^\n]*|//[^\n]*|/\*.*?\*/)
                      |(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
                      |(?P<pre>^[ \t]*\#\s*(?:include|define|pragma|if|ifdef|ifndef|endif|else)[^\n]*)
                      |(?P<number>\b\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[fFuUlL]*\b)
                      |(?P<word>[A-Za-z_]\w*)""", re.S | re.M | re.X)


def highlight(source: str, language: str) -> str:
    """``source`` as HTML with spans for comments, strings, numbers, keywords and ``tl.*``."""
    out = []
    pos = 0
    for m in _TOKEN.finditer(source):
        out.append(e(source[pos:m.start()]))
        text = m.group()
        kind = m.lastgroup
        if kind == "comment" and language == "c" and text.startswith("#"):
            kind = "pre" if re.match(r"#\s*\w", text) else "comment"
        if kind == "word":
            kind = "kw" if text in _KEYWORDS else "tl" if text in ("tl", "triton", "torch", "omp") else None
        out.append(f'<span class="{kind}">{e(text)}</span>' if kind else e(text))
        pos = m.end()
    out.append(e(source[pos:]))
    return "".join(out)


def graph_svg(nodes: list[dict], colors: dict[str, str]) -> str:
    """The graph as an SVG picture: one row per depth (inputs at the top), an arrow per use, each
    node filled with its kernel's colour when a fused group holds it."""
    # Operations by longest path from the inputs; each input (a placeholder, a parameter) just
    # above its first user, so a long chain with many parameters stays narrow.
    leaf = {n["name"] for n in nodes if n["op"] in ("placeholder", "get_attr")}
    depth: dict[str, int] = {}
    for n in nodes:
        if n["name"] not in leaf:
            depth[n["name"]] = 1 + max((depth[i] for i in n["inputs"] if i in depth), default=0)
    for n in nodes:
        for i in n["inputs"]:
            if i in leaf and n["name"] in depth:
                depth[i] = min(depth.get(i, depth[n["name"]]), depth[n["name"]] - 1)
    for name in leaf:
        depth.setdefault(name, 0)
    rows: dict[int, list[dict]] = {}
    for n in nodes:
        rows.setdefault(depth[n["name"]], []).append(n)
    w, h, gap_x, gap_y = 150, 38, 18, 34
    width = max(len(r) for r in rows.values()) * (w + gap_x) + gap_x if rows else 100
    height = len(rows) * (h + gap_y) + gap_y
    pos: dict[str, tuple[float, float]] = {}
    for r, d in enumerate(sorted(rows)):
        row = rows[d]
        # Under their inputs where they are drawn already (barycentre order), the rest after.
        order = {n["name"]: k for k, n in enumerate(row)}

        def key(n, order=order):
            xs = [pos[i][0] for i in n["inputs"] if i in pos]
            return (sum(xs) / len(xs)) if xs else float("inf"), order[n["name"]]
        row.sort(key=key)
        offset = (width - len(row) * (w + gap_x) + gap_x) / 2
        for k, n in enumerate(row):
            pos[n["name"]] = (offset + k * (w + gap_x), gap_y + r * (h + gap_y))
    parts = [f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
             f'height="{height}" viewBox="0 0 {width:.0f} {height}" role="img">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
             'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#888"/></marker></defs>']
    for n in nodes:
        x2, y2 = pos[n["name"]]
        for i in n["inputs"]:
            if i in pos:
                x1, y1 = pos[i]
                parts.append(f'<line x1="{x1 + w / 2:.0f}" y1="{y1 + h}" x2="{x2 + w / 2:.0f}" '
                             f'y2="{y2}" stroke="#888" marker-end="url(#arrow)"/>')
    for n in nodes:
        x, y = pos[n["name"]]
        group = n.get("group")
        fill = colors.get(group, "#fff") if group else (
            "#eee" if n["op"] in ("placeholder", "get_attr", "output") else "#fff")
        text_fill = "#fff" if group else "#000"
        label = n["target"] if n["op"] not in ("placeholder", "output") else n["op"]
        title = f'%{n["name"]}: {n["target"]} {n["type"]}' + (f" (kernel {group})" if group else "")
        parts.append(
            f'<g class="node" data-group="{e(group or "")}"><title>{e(title)}</title>'
            f'<rect x="{x:.0f}" y="{y}" width="{w}" height="{h}" rx="5" fill="{fill}" stroke="#444"/>'
            f'<text x="{x + w / 2:.0f}" y="{y + 15}" text-anchor="middle" fill="{text_fill}" '
            f'font-size="11">{e(label[:24])}</text>'
            f'<text x="{x + w / 2:.0f}" y="{y + 30}" text-anchor="middle" fill="{text_fill}" '
            f'font-size="10">%{e(n["name"][:14])} {e(n["type"][:12])}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


def timeline_svg(fn: dict, start: float) -> str:
    """Captures (dots) and recompiles (red diamonds) along the run's time axis."""
    points = [(v["time"], "capture", f'{v["frame"]} version {v["version"]} captured ({v["ops"]} ops)')
              for v in fn["versions"]]
    points += [(r["time"], "recompile", f'recompile of {r["function"]}: {r["reason"]}')
               for r in fn["recompiles"]]
    if not points:
        return ""
    end = max(t for t, _, _ in points)
    span = max(end - start, 1e-3)
    width, height = 640, 60
    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}">',
             f'<line x1="10" y1="30" x2="{width - 10}" y2="30" stroke="#999"/>',
             '<text x="10" y="55" font-size="10">0 s</text>',
             f'<text x="{width - 10}" y="55" font-size="10" text-anchor="end">{span:.2f} s</text>']
    for t, kind, title in sorted(points):
        x = 10 + (t - start) / span * (width - 20)
        if kind == "capture":
            shape = f'<circle cx="{x:.1f}" cy="30" r="5" fill="#3182bd"/>'
        else:
            shape = (f'<path d="M{x:.1f},20 L{x + 7:.1f},30 L{x:.1f},40 L{x - 7:.1f},30 z" '
                     f'fill="#d62728"/>')
        parts.append(f'<g class="{kind}"><title>{e(title)}</title>{shape}</g>')
    parts.append("</svg>")
    return "".join(parts)


def _stage_bars(stages: dict) -> str:
    total = sum(stages.values()) or 1.0
    rows = []
    for name in STAGES:
        s = stages.get(name, 0.0)
        rows.append(f'<tr><td>{e(name)}</td><td class="num">{_ms(s)}</td><td class="bar">'
                    f'<div style="width:{100 * s / total:.1f}%"></div></td></tr>')
    return f'<table class="stages">{"".join(rows)}</table>'


def _anchor(fn: dict) -> str:
    return "fn-" + re.sub(r"[^A-Za-z0-9_]+", "-", fn["folder"])


def _function(fn: dict, start: float) -> str:
    fid = _anchor(fn)
    kernel_names = [k["name"] for v in fn["versions"] for k in v["kernels"]]
    colors = {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(kernel_names)}
    n_graphs = sum(v["graph"] is not None for v in fn["versions"])
    out = [f'<section class="function" id="{fid}"><h2>{e(fn["name"])}</h2>',
           f'<p class="where">{e(fn["file"])}:{fn["line"]} — {len(fn["versions"])} frame version(s), '
           f'{n_graphs} graph(s), {len(fn["breaks"])} graph break(s), {len(fn["recompiles"])} '
           f'recompile(s), {len(kernel_names)} kernel(s)</p>',
           '<h3>Frames and graphs</h3>']
    for i, v in enumerate(fn["versions"]):
        legend = "".join(f'<span class="chip" style="background:{colors[k["name"]]}">{e(k["name"])}</span>'
                         for k in v["kernels"])
        stages = ", ".join(f"{k} {_ms(s)}" for k, s in v["stages"].items() if s)
        resumes = f' → continues in {", ".join(e(r) for r in v["resumes"])}' if v["resumes"] else ""
        out.append(f'<div class="frame"><h4>{i}. {e(v["frame"])} <small>version {v["version"]}, '
                   f'{v["ops"]} ops, compiled in {_ms(v["seconds"])} ({e(stages)}){resumes}</small></h4>')
        if v["graph"] is not None:
            note = "the graph after the passes; fused groups coloured by kernel" \
                if v["graph_after_passes"] else "the captured graph"
            out.append(f'<p class="note">{note} {legend}</p><div class="svgbox">'
                       f'{graph_svg(v["graph"], colors)}</div>')
            out.append(f'<details><summary>graph listing</summary><pre>{e(v["graph_text"] or "")}'
                       f'</pre></details>')
        else:
            out.append('<p class="note">no graph (no tensor work)</p>')
        if v.get("readable"):
            out.append(f'<details><summary>the rewritten function as Python</summary>'
                       f'<pre class="code">{highlight(v["readable"], "python")}</pre></details>')
        out.append("</div>")
    out.append('<h3>Graph breaks</h3>')
    if fn["breaks"]:
        rows = "".join(
            f'<tr><td>{e(b["construct"])}</td><td>{e(b["function"])}</td>'
            f'<td>{e(b["where"]["file"] if b["where"] else "?")}:{b["where"]["line"] if b["where"] else ""}</td>'
            f'<td><code>{e(b["where"]["text"] if b["where"] else "")}</code></td><td>{e(b["hint"])}</td></tr>'
            for b in fn["breaks"])
        out.append('<table class="breaks"><tr><th>what</th><th>in</th><th>where</th><th>line</th>'
                   f'<th>what to do</th></tr>{rows}</table>')
    else:
        out.append("<p>None.</p>")
    if fn["fallbacks"]:
        out.append("<h3>Run as plain Python</h3><ul>" + "".join(
            f'<li>{e(f["function"])}: <pre>{e(f["message"])}</pre></li>' for f in fn["fallbacks"]) + "</ul>")
    out.append('<h3>Recompiles over time</h3>')
    out.append(timeline_svg(fn, start))
    if fn["recompiles"]:
        out.append("<ul class='recompiles'>" + "".join(
            f'<li><b>{e(r["function"])}</b> → version {r["version"]}: {e(r["reason"])}</li>'
            for r in fn["recompiles"]) + "</ul>")
    else:
        out.append("<p>No recompiles.</p>")
    out.append('<h3>Guards</h3>')
    for v in fn["versions"]:
        out.append(f'<details><summary>{e(v["frame"])} version {v["version"]}</summary>'
                   f'<pre class="code">{highlight(v["guards"], "python")}</pre></details>')
    out.append('<h3>Kernels</h3>')
    kernels = [(v, k) for v in fn["versions"] for k in v["kernels"]]
    if not kernels:
        out.append("<p>None (the backend generated no kernels).</p>")
    for v, k in kernels:
        builds = [b for b in v["builds"] if k["name"] in b["names"]]
        built = "; ".join(("disk cache hit" if b["cached"] else "compiled") + f' in {_ms(b["seconds"])}'
                          for b in builds) or "not built yet"
        out.append(
            f'<details class="kernel"><summary><span class="chip" style="background:{colors[k["name"]]}">'
            f'{e(k["name"])}</span> {e(k["language"])} on {e(k["device"])}, {len(k["group"])} fused op(s), '
            f'generated in {_ms(k["seconds"])}, {built}</summary>'
            f'<p>fuses:</p><pre>{e(chr(10).join(k["group"]))}</pre>'
            f'<pre class="code">{highlight(k["source"], k["language"])}</pre></details>')
    out.append('<h3>Compile time per stage</h3>')
    out.append(_stage_bars(fn["stages"]))
    out.append("</section>")
    return "\n".join(out)


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{background:#23395d;color:#fff;padding:12px 20px}
header h1{margin:0;font-size:20px}
nav{padding:8px 20px;background:#eef2f7}
nav a{margin-right:14px}
main{padding:0 20px 40px}
section.function{border-top:2px solid #23395d;margin-top:24px}
.where,.note{color:#555}
.frame{border:1px solid #ddd;border-radius:6px;padding:6px 10px;margin:8px 0}
.svgbox{overflow-x:auto}
.chip{color:#fff;border-radius:4px;padding:1px 6px;margin-left:4px;font-size:12px}
pre{background:#f7f7f7;padding:8px;overflow-x:auto}
table{border-collapse:collapse}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td.num{text-align:right}
td.bar{width:320px}
td.bar div{background:#3182bd;height:12px}
.kw{color:#0000c0;font-weight:600}.string{color:#a31515}.comment{color:#008000}
.number{color:#098658}.tl{color:#795e26}.pre{color:#af00db}
g.node.dim{opacity:.25}
"""

_SCRIPT = """
(function(){
  // Hovering a fused node dims every node outside its kernel.
  document.querySelectorAll('g.node').forEach(function(node){
    var group = node.getAttribute('data-group');
    if(!group) return;
    var svg = node.ownerSVGElement;
    node.addEventListener('mouseenter', function(){
      svg.querySelectorAll('g.node').forEach(function(other){
        if(other.getAttribute('data-group') !== group) other.classList.add('dim');
      });
    });
    node.addEventListener('mouseleave', function(){
      svg.querySelectorAll('g.node.dim').forEach(function(other){ other.classList.remove('dim'); });
    });
  });
  var toggle = document.getElementById('toggle-all');
  toggle.addEventListener('click', function(){
    var open = toggle.getAttribute('data-open') !== '1';
    document.querySelectorAll('details').forEach(function(d){ d.open = open; });
    toggle.setAttribute('data-open', open ? '1' : '0');
  });
  document.getElementById('status').textContent =
    'ready: ' + document.querySelectorAll('section.function').length + ' function(s)';
})();
"""

_ERRORS = """
window.__errors = [];
window.addEventListener('error', function(ev){
  window.__errors.push(String(ev.message));
  var box = document.getElementById('script-errors');
  if(box){ box.textContent = window.__errors.join('\\n'); box.hidden = false; }
});
"""


def render(data: dict, title: str = "framejit report") -> str:
    functions = data["functions"]
    start = data.get("started", 0.0)
    totals = {name: sum(fn["stages"].get(name, 0.0) for fn in functions) for name in STAGES}
    n = {
        "graphs": sum(v["graph"] is not None for fn in functions for v in fn["versions"]),
        "breaks": sum(len(fn["breaks"]) for fn in functions),
        "recompiles": sum(len(fn["recompiles"]) for fn in functions),
        "kernels": sum(len(v["kernels"]) for fn in functions for v in fn["versions"]),
    }
    nav = "".join(f'<a href="#{_anchor(fn)}">{e(fn["name"])}</a>' for fn in functions)
    body = "\n".join(_function(fn, start) for fn in functions)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>framejit report: {e(title)}</title>
<script>{_ERRORS}</script>
<style>{_STYLE}</style></head>
<body>
<header><h1>framejit report</h1><div>{e(title)}: {len(functions)} function(s), {n["graphs"]} graph(s),
{n["breaks"]} graph break(s), {n["recompiles"]} recompile(s), {n["kernels"]} kernel(s)
<button id="toggle-all" type="button">expand / collapse all</button>
<span id="status">loading</span></div><pre id="script-errors" hidden></pre></header>
<nav>{nav}</nav>
<main>
<section id="summary"><h2>Compile time per stage (all functions)</h2>{_stage_bars(totals)}</section>
{body}
</main>
<script>{_SCRIPT}</script>
</body></html>
"""
