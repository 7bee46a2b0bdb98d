#!/usr/bin/env python3
"""Measure the structure issue 43 asks for: layers, the walk of a recipe, sizes and goldens.

Definitions (the targets of issue 43, "resolve once"; ``tests/test_import_layers.py`` holds
the code to the first two, and the walk to at most 12 climbs):

* **Layers.** :data:`LAYERS` orders slurmfm's folders and top modules from the bottom (values
  every other part uses: errors, the strict model base, shell quoting, the job runtime) through
  the pure steps in the order a recipe flows (catalog, launchers, recipe, topology, plan,
  resolve, render, request) to the parts that touch files and processes (history, backends,
  submit) and the entry points (api, cli). A module's layer is its folder
  (``slurmfm/render/script.py``: ``render/``) or, at the package's top, its own name
  (``slurmfm/resolve.py``: ``resolve``).
* **An import runs back up** when an ``import`` that runs (at module level, or in a function
  body, when the function is called; not one under ``if TYPE_CHECKING:``) names a module of a
  higher layer than its own. Read with ``ast`` (:func:`imports`, which the test uses too).
* **Cross-folder cycles**: strongly connected components of more than one node in the graph
  of module-level imports between layers (a folder or a top module is one node).
* **The walk** of a recipe: ``slurmfm.api.dry_run(recipe)`` (what ``api.submit`` renders and
  hands to the backend) run under ``sys.setprofile``. Each call of a slurmfm function that is
  *passed the recipe* (an argument other than ``self`` is the recipe, one of its sections, a
  pydantic model inside it, or a value with the recipe as an attribute, such as the
  ``ResolvedJob``) appends its module's layer to the walk; repeats in a row count once.
  **Rooms** are the distinct layers of the walk; a **climb** is a step of the walk to a higher
  layer (it went lower, to a lookup or a helper below, and comes back up). Counted per shipped
  recipe (``recipes/*.yaml``); max and median are reported. A method of the recipe or of the
  resolved job (``recipe.procs_per_node``, ``job.supports(...)``) reads the value it belongs
  to rather than passing it on, so it is not a step; the report shows the climbs counting
  those too ("with own methods") beside the target's. The walk follows objects, not the
  strings in them: a lookup by name (``get_instance(recipe.cluster.instance_type)``) is not
  a step, so the report also counts the calls from ``render/`` into ``catalog/``, whatever
  they are passed ("catalog lookups"). A sweep's tasks are recipes of their own (made by
  overrides), so a sweep recipe's walk follows its table, not each task's render.
* **Sizes**: the longest function (``def`` to its last line, as ``tests/test_sizes.py``) and
  module (lines) in ``slurmfm/``, and outside the job runtime (``slurmfm/job``).
* **Goldens a runtime-only change rewrites**: in a temporary copy of the tree, every golden
  file's text (``tests/golden_scripts.py``'s ``expected_files``) is computed, one statement is
  appended to ``slurmfm/job/node.py`` (part of the runtime every script embeds), and the files
  whose text changed are counted.
* **Payload**: the base64 runtime on the last line of the quickstart's script (bytes), and
  ``len(repr(SubmitRequest))`` of the quickstart's dry run.

Stdlib and networkx only; ``--tree`` measures another checkout (an older commit: what it
lacks prints ``n/a``).

    python scripts/bench_structure.py                      # this checkout
    python scripts/bench_structure.py --tree ../old --json # another checkout, as JSON
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent

LAYERS: tuple[str, ...] = (
    # values every layer uses; the package root holds only __version__
    "slurmfm",
    "errors",
    "strict",
    "quote",
    "job/",
    "fsutil",
    "polling",
    # the pure steps, in the order a recipe's facts are looked up and used
    "catalog/",
    "target",
    "launchers/",
    "recipe/",
    "topology/",
    "plan/",
    "referee/",  # before issue 43's sizes work: the placement referee (now bench/referee)
    "resolve",
    "render/",
    "request",
    # files and processes
    "checkpoint",
    "history",
    "call",
    "run_lock",
    "observe/",
    "backends/",
    "submit",
    "pipeline",
    # entry points
    "api",
    "cli/",
)
"""slurmfm's folders (``name/``) and top modules, bottom first (see the module docstring)."""

RANK = {name: i for i, name in enumerate(LAYERS)}
MAX_CLIMBS = 12  # issue 43's target for the walk of every shipped recipe


