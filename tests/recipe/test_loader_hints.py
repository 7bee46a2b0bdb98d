"""Errors a newcomer can act on: "did you mean", no pydantic class names, how to write a
list or a mapping in --set."""

from __future__ import annotations

import pytest

from slurmfm.errors import RecipeError
from slurmfm.recipe.loader import parse_override, validate

BASE = {
    "name": "x",
    "cluster": {"instance_type": "lab-cpu"},
    "resources": {"nodes": 1, "procs_per_node": 1},
    "launcher": {"kind": "torchrun", "script": "t.py"},
}


def problems(data: dict[str, object], *sets: str) -> list[str]:
    with pytest.raises(RecipeError) as err:
        validate(data, overrides=dict(parse_override(s) for s in sets))
    return [str(p) for p in err.value.problems]


def test_a_misspelt_key_gets_the_nearest_field() -> None:
    data = {**BASE, "resourcs": {}}
    assert problems(data) == ["<dict>:1: resourcs: unknown field; did you mean 'resources'?"]
    launcher = {**BASE, "launcher": {"kind": "torchrun", "scrpt": "t.py"}}
    assert "<dict>:1: launcher.scrpt: unknown field; did you mean 'script'?" in problems(launcher)
    # Inside a union, the tag's own fields: megatron's entrypoint is not torchrun's.
    assert problems(BASE, "launcher.entrypont=x") == [
        "<override>: launcher.entrypont: unknown field "
        "(check the spelling; see docs/recipe-reference.md)"
    ]


def test_a_misspelt_override_is_the_overrides_problem() -> None:
    assert problems(BASE, "resource.nodes=4") == [
        "<override>: resource: unknown field; did you mean 'resources'?"
    ]
    assert problems(BASE, "resources.nodse=4") == [
        "<override>: resources.nodse: unknown field; did you mean 'nodes'?"
    ]


def test_set_of_a_section_names_no_class_and_says_how_to_write_a_mapping() -> None:
    (msg,) = problems(BASE, "resources=5")
    assert "instance of" not in msg
    assert "Resources" not in msg
    assert msg == (
        "<override>: resources: should be a mapping of fields, not a number (5); write a "
        "mapping as --set 'resources={key: value}', or one key as --set resources.key=value"
    )


def test_set_errors_say_how_to_write_lists_and_dicts() -> None:
    assert problems(BASE, "launcher.args=--steps 5") == [
        "<override>: launcher.args: should be a list, not a string ('--steps 5'); write a list "
        "as --set 'launcher.args=[a, b]'"
    ]
    assert problems(BASE, "storage.data=/fsx") == [
        "<override>: storage.data: should be a mapping, not a string ('/fsx'); write a mapping "
        "as --set 'storage.data={key: value}', or one key as --set storage.data.key=value"
    ]
    assert problems(BASE, "launcher.args=[--steps, 5]") == [
        '<override>: launcher.args.1: should be a string, not a number (5); quote it: "5"'
    ]
    # Written as the hints say, both validate.
    r = validate(
        BASE,
        overrides=dict(
            parse_override(s) for s in ("launcher.args=[--steps, '5']", "storage.data={a: /fsx}")
        ),
    )
    assert r.launcher.args == ["--steps", "5"]  # type: ignore[union-attr]
    assert r.storage.data == {"a": "/fsx"}
