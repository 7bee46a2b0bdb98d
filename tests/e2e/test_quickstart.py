"""End to end on the real local Slurm: ``slurmfm submit`` of the quickstart runs real torchrun.

Checked from the job's own output: the world size, every rank's node (``SLURMD_NODENAME``,
since ``hostname`` is the same on every virtual node), that ranks follow the job's host order
(node i holds ranks i*G .. i*G+G-1), and that the checkpoint was written and published. Both tests look at one quickstart job per lab
(a real torchrun job is about 25 s of CPU on the lab's two shared cores): the first to ask for it
submits it, the other reads the same job.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from lab import SlurmLab, last_attempt_ranks

from slurmfm.backends.slurm_cli import parse_scontrol_record

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def submit_quickstart(lab: SlurmLab, tmp: Path, *extra: str) -> tuple[str, str, Path]:
    ckpt = tmp / "ckpt"
    logs = tmp / "logs"
    proc = lab.slurmfm(
        "submit",
        "recipes/quickstart.yaml",
        "--set",
        f"storage.checkpoint_root={ckpt}",
        "--set",
        f"storage.log_dir={logs}",
        "--wait",
        "--timeout",
        "240",
        *extra,
        timeout=300,
    )
    job_id = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    outs = list(logs.glob(f"quickstart_{job_id}.out"))
    log = outs[0].read_text() if outs else ""
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{log}"
    return job_id, log, ckpt


# One quickstart job per lab (its directory): job id, log, checkpoint root, rendered script's dir.
_RUNS: dict[Path, tuple[str, str, Path, Path]] = {}


def quickstart_run(lab: SlurmLab, factory: pytest.TempPathFactory) -> tuple[str, str, Path, Path]:
    """The lab's quickstart job, submitted with ``-o`` (the rendered script kept) on first use."""
    if lab.lab_dir not in _RUNS:
        tmp = factory.mktemp("quickstart")
        job_id, log, ckpt = submit_quickstart(lab, tmp, "-o", str(tmp / "out"))
        _RUNS[lab.lab_dir] = (job_id, log, ckpt, tmp / "out")
    return _RUNS[lab.lab_dir]


def events(log: str) -> list[dict[str, Any]]:
    """The JSON event objects in a job log.

    Lines from different tasks reach srun's output separately, and a line of one task can be
    split by another's (seen on the lab), so objects are found by pattern, not by line.
    """
    return [json.loads(m.group(0)) for m in re.finditer(r'\{"event"[^{}]*\}', log)]


def test_quickstart_runs_torchrun_over_two_nodes(
    each_lab: SlurmLab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    slurm_lab = each_lab
    job_id, log, ckpt, _ = quickstart_run(slurm_lab, tmp_path_factory)
    ev = events(log)
    ranks = last_attempt_ranks(ev)
    assert [e["rank"] for e in ranks] == [0, 1, 2, 3]
    assert {e["world_size"] for e in ranks} == {4}
    order = ranks[0]["host_order"].split()
    assert len(order) == 2
    # The job's allocation is exactly the host order, and ranks follow it.
    rec = parse_scontrol_record(slurm_lab.run(["scontrol", "show", "job", "-o", job_id]).stdout)
    alloc = slurm_lab.hostnames(rec["NodeList"])
    assert sorted(alloc) == sorted(order)
    for e in ranks:
        assert e["node"] == order[e["rank"] // 2], e
        assert e["node_rank"] == e["rank"] // 2
        assert e["topology_addr"].endswith("." + e["node"])
    # two distinct virtual nodes really took part
    assert len({e["node"] for e in ranks}) == 2
    steps = [e["step"] for e in ev if e["event"] == "step"]
    assert steps == list(range(1, 11))
    run_dir = ckpt / "quickstart" / "quickstart"
    assert (run_dir / "latest").read_text().strip() == "step_000000010"
    assert (run_dir / "step_000000010" / "state.pt").stat().st_size > 0
    assert any(e["event"] == "done" for e in ev)


def test_status_and_render_agree_with_slurm(
    each_lab: SlurmLab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    slurm_lab = each_lab
    job_id, _, _, out = quickstart_run(slurm_lab, tmp_path_factory)
    proc = slurm_lab.slurmfm("status", job_id, "--json")
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["state"] == "COMPLETED"
    assert st["done"] is True
    assert st["name"] == "quickstart"
    text = (out / "quickstart.sh").read_text()
    major_minor = ".".join(slurm_lab.version.split(".")[:2])
    assert f"# Slurm target {major_minor}" in text  # rendered for the real cluster's version
    assert "(assumed" not in text


def test_the_log_and_report_say_the_ranks_order_by_leaf(
    slurm_lab: SlurmLab, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Issue 42 item 1, on the host lab's real Slurm 22.05 and real torchrun (the quickstart job
    the other tests read: no job of its own). The prepare step's one host-order line ends
    with the order by leaf, which must agree with the lab's topology as slurmfm's own
    ``scontrol show topology`` parser (not the runtime's) reads it; torchrun's workers got the
    node ranks the order gives (no ``rank order differs`` line, and each rank's node is the
    order's), and ``slurmfm report`` shows the line under the run."""
    from slurmfm.topology.scontrol import parse_scontrol_topology

    job_id, log, _, _ = quickstart_run(slurm_lab, tmp_path_factory)
    lines = [x for x in log.splitlines() if f"slurmfm: job {job_id} host order:" in x]
    assert len(lines) == 1, log
    m = re.search(r"host order: ([^;]+); rendezvous [^;]+; (by leaf: .*)$", lines[0])
    assert m, lines[0]
    order, by_leaf = m.group(1).split(), m.group(2)
    topo = parse_scontrol_topology(slurm_lab.run(["scontrol", "show", "topology"]).stdout)
    leaves = [topo.leaf_of[h] for h in order]
    runs = [lf for i, lf in enumerate(leaves) if i == 0 or leaves[i - 1] != lf]
    shown = " ".join(
        f"{lf}[{leaves.index(lf)}]"
        if leaves.count(lf) == 1
        else f"{lf}[{leaves.index(lf)}-{leaves.index(lf) + leaves.count(lf) - 1}]"
        for lf in runs
    )
    contiguous = len(runs) == len(set(runs))
    if contiguous:
        assert by_leaf == (
            f"by leaf: {shown}; topology order: yes ({len(runs)} "
            f"{'leaf' if len(runs) == 1 else 'leaves'}, from scontrol show topology)"
        )
    else:
        assert "topology order: NO" in by_leaf
    assert "rank order differs" not in log
    ranks = last_attempt_ranks(events(log))
    assert [e["node"] for e in ranks] == [order[e["rank"] // 2] for e in ranks]
    rep = slurm_lab.slurmfm("report", job_id)  # the log dir from the job's StdOut
    assert rep.returncode == 0, rep.stderr
    assert f"    rank order {by_leaf}" in rep.stdout, rep.stdout
