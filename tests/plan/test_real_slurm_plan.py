"""Plans on real Slurm: jobs land where the plan says and order their ranks by the fabric.

Host lab (22.05, tree, 4 leaves x 4 nodes, names not in topology order): the quickstart recipe
is submitted through the API with a plan in pin and constrain mode while a few nodes are kept
busy; from inside the job each rank reports its node, node rank and host order. Torch is not the
subject here: the launch goes through slurmfm's real batch step and per-node entry, and a
torchrun stand-in (tests/standins/torchrun.py, torchrun's documented rank arithmetic) starts a
script that reports the rank record at once; 20 real torch ranks cost minutes of CPU. Newer labs
(our own 26.05 sid / 24.11 trixie chroot labs with 2 blocks of 18 nodes x 4 GPUs) check the
block/segment path. They never touch the shared labs' topology.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import REPO_ROOT, OwnLab, SlurmLab, last_attempt_ranks, own_lab_fixture

from slurmfm import api
from slurmfm.backends.slurm_cli import SlurmCLI, parse_scontrol_record
from slurmfm.catalog.slurm_features import SlurmVersion
from slurmfm.plan.cost import JobShape
from slurmfm.plan.planner import Plan, plan, plan_for_recipe
from slurmfm.plan.types import Placement
from slurmfm.topology.model import Node, Topology

STANDINS = Path(__file__).resolve().parent.parent / "standins"
# 36 nodes of 4 GPUs in 2 blocks of 18 (two GB200 NVL72 racks), on ports of no other lab
_BLOCKS = ("--gpus-per-node", "4", "--topology-plugin", "block", "--block-size", "18")
OWN_LABS = {
    suite: OwnLab(f"plan-{suite}", ctld, slurmd, nodes=36, suite=suite, options=_BLOCKS)
    for suite, ctld, slurmd in (("sid", 16947, 17501), ("trixie", 16957, 17601))
}


def topology_from_lab(lab: SlurmLab) -> Topology:
    """The lab's true topology (topology.json) as a model."""
    t = lab.topology
    if t["plugin"] == "block":
        leaf_of = {n: b for b, spec in t["blocks"].items() for n in spec["nodes"]}
        return Topology.from_parents([Node(n) for n in leaf_of], leaf_of, {}, kind="block")
    leaf_of = {
        n: sw for sw, spec in t["switches"].items() if spec["level"] == 0 for n in spec["nodes"]
    }
    parents = {sw: spec["parent"] for sw, spec in t["switches"].items()}
    return Topology.from_parents([Node(n) for n in leaf_of], leaf_of, parents)


