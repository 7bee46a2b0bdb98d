"""The ranks' order by node and leaf, and the launch checks (slurmfm/job/rankorder.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from slurmfm.job import rankorder as ro

# As the lab's 22.05.8 prints it (docs: /work/shared/reference, slurm-on-one-host section):
# leaves are Level=0 without Switches=; the spine and core lines list every node below.
TREE = """\
SwitchName=core Level=2 LinkSpeed=1 Nodes=node[001-008] Switches=spine[1-2]
SwitchName=spine1 Level=1 LinkSpeed=1 Nodes=node[001-004] Switches=leaf[1-2]
SwitchName=spine2 Level=1 LinkSpeed=1 Nodes=node[005-008] Switches=leaf[3-4]
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=node[001-002]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=node[003-004]
SwitchName=leaf3 Level=0 LinkSpeed=1 Nodes=node[005-006]
SwitchName=leaf4 Level=0 LinkSpeed=1 Nodes=node[007-008]
"""
BLOCK = """\
BlockName=b1 BlockIndex=0 Nodes=gb[01-18] BlockSize=18
BlockName=b2 BlockIndex=1 Nodes=gb[19-36] BlockSize=18
AggregatedBlock=b[1-2] BlockIndex=0 Nodes=gb[01-36] BlockSize=36
"""


def test_leaves_from_scontrol_tree_and_block() -> None:
    leaf = ro.leaves_from_scontrol(TREE)
    assert leaf == {
        **{f"node00{i}": f"leaf{(i + 1) // 2}" for i in range(1, 9)},
    }
    block = ro.leaves_from_scontrol(BLOCK)
    assert (block["gb01"], block["gb18"], block["gb19"]) == ("b1", "b1", "b2")
    assert len(block) == 36
    assert ro.leaves_from_scontrol("") == {}
    assert ro.leaves_from_scontrol("No topology information available\n") == {}


def test_summary_says_topology_order_only_when_each_leaf_is_one_run() -> None:
    leaf = ro.leaves_from_scontrol(TREE)
    good = ["node003", "node004", "node001", "node002", "node007"]
    assert ro.summary(good, leaf, "scontrol show topology") == (
        "by leaf: leaf2[0-1] leaf1[2-3] leaf4[4]; topology order: yes (3 leaves, from "
        "scontrol show topology)"
    )
    # Name order of nodes whose names do not follow the fabric (EC2): leaves split.
    bad = ["node001", "node005", "node002", "node006"]
    line = ro.summary(bad, leaf, "SLURM_TOPOLOGY_ADDR")
    assert line.startswith("by leaf: leaf1[0] leaf3[1] leaf1[2] leaf3[3]; topology order: NO")
    assert "2 of 2 leaves split, leaf1 into 2 runs" in line
    unknown = ro.summary(["node001", "x9"], leaf, "scontrol show topology")
    assert unknown.endswith("topology order: unknown (no leaf known for some nodes: "
                            "scontrol show topology)")  # fmt: skip
    assert (
        ro.summary(["a"], {}, "s")
        == "by leaf: ?[0]; topology order: unknown (no leaf known for some nodes: s)"
    )


@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=30))
def test_summary_yes_exactly_when_no_leaf_recurs(leaves: list[str]) -> None:
    order = [f"h{i}" for i in range(len(leaves))]
    leaf_of = dict(zip(order, leaves, strict=True))
    runs = ro.runs(order, leaf_of)
    assert sum(b - a + 1 for _, a, b in runs) == len(order)
    contiguous = len({lf for lf, _, _ in runs}) == len(runs)
    assert ("topology order: yes" in ro.summary(order, leaf_of, "s")) == contiguous


def test_leaves_from_addrs_drop_the_node() -> None:
    assert ro.leaves_from_addrs({"n1": "core.s1.l1.n1", "n2": "n2"}) == {"n1": "core.s1.l1"}


def test_c10d_is_found_in_every_spelling() -> None:
    assert ro.c10d(["torchrun", "--rdzv-backend=c10d", "x.py"]) == "--rdzv-backend=c10d"
    assert ro.c10d(["torchrun", "--rdzv_backend", "c10d"]) == "--rdzv_backend c10d"
    assert ro.c10d(["bash", "-c", "torchrun --rdzv_backend='c10d' t.py"]) == "--rdzv_backend='c10d'"
    assert ro.c10d(["torchrun", "--rdzv-backend=static", "--nnodes=2"]) is None
    assert ro.c10d(["torchrun", "--rdzv-backend"]) is None
    assert ro.c10d(["python", "train.py", "--backend=c10d"]) is None


def test_launch_differs_for_one_task_per_gpu() -> None:
    order = ["b", "a"]
    env = {"SLURMFM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "a"}
    assert ro.launch_differs(env, order, 1) is None  # node rank 1, 2 tasks per node: 2 + 1
    env["SLURM_PROCID"] = "1"  # what name order (a before b) would give
    line = ro.launch_differs(env, order, 1)
    assert line == (
        "slurmfm: rank order differs on a: Slurm gave task 1 (SLURM_PROCID), the job's order "
        "puts it at 3 (node rank 1)"
    )
    assert ro.launch_differs({"SLURM_PROCID": "1"}, order, 1) is None  # torchrun: not checked


def test_workers_group_rank_is_checked_once_they_start() -> None:
    # entry 10 -> launcher 11 -> workers 12, 13; the workers appear on the second look
    looks = {"n": 0}

    def kids(pid: int) -> list[int]:
        if pid == 10:
            return [11]
        if pid == 11:
            looks["n"] += 1
            return [12, 13] if looks["n"] > 1 else []
        return []

    said: list[str] = []
    envs = {12: {"GROUP_RANK": "0", "RANK": "0"}, 13: {"GROUP_RANK": "0", "RANK": "1"}}
    got = ro.check_workers("n3", 2, kids, lambda p: envs.get(p, {}), 10, say=said.append,
                           sleep=lambda s: None)  # fmt: skip
    assert got == "differs"
    assert said == [
        "slurmfm: rank order differs on n3: the launch made it node 0 (GROUP_RANK), the job's "
        "order node 2"
    ]
    looks["n"] = 0
    said.clear()
    assert ro.check_workers("n1", 0, kids, lambda p: envs.get(p, {}), 10, say=said.append,
                            sleep=lambda s: None) == "agrees"  # fmt: skip
    assert not said
    assert ro.check_workers("n1", 0, lambda p: [], dict, 10, tries=3, sleep=lambda s: None) == (
        "none"
    )


def _prepare(monkeypatch: Any, tmp: Path, *opts: str) -> None:
    """prepare on a 3-node allocation n1 n2 n3 whose Slurm topology puts n1 n3 on leaf l1."""
    from slurmfm.job import cli, health, slurm

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        if argv[0] == "srun":  # whoami on every node (--topo-addr)
            return 0, "n1 s.l1.n1\nn2 s.l2.n2\nn3 s.l1.n3\n"
        if list(argv[:3]) == ["scontrol", "show", "topology"]:
            return 0, (
                "SwitchName=s Level=1 LinkSpeed=1 Nodes=n[1-3] Switches=l[1-2]\n"
                "SwitchName=l1 Level=0 LinkSpeed=1 Nodes=n[1,3]\n"
                "SwitchName=l2 Level=0 LinkSpeed=1 Nodes=n2\n"
            )
        return 0, "".join(f"NodeName=n{i} NodeAddr=10.0.0.{i}\n" for i in (1, 2, 3))

    monkeypatch.setattr(health, "run_command", run)
    monkeypatch.setattr(slurm, "hostnames", lambda text: ["n1", "n2", "n3"])
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_ID": "7", "SLURMFM_LOG_DIR": str(tmp)}
    assert cli.prepare(cli.parser().parse_args(["prepare", *opts]), env, []) == 0


def test_prepare_logs_and_records_the_order_by_leaf(
    monkeypatch: Any, tmp_path: Path, capsys: Any
) -> None:
    """One host-order line with the order by leaf (not a second line), and a state record
    that ``slurmfm report`` shows; the leaves from scontrol, or from the nodes' addresses."""
    from slurmfm.job.state import events

    _prepare(monkeypatch, tmp_path, "--planned", "n1 n2 n3")  # a name-order plan: l1 split
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "host order" in x]
    assert len(lines) == 1
    assert lines[0].startswith("slurmfm: job 7 host order: n1 n2 n3; rendezvous 10.0.0.1:")
    assert lines[0].endswith(
        "; by leaf: l1[0] l2[1] l1[2]; topology order: NO (1 of 2 leaves split, l1 into 2 "
        "runs; from scontrol show topology)"
    )
    _prepare(monkeypatch, tmp_path, "--topo-addr", "1")  # sorted by SLURM_TOPOLOGY_ADDR
    err = capsys.readouterr().err
    assert "host order: n1 n3 n2;" in err
    assert (
        "by leaf: s.l1[0-1] s.l2[2]; topology order: yes (2 leaves, from SLURM_TOPOLOGY_ADDR)"
        in err
    )
    (state,) = tmp_path.glob("*.state")
    recorded = [e.detail for e in events(state.read_text()) if e.event == "order"]
    assert recorded[-1].startswith("by leaf: s.l1[0-1] s.l2[2]; topology order: yes")
    assert recorded[0].startswith("by leaf: l1[0] l2[1] l1[2]; topology order: NO")


def test_workers_group_rank_is_read_from_real_processes() -> None:
    """The entry's real process tree, read through /proc as the node entry does: this process
    (the entry) starts a launcher (sh) whose child (the worker) has GROUP_RANK=1 in its
    environment, as torchrun gives its workers."""
    import os
    import subprocess
    import sys

    from slurmfm.job.node import children, environ

    env = {**os.environ, "GROUP_RANK": "1"}
    launcher = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(30)' & wait"],
        env=env,
    )
    try:
        said: list[str] = []
        got = ro.check_workers(
            "n0", 0, children, environ, os.getpid(), tries=100, pause_s=0.1, say=said.append
        )
        assert got == "differs"
        assert said == [
            "slurmfm: rank order differs on n0: the launch made it node 1 (GROUP_RANK), the "
            "job's order node 0"
        ]
        assert ro.check_workers("n1", 1, children, environ, os.getpid(), tries=10) == "agrees"
    finally:
        for kid in children(launcher.pid):
            os.kill(kid, 9)
        launcher.wait(10)
