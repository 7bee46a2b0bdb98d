"""Fast paths of the topology model (the 64k-node plan's speed work) agree with the plain
definitions."""

from __future__ import annotations


def test_plain_nodes_equal_constructed_ones() -> None:
    """``Node.plain`` (the 64k-node parse path) reads, compares and hashes like ``Node(n)``."""
    import dataclasses
    import pickle

    from slurmfm.topology.model import Node

    fast = Node.plain(["a1", "b2"])
    assert fast == [Node("a1"), Node("b2")]
    assert hash(fast[0]) == hash(Node("a1"))
    assert fast[0].free
    assert fast[0].state == "idle"
    assert fast[0].nvlink_domain is None
    assert dataclasses.replace(fast[0], state="down") == Node("a1", state="down")
    assert pickle.loads(pickle.dumps(fast[1]))  # noqa: S301 - our own bytes == Node("b2")


def test_natural_key_fast_path_matches_the_whole_name_regex() -> None:
    """The per-stem cache gives the same key as encoding every digit run of the name."""
    import random

    from slurmfm.job.hosts import _DIGIT_RUN, _encode_run, natural_key

    rng = random.Random(6)
    for _ in range(20000):
        name = "".join(rng.choice("ab09-._1\u0663") for _ in range(rng.randint(0, 9)))
        assert natural_key(name) == _DIGIT_RUN.sub(_encode_run, name)


def test_natural_sorted_same_as_sorting_by_the_key() -> None:
    """The one-width fast path and the general path both give ``natural_key`` order."""
    import random

    from slurmfm.topology.model import natural_key, natural_sorted

    rng = random.Random(7)
    for _ in range(2000):
        stem = rng.choice(["p5-", "n", "", "a0b", "x-9-", "a\u0663"])
        width = rng.randint(1, 4)
        names = {stem + "".join(rng.choice("0123456789") for _ in range(width)) for _ in range(9)}
        if rng.random() < 0.3:  # mixed widths or stems: the general path
            names.add(rng.choice(["n1", "n01", "p5-7", "b", "0"]))
        assert natural_sorted(names) == sorted(names, key=natural_key)
