"""Tests for slurmfm.plan.slurm_sim: Slurm's topology/tree selection, reproduced.

The worked examples follow ``_eval_nodes_topo`` in SchedMD/slurm:src/plugins/topology/tree/eval_nodes_tree.c (its
steps are named as in that function) and the 24.05.3 change of SchedMD commits 2ec1d02624 and
64263118c3. The
agreement test (``-m slurm``) is the one that matters: it loads generated uneven 3-level
trees into a real Slurm 22.05.8 lab, makes nodes busy with pinned exclusive ``sleep`` jobs,
asks ``sbatch --test-only`` where a job would go, and compares with ``select_tree(...,
rules="21.08")`` (22.05 is in the 21.08-24.05.2 rule set).

The lab is this test's own (not the shared host lab): ``$SLURMFM_SIM.dir`` (default
``/var/tmp/slurmfm-lab/sim-host``), 32 nodes, ports 16967/17701 (``scripts/README-lab.md``,
"Ports"). The fixture brings it up if needed and takes it down again if it did so; it
restores the lab's topology.conf either way.

The block agreement test does the same for ``select_block`` on our own 36-node chroot labs
(``simblock-sid``: Slurm 26.05, ``simblock-trixie``: 24.11; ports 16907/18201 and 16997/18101):
random base blocks (names unrelated to block order) and BlockSizes with several enforced
levels, busy nodes, jobs inside one base block, over several and over the whole fabric, with
and without ``--segment`` (``slurm-lab pick K SEGMENT``).
"""

from __future__ import annotations

import math
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from lab import OwnLab, SlurmLab, lab_root, own_lab_fixture, wait_until

from slurmfm.plan.slurm_sim import (
    BlockRules,
    natural_key,
    rank_order,
    select_block,
    select_tree,
)
from slurmfm.topology.model import Topology


# ------------------------------------------------------------------ helpers
def tree(spec: dict[str, dict[str, list[str]]]) -> tuple[Topology, list[str]]:
    """A 3-level tree ``{spine: {leaf: [nodes]}}`` under ``core``; returns it and a config order
    (leaves in dict order, then spines, then core, as a topology.conf would list them)."""
    paths = {
        n: ["core", sp, lf] for sp, leaves in spec.items() for lf, ns in leaves.items() for n in ns
    }
    topo = Topology.from_paths(paths)
    order = [lf for leaves in spec.values() for lf in leaves] + list(spec) + ["core"]
    return topo, order


def names(prefix: str, *nums: int) -> list[str]:
    return [f"{prefix}{i:02d}" for i in nums]


def leaves_of(topo: Topology, chosen: Sequence[str]) -> list[str]:
    return sorted({topo.leaf(n) for n in chosen})


# ------------------------------------------------------------------ worked examples
def test_single_leaf_tightest_fit() -> None:
    """``_eval_nodes_topo``'s best fit: when several leaves fit, the one with the fewest free
    nodes wins."""
    topo, order = tree(
        {
            "s1": {
                "l1": names("n", 1, 2, 3, 4),
                "l2": names("n", 5, 6, 7),
                "l3": names("n", 8, 9, 10, 11, 12),
            }
        }
    )
    for rules in ("21.08", "24.05.3"):
        got = select_tree(topo, set(topo.nodes), 3, rules=rules, switch_order=order)
        assert got == names("n", 5, 6, 7)


def test_largest_first_then_tight_fit_within_one_parent() -> None:
    """``_eval_nodes_topo`` within one parent: largest leaves first, then a tight fit."""
    topo, order = tree(
        {
            "s1": {
                "l1": names("n", 1, 2, 3, 4),
                "l2": names("n", 5, 6, 7, 8, 9, 10),
                "l3": names("n", 11, 12),
                "l4": names("n", 13, 14, 15),
            }
        }
    )
    got = select_tree(topo, set(topo.nodes), 9, rules="21.08", switch_order=order)
    assert got is not None
    assert leaves_of(topo, got) == ["l2", "l4"]


def test_nodes_inside_a_leaf_follow_name_order_not_config_order() -> None:
    """Nodes are taken in node-table (natural name) order
    (SchedMD/slurm:src/slurmctld/read_config.c, ``_sort_node_record_table_ptr``)."""
    topo, order = tree({"s1": {"l1": ["node10", "node9", "node100", "node2"]}})
    got = select_tree(topo, set(topo.nodes), 2, rules="21.08", switch_order=order)
    assert got == ["node2", "node9"]
    assert sorted(["node10", "node9", "node2"], key=natural_key) == ["node2", "node9", "node10"]


