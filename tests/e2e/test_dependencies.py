"""Dependencies, pipelines and array sweeps on the real local Slurm: 22.05 (the host lab),
24.11 (trixie) and 26.05 (sid), each test on each.

Every job is a lab-cpu recipe whose torchrun script (``step.py`` below, started at once by the
torchrun stand-in tests/standins/torchrun.py: torch is not the subject here) writes one JSON file
per job: which stage it is, its arguments, the environment slurmfm gave it (``SLURMFM_*``, the
array task id, an overridden variable) and when it started and ended; then it sleeps a little
and exits with the status it was told to. Ordering and "never ran" are checked from those
files and from Slurm's own records (``scontrol show job``: state, reason, start/end times).

What Slurm 22.05, 24.11 and 26.05 do when an ``afterok`` dependency fails (checked here): with
``--kill-on-invalid-dep=yes`` the dependent job is ended at once, state CANCELLED, reason
DependencyNeverSatisfied; it never starts.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from lab import REPO_ROOT, SlurmLab

from slurmfm.backends.slurm_cli import parse_scontrol_record

# On 22.05 these run on the third host lab (tests/lab.py, HOST_C), beside the shared host
# lab's other tests: they only submit, wait and read, and took 159 s of its group.
pytestmark = [pytest.mark.slurm, pytest.mark.host_c]


@pytest.fixture
def slurm_lab(every_lab: SlurmLab) -> SlurmLab:
    """Dependency handling is the scheduler's: each test runs on every Slurm version."""
    return every_lab


STEP = """\
import json, os, sys, time
stage, rc, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
restart = os.environ.get("SLURMFM_RESTART", "0")
if rc < 0:  # fail only the first run (restart 0) with -rc; later runs succeed
    rc = -rc if restart == "0" else 0
out = os.path.join(
    os.environ["STEP_OUT"],
    f"{stage}-{os.environ['SLURM_JOB_ID']}-r{restart}.json",
)
rec = {
    "stage": stage, "argv": sys.argv[1:], "t0": time.time(),
    "job": os.environ["SLURM_JOB_ID"],
    "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
    "array_job": os.environ.get("SLURM_ARRAY_JOB_ID"),
    "run_id": os.environ["SLURMFM_RUN_ID"],
    "checkpoint_dir": os.environ["SLURMFM_CHECKPOINT_DIR"],
    "lr": os.environ.get("LR"),
    "overrides": os.environ.get("SLURMFM_SWEEP_OVERRIDES"),
    "restart": restart,
}
time.sleep(pause)
rec["t1"] = time.time()
with open(out + ".tmp", "w") as f:
    json.dump(rec, f)
os.rename(out + ".tmp", out)
sys.exit(rc)
"""


# `python3 -m torch.distributed.run ...` started at once: these tests are about Slurm's
# dependencies, arrays and requeues; importing torch cost each job seconds of CPU.
TORCHRUN = REPO_ROOT / "tests" / "standins" / "torchrun.py"


def recipe(tmp: Path, name: str, rc: int = 0, pause: float = 1.0, extra: str = "") -> Path:
    """A one-node lab-cpu recipe running step.py; requeue off so a failure is final."""
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        "cluster: {partition: batch, instance_type: lab-cpu}\n"
        "resources: {nodes: 1, procs_per_node: 1, time_limit: 5, exclusive: false}\n"
        f"launcher: {{kind: torchrun, script: {tmp / 'step.py'}, python: {TORCHRUN}, "
        f"args: [{name}, '{rc}', '{pause}']}}\n"
        f"env: {{STEP_OUT: {tmp / 'out'}, OMP_NUM_THREADS: '1'}}\n"
        f"storage: {{checkpoint_root: {tmp / 'ckpt'}, log_dir: {tmp / 'logs'}}}\n"
        "resilience: {health_gate: 'off', requeue: false, save_before_timeout_s: 0}\n" + extra
    )
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "step.py").write_text(STEP)
    (tmp_path / "out").mkdir()
    return tmp_path


