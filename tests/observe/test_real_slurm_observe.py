"""Observability end to end: a real Slurm job, a real node_exporter and a real Prometheus.

The quickstart recipe runs on each local Slurm lab (22.05, 24.11, 26.05) with observability on
and its textfile directory pointed at a node_exporter (textfile collector only) that a
Prometheus on loopback scrapes every second (``scripts/obs-stack``). Torch is not the subject:
the launch goes through slurmfm's batch step, node entry and agents, and stand-ins for
torchrun and the training (tests/standins/: torchrun's rank arithmetic and exit status, the
quickstart trainer's events and checkpoint contract) start at once. The training fails its
first run on purpose with an exit code the recipe marks retryable, so the job requeues itself
once and then trains with checkpoints.

Checked: Prometheus scraped the job's textfile metrics with their labels and the reported
steps; every PromQL query of the shipped Grafana dashboard, with ``$jobid`` set to the job,
returns series through Prometheus's HTTP API (the GPU and EFA panels read a fixture file that
stands in for DCGM-Exporter and the EFA exporter, which need hardware this machine lacks:
tests/observe/fixtures/README.md); ``slurmfm report`` shows the nodes in rank order, the
restart and its reason, and the checkpoints; ``slurmfm logs`` splits restarts and ranks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import REPO_ROOT, SlurmLab, port_offset, slurm_required, wait_until, worker_index
from resilience.test_real_slurm_resilience import events, wait_done

from slurmfm.observe import dashboard

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture
def slurm_lab(every_lab: SlurmLab) -> SlurmLab:
    """The agent runs inside each Slurm's job steps: every version, not just 22.05."""
    return every_lab


OBS_STACK = REPO_ROOT / "scripts" / "obs-stack"
STANDINS = REPO_ROOT / "tests" / "standins"
FIXTURES = Path(__file__).parent / "fixtures"
# One stack per xdist worker and per run (port offset), below the ephemeral range.
_OBS_BASE = 19190 + port_offset() + 2 * worker_index()
PROM_PORT = os.environ.get("SLURMFM_OBS_PROM_PORT", str(_OBS_BASE))
NODE_PORT = os.environ.get("SLURMFM_OBS_NODE_PORT", str(_OBS_BASE + 1))

FLAKY = """\
import os, runpy, sys
# Fail the first run (restart 0) on purpose; later runs train for real.
if os.environ.get("SLURMFM_RESTART", "0") == "0":
    print("flaky: failing run 0 on purpose", flush=True)
    sys.exit(3)
train = {train!r}
sys.argv = [train] + sys.argv[1:]
runpy.run_path(train, run_name="__main__")
"""