def test_top_switch_tie_goes_to_last_in_config_order_and_disjoint_trees_pend() -> None:
    """``_eval_nodes_topo``'s top switch: highest level with enough free nodes, ties to the
    last switch."""
    paths = {"x1": ["A", "a1"], "x2": ["A", "a1"], "y1": ["B", "b1"], "y2": ["B", "b1"]}
    topo = Topology.from_paths(paths)
    no_root = ["a1", "b1", "A", "B"]  # a topology.conf without a common top switch
    assert select_tree(topo, set(topo.nodes), 2, rules="21.08", switch_order=no_root) == [
        "y1",
        "y2",
    ]
    assert select_tree(topo, set(topo.nodes), 3, rules="21.08", switch_order=no_root) is None
    with_root = [*no_root, "root"]
    got = select_tree(topo, set(topo.nodes), 3, rules="21.08", switch_order=with_root)
    assert got is not None
    assert len(got) == 3


def test_not_enough_free_nodes_and_switches_limit() -> None:
    """Too few free nodes pend; more leaves than --switches=K wait
    (https://slurm.schedmd.com/sbatch.html#OPT_switches)."""
    topo, order = tree({"s1": {"l1": names("n", 1, 2), "l2": names("n", 3, 4)}})
    assert select_tree(topo, {"n01", "n02", "n03"}, 4, rules="21.08", switch_order=order) is None
    assert (
        select_tree(topo, set(topo.nodes), 3, rules="21.08", switches=1, switch_order=order) is None
    )
    assert select_tree(
        topo, set(topo.nodes), 2, rules="21.08", switches=1, switch_order=order
    ) == names("n", 1, 2)


def test_rule_sets_differ_on_stale_ancestor_counts() -> None:
    """The two rule sets (21.08-24.05.2 and 24.05.3+) on one fabric: spine A = a1, a2 (5 free each), spine B = b1, b2, b3
    (4 free each), job of 12 nodes.

    First pick, both rule sets: no leaf fits, so compare climbs to the spines; B (12) fits the
    whole job and A (10) does not, so b1 is chosen ("prefer leaves whose ancestor can hold the
    rest"). Now 8 nodes remain, b2/b3 are 2 hops away and a1/a2 4 hops.

    * 21.08-24.05.2: B keeps its stale count 12, A has 10; both "fit" 8 and the tighter
      ancestor A wins, so the closer b2 does not displace a1 (compare < 0). a1 (5) is taken,
      then b2 finishes the job: leaves a1, b1, b2.
    * 24.05.3+: B's count drops to 8 when b1 is used; both fit and now B is the tighter one,
      so b2 wins, then b3: leaves b1, b2, b3, all under one spine.
    """
    topo, order = tree(
        {
            "A": {"a1": names("a", 1, 2, 3, 4, 5), "a2": names("a", 6, 7, 8, 9, 10)},
            "B": {
                "b1": names("b", 1, 2, 3, 4),
                "b2": names("b", 5, 6, 7, 8),
                "b3": names("b", 9, 10, 11, 12),
            },
        }
    )
    old = select_tree(topo, set(topo.nodes), 12, rules="21.08", switch_order=order)
    new = select_tree(topo, set(topo.nodes), 12, rules="24.05.3", switch_order=order)
    assert old is not None
    assert new is not None
    assert leaves_of(topo, old) == ["a1", "b1", "b2"]
    assert old == names("a", 1, 2, 3, 4, 5) + names("b", 1, 2, 3, 4, 5, 6, 7)
    assert leaves_of(topo, new) == ["b1", "b2", "b3"]


def test_rank_order_name_and_leaf() -> None:
    """Name order before 26.05; leaf-config order then name order in 26.05
    (https://slurm.schedmd.com/topology.html)."""
    topo, _ = tree({"s1": {"l1": ["n9", "n1"], "l2": ["n5", "n3"]}})
    order = ["l2", "l1", "s1", "core"]
    alloc = ["n1", "n3", "n5", "n9"]
    assert rank_order(alloc, topo, policy="name") == ["n1", "n3", "n5", "n9"]
    assert rank_order(alloc, topo, policy="leaf", switch_order=order) == ["n3", "n5", "n1", "n9"]


