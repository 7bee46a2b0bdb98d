"""The runtime's options are one typed value per subcommand (slurmfm.job.options): what the
renderer writes is what the runtime reads, and both sides have one set of defaults."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmfm import api
from slurmfm.job.cli import parser
from slurmfm.job.options import (
    BatchOptions,
    ContainerRemoveOptions,
    ForwardOptions,
    HealthOptions,
    NodeOptions,
    Options,
    PrepareOptions,
    TaskOptions,
)

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.yaml"))
CLASSES: list[type[Options]] = [
    PrepareOptions,
    BatchOptions,
    HealthOptions,
    NodeOptions,
    ForwardOptions,
    ContainerRemoveOptions,
    TaskOptions,
]


def values(cls: type[Options]) -> st.SearchStrategy[Any]:
    """Any value of ``cls``: every field drawn from its type (or its choices)."""
    text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, default in cls.defaults().items():
        if name in cls.CHOICES:
            fields[name] = st.sampled_from(cls.CHOICES[name])
        elif isinstance(default, bool):
            fields[name] = st.booleans()
        elif isinstance(default, int):
            fields[name] = st.integers()
        elif isinstance(default, float):
            fields[name] = st.floats(allow_nan=False)
        elif isinstance(default, tuple):
            fields[name] = st.lists(text, max_size=3).map(tuple)
        else:
            fields[name] = text
    return st.builds(cls, **fields)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_words_of_any_value_read_back_as_that_value(cls: type[Options], data: Any) -> None:
    x = data.draw(values(cls))
    assert cls.from_argv(x.to_argv()) == x
    assert cls.from_argv(x.to_argv(always=cls.defaults())) == x  # all shown: the same value
    # read without argparse (a node entry's start): the same value, the words after "--" kept
    assert cls.from_words([*x.to_argv(), "--", "cmd", "--x"]) == (x, ["cmd", "--x"])
    assert cls.from_words([*x.to_argv(always=cls.defaults()), "--"]) == (x, [])


def test_a_value_that_is_exactly_two_dashes_reads_back() -> None:
    """``--``, which argparse drops from an option's arguments (Python 3.11: ``--x=--`` gave
    ``[]``), in a list and in a text field, through both readers (found by the property test
    above)."""
    x = BatchOptions(component_unset=("--", "0:A"), fabric_args="--")
    assert {"--fabric-args=--", "--component-unset=--"} <= set(x.to_argv())
    assert BatchOptions.from_argv(x.to_argv()) == x
    assert BatchOptions.from_words([*x.to_argv(), "--", "srun"]) == (x, ["srun"])


def test_a_value_with_nothing_changed_has_no_words() -> None:
    for cls in CLASSES:
        assert cls().to_argv() == [w for name in sorted(cls.REQUIRED) for w in (f"--{name}", "")]
        assert cls.from_argv(cls().to_argv()) == cls()


def test_the_runtime_defaults_are_a_default_recipes() -> None:
    """The drift this replaces: ``drain_unhealthy`` was true in the recipe, ``--drain`` 0 in
    the runtime. A default recipe now renders no value that differs from the runtime's."""
    from slurmfm.recipe.schema import Resilience

    res, rt = Resilience(), BatchOptions()
    assert res.drain_unhealthy is rt.drain is True
    assert (res.max_restarts, res.requeue, res.restart_in_job) == (
        rt.max_restarts,
        rt.requeue,
        rt.restart_in_job,
    )
    assert (res.hang_timeout_s, res.nccl_check_timeout_s) == (rt.hang_timeout_s, rt.nccl_timeout_s)
    assert res.expedited_requeue is rt.expedite
    assert rt.retry_exit == "none"  # an empty resilience.retry_exit_codes


def _line(text: str, start: str) -> str:
    joined = text.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if ln.lstrip().startswith(start)]
    return line