@pytest.fixture(scope="module")
def obs_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("obs")
    textfiles = root / "textfile"
    args = [str(OBS_STACK), "--dir", str(root / "stack"), "--textfile-dir", str(textfiles)]
    env = {
        **os.environ,
        "SLURMFM_OBS_PROM_PORT": PROM_PORT,
        "SLURMFM_OBS_NODE_PORT": NODE_PORT,
    }
    proc = subprocess.run(
        [*args, "up"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        msg = f"obs-stack did not come up:\n{proc.stdout}\n{proc.stderr}"
        if slurm_required():
            pytest.fail(msg)
        pytest.skip(msg)
    yield {"root": root, "textfile": textfiles}
    subprocess.run([*args, "down"], env=env, capture_output=True, timeout=120, check=False)


def prom(path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{PROM_PORT}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]


def job_series(metric: str, job_id: str, since: float) -> list[Any]:
    """Every series of ``metric`` for the job, from ``since`` until now, in 1 s steps."""
    query = f'{metric}{{jobid="{job_id}"}}'
    end = str(time.time())
    return list(
        prom("/api/v1/query_range", query=query, start=str(since), end=end, step="1")["result"]
    )


def test_job_metrics_dashboard_and_report(
    slurm_lab: SlurmLab, obs_stack: dict[str, Path], tmp_path: Path
) -> None:
    flaky = tmp_path / "flaky_train.py"
    flaky.write_text(FLAKY.format(train=str(STANDINS / "train_fast.py")))
    t0 = time.time()
    proc = slurm_lab.slurmfm(
        "submit",
        "recipes/quickstart.yaml",
        "--set",
        f"storage.checkpoint_root={tmp_path}/ckpt",
        "--set",
        f"storage.log_dir={tmp_path}/logs",
        "--set",
        f"launcher.script={flaky}",
        "--set",
        f"launcher.python={STANDINS / 'torchrun.py'}",
        "--set",  # torchrun ends with 1 when a worker fails (the flaky run 0)
        "resilience.retry_exit_codes=[1]",
        "--set",  # a requeue: the restart count Slurm keeps is what is measured
        "resilience.restart_in_job=false",
        "--set",
        # every rank lives as long as the run, as in a real one: so does each node's agent
        "launcher.args=[--steps, '30', --checkpoint-every, '10', --sleep, '0.3', "
        "--others-wait, '120']",
        "--set",
        "resilience.max_restarts=2",
        "--set",
        "observability.enabled=on",
        "--set",
        f"observability.textfile_dir={obs_stack['textfile']}",
        "--set",
        "observability.interval_s=1",
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    # Stand-ins for DCGM-Exporter and the EFA exporter on the job's "hosts" (fixture).
    fixture = (FIXTURES / "dcgm-efa-exporters.prom").read_text()
    (obs_stack["textfile"] / "fixture_dcgm_efa.prom").write_text(
        fixture.replace("JOBID", job_id).replace("NODE", "lab")
    )
    rec = wait_done(slurm_lab, job_id, timeout=600)
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    log = log_path.read_text() if log_path.exists() else ""
    assert rec["JobState"] == "COMPLETED", log[-3000:]

    # --- Prometheus scraped the job's textfile metrics (its last scrape may follow the job's end)
    def scraped() -> bool:
        steps = job_series("slurmfm_train_step", job_id, t0)
        return bool(steps) and max(float(v) for _, v in steps[0]["values"]) >= 10

    wait_until(f"slurmfm_train_step >= 10 for job {job_id} in Prometheus", scraped, 60)
    series = job_series("slurmfm_train_step", job_id, t0)
    [s] = series
    labels = s["metric"]
    assert labels["recipe"] == "quickstart"
    assert labels["run_id"] == "quickstart"
    assert labels["job"] == "node"  # scraped from node_exporter's textfile collector
    steps = [float(v) for _, v in s["values"]]
    assert max(steps) >= 10, steps
    t_seen = float(s["values"][-1][0])
    restarts = prom(
        "/api/v1/query", query=f'max(slurmfm_job_restarts{{jobid="{job_id}"}})', time=str(t_seen)
    )["result"]
    assert restarts[0]["value"][1] == "1"
    # one textfile per node, each seen at some point of the job's life (an instant query at
    # t_seen missed a node whose agent started late on a loaded machine)
    nodes = job_series("slurmfm_job_info", job_id, t0)
    assert len({r["metric"]["node"] for r in nodes}) == 2

    # --- every dashboard query returns this job's series
    board = json.loads(dashboard.SHIPPED.read_text())
    for title, expr in dashboard.queries(board):
        q = expr.replace("$jobid", job_id).replace("$__rate_interval", "30s")
        result = prom("/api/v1/query", query=q, time=str(t_seen))["result"]
        assert result, f"dashboard panel {title!r}: no series for job {job_id}: {q}"
        for r in result:
            m = r["metric"]
            if "jobid" in m:
                assert m["jobid"] == job_id, (title, m)
            if "hpc_job" in m:
                assert m["hpc_job"] == job_id, (title, m)

    # --- slurmfm report
    proc = slurm_lab.slurmfm("report", job_id, "--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    ranks = sorted((e for e in events(log) if e["event"] == "rank"), key=lambda e: e["rank"])
    order = ranks[0]["host_order"].split()
    assert rep["nodes"] == order
    assert rep["restarts"] == 1
    assert [r["outcome"] for r in rep["runs"]] == ["requeue", "finished"]
    assert rep["runs"][0]["reason"].startswith("step failed with exit")
    assert [c["step"] for c in rep["checkpoints"]] == [10, 20, 30]
    assert rep["latest_checkpoint"].endswith("step_000000030")
    assert rep["progress"]["step"] == 30
    assert rep["wall_time_s"] > 0
    assert set(rep["topology"]) == set(order)
    text = slurm_lab.slurmfm("report", job_id).stdout
    assert f"nodes (rank order): {' '.join(order)}" in text
    assert "run 0:" in text
    assert "-> requeue: step failed with exit" in text

    # --- slurmfm logs: per restart, per rank
    first = slurm_lab.slurmfm("logs", job_id, "--restart", "0")
    assert first.returncode == 0, first.stderr
    assert "flaky: failing run 0 on purpose" in first.stdout
    assert '"event": "step"' not in first.stdout
    rank2 = slurm_lab.slurmfm("logs", job_id, "--restart", "1", "--rank", "2")
    assert rank2.returncode == 0, rank2.stderr
    seen = {e["rank"] for e in events(rank2.stdout) if e["event"] == "rank"}
    assert seen == {2, 3}, rank2.stdout[-2000:]  # node rank 1 holds ranks 2 and 3
    assert not re.search(r"^\s*\d+: ", rank2.stdout, re.MULTILINE)  # labels removed


def runtime_copies(job_id: str, since: float) -> list[bool]:
    """This job's runtime copies in this host's /tmp (written after ``since``: the lab's job
    ids repeat across runs): for each, whether it carries the modules' bytecode."""
    import zipfile

    out = []
    for p in Path("/tmp").glob(f"slurmfm-{job_id}-*"):
        try:
            if p.stat().st_mtime < since - 1:
                continue
            with zipfile.ZipFile(p) as z:
                out.append("slurmfm_job/node.pyc" in z.namelist())
        except (OSError, zipfile.BadZipFile):
            continue  # gone meanwhile, or the batch script's extraction half-written
    return out


def test_gpu_job_maps_its_gpus_for_dcgm_exporter(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    """A whole-node GPU job (--gpus-per-node=8, --exclusive, --mem=0) on the lab, whose nodes
    have 8 GPU GRES each: the agents run beside the training (srun --overlap shares the GPUs
    and memory), map every GPU Slurm allocated to the job id in DCGM-Exporter's format while
    the job runs, and remove the mapping at the end."""
    mapdir = tmp_path / "map"
    mapdir.mkdir()
    submitted = time.time()
    proc = slurm_lab.slurmfm(
        "submit",
        "recipes/quickstart.yaml",
        "--set",
        f"storage.checkpoint_root={tmp_path}/ckpt",
        "--set",
        f"storage.log_dir={tmp_path}/logs",
        "--set",
        "cluster.instance_type=p5.48xlarge",
        "--set",
        "resources.procs_per_node=2",
        "--set",  # whole nodes: a shared p5 node would ask 24 CPUs per process, a lab node has 16
        "resources.exclusive=true",
        "--set",
        "resilience.health_gate=off",
        "--set",
        "resilience.nccl_transport_check=off",
        "--set",
        f"observability.dcgm_job_mapping_dir={mapdir}",
        "--set",
        "observability.textfile_dir=null",
        "--set",
        f"launcher.python={STANDINS / 'torchrun.py'}",
        "--set",
        f"launcher.script={STANDINS / 'train_fast.py'}",
        "--set",
        "launcher.args=[--steps, '20', --sleep, '0.5', --others-wait, '120']",
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    seen: dict[str, list[str]] = {}
    copies: list[bool] = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        files = {p.name: p.read_text().split() for p in mapdir.iterdir() if p.name.isdigit()}
        if len(files) == 8:
            seen = files
            copies = runtime_copies(job_id, submitted)  # the agents run: so does the launch
            break
        time.sleep(0.5)
    rec = wait_done(slurm_lab, job_id, timeout=300)
    log = (tmp_path / "logs" / f"quickstart_{job_id}.out").read_text()
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert seen == {str(i): [job_id] for i in range(8)}, (seen, log[-2000:])
    # The steps ran the runtime's copy with bytecode, which prepare made and sbcast (no
    # "without bytecode" line); on the host lab, whose nodes share this host's /tmp: both
    # copies were there while the job ran, and the job's end removed both.
    assert "without bytecode" not in log, log[-2000:]
    if slurm_lab.suite == "host":
        assert sorted(copies) == [False, True], copies
        assert runtime_copies(job_id, submitted) == []
    assert list(mapdir.iterdir()) == []
    obs = tmp_path / "logs" / f"quickstart_{job_id}.observe"
    infos = [json.loads(p.read_text()) for p in obs.glob("node_*_r0.json")]
    assert len(infos) == 2
    for info in infos:
        assert info["gpus"] == list(range(8))
    # The lab's nodes share one host and so one mapping directory: the first agent adds the
    # job to each file and the second normally finds it there (and leaves it to the first).
    assert sorted({i for info in infos for i in info["dcgm_mapped"]}) == list(range(8))
