"""slurmfm.topology.hostlist: the one hostlist module (expanding, writing, ``--nodelist``)."""

from __future__ import annotations

import random

import hostlist
import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmfm.plan.cost import JobShape
from slurmfm.plan.planner import plan
from slurmfm.plan.types import Placement
from slurmfm.topology.hostlist import (
    BadHostlist,
    collect_hostlist,
    compress_hostlist,
    expand_hostlist,
    nodelist,
)
from slurmfm.topology.model import Topology


def test_compress_hostlist_only_trailing_ranges() -> None:
    assert compress_hostlist(["node001", "node002", "node010"]) == "node[001-002,010]"
    assert compress_hostlist(["n9", "n10"]) == "n9,n10"  # different widths stay apart
    # python-hostlist would write nn-1a[2-3]b, which real Slurm 22.05.8 rejects
    assert compress_hostlist(["nn-1a2b", "nn-1a3b"]) == "nn-1a2b,nn-1a3b"
    assert compress_hostlist(["leaf2", "leaf10", "leaf1"]) == "leaf[1-2],leaf10"


@given(st.lists(st.from_regex(r"[a-z]{1,3}-?[0-9]{1,3}", fullmatch=True), min_size=1, max_size=40))
def test_compress_expand_roundtrip(names: list[str]) -> None:
    assert sorted(expand_hostlist(compress_hostlist(names))) == sorted(set(names))


@given(st.text(alphabet="ab01-[],", min_size=1, max_size=12))
def test_expand_agrees_with_python_hostlist(expr: str) -> None:
    """Any expression: the same names as python-hostlist, or both refuse it."""
    try:
        want: list[str] | None = list(dict.fromkeys(hostlist.expand_hostlist(expr)))
    except hostlist.BadHostlist:
        want = None
    try:
        got: list[str] | None = expand_hostlist(expr)
    except BadHostlist:
        got = None
    if want is not None and got is not None:
        assert got == want, expr
    else:
        # Plain names with blanks or brackets inside are where the two may differ in what
        # they refuse; a name list from either is still valid for Slurm.
        assert want is None or got is None or got == want


def test_nodelist_is_the_one_text_for_the_planner_and_the_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--nodelist`` in the plan's sbatch options and in the rendered script is one function:
    replacing :func:`nodelist` changes both."""
    from slurmfm.recipe.loader import validate
    from slurmfm.render.script import Target, render_script
    from slurmfm.topology import hostlist as hl

    topo = Topology.from_paths({f"p5-{i:05d}": ("core", f"leaf{i // 4}") for i in range(16)})
    p = plan(topo, JobShape(2, 8, tp=8), unavailable=["p5-00001"])
    assert f"--nodelist={nodelist(p.nodes)}" in p.sbatch_options
    assert nodelist(p.nodes) == hostlist.collect_hostlist(list(p.nodes))
    monkeypatch.setattr(hl, "nodelist", lambda nodes: "marked[1-2]")
    assert "--nodelist=marked[1-2]" in plan(topo, JobShape(2, 8, tp=8)).sbatch_options
    recipe = validate(
        {
            "name": "r",
            "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "torchrun", "script": "/fsx/train.py"},
        }
    )
    text = render_script(
        recipe, Target.for_recipe(recipe, "24.11"), Placement(mode="pin", nodes=p.nodes)
    ).text
    assert "#SBATCH --nodelist=marked[1-2]" in text.splitlines()


def test_collect_hostlist_is_python_hostlists_text() -> None:
    """The one-width fast path writes exactly what python-hostlist writes (and others go to it)."""
    rng = random.Random(9)
    for _ in range(3000):
        stem = rng.choice(["p5-", "node", "", "a1b2-", "x[", "gpu-0"])
        width = rng.randint(1, 3)
        names = [
            stem + "".join(rng.choice("0123456789") for _ in range(width))
            for _ in range(rng.randint(1, 12))
        ]
        names += rng.sample(names, min(len(names), rng.randint(0, 2)))  # duplicates
        if rng.random() < 0.2:
            names.append(rng.choice(["n1", "n01", "p5-7", "b", "p5-1234"]))
        rng.shuffle(names)
        if "[" in stem:
            continue  # python-hostlist refuses it; so does the fallback
        assert collect_hostlist(names) == hostlist.collect_hostlist(names), names