def hold(lab: SlurmLab, nodes: list[str]) -> list[str]:
    """Keep ``nodes`` busy with exclusive sleep jobs; wait until they run.

    A hold that ended at once is sent again (at most 3 times), as in
    tests/plan/test_slurm_sim.py: on 26.05 in CI a node's slurmd, just started with the lab,
    purged the new job's script as a stray ("_handle_stray_script: Purging vestigial job
    script", then "execve(): ... No such file or directory") and the job ended in 0.2 s.
    """

    def submit(n: str) -> str:
        proc = lab.run(
            [
                "sbatch",
                "--parsable",
                "--exclusive",
                "-w",
                n,
                "-J",
                "plan-busy",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 120",
            ]
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip().split(";")[0]

    ids = [submit(n) for n in nodes]
    again = 3
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        proc = lab.run(["squeue", "-h", "-j", ",".join(ids), "-t", "all", "-o", "%i %T"])
        known = dict(ln.split() for ln in proc.stdout.splitlines() if len(ln.split()) == 2)
        states = [known.get(i, "") for i in ids]
        for k, state in enumerate(states):
            if state in ("FAILED", "COMPLETED", "CANCELLED", "NODE_FAIL") and again:
                again -= 1
                ids[k] = submit(nodes[k])
        if all(s == "RUNNING" for s in states):
            return ids
        time.sleep(0.2)
    raise AssertionError(f"busy jobs not running: {states}")


def release(lab: SlurmLab, ids: list[str]) -> None:
    if ids:
        lab.run(["scancel", *ids])


def run_quickstart(
    lab: SlurmLab, tmp: Path, nodes: int, placement: Placement, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[dict[str, Any]], list[str]]:
    """Submit the quickstart through the API; return per-rank records and the allocation."""
    monkeypatch.chdir(REPO_ROOT)
    recipe = api.load(
        REPO_ROOT / "recipes" / "quickstart.yaml",
        {
            "resources.nodes": nodes,
            "resources.procs_per_node": 1,
            "launcher.python": str(STANDINS / "torchrun.py"),
            "launcher.script": str(STANDINS / "report_rank.py"),
            "launcher.args": [],
            "storage.checkpoint_root": str(tmp / "ckpt"),
            "storage.log_dir": str(tmp / "logs"),
        },
    )
    job = api.submit(recipe, backend=SlurmCLI(lab.env), env=lab.env, placement=placement)
    fields = lab.wait_job(job.job_id, timeout=280)
    outs = list((tmp / "logs").glob(f"quickstart_{job.job_id}.out"))
    log = outs[0].read_text() if outs else ""
    assert fields.get("JobState") == "COMPLETED", f"{fields}\n{log}"
    # one attempt (the log is appended to if slurmfm requeued the job after a lost node)
    ranks = last_attempt_ranks(json.loads(x) for x in log.splitlines() if x.startswith("{"))
    rec = parse_scontrol_record(lab.run(["scontrol", "show", "job", "-o", job.job_id]).stdout)
    assert len(ranks) == nodes, log
    return ranks, lab.hostnames(rec["NodeList"])


def check_ranks_follow_order(ranks: list[dict[str, Any]]) -> list[str]:
    order = ranks[0]["host_order"].split()
    for e in ranks:
        assert e["node_rank"] == e["rank"]  # 1 process per node
        assert e["node"] == order[e["node_rank"]], e
    return order


def check_grouped(topo: Topology, order: list[str], plan_: Plan) -> None:
    """Nodes grouped by leaf, leaves in fabric DFS order (= the plan's rank key order)."""
    leaves = [topo.leaf(n) for n in order]
    runs = [x for i, x in enumerate(leaves) if i == 0 or leaves[i - 1] != x]
    assert len(runs) == len(set(runs)), order
    assert order == sorted(order, key=plan_.rank_key.__getitem__) if plan_.rank_key else True


@pytest.mark.slurm
@pytest.mark.parametrize("mode", ["pin", "constrain"])
def test_host_lab_plan_modes(
    slurm_lab: SlurmLab, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo = topology_from_lab(slurm_lab)
    # Busy: 2 nodes of leaf1 and 1 of leaf3, so a 6-node job fits spine1 only as 2 + 4.
    busy = (
        slurm_lab.topology["switches"]["leaf1"]["nodes"][:2]
        + slurm_lab.topology["switches"]["leaf3"]["nodes"][:1]
    )
    ids = hold(slurm_lab, busy)
    try:
        recipe = api.load(REPO_ROOT / "recipes" / "quickstart.yaml", {"resources.nodes": 6})
        p = plan_for_recipe(
            recipe, topo, mode=mode, unavailable=busy, slurm_version=slurm_lab.version
        )  # type: ignore[arg-type]
        assert p.leaves == ("leaf1", "leaf2")
        ranks, alloc = run_quickstart(slurm_lab, tmp_path, 6, p.placement(), monkeypatch)
    finally:
        release(slurm_lab, ids)
    order = check_ranks_follow_order(ranks)
    assert sorted(order) == sorted(alloc)
    assert not set(order) & set(busy)
    if mode == "pin":
        assert tuple(order) == p.nodes
    else:
        # Slurm chose; the job sorted its allocation by the fabric and stays within K leaves.
        assert len({topo.leaf(n) for n in order}) <= len(p.leaves) + 1
    check_grouped(topo, order, p)
    # Consecutive node ranks share a leaf except at the minimum number of leaf changes.
    changes = sum(1 for a, b in itertools.pairwise(order) if topo.leaf(a) != topo.leaf(b))
    assert changes == len({topo.leaf(n) for n in order}) - 1


@pytest.mark.slurm
def test_host_lab_orders_by_topology_addr_without_a_map(
    slurm_lab: SlurmLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo = topology_from_lab(slurm_lab)
    ranks, alloc = run_quickstart(slurm_lab, tmp_path, 5, Placement(mode="constrain"), monkeypatch)
    order = check_ranks_follow_order(ranks)
    assert sorted(order) == sorted(alloc)
    for e in ranks:
        assert e["topology_addr"].endswith("." + e["node"])
    addrs = [next(e["topology_addr"] for e in ranks if e["node"] == n) for n in order]
    leaves = [a.split(".")[-2] for a in addrs]
    runs = [x for i, x in enumerate(leaves) if i == 0 or leaves[i - 1] != x]
    assert len(runs) == len(set(runs)), addrs
    assert [topo.leaf(n) for n in order] == leaves


# ---------------------------------------------------------------------------- newer Slurm, block


@pytest.fixture(scope="session")
@own_lab_fixture(*OWN_LABS.values())
def own_block_lab() -> Iterator[Any]:
    """Our own 36-node, 2 x 18 block labs (sid 26.05, trixie 24.11), brought up idempotently."""
    cache: dict[str, SlurmLab] = {}

    def get(suite: str) -> SlurmLab:
        if suite not in cache:
            cache[suite] = OWN_LABS[suite].up()
        return cache[suite]

    return get


@pytest.mark.slurm_newer
@pytest.mark.parametrize("suite", ["trixie", "sid"])
@pytest.mark.parametrize("mode", ["pin", "constrain"])
def test_block_lab_plan_lands_in_expected_blocks(
    own_block_lab: Any, suite: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab: SlurmLab = own_block_lab(suite)
    topo = topology_from_lab(lab)
    blocks = lab.topology["blocks"]
    # block1 has 4 nodes busy (14 free), block2 all 18 free: a 12-node tp=8 job (2-node
    # NVLink units on 4-GPU nodes) fits block1 tightly.
    busy = blocks["block1"]["nodes"][:4]
    job = JobShape(12, 4, tp=8)
    p = plan(topo, job, unavailable=busy, mode=mode, slurm_version=SlurmVersion.parse(lab.version))  # type: ignore[arg-type]
    assert p.leaves == ("block1",)
    if mode == "constrain":
        assert p.segment is not None
        assert 18 % p.segment == 0
        assert 12 % p.segment == 0
        assert p.segment % 2 == 0
    ids = hold(lab, busy)
    try:
        ranks, alloc = run_quickstart(lab, tmp_path, 12, p.placement(), monkeypatch)
    finally:
        release(lab, ids)
    order = check_ranks_follow_order(ranks)
    assert sorted(order) == sorted(alloc)
    assert {topo.leaf(n) for n in order} == {"block1"}
    if mode == "pin":
        assert tuple(order) == p.nodes
    else:
        assert order == sorted(order, key=p.rank_key.__getitem__)
    for e in ranks:
        assert e["topology_addr"].startswith(topo.leaf(e["node"]) + ".")
    # NVLink units (2 consecutive nodes) share a block.
    for i in range(0, 12, 2):
        assert topo.leaf(order[i]) == topo.leaf(order[i + 1])


@pytest.mark.slurm_newer
@pytest.mark.parametrize("suite", ["trixie", "sid"])
def test_block_lab_two_blocks_ordered_by_block(
    own_block_lab: Any, suite: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 20-node job needs both blocks; segments keep NVLink units whole; ranks go by block."""
    lab: SlurmLab = own_block_lab(suite)
    topo = topology_from_lab(lab)
    p = plan(
        topo, JobShape(20, 4, tp=8), mode="constrain", slurm_version=SlurmVersion.parse(lab.version)
    )
    assert p.segment == 2
    assert p.leaves == ("block1", "block2")
    ranks, alloc = run_quickstart(lab, tmp_path, 20, p.placement(), monkeypatch)
    order = check_ranks_follow_order(ranks)
    assert sorted(order) == sorted(alloc)
    blocks = [topo.leaf(n) for n in order]
    assert blocks == sorted(blocks)  # block1's nodes first, then block2's
    for i in range(0, 20, 2):
        assert blocks[i] == blocks[i + 1]


# ---------------------------------------------------------------------------- GB200 --nodelist
def _nvl_blocks(lab: SlurmLab, tmp: Path) -> tuple[Path, dict[str, list[str]]]:
    """GB200 NVL72 UltraServers scaled to the lab: 4 base blocks of 9 nodes (18 on a real
    NVL72), BlockSizes=9,18,36 as block_sizes_for writes them, and the lab's own
    topology.conf kept to put back."""
    names = [f"node{i:03d}" for i in range(1, lab.nodes + 1)]
    blocks = {f"us{b + 1}": names[b * 9 : (b + 1) * 9] for b in range(4)}
    conf = tmp / "nvl72.conf"
    conf.write_text(
        "".join(f"BlockName={b} Nodes={','.join(ns)}\n" for b, ns in blocks.items())
        + "BlockSizes=9,18,36\n"
    )
    return conf, blocks


def _submit_test(lab: SlurmLab, nodes: list[str], *extra: str) -> tuple[int, str, list[str]]:
    """(exit status, stderr, nodes) of an exclusive ``sbatch --test-only -N len -w nodes``."""
    proc = lab.run(
        [
            *("sbatch", "--test-only", "--exclusive", "-o", "/dev/null", "-N", str(len(nodes))),
            *("-w", ",".join(nodes), *extra, "--wrap", "true"),
        ]
    )
    m = re.search(r" on nodes (\S+)", proc.stderr)
    return proc.returncode, proc.stderr.strip(), lab.hostnames(m.group(1)) if m else []


@pytest.mark.slurm_newer
@pytest.mark.parametrize("suite", ["trixie", "sid"])
def test_gb200_nodelist_across_ultraservers(
    own_block_lab: Any, suite: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Does real Slurm take a GB200 plan's --nodelist that spans UltraServers partly busy with
    other jobs (issue 42)? Measured on 24.11.5 and 26.05.5 with topology/block:

    * --nodelist alone is taken only inside one block of the job's level (an 8-node job: one
      base block; a 16-node job: an aligned pair), and refused at submission otherwise;
    * with --segment, 26.05 takes the list and lays the segments out inside it, 24.11
      refuses it;
    * the planner now emits only what the version takes: on 26.05 the job starts on exactly
      the planned nodes, in the planned rank order; on 24.11 it says no --nodelist can start
      the job now (no base block has 8 free nodes), as Slurm's own --segment=8 could not.
    """
    from slurmfm.plan.planner import PlanError, plan_for_recipe
    from slurmfm.plan.slurm_sim import nodelist_accepted
    from slurmfm.recipe.loader import validate

    lab: SlurmLab = own_block_lab(suite)
    version = SlurmVersion.parse(lab.version)
    conf, blocks = _nvl_blocks(lab, tmp_path)
    original = tmp_path / "original.conf"
    original.write_text((lab.lab_dir / "etc" / "topology.conf").read_text())
    proc = lab.lab_command("topology", str(conf), "--plugin", "block")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids: list[str] = []
    try:
        us = blocks
        # Fixed cases first, all nodes idle: what the block plugin takes with -w.
        cases = [
            (us["us1"][:8], (), True),  # one base block
            (us["us1"][:4] + us["us2"][:4], (), False),  # two base blocks, 8 nodes
            (us["us1"][:8] + us["us2"][:8], (), True),  # an aligned pair, 16 nodes
            (us["us2"][:8] + us["us3"][:8], (), False),  # a pair that is not aligned
            (us["us1"][:4] + us["us2"][:4], ("--segment=4",), suite == "sid"),
            (us["us2"][:8] + us["us3"][:8], ("--segment=8",), suite == "sid"),
        ]
        rules = "26.05" if suite == "sid" else "24.11"
        table = list(us.values())
        for nodes, extra, taken in cases:
            rc, err, got = _submit_test(lab, nodes, *extra)
            assert (rc == 0) == taken, (nodes, extra, err)
            if taken:
                assert sorted(got) == sorted(nodes), err
            else:
                assert "Requested node configuration is not available" in err
            seg = int(extra[0].split("=")[1]) if extra else None
            model = nodelist_accepted(
                table, nodes, block_sizes=[9, 18, 36], rules=rules, segment=seg
            )
            assert model == taken, (nodes, extra)
        # UltraServers partly busy with other jobs: 6, 5, 7 and 4 nodes free, so no base
        # block holds an 8-node job (Slurm's own -N 8 --segment=8 stays pending).
        busy = us["us1"][:3] + us["us2"][:4] + us["us3"][:2] + us["us4"][:5]
        ids = hold(lab, busy)
        leaf_of = {n: b for b, ns in us.items() for n in ns}
        topo = Topology.from_parents([Node(n) for n in leaf_of], leaf_of, {}, kind="block")
        job = JobShape(8, 4, tp=4)  # GB200: 4 GPUs per node, TP 4
        newer = plan(topo, job, unavailable=busy, slurm_version=SlurmVersion.parse("26.05.5"))
        spans = list(newer.nodes)
        assert len({leaf_of[n] for n in spans}) > 1
        # The list alone, as the planner emitted it before: refused at submission.
        sub = lab.run(
            [
                *("sbatch", "--parsable", "--exclusive", "-o", "/dev/null", "-N", "8"),
                *("-w", ",".join(spans), "--wrap", "true"),
            ]
        )
        assert sub.returncode != 0, sub.stdout
        assert "Requested node configuration is not available" in sub.stderr
        assert newer.segment is not None
        rc, err, got = _submit_test(lab, spans, f"--segment={newer.segment}")
        assert (rc == 0) == (suite == "sid"), err
        # Spares (resources.spare_nodes) are listed by the pin plan after the trainer: the
        # whole list, with its --segment where the plan gives one, is one Slurm takes now
        spared = plan_for_recipe(
            validate(
                {
                    "name": "spares",
                    "cluster": {"instance_type": "p6e-gb200.36xlarge"},
                    "resources": {"nodes": 4, "spare_nodes": 2},
                    "launcher": {"kind": "torchrun", "script": "t.py"},
                }
            ),
            topo,
            unavailable=busy,
            slurm_version=version,
        )
        assert len(spared.nodes) == 6
        seg = (f"--segment={spared.segment}",) if spared.segment else ()
        s_rc, s_err, s_got = _submit_test(lab, list(spared.nodes), *seg)
        assert s_rc == 0, (spared.nodes, seg, s_err, spared.explanation)
        assert sorted(s_got) == sorted(spared.nodes)
        if suite == "trixie":
            with pytest.raises(PlanError, match="topology/block"):
                plan(topo, job, unavailable=busy, slurm_version=version)
            return
        assert sorted(got) == sorted(spans)
        p = plan(topo, job, unavailable=busy, slurm_version=version)
        assert p.nodes == newer.nodes
        assert p.sbatch_options[1] == f"--segment={p.segment}"
        ranks, alloc = run_quickstart(lab, tmp_path, 8, p.placement(), monkeypatch)
        order = check_ranks_follow_order(ranks)
        assert sorted(alloc) == sorted(p.nodes)
        assert tuple(order) == p.nodes
    finally:
        release(lab, ids)
        lab.run(["scancel", "--name", "plan-busy"])
        lab.lab_command("topology", str(original), "--plugin", "block")
