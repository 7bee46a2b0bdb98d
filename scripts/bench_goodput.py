#!/usr/bin/env python3
"""Goodput under injected failures: slurmfm against the way people launch today.

On a running lab (``scripts/slurm-lab --nodes 5 up``: the training's 4 nodes and one that
takes a lost node's place; pass its directory), the quickstart's real torch training
(recipes/scripts/train_tiny.py through tests/resilience/train_faults.py: gloo, real torchrun,
a checkpoint every 5 steps, steps of ``--sleep`` seconds) runs under each arm, the arms
alternating run by run so that all see the same machine:

* ``slurmfm``: ``slurmfm submit recipes/quickstart.yaml`` (in-job relaunch, evidence-based
  retry, hang watch with ``resilience.hang_timeout`` = ``--hang-timeout``, pre-timeout save);
* ``aws``: the AWS samples' way, as aws-samples/awsome-distributed-training
  ``3.test_cases/pytorch/FSDP/slurm/llama3_1_8b-training.sbatch`` writes it: one ``srun`` of
  ``torchrun --nnodes=$SLURM_JOB_NUM_NODES --rdzv_id=$SLURM_JOB_ID --rdzv_backend=c10d
  --rdzv_endpoint=$(hostname)``, no requeue, no restarts (a crash ends the job);
* ``aws-careful``: the same with what a careful user adds, ``#SBATCH --requeue`` and torchrun
  ``--max-restarts=3`` (torch elastic restarts every worker of the group in place);
* ``submitit``: real submitit (PyPI, extra ``bench``; not a dependency of slurmfm), a
  checkpointable job (its ``checkpoint`` resubmits on the time limit's USR2, sent
  ``--save-s`` before the limit, as slurmfm's pre-timeout signal is), one training process
  per task with torch's ``env://`` variables from submitit's JobEnvironment.

The failures, injected by this script and the training wrapper, never by the code under
test (``--faults``):

* ``none``: the failure-free baseline;
* ``kill``: rank 0's worker SIGKILLed once, at step 12 (after the step-10 checkpoint);
* ``node``: at step 12 a node that is not the batch host is lost: its slurmd and the job's
  processes on it SIGKILLed (Slurm marks it down when it misses its pings);
* ``hang``: at step 12 rank 1's worker is stopped with SIGSTOP; the others wait inside their
  next collective (gloo's own timeout is 30 minutes). Any run with no new step for
  ``--stall-s`` while its job runs (``--node-stall-s`` for a lost node, which Slurm itself
  notices after SlurmdTimeout) is cancelled and counted as not recovered;
* ``limit``: a short time limit (``--limit-min``, the training ``--limit-steps`` long): a
  pre-timeout save (or the last periodic checkpoint), requeue, resume;
* ``kill+hang``: the kill at step 12, then the hang at step 22 (two failures in one run, for
  ``slurmfm report``; not in the default schedule).

Everything is measured from the training's own unthrottled timeline (``TEST_TIMELINE``:
every progress report with its time and pid, and each worker's start before torch's import),
the injection times, the time this script submitted, and Slurm's ``EndTime``:

* ETTR: kept training (each launch from its first step to the checkpoint the next launch
  resumed from, the last launch to its end) over the wall time (submission to ``EndTime``);
* per failure: time from the injection (for the kill: the last step before it) to a new
  worker process, and to training again (the next launch's first step); the time lost (from
  the checkpoint the next launch resumed from to its first step: detection, restart and the
  recomputed steps); the steps recomputed. An arm that does not recover (the job ends with
  training unfinished) is reported as such, and its time to recover as unbounded: a person
  has to notice and resubmit, which this benchmark does not guess.

A requeued job that Slurm holds (BeginTime) is released after 20 s, for every arm alike (the
lab's shortcut for the credential's lifetime, 120 s by default). For the slurmfm arm the
goodput ledger of ``slurmfm report --json`` is kept beside the benchmark's own ETTR.

    SLURMFM_LAB_ROOT=... scripts/slurm-lab --nodes 5 up
    pip install -e .[bench]   # submitit and matplotlib
    .venv/bin/python scripts/bench_goodput.py \\
        --lab "$SLURMFM_LAB_ROOT/host" --runs 3 --json out.json --png goodput.png
    scripts/bench_goodput.py --table-from out.json more.json --png goodput.png   # merge rounds
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.lab import lab_env  # noqa: E402

FAULTS = REPO / "tests" / "resilience" / "train_faults.py"
ARMS = ("slurmfm", "aws", "aws-careful", "submitit")
FAULT_KINDS = ("none", "kill", "node", "hang", "limit", "kill+hang")
# the failures injected at (or after) a step: the worker's kill by the training wrapper,
# a node's loss and a rank's SIGSTOP by this script
INJECT_AT = {"kill": 12, "node": 12, "hang": 12}
SECOND_AT = 22  # kill+hang: the hang, in the relaunched training
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


def record(env: dict[str, str], job: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True, check=False
    ).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r"(\w+)=(\S*)", out)}


def epoch(stamp: str) -> float | None:
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def hostnames(env: dict[str, str], hostlist: str) -> list[str]:
    out = subprocess.run(
        ["scontrol", "show", "hostnames", hostlist],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return out.split()


def read_lines(path: Path) -> list[list[str]]:
    try:
        return [x.split() for x in path.read_text().splitlines() if x.strip()]
    except OSError:
        return []


def job_pids(node: str, job: str) -> list[int]:
    """The processes Slurm started for ``job`` on the virtual ``node`` (by their environment:
    every virtual node of the lab is this one host)."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURMD_NODENAME={node}".encode() in env and f"SLURM_JOB_ID={job}".encode() in env:
            pids.append(int(p.name))
    return pids


