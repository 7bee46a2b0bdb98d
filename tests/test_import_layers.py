"""No import cycle spans two folders of the package (issue 43): read from the module-level
imports (the ones that run when a module loads), each root module its own node."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "slurmfm"


def _modname(p: Path, root: Path) -> str:
    parts = list(p.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _node(mod: str, root: Path) -> str:
    parts = mod.split(".")
    return parts[1] + "/" if len(parts) >= 2 and (root / parts[1]).is_dir() else mod


def folder_graph(root: Path = ROOT) -> nx.DiGraph:
    mods = {_modname(p, root): p for p in root.rglob("*.py")}
    g = nx.DiGraph()
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for stmt in ast.parse(path.read_text()).body:
            targets: list[str] = []
            if isinstance(stmt, ast.ImportFrom):
                base = stmt.module or ""
                if stmt.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - stmt.level + 1]
                    base = ".".join(up + ([stmt.module] if stmt.module else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in stmt.names
                ]
            elif isinstance(stmt, ast.Import):
                targets = [a.name for a in stmt.names]
            for t in targets:
                if t.startswith("slurmfm") and _node(t, root) != _node(mod, root):
                    g.add_edge(_node(mod, root), _node(t, root))
    return g


def test_no_import_cycle_spans_two_folders() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(folder_graph()) if len(c) > 1]
    assert not cycles, cycles


def test_the_check_sees_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "slurmfm"
    for d in ("a", "b"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from slurmfm.b.y import Y\n")
    (pkg / "b" / "y.py").write_text("from slurmfm.a import x\nY = 1\n")
    g = folder_graph(pkg)
    assert [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1] == [["a/", "b/"]]
