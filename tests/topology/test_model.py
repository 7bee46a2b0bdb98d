"""Fast paths of the topology model (issue 14 item 6) agree with the plain definitions."""

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

    from slurmfm.topology.model import _DIGIT_RUN, _encode_run, natural_key

    rng = random.Random(6)
    for _ in range(20000):
        name = "".join(rng.choice("ab09-._1") for _ in range(rng.randint(0, 9)))
        assert natural_key(name) == _DIGIT_RUN.sub(_encode_run, name)