def cli(lab: SlurmLab, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return lab.slurmfm(*args, timeout=timeout)


def ran(work: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in sorted((work / "out").glob("*.json")):
        rec = json.loads(f.read_text())
        out.setdefault(rec["stage"], []).append(rec)
    return out


def job(lab: SlurmLab, job_id: str) -> dict[str, str]:
    proc = lab.run(["scontrol", "show", "job", "-o", job_id])
    assert proc.returncode == 0, proc.stderr
    return parse_scontrol_record(proc.stdout.strip().splitlines()[0])


def ids(stdout: str) -> dict[str, str]:
    """``STAGE JOBID [after EXPR]`` lines of ``pipeline submit`` / ``submit --then``."""
    return {line.split()[0]: line.split()[1] for line in stdout.splitlines() if line.strip()}


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_afterok_chain_starts_after_success(slurm_lab: SlurmLab, work: Path) -> None:
    a, b = recipe(work, "a", pause=3), recipe(work, "b")
    proc = cli(slurm_lab, "submit", str(a), "--then", str(b), "--wait", "--timeout", "180")
    assert proc.returncode == 0, proc.stderr
    jobs = ids(proc.stdout)
    rec_b = job(slurm_lab, jobs["b"])
    assert rec_b["Dependency"] in {"(null)", ""}  # satisfied and cleared
    rec_a = job(slurm_lab, jobs["a"])
    assert rec_a["JobState"] == rec_b["JobState"] == "COMPLETED"
    assert ts(rec_b["StartTime"]) >= ts(rec_a["EndTime"])  # Slurm's own record
    r = ran(work)
    assert r["b"][0]["t0"] >= r["a"][0]["t1"]  # the jobs' own clocks


def test_failure_paths_afterok_afternotok_afterany(slurm_lab: SlurmLab, work: Path) -> None:
    """a fails: afterok never runs (cancelled), afternotok and afterany run."""
    recipe(work, "a", rc=3)
    for name in ("ok", "notok", "anyway"):
        recipe(work, name)
    pipeline = work / "pipeline.yaml"
    pipeline.write_text(
        "name: failure-paths\n"
        "stages:\n"
        "  a: {recipe: a.yaml}\n"
        "  ok: {recipe: ok.yaml, after: [a]}\n"
        "  notok: {recipe: notok.yaml, after: [{stage: a, condition: afternotok}]}\n"
        "  anyway: {recipe: anyway.yaml, after: [{stage: a, condition: afterany}]}\n"
    )
    proc = cli(slurm_lab, "pipeline", "submit", str(pipeline), "--wait", "--timeout", "180")
    assert proc.returncode == 1, proc.stderr  # a failed (ok was skipped: not a failure itself)
    jobs = ids(proc.stdout)
    assert set(jobs) == {"a", "ok", "notok", "anyway"}
    a = job(slurm_lab, jobs["a"])
    assert a["JobState"] == "FAILED"
    assert a["ExitCode"] != "0:0"  # the step failed (step.py exited 3, torchrun 1)
    ok = job(slurm_lab, jobs["ok"])
    # What 22.05 does with --kill-on-invalid-dep=yes: cancelled at once, never started.
    assert ok["JobState"] == "CANCELLED", ok
    assert ok["Reason"] == "DependencyNeverSatisfied", ok
    assert ok.get("BatchHost", "") in {"", "(null)"}  # never had a batch host
    # (Not RunTime: 22.05 once reported 20787-01:07:35, the time since the epoch, for this
    # never-started job in CI. Never running shows in the batch host above and in ran() below.)
    for name in ("notok", "anyway"):
        rec = job(slurm_lab, jobs[name])
        assert rec["JobState"] == "COMPLETED", rec
        assert ts(rec["StartTime"]) >= ts(a["EndTime"])
    r = ran(work)
    assert "ok" not in r
    assert r["notok"][0]["t0"] >= r["a"][0]["t1"]
    assert r["anyway"][0]["t0"] >= r["a"][0]["t1"]
    assert f"ok {jobs['ok']} CANCELLED (DependencyNeverSatisfied) exit=" in proc.stderr
    assert re.search(
        rf"^a {jobs['a']} FAILED \(NonZeroExitCode\) exit=\S+: failed$", proc.stderr, re.M
    )
    # later, from any shell: the record under the first stage's log_dir, asked of Slurm again
    status = cli(slurm_lab, "pipeline", "status", str(pipeline), "--json")
    assert status.returncode == 1, status.stderr  # a failed
    got = json.loads(status.stdout)
    assert got["record"] == str(work / "logs" / "pipelines" / f"failure-paths_{jobs['a']}.json")
    verdicts = {s["stage"]: (s["job_id"], s["verdict"]) for s in got["stages"]}
    assert verdicts == {
        "a": (jobs["a"], "failed"),
        "ok": (jobs["ok"], "skipped"),
        "notok": (jobs["notok"], "completed"),
        "anyway": (jobs["anyway"], "completed"),
    }


def test_afternotok_after_success_is_cancelled(slurm_lab: SlurmLab, work: Path) -> None:
    a, b = recipe(work, "a"), recipe(work, "b")
    proc = cli(
        slurm_lab,
        "submit",
        str(a),
        "--then",
        str(b),
        "--condition",
        "afternotok",
        "--wait",
        "--timeout",
        "120",
    )
    # b's condition did not hold: skipped by design, so the chain succeeded
    assert proc.returncode == 0, proc.stderr
    jobs = ids(proc.stdout)
    assert job(slurm_lab, jobs["a"])["JobState"] == "COMPLETED"
    b_rec = job(slurm_lab, jobs["b"])
    assert (b_rec["JobState"], b_rec["Reason"]) == ("CANCELLED", "DependencyNeverSatisfied")
    assert "b" not in ran(work)
    assert f"b {jobs['b']} CANCELLED (DependencyNeverSatisfied) exit=" in proc.stderr
    assert proc.stderr.rstrip().endswith(": skipped")


def test_array_sweep_each_task_its_own_overrides(slurm_lab: SlurmLab, work: Path) -> None:
    path = recipe(
        work,
        "sweep",
        pause=4,
        extra=(
            "sweep:\n"
            "  max_concurrent: 2\n"
            "  tasks:\n"
            "    - {env.LR: '0.1', launcher.args: [sweep, '0', '4', --tag, first]}\n"
            "    - {env.LR: '0.01', launcher.args: [sweep, '0', '4', --tag, 'two words']}\n"
            "    - {env.LR: '0.001', launcher.args: [sweep, '0', '4', --tag, \"it's\"]}\n"
        ),
    )
    proc = cli(slurm_lab, "submit", str(path), "--wait", "--timeout", "180")
    assert proc.returncode == 0, proc.stderr
    array_id = proc.stdout.strip().splitlines()[0]
    recs = sorted(ran(work)["sweep"], key=lambda r: int(r["array_task"]))
    assert [r["array_task"] for r in recs] == ["0", "1", "2"]
    assert {r["array_job"] for r in recs} == {array_id}
    assert [r["lr"] for r in recs] == ["0.1", "0.01", "0.001"]
    assert [r["argv"][-1] for r in recs] == ["first", "two words", "it's"]
    assert [r["run_id"] for r in recs] == ["sweep-t0", "sweep-t1", "sweep-t2"]
    dirs = [r["checkpoint_dir"] for r in recs]
    assert dirs == [str(work / "ckpt" / "sweep" / f"sweep-t{i}") for i in range(3)]
    assert all(Path(d).is_dir() for d in dirs)
    assert json.loads(recs[1]["overrides"])["env.LR"] == "0.01"
    # at most 2 at once (%2): no instant is inside all three runs
    assert max(r["t0"] for r in recs) >= min(r["t1"] for r in recs)
    # Slurm's view: one array, throttle 2, every task COMPLETED, its own log
    task1 = job(slurm_lab, f"{array_id}_1")
    assert task1["ArrayTaskThrottle"] == "2"
    assert task1["StdOut"] == str(work / "logs" / f"sweep_{array_id}_1.out")
    for r in recs:
        log = work / "logs" / f"sweep_{array_id}_{r['array_task']}.out"
        assert f"job {r['job']} start 0" in log.read_text()
    # slurmfm status per task: its own state file and checkpoint directory
    st = cli(slurm_lab, "status", f"{array_id}_2", "--json")
    info = json.loads(st.stdout)
    assert info["state"] == "COMPLETED"
    assert any(e.endswith(f"checkpoint-dir {dirs[2]}") for e in info["events"])
    whole = json.loads(cli(slurm_lab, "status", array_id, "--json").stdout)
    assert whole["raw"]["ArrayTasks"] == "0:COMPLETED 1:COMPLETED 2:COMPLETED"


def test_a_failed_array_task_requeues_itself_alone(slurm_lab: SlurmLab, work: Path) -> None:
    """Task 1 fails its first run (torchrun then exits 1, which the recipe marks retryable):
    with requeue on, that task alone restarts (same array task id, restart 1) and completes; task 0 runs once; the array ends COMPLETED."""
    path = recipe(
        work,
        "flaky",
        extra=(
            "sweep:\n"
            "  tasks:\n"
            "    - {launcher.args: [flaky, '0', '1']}\n"
            "    - {launcher.args: [flaky, '-3', '1']}\n"
        ),
    )
    path.write_text(
        path.read_text().replace(
            # the subject is the array task's own requeue, not a restart inside the allocation
            "requeue: false",
            "requeue: true, max_restarts: 2, retry_exit_codes: [1], restart_in_job: false",
        )
    )
    proc = cli(slurm_lab, "submit", str(path), "--wait", "--timeout", "240")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    array_id = proc.stdout.strip().splitlines()[0]
    runs = sorted((r["array_task"], r["restart"]) for r in ran(work)["flaky"])
    assert runs == [("0", "0"), ("1", "0"), ("1", "1")]
    assert {r["array_job"] for r in ran(work)["flaky"]} == {array_id}
    task0 = job(slurm_lab, f"{array_id}_0")
    task1 = job(slurm_lab, f"{array_id}_1")
    assert (task0["JobState"], task0["Restarts"]) == ("COMPLETED", "0")
    assert (task1["JobState"], task1["Restarts"]) == ("COMPLETED", "1")
    # each task's own state file says why it restarted
    state = next((work / "logs").glob(f"flaky_{task1['JobId']}.state")).read_text()
    assert "event=requeue" in state


def test_pipeline_of_three_stages_with_an_array(slurm_lab: SlurmLab, work: Path) -> None:
    recipe(work, "prep", pause=2)
    recipe(
        work,
        "train",
        extra="sweep:\n  parameters:\n    env.LR: ['1', '2']\n",
    )
    recipe(work, "report")
    pipeline = work / "pipeline.yaml"
    pipeline.write_text(
        "name: three\n"
        "stages:\n"
        "  report:\n"
        "    recipe: report.yaml\n"
        "    after: [train]\n"
        "  prep: {recipe: prep.yaml}\n"
        "  train:\n"
        "    recipe: train.yaml\n"
        "    set: {launcher.args: [train, '0', '2']}\n"
        "    after: [prep]\n"
    )
    dry = cli(slurm_lab, "pipeline", "submit", str(pipeline), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["stages"]
    assert [(s["stage"], s["dependency"], s["array_tasks"]) for s in plan] == [
        ("prep", "", 0),
        ("train", "afterok:<prep>", 2),
        ("report", "afterok:<train>", 0),
    ]
    proc = cli(slurm_lab, "pipeline", "submit", str(pipeline), "--wait", "--timeout", "240")
    assert proc.returncode == 0, proc.stderr
    jobs = ids(proc.stdout)
    assert list(jobs) == ["prep", "train", "report"]  # submitted in dependency order
    assert f"after afterok:{jobs['prep']}" in proc.stdout
    r = ran(work)
    assert sorted(x["lr"] for x in r["train"]) == ["1", "2"]
    assert min(x["t0"] for x in r["train"]) >= r["prep"][0]["t1"]
    # afterok on an array waits for every task
    assert r["report"][0]["t0"] >= max(x["t1"] for x in r["train"])


def test_singleton_segments_never_overlap(slurm_lab: SlurmLab, work: Path) -> None:
    """Two submissions of one singleton recipe (e.g. chained training segments): the second
    waits for the first even without an explicit dependency."""
    path = recipe(work, "segment", pause=3, extra="")
    text = path.read_text().replace("exclusive: false}", "exclusive: false, singleton: true}")
    path.write_text(text)
    first = cli(slurm_lab, "submit", str(path))
    assert first.returncode == 0, first.stderr
    second = cli(slurm_lab, "submit", str(path), "--wait", "--timeout", "120")
    assert second.returncode == 0, second.stderr
    id1, id2 = first.stdout.split()[0], second.stdout.split()[0]
    assert slurm_lab.wait_job(id1)["JobState"] == "COMPLETED"
    recs = {r["job"]: r for r in ran(work)["segment"]}
    assert recs[id2]["t0"] >= recs[id1]["t1"]
    assert job(slurm_lab, id2)["Dependency"] in {"(null)", ""}


def test_failed_submission_cancels_queued_stages(slurm_lab: SlurmLab, work: Path) -> None:
    """sbatch refuses stage b (no such partition; preflight skipped so sbatch itself says it):
    stage a, already queued, is cancelled and the error names it."""
    recipe(work, "a", pause=30)
    recipe(work, "b")
    pipeline = work / "pipeline.yaml"
    pipeline.write_text(
        "stages:\n"
        "  a: {recipe: a.yaml}\n"
        "  b: {recipe: b.yaml, after: [a], set: {cluster.partition: nosuchpartition}}\n"
    )
    proc = cli(slurm_lab, "pipeline", "submit", str(pipeline), "--no-check")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("pipeline: stage b was not submitted: sbatch: error:")
    assert "invalid partition" in lines[0].lower()
    assert lines[1].startswith("pipeline: cancelled the stages already submitted: a=")
    a_id = lines[1].split("a=")[1].split()[0].rstrip(";")
    assert slurm_lab.wait_job(a_id, timeout=60)["JobState"] == "CANCELLED"
