"""The launcher registry (``slurmfm.launchers.SPECS``) is the only list of kinds (issue 43,
item 2): outside ``slurmfm/launchers`` no module writes two or more kinds down together (a
set, tuple or list of kind names, an ``isinstance`` over two launcher models, or a ``|`` union
of them), and the schema re-exports no launcher model. Why: a new kind (the ``ray`` launcher,
say) added to the registry must reach the loader, the sweep check, the schema and the
renderer without a second list to forget; the loader's old list of three reported a vLLM
field at the wrong line.
"""

from __future__ import annotations

import ast
from pathlib import Path

from slurmfm.launchers import SPECS
from slurmfm.recipe import schema

PACKAGE = Path(__file__).resolve().parents[2] / "slurmfm"


def _model_names() -> set[str]:
    from slurmfm import launchers

    return {
        name
        for name in dir(launchers)
        if name.endswith("Launcher") and isinstance(getattr(launchers, name), type)
    }


def _kinds_in(node: ast.AST, models: set[str]) -> list[str]:
    """The kinds (or launcher model names) ``node`` writes down together, when two or more."""
    if isinstance(node, ast.Set | ast.Tuple | ast.List):
        found = [
            e.value
            for e in node.elts
            if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in SPECS
        ]
        found += [e.id for e in node.elts if isinstance(e, ast.Name) and e.id in models]
        return found if len(found) >= 2 else []
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in models]
        return names if len(names) >= 2 else []
    return []


def lists_of_kinds(source: str, models: set[str]) -> list[tuple[int, list[str]]]:
    """(line, names) of every place ``source`` lists two or more launcher kinds."""
    return [
        (getattr(node, "lineno", 0), found)
        for node in ast.walk(ast.parse(source))
        if (found := _kinds_in(node, models))
    ]


def test_no_module_outside_the_launchers_lists_kinds() -> None:
    models = _model_names()
    found = [
        f"slurmfm/{path.relative_to(PACKAGE).as_posix()}:{line}: {', '.join(names)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in ("launchers", "job")
        for line, names in lists_of_kinds(path.read_text(encoding="utf-8"), models)
    ]
    assert not found, "ask slurmfm.launchers.SPECS instead:\n" + "\n".join(found)


def test_the_check_finds_a_list_of_kinds() -> None:
    """The check above can fail: each way of listing kinds it looks for is found."""
    models = _model_names()
    assert lists_of_kinds('KINDS = {"torchrun", "megatron", "nemo"}\n', models)
    assert lists_of_kinds('if k in ("vllm", "sglang"): pass\n', models)
    assert lists_of_kinds("isinstance(x, (VllmLauncher, SglangLauncher))\n", models)
    assert lists_of_kinds("isinstance(x, VllmLauncher | SglangLauncher)\n", models)
    assert not lists_of_kinds('if k == "nemo": pass\n', models)
    assert not lists_of_kinds('X = ("torchrun", "other")\n', models)


def test_the_schema_names_no_launcher_model() -> None:
    assert not [name for name in _model_names() if name in vars(schema)]


def test_the_save_on_signal_default_names_every_kind() -> None:
    """The field's description is built from the registry: every kind is named in it."""
    text = schema.Resilience.model_fields["save_on_signal"].description or ""
    for kind, spec in SPECS.items():
        assert kind in text
        side = text.split("Default by launcher:", 1)[1]
        true_part, false_part = side.split("false for", 1)
        assert (kind in true_part) is (spec.save_signal is not None), kind
        assert (kind in false_part) is (spec.save_signal is None), kind