def layer(module: str, package: Path) -> str:
    """The layer of a dotted module name of ``package`` (``slurmfm.render.script``: ``render/``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    return parts[1] + "/" if (package / parts[1]).is_dir() else parts[1]


def _modules(package: Path) -> dict[str, Path]:
    out = {}
    for p in sorted(package.rglob("*.py")):
        parts = list(p.relative_to(package.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


class _Imports(ast.NodeVisitor):
    """Every import of a module that runs: (line, target, at module level or not)."""

    def __init__(self, mod: str, pkg: str, mods: dict[str, Path]) -> None:
        self.mod, self.pkg, self.mods = mod, pkg, mods
        self.depth = 0
        self.found: list[tuple[int, str, bool]] = []

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):  # never runs
            for stmt in node.orelse:
                self.visit(stmt)
            return
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.found.append((node.lineno, a.name, self.depth == 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            up = self.pkg.split(".")[: len(self.pkg.split(".")) - node.level + 1]
            base = ".".join(up + ([node.module] if node.module else []))
        for a in node.names:
            full = f"{base}.{a.name}"
            self.found.append((node.lineno, full if full in self.mods else base, self.depth == 0))


def imports(package: Path) -> list[tuple[str, int, str, bool]]:
    """(file relative to the package's parent, line, imported module, at module level) of
    every import of a slurmfm module that runs (module level or in a function body), read
    with ``ast``; imports under ``if TYPE_CHECKING:`` never run and are left out."""
    mods = _modules(package)
    out = []
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        v = _Imports(mod, pkg, mods)
        v.visit(ast.parse(path.read_text(encoding="utf-8")))
        rel = str(path.relative_to(package.parent))
        out += [(rel, line, t, top) for line, t, top in v.found if t.split(".")[0] == "slurmfm"]
    return out


def _file_module(rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def back_up_arrows(package: Path) -> list[str]:
    """``file:line layer -> layer (module)`` for every import that runs back up."""
    out = []
    for rel, line, target, _top in imports(package):
        a, b = layer(_file_module(rel), package), layer(target, package)
        if a in RANK and b in RANK and RANK[b] > RANK[a]:
            out.append(f"{rel}:{line} {a} -> {b} ({target})")
    return out


def unplaced(package: Path) -> list[str]:
    """Layers of ``package`` that :data:`LAYERS` does not name (each must be placed)."""
    return sorted({layer(m, package) for m in _modules(package)} - set(RANK))


def folder_cycles(package: Path) -> list[list[str]]:
    """Cross-folder import cycles: the module-level import graph between layers, each
    strongly connected component of more than one node (sorted)."""
    g: nx.DiGraph[str] = nx.DiGraph()
    for rel, _line, target, top in imports(package):
        a, b = layer(_file_module(rel), package), layer(target, package)
        if top and a != b:
            g.add_edge(a, b)
    return sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)


def longest(package: Path, skip: str = "") -> dict[str, Any]:
    """The longest function (lines, ``file:qualname``) and module (lines, file) in
    ``package``, leaving out files under ``skip`` (a folder of the package)."""
    fn: tuple[int, str] = (0, "")
    mod: tuple[int, str] = (0, "")
    for path in sorted(package.rglob("*.py")):
        rel = str(path.relative_to(package))
        if skip and rel.startswith(skip + "/"):
            continue
        text = path.read_text(encoding="utf-8")
        mod = max(mod, (len(text.splitlines()), rel))
        stack: list[tuple[ast.AST, str]] = [(ast.parse(text), "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        end = child.end_lineno or child.lineno
                        fn = max(fn, (end - child.lineno + 1, f"{rel}:{name}"))
                    stack.append((child, name + "."))
                else:
                    stack.append((child, prefix))
    return {
        "function": {"lines": fn[0], "name": fn[1]},
        "module": {"lines": mod[0], "name": mod[1]},
    }


# ---------------------------------------------------------------------------- the walk


def _parts(recipe: Any) -> set[int]:
    """ids of the recipe and every pydantic model inside it."""
    from pydantic import BaseModel

    seen: set[int] = set()
    todo = [recipe]
    while todo:
        v = todo.pop()
        if isinstance(v, BaseModel):
            if id(v) in seen:
                continue
            seen.add(id(v))
            todo += [getattr(v, f) for f in type(v).model_fields]
        elif isinstance(v, list | tuple | set | frozenset):
            todo += list(v)
        elif isinstance(v, dict):
            todo += list(v.values())
    return seen


def _carries(value: Any, recipe: Any, parts: set[int]) -> bool:
    if id(value) in parts:
        return True
    attrs = getattr(value, "__dict__", None)
    return isinstance(attrs, dict) and any(v is recipe for v in attrs.values())


class Walk(NamedTuple):
    """One recipe's walk (see the module docstring)."""

    passed: list[str]  # the walk: layers of the calls the recipe is passed to
    reads: list[str]  # the same, with the recipe's and the resolved job's own methods
    lookups: int  # calls from render/ into catalog/, whatever their arguments


def walk(recipe: Any, package: Path) -> Walk:
    """``slurmfm.api.dry_run(recipe)``'s walk: the layers of the calls that are passed the
    recipe, in call order, repeats in a row counted once; the same with the calls that only
    read a value holding it (its own methods: ``self`` carries it); the render's lookups in
    the catalog (see the module docstring)."""
    from slurmfm import api

    parts = _parts(recipe)
    passed: list[str] = []
    reads: list[str] = []
    lookups = 0

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        nonlocal lookups
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not isinstance(name, str) or not name.startswith("slurmfm."):
            return
        code = frame.f_code
        local = frame.f_locals
        args = [
            a
            for a in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if _carries(local.get(a), recipe, parts)
        ]
        here = layer(name, package)
        for seq, counts in ((passed, any(a != "self" for a in args)), (reads, bool(args))):
            if counts and (not seq or seq[-1] != here):
                seq.append(here)
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if here == "catalog/" and isinstance(caller, str) and caller.startswith("slurmfm.render"):
            lookups += 1

    sys.setprofile(profile)
    try:
        api.dry_run(recipe)
    finally:
        sys.setprofile(None)
    return Walk(passed, reads, lookups)


def climbs(seq: list[str]) -> int:
    """Steps of the walk to a higher layer."""
    return sum(1 for a, b in itertools.pairwise(seq) if RANK.get(b, -1) > RANK.get(a, -1))


def walks(tree: Path) -> dict[str, dict[str, Any]]:
    """Per shipped recipe of ``tree``: the walk, its rooms and its climbs (slurmfm imported
    from ``tree``: call this in a process whose ``sys.path`` starts there)."""
    from slurmfm import api

    out = {}
    for path in sorted((tree / "recipes").glob("*.yaml")):
        w = walk(api.load(path), tree / "slurmfm")
        out[path.stem] = {
            "rooms": len(set(w.passed)),
            "climbs": climbs(w.passed),
            "walk": w.passed,
            "climbs_with_own_methods": climbs(w.reads),
            "render_catalog_lookups": w.lookups,
        }
    return out


def _runtime(tree: Path) -> dict[str, Any]:
    """The walks, the quickstart's payload line and ``len(repr(SubmitRequest))``."""
    from slurmfm import api

    request = api.dry_run(api.load(tree / "recipes" / "quickstart.yaml"))
    script = request.script
    text = script.decode() if isinstance(script, bytes) else script
    last = text.rstrip("\n").rpartition("\n")[2].split(" ")
    payload = len(last[3]) if last[:2] == ["#", "slurmfm-runtime"] and len(last) == 4 else None
    return {"walks": walks(tree), "payload_bytes": payload, "repr_len": len(repr(request))}


# -------------------------------------------------------------- goldens of a runtime change

_GOLDENS = """
import hashlib, json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
import golden_scripts
files = golden_scripts.expected_files()
print(json.dumps({p.name: hashlib.sha256(t.encode()).hexdigest() for p, t in files.items()}))
"""


def goldens_rewritten(tree: Path) -> dict[str, Any]:
    """How many golden files change when only the runtime does (see the module docstring)."""
    if not (tree / "tests" / "golden_scripts.py").is_file():
        return {"changed": None, "of": None}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        shutil.copytree(tree / "slurmfm", copy / "slurmfm")
        shutil.copytree(tree / "recipes", copy / "recipes")
        (copy / "tests").mkdir()
        shutil.copy(tree / "tests" / "golden_scripts.py", copy / "tests")

        def hashes() -> dict[str, str]:
            env = {**os.environ, "PYTHONPATH": str(copy)}
            out = subprocess.run(
                [sys.executable, "-c", _GOLDENS, str(copy)],
                env=env,
                cwd=copy,
                capture_output=True,
                text=True,
                check=True,
            )
            result: dict[str, str] = json.loads(out.stdout)
            return result

        before = hashes()
        with (copy / "slurmfm" / "job" / "node.py").open("a", encoding="utf-8") as f:
            f.write("\n_BENCH_STRUCTURE = 1  # a runtime-only change\n")
        after = hashes()
    return {"changed": sum(before[k] != after.get(k) for k in before), "of": len(before)}


# ------------------------------------------------------------------------------- report


@contextlib.contextmanager
def _imported_from(tree: Path) -> Iterator[None]:
    """slurmfm imported from ``tree`` (this process must not have imported another)."""
    sys.path.insert(0, str(tree))
    try:
        import slurmfm

        where = Path(slurmfm.__file__).resolve().parent
        if where != (tree / "slurmfm").resolve():
            raise SystemExit(f"slurmfm was imported from {where}, not {tree}")
        yield
    finally:
        sys.path.remove(str(tree))


def measure(tree: Path, goldens: bool = True) -> dict[str, Any]:
    """Everything the report shows, for the checkout at ``tree``."""
    package = tree / "slurmfm"
    arrows = back_up_arrows(package)
    with _imported_from(tree):
        run = _runtime(tree)
    per = run.pop("walks")
    climb = [w["climbs"] for w in per.values()]
    rooms = [w["rooms"] for w in per.values()]
    return {
        "tree": str(tree),
        "walk": {
            "climbs_max": max(climb),
            "climbs_median": statistics.median(climb),
            "rooms_max": max(rooms),
            "rooms_median": statistics.median(rooms),
            "climbs_with_own_methods_max": max(w["climbs_with_own_methods"] for w in per.values()),
            "render_catalog_lookups_max": max(w["render_catalog_lookups"] for w in per.values()),
            "render_catalog_lookups_median": statistics.median(
                w["render_catalog_lookups"] for w in per.values()
            ),
            "per_recipe": per,
        },
        "back_up_arrows": {"count": len(arrows), "list": arrows},
        "unplaced_layers": unplaced(package),
        "cross_folder_cycles": folder_cycles(package),
        "longest": longest(package),
        "longest_outside_job": longest(package, skip="job"),
        "goldens_rewritten_by_a_runtime_change": (
            goldens_rewritten(tree) if goldens else {"changed": None, "of": None}
        ),
        "payload_bytes": run["payload_bytes"],
        "submit_request_repr_len": run["repr_len"],
    }


def _na(v: object) -> str:
    return "n/a" if v is None else str(v)


def report(m: dict[str, Any]) -> str:
    """The measurement as text."""
    w, g = m["walk"], m["goldens_rewritten_by_a_runtime_change"]
    lines = [
        f"tree: {m['tree']}",
        f"walk of a recipe from api.dry_run: climbs max {w['climbs_max']} median "
        f"{w['climbs_median']}; rooms max {w['rooms_max']} median {w['rooms_median']} "
        f"(climbs counting the recipe's and the resolved job's own methods: max "
        f"{w['climbs_with_own_methods_max']}); render/ asks catalog/ at most "
        f"{w['render_catalog_lookups_max']} times (median {w['render_catalog_lookups_median']})",
    ]
    for name, r in w["per_recipe"].items():
        lines.append(
            f"  {name}: {r['rooms']} rooms, {r['climbs']} climbs "
            f"({r['climbs_with_own_methods']} with own methods), "
            f"{r['render_catalog_lookups']} catalog lookups from render/: {' '.join(r['walk'])}"
        )
    arrows = m["back_up_arrows"]
    lines.append(f"imports that run back up: {arrows['count']}")
    lines += [f"  {a}" for a in arrows["list"]]
    if m["unplaced_layers"]:
        lines.append(f"layers not in LAYERS: {', '.join(m['unplaced_layers'])}")
    cycles = m["cross_folder_cycles"]
    lines.append(f"cross-folder import cycles: {len(cycles)}")
    lines += [f"  {' <-> '.join(c)}" for c in cycles]
    for key, label in (("longest", "slurmfm/"), ("longest_outside_job", "slurmfm/ but job/")):
        fn, mod = m[key]["function"], m[key]["module"]
        lines.append(
            f"longest function in {label}: {fn['lines']} lines ({fn['name']}); "
            f"longest module: {mod['lines']} lines ({mod['name']})"
        )
    lines.append(
        f"golden files a runtime-only change rewrites: {_na(g['changed'])} of {_na(g['of'])}"
    )
    lines.append(f"runtime payload (base64, quickstart): {_na(m['payload_bytes'])} bytes")
    lines.append(f"len(repr(SubmitRequest)) of the quickstart: {m['submit_request_repr_len']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="checkout to measure (default: this)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--no-goldens", action="store_true", help="skip the golden count (slow)")
    a = ap.parse_args(argv)
    m = measure(a.tree.resolve(), goldens=not a.no_goldens)
    print(json.dumps(m, indent=1) if a.json else report(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
