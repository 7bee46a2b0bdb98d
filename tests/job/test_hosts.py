"""Host order, rank insertion, node addresses and the port choice."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmfm.job import hosts as hs


def test_planned_order_is_kept_and_must_match_the_allocation() -> None:
    assert hs.host_order(["a", "b", "c"], planned=["c", "a", "b"]) == ["c", "a", "b"]
    with pytest.raises(hs.OrderError, match="planned order has 2 hosts, allocation has 3"):
        hs.host_order(["a", "b", "c"], planned=["a", "b"])


def test_rank_map_sorts_and_unknown_hosts_go_last() -> None:
    order = hs.host_order(["n1", "n2", "n3"], rank_map={"n3": "0001", "n1": "0002"})
    assert order == ["n3", "n1", "n2"]


def test_topology_address_natural_order() -> None:
    addr = {"n10": "s0.s2.n10", "n2": "s0.s10.n2", "n1": "s0.s2.n1"}
    assert hs.host_order(["n2", "n10", "n1"], topo_addr=addr) == ["n1", "n10", "n2"]
    # a node that did not answer: keep the allocation's order
    assert hs.host_order(["n2", "n1"], topo_addr={"n1": "x"}) == ["n2", "n1"]


def test_rank_and_insertion() -> None:
    assert hs.node_rank(["a", "b"], "b") == 1
    assert hs.node_rank(["a", "b"], "z") == -1
    assert hs.insert_rank(["py", "-m", "t", "--x"], 3, 1) == [
        "py",
        "-m",
        "t",
        "--node-rank=1",
        "--x",
    ]
    assert hs.insert_rank(["a"], 0, 5) == ["a"]


def test_node_addresses_from_scontrol() -> None:
    text = (
        "NodeName=node001 Arch=x86_64 NodeAddr=10.0.0.1 NodeHostName=h1\n"
        "NodeName=node002 Arch=x86_64 CoresPerSocket=1\n"
    )
    assert hs.parse_node_addrs(text) == {"node001": "10.0.0.1", "node002": "node002"}


def test_port_outside_ephemeral_range_and_free() -> None:
    taken = {20035}
    port = hs.choose_port(5, 0, 20000, 6000, (32768, 60999), is_free=lambda p: p not in taken)
    assert port == 20036  # 20035 is taken: the next one
    # the whole default range of the old rule (20000 + id % 20000) is checked against the
    # node's own range: a node whose range starts at 20000 pushes the port below it
    port = hs.choose_port(5, 0, 15000, 6000, (20000, 60999), is_free=lambda p: True)
    assert 15000 <= port < 20000
    # a requeue picks another port (the last one may sit in TIME_WAIT)
    assert hs.choose_port(5, 1, 20000, 6000, (32768, 60999)) != hs.choose_port(
        5, 0, 20000, 6000, (32768, 60999), is_free=lambda p: True
    )
    with pytest.raises(hs.OrderError):
        hs.choose_port(5, 0, 40000, 100, (32768, 60999))


def test_ephemeral_range_reads_proc(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "range"
    f.write_text("20000\t40000\n")
    assert hs.ephemeral_range(str(f)) == (20000, 40000)
    assert hs.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)


def test_a_replayed_step_keeps_the_survivors_ranks_and_moves_the_master() -> None:
    """HyperPod's auto-resume replays the launch on the replacement of a faulty node: the
    order, the master and the ranks fixed at batch start are recomputed inside the step."""
    from slurmfm.job.hosts import replayed_order, with_master
    from slurmfm.job.node import replayed

    assert replayed_order(["n3", "n1", "n2"], ["n1", "n2", "n9"]) == ["n9", "n1", "n2"]
    assert replayed_order(["n3", "n1"], ["n1", "n3"]) == ["n3", "n1"]
    argv = ["torchrun", "--master-addr=n3", "--rdzv_endpoint=n3:29500", "train.py"]
    assert with_master(argv, "n3", "n9") == [
        "torchrun",
        "--master-addr=n9",
        "--rdzv_endpoint=n9:29500",
        "train.py",
    ]
    env = {
        "SLURMFM_LAUNCH_NODELIST": "n[1-3]",
        "SLURM_STEP_NODELIST": "n[1-2],n9",
        "SLURMFM_RDZV_HOST": "n3",
    }
    calls: list[list[str]] = []

    def run(a: object, t: float) -> tuple[int, str]:
        calls.append(list(a))  # type: ignore[call-overload]
        return 0, "n1\nn2\nn9\n"

    words, order = replayed(argv, ["n3", "n1", "n2"], env, run)
    assert calls == [["scontrol", "show", "hostnames", "n[1-2],n9"]]
    assert order == ["n9", "n1", "n2"]
    assert words[1] == "--master-addr=n9"
    assert env["SLURMFM_HOST_ORDER"] == "n9 n1 n2"
    # not a replay: nothing asked, nothing changed
    same = {"SLURMFM_LAUNCH_NODELIST": "n[1-3]", "SLURM_STEP_NODELIST": "n[1-3]"}
    assert replayed(argv, ["n3", "n1", "n2"], same, run) == (argv, ["n3", "n1", "n2"])
    assert len(calls) == 1


def test_one_host_sort_key_for_the_runtime_and_the_planner() -> None:
    """The job's host order and the planner sort names by the same key, Slurm's strnatcmp
    (they sorted ``node1 node-1 node01`` differently before)."""
    from slurmfm.job import hosts
    from slurmfm.topology import model

    assert hosts.natural_key is model.natural_key
    names = ["node1", "node-1", "node01", "node10", "node2"]
    assert sorted(names, key=hosts.natural_key) == ["node-1", "node01", "node1", "node2", "node10"]
    addr = {n: f"spine.leaf{i % 2}.{n}" for i, n in enumerate(names)}
    assert hosts.host_order(names, topo_addr=addr) == sorted(
        names, key=lambda h: (hosts.natural_key(addr[h]), hosts.natural_key(h))
    )


def test_a_replay_in_a_container_reads_the_host_list_itself() -> None:
    """Issue 37: a node entry in a container has no scontrol; the replayed step's host list
    is expanded by the runtime (Slurm's hostlist syntax) and the order recomputed all the
    same."""
    from slurmfm.job.node import replayed

    env = {
        "SLURMFM_LAUNCH_NODELIST": "n[1-3]",
        "SLURM_STEP_NODELIST": "n[1-2],n9",
        "SLURMFM_RDZV_HOST": "n3",
    }
    argv = ["torchrun", "--master-addr=n3", "train.py"]
    words, order = replayed(argv, ["n3", "n1", "n2"], env, lambda a, t: (127, "not found"))
    assert order == ["n9", "n1", "n2"]
    assert words[1] == "--master-addr=n9"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu-[008-010,3],login", ["gpu-008", "gpu-009", "gpu-010", "gpu-3", "login"]),
        ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
        ("ip-10-0-[1-2]-5", ["ip-10-0-1-5", "ip-10-0-2-5"]),
        ("bad[x]", ["bad[x]"]),
        ("", []),
    ],
)
def test_host_lists_expand_as_slurm_writes_them(text: str, want: list[str]) -> None:
    assert hs.expand_hostlist(text) == want


@given(
    st.text("abcn-", min_size=1, max_size=4),
    st.integers(0, 500),
    st.integers(0, 20),
    st.integers(1, 4),
)
def test_a_range_expands_to_each_number_zero_padded(
    prefix: str, lo: int, span: int, width: int
) -> None:
    hi = lo + span
    text = f"{prefix}[{str(lo).zfill(width)}-{str(hi).zfill(width)}]"
    assert hs.expand_hostlist(text) == [prefix + str(i).zfill(width) for i in range(lo, hi + 1)]
