"""One natural sort key, equal to Slurm's ``strnatcmp`` (SchedMD/slurm src/common/strnatcmp.c)."""

from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from slurmfm.plan import planner, slurm_sim
from slurmfm.topology import render_svg, slurm_model, topology_conf
from slurmfm.topology.model import Topology, natural_key


def _left(a: str, b: str) -> int:
    i = 0
    while True:
        ca = a[i] if i < len(a) else ""
        cb = b[i] if i < len(b) else ""
        if not ca.isdigit() and not cb.isdigit():
            return 0
        if not ca.isdigit():
            return -1
        if not cb.isdigit():
            return 1
        if ca != cb:
            return -1 if ca < cb else 1
        i += 1


def _right(a: str, b: str) -> int:
    bias, i = 0, 0
    while True:
        ca = a[i] if i < len(a) else ""
        cb = b[i] if i < len(b) else ""
        if not ca.isdigit() and not cb.isdigit():
            return bias
        if not ca.isdigit():
            return -1
        if not cb.isdigit():
            return 1
        if ca < cb and not bias:
            bias = -1
        elif ca > cb and not bias:
            bias = 1
        i += 1


def strnatcmp(a: str, b: str) -> int:
    """A line-by-line port of strnatcmp0(a, b, fold_case=0), without the space skipping."""
    ai = bi = 0
    while True:
        ca = a[ai] if ai < len(a) else ""
        cb = b[bi] if bi < len(b) else ""
        if ca.isdigit() and cb.isdigit():
            r = _left(a[ai:], b[bi:]) if "0" in (ca, cb) else _right(a[ai:], b[bi:])
            if r:
                return r
        if not ca and not cb:
            return 0
        if ca != cb:
            return -1 if ca < cb else 1
        ai += 1
        bi += 1


def test_examples() -> None:
    names = ["node10", "node9", "node2", "node01", "node1", "node-1", "n01x", "n012", "n"]
    ported = sorted(names, key=functools.cmp_to_key(strnatcmp))
    assert sorted(names, key=natural_key) == ported
    assert ported.index("node2") < ported.index("node10")
    assert ported.index("node01") < ported.index("node1")
    assert ported.index("node-1") < ported.index("node1")
    assert ported.index("n01x") < ported.index("n012")


@settings(max_examples=500, deadline=None)
@given(
    st.text(alphabet="0129ab-._", max_size=8),
    st.text(alphabet="0129ab-._", max_size=8),
)
def test_same_order_as_strnatcmp(a: str, b: str) -> None:
    want = strnatcmp(a, b)
    ka, kb = natural_key(a), natural_key(b)
    got = (ka > kb) - (ka < kb)
    assert got == want, (a, b)


def test_one_key_everywhere() -> None:
    assert planner.natural_key is natural_key
    assert slurm_sim.natural_key is natural_key
    assert slurm_model.natural_key is natural_key
    assert topology_conf.natural_key is natural_key
    assert render_svg.natural_key is natural_key


def test_natural_order_is_computed_once_per_topology() -> None:
    topo = Topology.from_paths({f"n{i}": ("root", "leaf") for i in (10, 9, 2)})
    assert topo.natural_order == ("n2", "n9", "n10")
    assert topo.natural_order is topo.natural_order