class Injector:
    """The failure, injected by this script (never by the code under test) once the training
    reached its step: a node's slurmd and the job's processes on it SIGKILLed (Slurm marks it
    down once it misses its pings), or one rank (1) stopped with SIGSTOP, so that the others
    wait inside their next collective. ``kill`` is the training wrapper's own
    (train_faults.py ``TEST_FAULT``: SIGKILL of rank 0's worker after it reported the step)."""

    def __init__(self, env: dict[str, str], lab: str, fault: str, tmp: Path) -> None:
        self.env, self.lab, self.tmp = env, Path(lab), tmp
        self.plan: list[tuple[str, int]] = []
        if fault in ("node", "hang"):
            self.plan.append((fault, INJECT_AT[fault]))
        if fault == "kill+hang":
            self.plan.append(("hang", SECOND_AT))
        self.done: list[tuple[str, float, str]] = []  # (kind, when, what)
        self.stopped: list[int] = []
        self.victims: list[str] = []

    def poll(self, job: str, step: int) -> None:
        if not self.plan or step < self.plan[0][1]:
            return
        kind, _ = self.plan[0]
        rec = record(self.env, job)
        if rec.get("JobState") != "RUNNING":
            return
        what = self.lose_node(job, rec) if kind == "node" else self.stop_rank()
        if what:
            self.plan.pop(0)
            self.done.append((kind, time.time(), what))
            print(f"  injected {kind}: {what}", flush=True)

    def lose_node(self, job: str, rec: dict[str, str]) -> str:
        nodes = hostnames(self.env, rec.get("NodeList", ""))
        victim = next((n for n in nodes if n != rec.get("BatchHost")), "")
        if not victim:
            return ""
        pid_file = self.lab / "run" / f"slurmd-{victim}.pid"
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        for pid in job_pids(victim, job):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.victims.append(victim)
        return victim

    def stop_rank(self) -> str:
        starts = [x for x in read_lines(self.tmp / "timeline.starts") if x[2] == "1"]
        if not starts:
            return ""
        pid = int(starts[-1][1])
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return ""
        self.stopped.append(pid)
        return f"rank 1 (pid {pid})"

    def restore(self, nodes: int) -> None:
        """Bring killed slurmds back and the nodes into service for the next run."""
        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.victims:
            subprocess.run(
                [str(REPO / "scripts" / "slurm-lab"), "--lab", str(self.lab), "--nodes",
                 str(nodes), "up"],
                env=self.env, capture_output=True, check=False,
            )  # fmt: skip
            for v in self.victims:
                subprocess.run(
                    ["scontrol", "update", f"NodeName={v}", "State=RESUME"],
                    env=self.env, capture_output=True, check=False,
                )  # fmt: skip