def _argv_by_bash(words: str) -> list[str]:
    """What bash passes for these shell words (the server array defined as the script has it
    by then: 3 words)."""
    script = f'slurmfm_serve=(a b c); set -- {words}; for w; do printf "%s\\0" "$w"; done'
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_the_scripts_runtime_lines_parse_as_the_renderers_values(path: Path) -> None:
    """Every shipped recipe: the ``prepare`` and ``batch`` words bash passes parse, with the
    runtime's own parser, into exactly the values the renderer built."""
    out = api.render(api.load(path)).rendered
    assert out is not None
    assert out.batch_options is not None
    assert out.prepare_options is not None
    prep = _line(out.text, 'slurmfm_env=$(python3 -I -S -c "$slurmfm_checked" prepare')
    words = prep.split("prepare", 1)[1].rsplit(")", 1)[0]
    got = parser().parse_args(["prepare", *_argv_by_bash(words)])
    assert PrepareOptions.from_namespace(got) == out.prepare_options
    batch = _line(out.text, 'exec python3 -I -S -c "$slurmfm_checked" batch')
    argv = _argv_by_bash(batch.split(" batch ", 1)[1])
    a = parser().parse_args(["batch", *argv])
    o = BatchOptions.from_namespace(a)
    # the two values only the job's bash knows: the server command's length, the
    # components' environment values (shell words of the profile)
    serving = out.batch_options.serve_kind != ""
    assert o.serve_words == (3 if serving else 0)
    want = out.batch_options._replace(serve_words=o.serve_words, component_env=o.component_env)
    assert o == want
    assert a.argv[:1] == ["--"]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_the_scripts_node_entries_parse_with_the_runtimes_parser(path: Path) -> None:
    """The per-node entry of every step (launch, server) parses as ``runtime node`` options;
    a server's entry reads its own host order."""
    out = api.render(api.load(path)).rendered
    assert out is not None
    joined = out.text.replace("\\\n", " ")
    # (none where the launch needs no entry: NeMo's tasks, a sweep's table)
    entries = [ln.split(" node ", 1)[1] for ln in joined.splitlines() if '" node --' in ln]
    for words in entries:
        argv = _argv_by_bash(words.split(" -- ", 1)[0])
        a = parser().parse_args(["node", *argv])
        o = NodeOptions.from_namespace(a)
        assert o.order_var in ("SLURMFM_HOST_ORDER", "SLURMFM_SERVE_ORDER")
        # what every launch task reads them with, without argparse: the same value
        assert NodeOptions.from_words([*argv, "--", "torchrun"]) == (o, ["torchrun"])


@pytest.mark.parametrize(
    "words",
    [
        ["--prefix", "2", "torchrun"],  # no "--": argparse's REMAINDER decides
        ["--prefix", "2"],
        ["--prefix", "-1", "--", "x"],  # a value after a space that starts with "-"
        ["--prefix", "two", "--", "x"],  # a value the field refuses
        ["--forward", "KILL", "--", "x"],  # not one of the choices
        ["--pref", "2", "--", "x"],  # an abbreviation: argparse's own rule
        ["--no-such", "1", "--", "x"],
        ["--ray-driver=1", "--", "x"],  # a bare switch given a value
        ["--prefix"],
    ],
)
def test_what_the_renderer_never_writes_goes_to_argparse(words: list[str]) -> None:
    """Options.from_words reads only the renderer's own forms; anything else is None, and
    the caller gives it to argparse, whose reading and messages stay the reference."""
    assert NodeOptions.from_words(words) is None


def test_a_node_entry_reads_its_options_as_argparse_does() -> None:
    words = ["--prefix", "4", "--forward=TERM", "--ray-driver", "--pd-router-arg", "a"]
    words += ["--pd-router-arg=-b", "--vllm-dp", "2", "--", "torchrun", "--", "x.py"]
    a = parser("node").parse_args(["node", *words])
    assert NodeOptions.from_words(words) == (NodeOptions.from_namespace(a), a.argv[1:])


def _subcommands(p: argparse.ArgumentParser) -> list[str]:
    (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(sub.choices)


def test_a_step_builds_the_parser_of_its_own_subcommand_only() -> None:
    """Every step parses one subcommand: the per-node entry builds one parser, not eleven."""
    from slurmfm.job import cli

    assert _subcommands(cli.parser("node")) == ["node"]
    every = _subcommands(cli.parser())
    assert len(every) == len(cli._SUBCOMMANDS) == 11
    assert _subcommands(cli.parser("no-such")) == every
    one = cli.parser("node").parse_args(["node", "--prefix", "2", "--", "torchrun", "x.py"])
    full = cli.parser().parse_args(["node", "--prefix", "2", "--", "torchrun", "x.py"])
    assert one == full
