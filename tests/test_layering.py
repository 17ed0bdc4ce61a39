"""framejit's packages import one way (DESIGN.md):

    api → capture → fx_ir
    api → compiler → passes / kernels / backends → fx_ir

capture never imports passes, kernels, backends, the compiler or debug; passes, kernels and
backends import nothing of framejit but fx_ir and leaves (the C extension; framejit/record.py,
where every layer writes its events; framejit/diskcache.py, the disk caches' folders and
pruning); fx_ir imports only diskcache, and the leaves import nothing of framejit.
Function-level imports count too.
"""

import ast
from pathlib import Path

import pytest

import framejit

ROOT = Path(framejit.__file__).parent

ALLOWED = {
    "fx_ir": {"diskcache"},
    "kernels": {"fx_ir", "_claunch", "record", "diskcache"},
    "passes": {"fx_ir", "record"},
    "backends": {"fx_ir", "record"},
    "capture": {"fx_ir", "errors", "config", "_C", "record", "diskcache"},
}


def _framejit_imports(path: Path) -> set[str]:
    """The top-level framejit modules/packages that ``path`` imports."""
    package = path.relative_to(ROOT).parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.split(".")[0] == "framejit":
                    parts = node.module.split(".")[1:]
                    found.add(parts[0] if parts else node.names[0].name)
                continue
            base = list(package[: len(package) - (node.level - 1)])
            parts = base + (node.module.split(".") if node.module else [])
            if parts:
                found.add(parts[0])
            else:
                found |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "framejit" and len(parts) > 1:
                    found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_the_layering_allows(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        extra = _framejit_imports(path) - ALLOWED[package] - {package}
        if extra:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(extra)}")
    assert not bad, (f"framejit/{package} may import only {sorted(ALLOWED[package]) or 'nothing'} "
                     f"of framejit:\n  " + "\n  ".join(bad))


@pytest.mark.parametrize("leaf", ["record.py", "diskcache.py"])
def test_leaves_import_nothing_of_framejit(leaf):
    # Every layer uses them: they must not pull any layer in.
    path = ROOT / leaf
    assert _framejit_imports(path) == set(), f"framejit/{leaf} imports {_framejit_imports(path)}"