def wait_end(
    env: dict[str, str], job: str, timeout: float, inj: Injector, tmp: Path, stall_s: float
) -> tuple[dict[str, str], float | None]:
    """Poll until Slurm says the job ended, injecting the failure on the way; the time this
    script cancelled it, if it had to: no new step for ``stall_s`` while the job runs, after
    training began (a hang nobody detects, as gloo's own timeout is 30 minutes, or a restart
    stuck).
    A requeued job waiting on BeginTime is released after 20 s (as tests/resilience does),
    for every arm alike."""
    deadline = time.monotonic() + timeout
    held: float | None = None
    rec: dict[str, str] = {}
    while time.monotonic() < deadline:
        rec = record(env, job)
        if rec.get("JobState") in DONE:
            return rec, None
        lines = read_lines(tmp / "timeline")
        step = int(lines[-1][2]) if lines else 0
        inj.poll(job, step)
        # the stuck-run clock also restarts at each start of the job (a requeue)
        started = epoch(rec.get("StartTime", "")) or 0.0
        marks = [t for _, t, _ in inj.done] + ([float(lines[-1][0])] if lines else [started])
        marks.append(started)
        last = max(marks, default=0.0)
        if lines and rec.get("JobState") == "RUNNING" and time.time() - last > stall_s:
            print(f"  no step for {stall_s:g} s (running): cancelled", flush=True)
            cancelled = time.time()
            subprocess.run(["scancel", job], env=env, check=False)
            time.sleep(3)
            return record(env, job), cancelled
        if rec.get("JobState") == "PENDING" and rec.get("Reason") == "BeginTime":
            held = held or time.monotonic()
            if time.monotonic() - held > 20:
                subprocess.run(
                    ["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, check=False
                )
                held = None
        else:
            # each requeue's hold is timed from its own start: a job that Slurm started before
            # the release (backfill) must not carry the clock into its next requeue, which
            # would then be released at once
            held = None
        time.sleep(0.5)
    subprocess.run(["scancel", job], env=env, check=False)
    raise SystemExit(f"job {job} not done after {timeout:g} s: {rec}")


def train_args(steps: int, sleep: float) -> list[str]:
    return ["--steps", str(steps), "--checkpoint-every", "5", "--sleep", str(sleep)]


def submit_slurmfm(
    env: dict[str, str], tmp: Path, fault_env: dict[str, str], steps: int, limit: int, a: Any
) -> str:
    args = ", ".join(f"'{x}'" for x in train_args(steps, a.sleep))
    sets = [
        f"storage.checkpoint_root={tmp}/ckpt",
        f"storage.log_dir={tmp}/logs",
        f"launcher.script={FAULTS}",
        f"launcher.args=[{args}]",
        f"resources.nodes={a.nodes}",
        "resources.procs_per_node=1",
        "resilience.max_restarts=6",
        f"resilience.hang_timeout={a.hang_timeout}",
        f"resources.time_limit={limit}",
        f"resilience.save_before_timeout_s={a.save_s}",
        *[f"env.{k}={v}" for k, v in fault_env.items()],
    ]
    cmd = [str(Path(sys.executable).parent / "slurmfm"), "submit", "recipes/quickstart.yaml"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return proc.stdout.strip().splitlines()[-1]


def aws_script(
    tmp: Path, fault_env: dict[str, str], careful: bool, steps: int, limit: int, a: Any
) -> str:
    """The AWS sample's launch (its torchrun arguments, one srun), for this training."""
    torchrun = Path(sys.executable).parent / "torchrun"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in fault_env.items())
    restarts = " --max-restarts=3" if careful else ""
    return (
        "#!/bin/bash\n"
        f"#SBATCH --nodes={a.nodes}\n"
        "#SBATCH --job-name=bench-aws\n"
        f"#SBATCH --time={limit}\n"
        f"#SBATCH --output={tmp}/logs/%x_%j.out\n"
        + ("#SBATCH --requeue\n" if careful else "#SBATCH --no-requeue\n")
        + "set -ex\n"
        f"export PYTHONPATH={shlex.quote(str(REPO))} OMP_NUM_THREADS=1\n"
        f"export SLURMFM_CHECKPOINT_DIR={shlex.quote(str(tmp / 'ckpt'))}\n"
        + exports
        + f"srun -l {torchrun} --nproc_per_node=1 --nnodes=$SLURM_JOB_NUM_NODES "
        "--rdzv_id=$SLURM_JOB_ID --rdzv_backend=c10d --rdzv_endpoint=$(hostname)"
        f"{restarts} {FAULTS} {' '.join(train_args(steps, a.sleep))}\n"
    )


def submit_sbatch(
    env: dict[str, str],
    tmp: Path,
    fault_env: dict[str, str],
    careful: bool,
    steps: int,
    limit: int,
    a: Any,
) -> str:
    (tmp / "logs").mkdir(parents=True, exist_ok=True)
    script = tmp / "job.sbatch"
    script.write_text(aws_script(tmp, fault_env, careful, steps, limit, a))
    proc = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return proc.stdout.strip().split(";")[0]


class SubmititTraining:
    """submitit's checkpointable job (facebookincubator/submitit docs/checkpointing.md): each
    task runs one training process with torch's environment (``env://``) from submitit's
    JobEnvironment; ``checkpoint`` (called on the time limit's signal, USR2) resubmits the
    same job, which resumes from the training's last periodic checkpoint."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env = argv, env

    def __call__(self) -> int:
        import submitit  # type: ignore[import-not-found, unused-ignore]

        je = submitit.JobEnvironment()
        head = je.hostnames[0]
        try:
            socket.gethostbyname(head)
        except OSError:
            head = socket.gethostname()  # the lab's virtual nodes are names on one host
        env = dict(os.environ, **self.env)
        env.update(
            RANK=str(je.global_rank),
            LOCAL_RANK=str(je.local_rank),
            WORLD_SIZE=str(je.num_tasks),
            MASTER_ADDR=head,
            MASTER_PORT=str(20000 + int(je.job_id) % 10000),
        )
        rc = subprocess.call([sys.executable, *self.argv], env=env)
        if rc != 0:
            raise RuntimeError(f"training exited {rc}")
        return rc

    def checkpoint(self) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(SubmititTraining(self.argv, self.env))


def submit_submitit(
    env: dict[str, str], tmp: Path, fault_env: dict[str, str], steps: int, limit: int, a: Any
) -> str:
    import submitit

    site = str(Path(submitit.__file__).resolve().parent.parent)
    job_env = dict(fault_env, OMP_NUM_THREADS="1", SLURMFM_CHECKPOINT_DIR=str(tmp / "ckpt"))
    ex = submitit.SlurmExecutor(folder=str(tmp / "submitit" / "%j"), max_num_timeout=6)
    ex.update_parameters(
        nodes=a.nodes,
        ntasks_per_node=1,
        time=limit,
        signal_delay_s=a.save_s,
        job_name="bench-submitit",
        setup=[f"export PYTHONPATH={shlex.quote(str(REPO) + os.pathsep + site)}"],
    )
    saved = dict(os.environ)
    os.environ.update(env)  # submitit runs sbatch with this process's environment
    try:
        job = ex.submit(SubmititTraining([str(FAULTS), *train_args(steps, a.sleep)], job_env))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return str(job.job_id)


def measure(
    tmp: Path, submitted: float, ended: float, steps: int, cut: float | None = None
) -> dict[str, Any]:
    """ETTR and each failure's cost from the training's own timeline (every report with its
    time and pid, unthrottled) and its workers' starts (train_faults.py ``TEST_TIMELINE``).
    ``cut``: when this script cancelled the run; later steps do not count (scancel sends a
    stopped rank SIGCONT before SIGTERM, and the others may finish one more step)."""
    launches: list[list[tuple[float, int, str]]] = []
    pid = None
    for t, p, step, saved in read_lines(tmp / "timeline"):
        if cut is not None and float(t) > cut:
            break
        if p != pid:
            launches.append([])
            pid = p
        launches[-1].append((float(t), int(step), saved))
    starts = sorted(float(x[0]) for x in read_lines(tmp / "timeline.starts"))
    wall = ended - submitted
    out: dict[str, Any] = {"wall_s": wall, "launches": len(launches)}
    last = max((s for launch in launches for _, s, _ in launch), default=0)
    out["finished"] = last >= steps
    out["startup_s"] = launches[0][0][0] - submitted if launches else None
    productive = 0.0
    failures: list[dict[str, Any]] = []
    for i, launch in enumerate(launches):
        if i + 1 < len(launches):
            nxt = launches[i + 1]
            resumed = nxt[0][1] - 1
            kept = [t for t, s, c in launch if s == resumed and c == str(resumed)]
            until = kept[0] if kept else launch[0][0]
            ended_at = launch[-1][0]
            restarted = [t for t in starts if ended_at < t <= nxt[0][0]]
            failures.append(
                {
                    "launch_from": launch[0][0],
                    "last_step_at": ended_at,
                    "next_at": nxt[0][0],
                    "new_process_at": restarted[0] if restarted else None,
                    "recomputed_steps": max(s for _, s, _ in launch) - resumed,
                    # from the last step before the failure (its injection for a kill)
                    "to_new_process_s": restarted[0] - ended_at if restarted else None,
                    "to_training_s": nxt[0][0] - ended_at,
                    # from the checkpoint the next launch resumed from: all the failure cost
                    "lost_s": nxt[0][0] - until,
                }
            )
        else:
            until = launch[-1][0]
        productive += until - launch[0][0]
    out["failures"] = failures
    out["productive_s"] = productive
    out["ettr"] = productive / wall if wall > 0 else None
    return out


def _ctld_times(lab: Path, job: str) -> tuple[list[float], list[float]]:
    """When slurmctld (the lab's log, local time) allocated ``job`` (each start) and
    requeued it."""
    starts, requeues = [], []
    try:
        lines = (lab / "log" / "slurmctld.log").read_text(errors="replace").splitlines()
    except OSError:
        return [], []
    for line in lines:
        m = re.match(r"\[(\S+?)(?:\.(\d+))?\] (.*)$", line)
        if not m:
            continue
        t = epoch(m.group(1))
        if t is None:
            continue
        t += float("0." + m.group(2)) if m.group(2) else 0.0
        rest = m.group(3)
        if re.search(rf"(Allocate|Started) JobId={job}\b", rest):
            starts.append(t)
        elif rest == f"Requeuing JobId={job}":
            requeues.append(t)
    return starts, requeues


def _signal_times(tmp: Path) -> list[float]:
    """When the time limit's USR2 reached the arm's own code: slurmfm's state file
    (``event=signal``, whole seconds, UTC) or submitit's rank-0 log ("Caught signal")."""
    out = []
    for f in (tmp / "logs").glob("*.state"):
        for line in f.read_text(errors="replace").splitlines():
            if " event=signal " in line:
                with contextlib.suppress(ValueError):
                    stamp = time.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%SZ")
                    out.append(float(calendar.timegm(stamp)))
    for f in (tmp / "submitit").glob("*/*_0_log.err"):
        for line in f.read_text(errors="replace").splitlines():
            m = re.search(r"\((\S+ \S+),(\d+)\) - Caught signal", line)
            if m:
                t = epoch(m.group(1).replace(" ", "T"))
                if t is not None:
                    out.append(t + int(m.group(2)) / 1000)
    return sorted(out)


def phases(failures: list[dict[str, Any]], lab: Path, job: str, tmp: Path) -> None:
    """Where each requeue's time went, from the signal to training again: the pre-timeout
    signal, the launch's last report (the save, where the arm saves on the signal), the
    job's end (slurmctld's "Requeuing"), its next start ("Allocate"/"Started"), the new
    worker process and its first step. Added to each failure that a requeue ended."""
    starts, requeues = _ctld_times(lab, job)
    signals = _signal_times(tmp)
    for f in failures:
        end = min((q for q in requeues if q >= f["last_step_at"] - 1.0), default=None)
        if end is None or end > f["next_at"]:
            continue
        start = min((a for a in starts if a > end), default=None)
        sig = max((x for x in signals if f["launch_from"] <= x <= end), default=None)
        f["signal_at"], f["job_end_at"], f["job_start_at"] = sig, end, start
        f["phases"] = {
            "signal -> last report": f["last_step_at"] - sig if sig is not None else None,
            "last report -> job end": end - f["last_step_at"],
            "job end -> job start": start - end if start is not None else None,
            "job start -> new process": (
                f["new_process_at"] - start
                if start is not None and f["new_process_at"] is not None
                else None
            ),
            "new process -> first step": (
                f["next_at"] - f["new_process_at"] if f["new_process_at"] is not None else None
            ),
        }


def attribute(failures: list[dict[str, Any]], injected: list[float]) -> None:
    """Count detection and restart from the injection (this script's clock) instead of the
    last step before it, for the failure whose span (its launch's first step to the next
    launch's first step) holds the injection; a kill by the training wrapper follows its
    step at once, so its last step is its time."""
    for at in injected:
        for f in failures:
            if f["launch_from"] <= at < f["next_at"]:
                f["to_training_s"] = f["next_at"] - at
                if f["new_process_at"] is not None:
                    f["to_new_process_s"] = f["new_process_at"] - at


def one(env: dict[str, str], tmp: Path, arm: str, fault: str, a: Any) -> dict[str, Any]:
    fault_env = {"TEST_TIMELINE": str(tmp / "timeline")}
    if fault in ("kill", "kill+hang"):
        fault_env["TEST_FAULT"] = f"kill:{INJECT_AT['kill']}:{tmp / 'once'}"
    steps = a.limit_steps if fault == "limit" else a.steps
    limit = a.limit_min if fault == "limit" else 60
    inj = Injector(env, a.lab, fault, tmp)
    submitted = time.time()
    if arm == "slurmfm":
        job = submit_slurmfm(env, tmp, fault_env, steps, limit, a)
    elif arm == "submitit":
        job = submit_submitit(env, tmp, fault_env, steps, limit, a)
    else:
        job = submit_sbatch(env, tmp, fault_env, arm == "aws-careful", steps, limit, a)
    try:
        stall = a.node_stall_s if fault == "node" else a.stall_s
        rec, cancelled = wait_end(env, job, a.timeout, inj, tmp, stall)
        return result(env, tmp, arm, fault, job, rec, cancelled, stall, inj, submitted, steps)
    finally:
        # after the report: bringing a killed slurmd back may restart the lab's slurmctld,
        # and with it go the records of ended jobs the report reads
        inj.restore(a.lab_nodes)


def result(
    env: dict[str, str],
    tmp: Path,
    arm: str,
    fault: str,
    job: str,
    rec: dict[str, str],
    cancelled: float | None,
    stall: float,
    inj: Injector,
    submitted: float,
    steps: int,
) -> dict[str, Any]:
    """One run's measurement, and for slurmfm its goodput ledger (``slurmfm report``)."""
    ended = (epoch(rec.get("EndTime", "")) or time.time()) + 0.5  # EndTime: whole seconds
    res = measure(tmp, submitted, ended, steps, cancelled)
    res.update(
        dir=str(tmp),
        arm=arm,
        fault=fault,
        job=job,
        state=rec.get("JobState", ""),
        restarts=int(rec.get("Restarts", "0") or 0),
        cancelled_hung=cancelled is not None,
        cancelled_at=cancelled,
        stall_s=stall,
        injected=[{"kind": k, "at": t, "what": w} for k, t, w in inj.done],
    )
    attribute(res["failures"], [t for _, t, _ in inj.done])
    phases(res["failures"], inj.lab, job, tmp)
    if arm == "slurmfm":
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "slurmfm"), "report", job, "--json"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            led = json.loads(proc.stdout)["goodput"]
            res["ledger_ettr"] = led.get("ettr")
            res["ledger"] = led
        except (ValueError, KeyError):
            res["ledger_ettr"] = None
    return res


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _first(r: dict[str, Any], key: str) -> float | None:
    fs = r.get("failures") or []
    return fs[0][key] if fs and fs[0].get(key) is not None else None


def recovered(r: dict[str, Any]) -> bool:
    return bool(r["finished"]) and not r.get("cancelled_hung")


def _s(v: float | None, none: str = "-") -> str:
    return none if v is None else f"{v:.1f} s"


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: arm x failure kind, medians over the runs that recovered."""
    rows = [
        "| failure | arm | runs | recovered | ETTR (median) | restarts | failure -> new process "
        "| failure -> training again | lost per failure | steps recomputed | ledger ETTR |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fault in FAULT_KINDS:
        for arm in ARMS:
            rs = [r for r in results if r["arm"] == arm and r["fault"] == fault]
            if not rs:
                continue
            ok = [r for r in rs if recovered(r)]
            ettr = _med([r["ettr"] for r in ok if r["ettr"] is not None])
            meds = {
                k: _med([v for v in (_first(r, k) for r in ok) if v is not None])
                for k in ("to_new_process_s", "to_training_s", "lost_s", "recomputed_steps")
            }
            ledger = _med([r["ledger_ettr"] for r in ok if r.get("ledger_ettr") is not None])
            never = "-" if fault == "none" else "unbounded"
            if not ok:
                why = sorted({"stuck, cancelled" if r.get("cancelled_hung") else r["state"]
                              for r in rs})  # fmt: skip
                rows.append(
                    f"| {fault} | {arm} | {len(rs)} | 0/{len(rs)}: {', '.join(why)} | "
                    f"no recovery | - | {never} | {never} | {never} | - | - |"
                )
                continue
            # launches seen in the timeline, or Slurm's requeues (some start nothing)
            restarts = _med(
                [float(max(len(r.get("failures") or []), r.get("restarts", 0))) for r in ok]
            )
            rec = meds["recomputed_steps"]
            rows.append(
                f"| {fault} | {arm} | {len(rs)} | {len(ok)}/{len(rs)} | "
                + (f"{100 * ettr:.1f} %" if ettr is not None else "-")
                + f" | {restarts:g}"
                + f" | {_s(meds['to_new_process_s'])} | {_s(meds['to_training_s'])}"
                + f" | {_s(meds['lost_s'])} | "
                + (f"{rec:g}" if rec is not None else "-")
                + " | "
                + (f"{100 * ledger:.1f} %" if ledger is not None else "-")
                + " |"
            )
    return "\n".join(rows)


def phase_table(results: list[dict[str, Any]]) -> str:
    """Markdown: each arm's requeues split into phases (:func:`phases`), medians over every
    requeue, those of a run that did not recover in the end too (each requeue resumed);
    empty where no run was requeued."""
    names = [
        "signal -> last report",
        "last report -> job end",
        "job end -> job start",
        "job start -> new process",
        "new process -> first step",
    ]
    rows = []
    for fault in FAULT_KINDS:
        for arm in ARMS:
            fs = [
                f["phases"]
                for r in results
                if r["arm"] == arm and r["fault"] == fault
                for f in r.get("failures") or []
                if f.get("phases")
            ]
            if not fs:
                continue
            meds = [_med([x[n] for x in fs if x.get(n) is not None]) for n in names]
            rows.append(
                f"| {fault} | {arm} | {len(fs)} | " + " | ".join(_s(m) for m in meds) + " |"
            )
    if not rows:
        return ""
    head = "| failure | arm | requeues | " + " | ".join(names) + " |"
    return "\n".join([head, "|---|---|---|" + "---|" * len(names), *rows])


def parts(r: dict[str, Any]) -> dict[str, float]:
    """Where one run's wall time went, as this script measured it."""
    startup = r.get("startup_s") or 0.0
    lost = sum(f["lost_s"] for f in r.get("failures") or [])
    productive = r.get("productive_s") or 0.0
    return {
        "start-up": startup,
        "productive": productive,
        "lost to failures and requeues": lost,
        "other (end, saves, teardown)": max(0.0, r["wall_s"] - startup - lost - productive),
    }


def chart(results: list[dict[str, Any]], path: str) -> str:
    """A PNG of where each arm's time went (the median-ETTR run of each arm and failure kind
    that recovered); matplotlib is optional: without it, say so."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib is not installed"
    labels, rows = [], []
    for fault in FAULT_KINDS:
        for arm in ARMS:
            ok = sorted(
                (r for r in results if r["arm"] == arm and r["fault"] == fault and recovered(r)),
                key=lambda r: r["ettr"] or 0.0,
            )
            if ok:
                labels.append(f"{fault} / {arm}")
                rows.append(parts(ok[len(ok) // 2]))
            elif any(r["arm"] == arm and r["fault"] == fault for r in results):
                labels.append(f"{fault} / {arm}: no recovery")
                rows.append({})
    if not rows:
        return "no chart: no runs"
    names = list(parts(results[0]))
    colors = ["#bbbbbb", "#2a9d8f", "#e76f51", "#e9c46a"]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.4))
    left = [0.0] * len(rows)
    for name, color in zip(names, colors, strict=True):
        vals = [row.get(name, 0.0) for row in rows]
        ax.barh(labels, vals, left=left, color=color, label=name)
        left = [x + v for x, v in zip(left, vals, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds of wall time (submission to end)")
    ax.set_title("Where each arm's time went (scripts/bench_goodput.py)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"chart: {path}"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--lab", help="a running lab's directory (at least --nodes + 1 nodes)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each arm and failure kind")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--faults", default=",".join(FAULT_KINDS[:5]))
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--lab-nodes", type=int, default=5, help="the lab's size, to restore it")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sleep", type=float, default=0.8, help="seconds per training step")
    ap.add_argument("--limit-min", type=int, default=2, help="time limit of the limit runs")
    ap.add_argument("--limit-steps", type=int, default=150, help="steps of the limit runs")
    ap.add_argument("--save-s", type=int, default=45, help="pre-timeout signal, s before")
    ap.add_argument("--hang-timeout", default="30s", help="slurmfm's resilience.hang_timeout")
    ap.add_argument("--stall-s", type=float, default=300, help="no step while running: cancel")
    ap.add_argument(
        "--node-stall-s",
        type=float,
        default=900,
        help="--stall-s of the node runs: Slurm's own notice of a lost node (SlurmdTimeout, "
        "300 s by default), a requeue and a slow start-up come first",
    )
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--json", help="write every run's measurement here")
    ap.add_argument("--png", help="write the chart here (needs matplotlib)")
    ap.add_argument(
        "--table-from",
        nargs="+",
        metavar="JSON",
        help="only print the table (and --png) of earlier runs' --json files",
    )
    a = ap.parse_args()
    if a.table_from:
        merged = [r for f in a.table_from for r in json.loads(Path(f).read_text())]
        for r in merged:  # each failure measured again from the run's kept timeline
            if r.get("dir") and Path(r["dir"], "timeline").exists():
                again = measure(Path(r["dir"]), 0.0, 0.0, 0, r.get("cancelled_at"))
                r["failures"] = again["failures"]
                attribute(r["failures"], [x["at"] for x in r.get("injected", [])])
                # the run's directory is <lab>/bench-goodput-*/<run>: the lab's slurmctld log
                phases(r["failures"], Path(r["dir"]).parent.parent, r["job"], Path(r["dir"]))
        print(table(merged))
        print(phase_table(merged))
        if a.png:
            print(chart(merged, a.png))
        return 0
    arms = [x for x in a.arms.split(",") if x]
    faults = [x for x in a.faults.split(",") if x]
    for x in arms:
        if x not in ARMS:
            ap.error(f"--arms: {x!r} is not one of {', '.join(ARMS)}")
    for x in faults:
        if x not in FAULT_KINDS:
            ap.error(f"--faults: {x!r} is not one of {', '.join(FAULT_KINDS)}")
    if not a.lab:
        ap.error("--lab is required")
    if "submitit" in arms:
        try:
            import submitit  # noqa: F401
        except ImportError:
            ap.error("--arms submitit: submitit is not importable (pip install submitit)")
    env = lab_env(a.lab)
    results: list[dict[str, Any]] = []
    # kept: each run's logs and state file, to look into a run that did not recover
    d = tempfile.mkdtemp(prefix="bench-goodput-", dir=a.lab)
    print(f"runs in {d}", flush=True)
    for i in range(a.runs):
        for fault in faults:
            for arm in arms:  # alternating: every arm once per round
                tmp = Path(d) / f"{arm}-{fault}-{i}"
                tmp.mkdir()
                try:
                    r = one(env, tmp, arm, fault, a)
                except (Exception, SystemExit) as e:  # one arm's breakage ends no schedule
                    r = {"arm": arm, "fault": fault, "error": str(e)[-500:], "state": "ERROR",
                         "finished": False, "wall_s": 0.0, "ettr": None}  # fmt: skip
                results.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "ledger"}), flush=True)
                if a.json:  # after every run: a long schedule cut short keeps what it measured
                    Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    print()
    print(" ".join(["scripts/bench_goodput.py", *sys.argv[1:]]))
    print(table(results))
    print(phase_table(results))
    if a.png:
        print(chart(results, a.png))
    return 0


if __name__ == "__main__":
    sys.exit(main())