# ------------------------------------------------------------------ real Slurm agreement
LAB_NODES = 32

SIM = OwnLab(
    "sim-host",
    ctld_port=16967,
    slurmd_port=17701,
    nodes=LAB_NODES,
    path=Path(os.environ.get("SLURMFM_SIM_LAB", str(lab_root() / "sim-host"))),
)


def _lab_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return SIM.command(*args, timeout=300)


@pytest.fixture(scope="session")
@own_lab_fixture(SIM)
def sim_lab() -> Iterator[SlurmLab]:
    """This test's own 32-node 22.05 lab, brought up idempotently; restored at the end."""
    was_up = SIM.healthy()
    lab = SIM.up()
    saved = SIM.dir / "topology.conf.before-sim-test"
    shutil.copy(SIM.dir / "etc" / "topology.conf", saved)
    try:
        yield lab
    finally:
        _cancel_all(lab)
        if was_up:
            _lab_cmd("topology", str(saved), "--plugin", "tree")
        else:
            _lab_cmd("down")
        saved.unlink(missing_ok=True)


def _cancel_all(lab: SlurmLab) -> None:
    lab.run(["scancel", "--full", "-u", "root"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        proc = lab.run(["squeue", "-h", "-o", "%i"])
        if proc.returncode == 0 and not proc.stdout.strip():
            proc = lab.run(["sinfo", "-h", "-N", "-o", "%t"])
            if set(proc.stdout.split()) <= {"idle"}:
                return
        time.sleep(0.3)
    raise TimeoutError("jobs did not end")


def random_fabric(
    rng: random.Random, hosts: Sequence[str], leaf_size: tuple[int, int] = (1, 7)
) -> tuple[Topology, list[str], str]:
    """An uneven 3-level tree over ``hosts`` (host names unrelated to the fabric), its switch
    config order (leaves shuffled), and the topology.conf text in that order."""
    perm = list(hosts)
    rng.shuffle(perm)
    sizes: list[int] = []
    left = len(perm)
    while left:
        s = min(left, rng.randint(*leaf_size))
        sizes.append(s)
        left -= s
    leaves: dict[str, list[str]] = {}
    k = 0
    for i, s in enumerate(sizes, 1):
        leaves[f"leaf{i}"] = perm[k : k + s]
        k += s
    leaf_names = list(leaves)
    rng.shuffle(leaf_names)
    spines: dict[str, list[str]] = {}
    j = 0
    while j < len(leaf_names):
        s = rng.randint(1, 4)
        spines[f"spine{len(spines) + 1}"] = leaf_names[j : j + s]
        j += s
    paths = {n: ["core", sp, lf] for sp, lfs in spines.items() for lf in lfs for n in leaves[lf]}
    topo = Topology.from_paths(paths)
    leaf_order = list(leaves)
    rng.shuffle(leaf_order)
    order = leaf_order + list(spines) + ["core"]
    lines = [f"SwitchName={lf} Nodes={','.join(leaves[lf])}" for lf in leaf_order]
    lines += [f"SwitchName={sp} Switches={','.join(lfs)}" for sp, lfs in spines.items()]
    lines.append(f"SwitchName=core Switches={','.join(spines)}")
    return topo, order, "\n".join(lines) + "\n"


def _test_only(k: int) -> list[str] | None:
    """Slurm's own nodes for a k-node exclusive job now (``slurm-lab pick``), or None."""
    proc = _lab_cmd("pick", str(k))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split() or None


def _make_busy(busy: Sequence[str]) -> None:
    """Occupy exactly ``busy`` with one sleeping job (``slurm-lab hold``)."""
    if busy:
        proc = _lab_cmd("hold", ",".join(busy))
        assert proc.returncode == 0, proc.stderr


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_agrees_with_real_slurm_2205(sim_lab: SlurmLab, seed: int) -> None:
    """select_tree(rules="21.08") == sbatch --test-only on Slurm 22.05.8, busy patterns included."""
    lab = sim_lab
    assert lab.version.startswith("22.05"), lab.version
    rng = random.Random(1000 + seed)
    hosts = [f"node{i:03d}" for i in range(1, lab.nodes + 1)]
    topo, order, text = random_fabric(rng, hosts)
    conf = lab.jobs_dir / f"sim-topo-{seed}.conf"
    conf.write_text(text)
    _cancel_all(lab)
    proc = _lab_cmd("topology", str(conf), "--plugin", "tree")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    mismatches: list[str] = []
    checked = 0
    for _pattern in range(3):
        busy = sorted(rng.sample(hosts, int(len(hosts) * rng.uniform(0.3, 0.7))), key=natural_key)
        _make_busy(busy)
        free = set(hosts) - set(busy)
        for k in sorted({1, 2, rng.randint(2, len(free)), rng.randint(2, len(free)), len(free)}):
            real = _test_only(k)
            sim = select_tree(topo, free, k, rules="21.08", switch_order=order)
            checked += 1
            if real != sim:
                mismatches.append(f"k={k} busy={busy}: slurm={real} sim={sim}")
        _cancel_all(lab)
    assert checked >= 10
    assert not mismatches, f"seed {seed}, topology:\n{text}\n" + "\n".join(mismatches)


# ------------------------------------------------------------------ >= 64-node jobs, 72 nodes
# The agreement above checks jobs up to the 32-node lab's size; the referee bench and
# the planner's guard rely on select_tree for >= 64-node jobs too. This lab is the largest
# slurm-lab makes (72 nodes), on ports of no other lab.
SIM72 = OwnLab("sim72-host", ctld_port=16847, slurmd_port=18601, nodes=72)


@pytest.fixture(scope="session")
@own_lab_fixture(SIM72)
def sim72_lab() -> Iterator[SlurmLab]:
    """The 72-node 22.05 lab, brought up idempotently; its topology restored at the end."""
    was_up = SIM72.healthy()
    lab = SIM72.up()
    saved = SIM72.dir / "topology.conf.before-sim72-test"
    shutil.copy(SIM72.dir / "etc" / "topology.conf", saved)
    try:
        yield lab
    finally:
        _cancel_all(lab)
        if was_up:
            SIM72.command("topology", str(saved), "--plugin", "tree", timeout=300)
        else:
            SIM72.command("down", timeout=300)
        saved.unlink(missing_ok=True)


@pytest.mark.slurm
@pytest.mark.parametrize("seed", range(3))
def test_large_jobs_agree_with_real_slurm_2205(sim72_lab: SlurmLab, seed: int) -> None:
    """select_tree(rules="21.08") == sbatch --test-only for 64- to 72-node jobs on 72 nodes.

    Uneven leaves of 2-12 nodes under 1-4 per spine, up to 8 nodes busy (pinned sleep jobs),
    so that a >= 64-node job spans most leaves and every tie-break of the leaf loop is hit.
    """
    lab = sim72_lab
    assert lab.version.startswith("22.05"), lab.version
    rng = random.Random(7200 + seed)
    hosts = [f"node{i:03d}" for i in range(1, lab.nodes + 1)]
    topo, order, text = random_fabric(rng, hosts, leaf_size=(2, 12))
    conf = lab.jobs_dir / f"sim72-topo-{seed}.conf"
    conf.write_text(text)
    _cancel_all(lab)
    proc = SIM72.command("topology", str(conf), "--plugin", "tree", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    mismatches: list[str] = []
    checked = 0
    for n_busy in (0, rng.randint(1, 4), rng.randint(5, 7), 8):
        busy = sorted(rng.sample(hosts, n_busy), key=natural_key)
        if busy:
            proc = SIM72.command("hold", ",".join(busy), timeout=300)
            assert proc.returncode == 0, proc.stderr
        free = set(hosts) - set(busy)
        for k in sorted({64, rng.randint(64, len(free)), len(free)}):
            got = SIM72.command("pick", str(k), timeout=300)
            assert got.returncode == 0, got.stderr
            real = got.stdout.split() or None
            sim = select_tree(topo, free, k, rules="21.08", switch_order=order)
            checked += 1
            if real != sim:
                mismatches.append(f"k={k} busy={busy}: slurm={real} sim={sim}")
        _cancel_all(lab)
    assert checked >= 7
    assert not mismatches, f"seed {seed}, topology:\n{text}\n" + "\n".join(mismatches)


# ------------------------------------------------------------------ real Slurm agreement, block
# Our own chroot labs (Slurm 26.05 on sid, 24.11 on trixie: topology/block needs a newer Slurm
# than the host's 22.05), on ports of no other lab; 36 nodes, started with 9 base blocks of 4.
BLOCK_LABS = {
    suite: OwnLab(
        f"simblock-{suite}",
        ctld_port=ctld,
        slurmd_port=slurmd,
        nodes=36,
        suite=suite,
        options=("--gpus-per-node", "2", "--topology-plugin", "block", "--block-size", "4"),
    )
    for suite, ctld, slurmd in (("sid", 16907, 18201), ("trixie", 16997, 18101))
}


@pytest.fixture(scope="session")
@own_lab_fixture(*BLOCK_LABS.values())
def sim_block_lab() -> Iterator[Callable[[str], SlurmLab]]:
    """This test's own block labs, one per suite, brought up on first use; each is taken down
    at the end if the test brought it up, else its topology.conf is restored."""
    cache: dict[str, SlurmLab] = {}
    saved: dict[str, tuple[bool, Path]] = {}

    def get(suite: str) -> SlurmLab:
        if suite not in cache:
            own = BLOCK_LABS[suite]
            was_up = own.healthy()
            lab = own.up()
            keep = own.dir / "topology.conf.before-sim-test"
            shutil.copy(own.dir / "etc" / "topology.conf", keep)
            saved[suite] = (was_up, keep)
            cache[suite] = lab
        return cache[suite]

    try:
        yield get
    finally:
        for suite, lab in cache.items():
            own = BLOCK_LABS[suite]
            was_up, keep = saved[suite]
            _cancel_all(lab)
            if was_up:
                own.command("topology", str(keep), "--plugin", "block", timeout=300)
            else:
                own.command("down", timeout=300)
            keep.unlink(missing_ok=True)


def random_blocks(
    rng: random.Random, hosts: Sequence[str], *, short: bool
) -> tuple[list[list[str]], list[int], str]:
    """Random base blocks over ``hosts`` (names unrelated to block order), in BlockName line
    order, with ``short`` some of them short of the base size (26.05 takes them; 24.11's
    slurmctld exits: "Block configuration (...) children count lower than bblock_node_cnt");
    BlockSizes with the base and 2-3 enforced aggregate levels (one of them, sometimes, larger
    than the fabric); the topology.conf."""
    perm = list(hosts)
    rng.shuffle(perm)
    base = rng.choice([2, 3, 4])
    blocks: list[list[str]] = []
    k = 0
    while k < len(perm):
        size = base if not short or rng.random() < 0.8 else rng.randint(1, base - 1)
        blocks.append(perm[k : k + size])
        k += size
    top = max(1, math.ceil(math.log2(len(blocks))) + 1)
    levels = sorted(rng.sample(range(1, top + 1), min(top, rng.randint(2, 3))))
    sizes = [base] + [base << lv for lv in levels]
    names = [f"bb{i}" for i in rng.sample(range(1, 100), len(blocks))]
    lines = [f"BlockName={nm} Nodes={','.join(b)}" for nm, b in zip(names, blocks, strict=True)]
    lines.append(f"BlockSizes={','.join(map(str, sizes))}")
    return blocks, sizes, "\n".join(lines) + "\n"


def _hold_per_block(lab: SlurmLab, blocks: Sequence[Sequence[str]], busy: set[str]) -> None:
    """Occupy exactly ``busy`` with one exclusive sleeping job per base block.

    Why not ``slurm-lab hold`` (one job on all of them): under topology/block a job's
    required nodes must share one block of its size level (``eval_nodes_block``: "requires
    nodes that do not have shared block"), so a job on a scattered set is refused; a job on
    the busy nodes of one base block always fits.
    """

    def hold(ns: Sequence[str]) -> str:
        proc = lab.run(
            [
                *("sbatch", "--parsable", "--exclusive", "-p", "batch", "-t", "30"),
                *("-N", str(len(ns)), "-w", ",".join(ns), "-o", "/dev/null"),
                *("-J", "sim-busy", "--wrap", "sleep 1800"),
            ],
            cwd=lab.jobs_dir,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    held: dict[str, list[str]] = {}  # job id -> its nodes
    for b in blocks:
        ns = [n for n in b if n in busy]
        if ns:
            held[hold(ns)] = ns
    if not held:
        return
    ids = list(held)
    again = 3

    def running() -> bool:
        # A hold that ended at once is sent again (at most 3 times): seen once on 24.11.5 just
        # after the topology restart, the node's slurmd purged the new job's script as a
        # stray ("_handle_stray_script: Purging vestigial job script", then "execve(): ... No
        # such file or directory") while it re-registered, and the job ended FAILED in 0.1 s.
        nonlocal again
        proc = lab.run(["squeue", "-h", "-j", ",".join(ids), "-t", "all", "-o", "%i %T"])
        states = dict(ln.split() for ln in proc.stdout.splitlines() if len(ln.split()) == 2)
        for k, i in enumerate(ids):
            if states.get(i) in ("FAILED", "COMPLETED", "CANCELLED", "NODE_FAIL") and again:
                again -= 1
                ids[k] = hold(held[i])
                held[ids[k]] = held[i]
                states[ids[k]] = "PENDING"
        return [states.get(i) for i in ids] == ["RUNNING"] * len(ids)

    # 120 s, not 30: the jobs start at slurmctld's next scheduling pass (about a second on an
    # idle machine), but on CI's two cores shared with the other labs one first pattern after
    # the topology restart was still waiting at 30 s (stop 35); the failure shows why.
    wait_until(f"busy jobs {ids} running", running, 120, lambda: _why_not_running(lab, ids))


def _why_not_running(lab: SlurmLab, ids: Sequence[str]) -> str:
    """What Slurm says of jobs that did not start: their state and reason, the nodes that are
    not idle, and slurmctld's log lines that name them."""
    jobs = lab.run(["squeue", "-h", "-j", ",".join(ids), "-t", "all", "-o", "%i %T %r %N"])
    nodes = lab.run(["sinfo", "-h", "-N", "-o", "%N %t %E"])
    busy = [ln for ln in nodes.stdout.splitlines() if ln.split()[1:2] != ["idle"]]
    log = lab.lab_dir / "log" / "slurmctld.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    named = [ln for ln in lines if any(f"JobId={i}" in ln or f"job {i}" in ln for i in ids)]
    return "\n".join(
        [
            f"squeue (rc {jobs.returncode}): {jobs.stdout.strip()} {jobs.stderr.strip()}",
            "nodes not idle: " + ("; ".join(busy) or "none"),
            "slurmctld.log on these jobs:",
            *named[-40:],
        ]
    )


def _divisors(k: int) -> list[int]:
    return [d for d in range(1, k) if k % d == 0]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("suite", ["sid", "trixie"])
@pytest.mark.parametrize("seed", range(4))
def test_block_agrees_with_real_slurm(
    sim_block_lab: Callable[[str], SlurmLab], suite: str, seed: int
) -> None:
    """select_block == sbatch --test-only [--segment] on Slurm 24.11 and 26.05, busy nodes
    included: random base blocks and BlockSizes, jobs inside one base block, over several, and
    over the whole fabric, with and without segments."""
    lab = sim_block_lab(suite)
    own = BLOCK_LABS[suite]
    rules: BlockRules = "26.05" if suite == "sid" else "24.11"
    assert lab.version.startswith(rules), lab.version
    rng = random.Random(2000 + seed)
    hosts = [f"node{i:03d}" for i in range(1, lab.nodes + 1)]
    blocks, sizes, text = random_blocks(rng, hosts, short=suite == "sid")
    conf = lab.jobs_dir / f"sim-block-{seed}.conf"
    conf.write_text(text)
    _cancel_all(lab)
    proc = own.command("topology", str(conf), "--plugin", "block", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    mismatches: list[str] = []
    checked = 0
    for _pattern in range(3):
        busy = set(rng.sample(hosts, int(len(hosts) * rng.uniform(0.1, 0.6))))
        _hold_per_block(lab, blocks, busy)
        free = set(hosts) - busy
        base = sizes[0]
        spans = rng.randint(base + 1, 3 * base)  # more than one base block
        half = rng.randint(2, max(2, len(free) // 2))
        for k in sorted({1, 2, rng.randint(2, base), spans, half, len(free)}):
            segs = _divisors(k)
            for seg in [None, *([rng.choice(segs[1:])] if len(segs) > 1 else [])]:
                got = own.command("pick", str(k), *([str(seg)] if seg else []), timeout=300)
                assert got.returncode == 0, got.stderr
                real = got.stdout.split() or None
                sim = select_block(blocks, free, k, block_sizes=sizes, rules=rules, segment=seg)
                checked += 1
                if real != sim:
                    mismatches.append(f"k={k} segment={seg} busy={sorted(busy)}: {real=} {sim=}")
        _cancel_all(lab)
    assert checked >= 12
    assert not mismatches, f"{suite} seed {seed}, topology:\n{text}\n" + "\n".join(mismatches)
