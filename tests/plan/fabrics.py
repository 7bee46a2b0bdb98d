"""The fabric the cost model and simulation tests check by hand: 4 leaves of 4 nodes, two
leaves per spine under one core (``n00``..``n15`` in fabric order)."""

from __future__ import annotations

from slurmfm.topology.model import Topology


def tree(leaves: int = 4, per_leaf: int = 4, leaves_per_spine: int = 2) -> Topology:
    """``leaves`` x ``per_leaf`` nodes named in fabric order, ``leaves_per_spine`` per spine."""
    paths = {}
    for i in range(leaves * per_leaf):
        leaf = i // per_leaf
        paths[f"n{i:02d}"] = ("core", f"spine{leaf // leaves_per_spine}", f"leaf{leaf}")
    return Topology.from_paths(paths)


NAMES = [f"n{i:02d}" for i in range(16)]
# Alternate the two spines (n00 n08 n01 n09 ...): every ring edge leaves its leaf and its spine.
SCRAMBLED = [NAMES[i // 2 + 8 * (i % 2)] for i in range(16)]
