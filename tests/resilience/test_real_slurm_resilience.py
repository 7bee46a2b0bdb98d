"""Resilience on the real local Slurm (22.05), with the CPU torch job (gloo) of the quickstart.

Its own small lab (4 nodes, own ports) so that drained and killed nodes never disturb other
tests. Checked from the jobs' own logs (append mode keeps every restart's output):

* time limit near -> USR2 -> the job saves -> requeues itself -> resumes at the next step;
* a node dies mid-job (its slurmd and the job's processes on it are killed) -> the job sets it
  DOWN, requeues, and resumes from the last checkpoint on other nodes;
* a finished short run resubmitted with more steps trains on (its DONE marker is stale);
* preflight refuses impossible requests with Slurm's reason, exit 2, nothing queued;
* issue 15's faults with the fast stand-ins (no torch): a save that outlasts the window, slurmctld
  away at a failed step, the restart cap;
* the health gate inside the launch step (p5 stand-ins: nvidia-smi and a sysfs tree): no step
  of its own, and a node failing the gate drained before any node starts the training.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import (
    OwnLab,
    SlurmLab,
    job_record,
    own_lab_fixture,
    read_text,
    signal_batch_until_recorded,
    wait_for_text,
    wait_job_done,
    wait_until,
)

from slurmfm.backends.slurm_cli import parse_scontrol_record

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]

RESIL = OwnLab("resil", ctld_port=16887, slurmd_port=17101, nodes=4)
# A second lab of the same shape for the fault scenarios of issue 15 (restart cap, a save that
# outlasts the window, slurmctld away): its xdist group runs beside the first one's, so the
# real tier is not one long queue of resilience tests on one worker.
RESIL2 = OwnLab("resil2", ctld_port=16897, slurmd_port=17151, nodes=4)
STANDINS = Path(__file__).resolve().parents[1] / "standins"
# torchrun and the training replaced by stand-ins that start in milliseconds (same arguments,
# events and checkpoint contract): these tests are about Slurm and the job runtime, not torch.
FAST = (
    f"launcher.python={STANDINS / 'torchrun.py'}",
    f"launcher.script={STANDINS / 'train_fast.py'}",
)


def _resil(own: OwnLab) -> Iterator[SlurmLab]:
    lab = own.up()
    yield lab
    lab.run(["scancel", "--user=root"])
    # bring killed slurmds back (slurmctld may not have noticed them yet) and undrain
    own.command("--nodes", str(own.nodes), "up", timeout=300)
    lab.run(["scontrol", "update", "NodeName=node[001-004]", "State=RESUME"])


@pytest.fixture(scope="module")
@own_lab_fixture(RESIL)
def resil_lab() -> Iterator[SlurmLab]:
    yield from _resil(RESIL)


@pytest.fixture(scope="module")
@own_lab_fixture(RESIL2)
def resil2_lab() -> Iterator[SlurmLab]:
    yield from _resil(RESIL2)


def events(log: str) -> list[dict[str, Any]]:
    return [json.loads(m.group(0)) for m in re.finditer(r'\{"event"[^{}]*\}', log)]


def wait_for_event(
    log_path: Path, what: str, event: str, timeout: float, min_step: int | None = None
) -> None:
    """Wait until the job's log holds an ``event`` record (at ``min_step`` or later)."""

    def seen() -> bool:
        return any(
            e["event"] == event and (min_step is None or e["step"] >= min_step)
            for e in events(read_text(log_path))
        )

    wait_until(what, seen, timeout, lambda: read_text(log_path))


def submit(lab: SlurmLab, tmp: Path, *sets: str) -> str:
    proc = lab.slurmfm(
        "submit",
        "recipes/quickstart.yaml",
        "--set",
        f"storage.checkpoint_root={tmp}/ckpt",
        "--set",
        f"storage.log_dir={tmp}/logs",
        *[x for s in sets for x in ("--set", s)],
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


job = job_record
wait_done = wait_job_done


def check_steps(ev: list[dict[str, Any]], total: int, interval: int) -> None:
    """Steps 1..total all ran; a step repeats only when a restart resumed before it."""
    steps = [e["step"] for e in ev if e["event"] == "step"]
    assert set(steps) == set(range(1, total + 1)), sorted(set(range(1, total + 1)) - set(steps))
    resumes = [e["step"] for e in ev if e["event"] == "resume"]
    repeats = len(steps) - len(set(steps))
    assert repeats <= interval * len(resumes), (repeats, resumes)


def test_time_limit_save_requeue_resume(resil_lab: SlurmLab, tmp_path: Path) -> None:
    total = 240
    job_id = submit(
        resil_lab,
        tmp_path,
        "resources.procs_per_node=1",  # one torch worker per node: ~5 s of CPU each
        "resources.time_limit=2",
        "resilience.save_before_timeout_s=75",
        "resilience.max_restarts=6",
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '20', --sleep, '0.25']",
    )
    # Once one save -> requeue cycle has happened (what this test is about), give the job room
    # to finish: how many 2-minute attempts 240 steps need depends on how fast torch starts on a
    # loaded machine, and past the restart cap the job rightly ends FAILED (issue 15 item 1).
    state_path = tmp_path / "logs" / f"quickstart_{job_id}.state"
    wait_for_text(state_path, "event=requeue saved before the time limit", 400)
    upd = resil_lab.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"])
    assert upd.returncode == 0, upd.stderr
    rec = wait_done(resil_lab, job_id, timeout=900)
    log = (tmp_path / "logs" / f"quickstart_{job_id}.out").read_text()
    ev = events(log)
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) >= 1
    saved = [e["step"] for e in ev if e["event"] == "saved-before-timeout"]
    resumed = [e["step"] for e in ev if e["event"] == "resume"]
    assert saved, log[-3000:]
    assert resumed[: len(saved)] == saved  # each run resumes exactly where the last one saved
    check_steps(ev, total, interval=0)  # a pre-timeout save loses nothing
    assert "USR2 received: asking the training processes to save and exit" in log
    state = (tmp_path / "logs" / f"quickstart_{job_id}.state").read_text()
    assert "event=requeue saved before the time limit" in state
    st = resil_lab.slurmfm("status", job_id, "--json")
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    assert info["restarts"] >= 1
    assert info["last_requeue_reason"].startswith("saved before the time limit")
    assert info["last_checkpoint"].endswith(f"step_{total:09d}")


def test_finished_short_run_resubmitted_with_more_steps_trains_on(
    resil_lab: SlurmLab, tmp_path: Path
) -> None:
    """15.2: the 20-step run's DONE marker must not end the 120-step run at its first save.

    The save comes from Slurm's own path for the pre-timeout signal, sent at once: the recipe's
    ``--signal=B:USR2@N`` makes Slurm signal the batch step only, which is what
    ``scancel --batch --signal=USR2`` does (https://slurm.schedmd.com/scancel.html). Waiting for a
    real time limit is test_time_limit_save_requeue_resume's subject. The DONE marker, the
    resume and the save request are the job runtime's and ``slurmfm.checkpoint``'s, not torch's:
    the training is the stand-in with the quickstart trainer's contract (FAST).
    """
    short = submit(
        resil_lab, tmp_path, *FAST, "launcher.args=[--steps, '20', --checkpoint-every, '10']"
    )
    assert wait_done(resil_lab, short, timeout=300)["JobState"] == "COMPLETED"
    marker = json.loads((tmp_path / "ckpt" / "quickstart" / "quickstart" / "DONE").read_text())
    assert (marker["job_id"], marker["steps"]) == (short, 20)
    total = 120
    job_id = submit(
        resil_lab,
        tmp_path,
        *FAST,
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '20', --sleep, '0.1']",
    )
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    wait_for_event(log_path, "training past the old run's 20 steps", "step", 240, min_step=21)
    signal_batch_until_recorded(resil_lab, job_id, tmp_path / "logs" / f"quickstart_{job_id}.state")
    rec = wait_done(resil_lab, job_id, timeout=400)
    log = log_path.read_text()
    ev = events(log)
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) >= 1, log[-3000:]
    saved = [e["step"] for e in ev if e["event"] == "saved-before-timeout"]
    assert len(saved) == 1, log[-3000:]
    assert saved[0] > 20
    # the short run's checkpoint, then exactly where the signal's save left off
    assert [e["step"] for e in ev if e["event"] == "resume"] == [20, saved[0]]
    steps = [e["step"] for e in ev if e["event"] == "step"]
    assert sorted(steps) == list(range(21, total + 1))  # each step once: nothing lost or redone
    assert [e["steps"] for e in ev if e["event"] == "done"] == [total]
    state = (tmp_path / "logs" / f"quickstart_{job_id}.state").read_text()
    assert f"stale DONE marker (written by job {short} for another launch, steps 20)" in state
    assert "event=requeue saved before the time limit" in state
    marker = json.loads((tmp_path / "ckpt" / "quickstart" / "quickstart" / "DONE").read_text())
    assert (marker["job_id"], marker["steps"]) == (job_id, total)


def node_processes(node: str, job_id: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURMD_NODENAME={node}".encode() in env and f"SLURM_JOB_ID={job_id}".encode() in env:
            pids.append(int(p.name))
    return pids


def test_node_death_requeue_resume(resil_lab: SlurmLab, tmp_path: Path) -> None:
    total, every = 240, 10
    job_id = submit(
        resil_lab,
        tmp_path,
        "resources.procs_per_node=1",  # one torch worker per node: ~5 s of CPU each
        "resilience.save_before_timeout_s=0",
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '{every}', --sleep, '0.2']",
    )
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    wait_for_event(
        log_path,
        f"a checkpoint at step {2 * every} or later",
        "checkpoint",
        180,
        min_step=2 * every,
    )
    rec = job(resil_lab, job_id)
    nodes = resil_lab.hostnames(rec["NodeList"])
    victim = next(n for n in nodes if n != rec["BatchHost"])
    pid_file = resil_lab.lab_dir / "run" / f"slurmd-{victim}.pid"
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    for pid in node_processes(victim, job_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    rec = wait_done(resil_lab, job_id, timeout=600)
    log = log_path.read_text()
    ev = events(log)
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) >= 1
    assert victim not in resil_lab.hostnames(rec["NodeList"])
    resumed = [e["step"] for e in ev if e["event"] == "resume"]
    assert resumed
    assert resumed[0] >= 2 * every
    check_steps(ev, total, interval=every)
    state = (tmp_path / "logs" / f"quickstart_{job_id}.state").read_text()
    assert f"unresponsive: {victim}" in state
    node = parse_scontrol_record(resil_lab.run(["scontrol", "show", "node", "-o", victim]).stdout)
    assert "DOWN" in node["State"] or "DRAIN" in node["State"]
    assert "slurmfm" in node.get("Reason", "")


@pytest.mark.parametrize(
    ("sets", "reason"),
    [
        (["resources.nodes=9"], "more nodes than the partition has"),
        (["cluster.partition=nosuch"], "the partition does not exist"),
        (
            ["cluster.partition=debug", "resources.time_limit=2:00:00"],
            "exceeds the partition's MaxTime",
        ),
    ],
)
def test_preflight_refuses_and_queues_nothing(
    resil_lab: SlurmLab, tmp_path: Path, sets: list[str], reason: str
) -> None:
    before = resil_lab.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    proc = resil_lab.slurmfm(
        "submit",
        "recipes/quickstart.yaml",
        "--set",
        f"storage.log_dir={tmp_path}/logs",
        *[x for s in sets for x in ("--set", s)],
    )
    assert proc.returncode == 2
    assert reason in proc.stderr
    assert "(Slurm: " in proc.stderr  # Slurm's own words are shown too
    assert proc.stdout == ""
    assert resil_lab.run(["squeue", "-h", "-o", "%i"]).stdout.split() == before


def test_save_outlasting_the_window_requeues_from_the_last_checkpoint(
    resil2_lab: SlurmLab, tmp_path: Path
) -> None:
    """15.3: Slurm's TERM at the time limit while the pre-timeout save still runs requeues.

    The pre-timeout signal is sent at once with ``scancel --batch --signal=USR2``, the request
    Slurm makes for the recipe's ``--signal=B:USR2@N`` (https://slurm.schedmd.com/scancel.html,
    https://slurm.schedmd.com/sbatch.html#OPT_signal). Once the slow save (``--save-sleep``) has
    begun, the time limit is cut to one minute (``scontrol update TimeLimit``), so Slurm itself
    ends the job at its limit with TERM (then KILL after the lab's ``KillWait``) while the save
    is still writing: the same path as a save longer than ``save_before_timeout_s``, without
    waiting for a long limit. The next attempt must resume from the last complete periodic
    checkpoint (the cut save left none) and finish.

    It takes 1.5 to 2 minutes, not seconds: a time limit is whole minutes and slurmctld tests
    limits every 30 s (``PERIODIC_TIMEOUT``, SchedMD/slurm:src/slurmctld/controller.c), and only
    a real limit shows whether ``scontrol requeue`` still works on a job Slurm is ending for it
    (a TERM sent by hand would not: Slurm ends nothing then).
    """
    total, every = 60, 5
    job_id = submit(
        resil2_lab,
        tmp_path,
        *FAST,
        "resilience.max_restarts=2",
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '{every}', --sleep, '0.2', "
        "--save-sleep, '600']",
    )
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    state_path = tmp_path / "logs" / f"quickstart_{job_id}.state"
    wait_for_event(log_path, "a periodic checkpoint", "checkpoint", 120)
    signal_batch_until_recorded(resil2_lab, job_id, state_path)
    wait_for_event(log_path, "the slow save", "saving", 60)
    cut = resil2_lab.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=1"])
    assert cut.returncode == 0, cut.stderr
    wait_until(
        "the requeue at the limit's TERM",
        lambda: "event=requeue the step outlasted the save window" in read_text(state_path),
        150,
    )
    # the requeued attempt gets a limit it can finish in
    back = resil2_lab.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"])
    assert back.returncode == 0, back.stderr
    rec = wait_done(resil2_lab, job_id, timeout=300)
    log = log_path.read_text()
    ev = events(log)
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) == 1, log[-3000:]
    saving = next(e["step"] for e in ev if e["event"] == "saving")
    assert not [e for e in ev if e["event"] == "saved-before-timeout"]  # the save never finished
    first = ev[: next(i for i, e in enumerate(ev) if e["event"] == "saving")]
    last_complete = max(e["step"] for e in first if e["event"] == "checkpoint")
    assert last_complete < saving
    assert [e["step"] for e in ev if e["event"] == "resume"] == [last_complete]
    check_steps(ev, total, interval=every)
    assert [e["steps"] for e in ev if e["event"] == "done"] == [total]
    state = state_path.read_text()
    assert "event=signal USR2 before the time limit" in state
    assert "event=give-up" not in state
    assert "event=fail" not in state


def test_slurmctld_away_at_a_failed_step_requeues_once_it_is_back(
    resil2_lab: SlurmLab, tmp_path: Path
) -> None:
    """15.4: slurmctld stopped, then the step fails: no node is judged, and the requeue is retried
    until slurmctld is back and recorded only once it has happened; the next attempt finishes.

    slurmctld is stopped with TERM (its pid file under the lab's ``run/``; it saves its state) and
    started again with that state by ``slurm-lab ctld-start`` (``up`` would start a fresh lab
    and lose the job); the ``finally`` brings it back whatever happens, so the next test finds
    a healthy lab. The step fails by
    ``train_fast --fail-if`` (rank 0 exits 3, the torchrun stand-in 1, listed as retryable).
    """
    total, every = 40, 5
    trigger = tmp_path / "fail-now"
    job_id = submit(
        resil2_lab,
        tmp_path,
        *FAST,
        "resilience.max_restarts=2",
        "resilience.retry_exit_codes=[1]",
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '{every}', --sleep, '0.2', "
        f"--fail-if, '{trigger}']",
    )
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    state_path = tmp_path / "logs" / f"quickstart_{job_id}.state"
    wait_for_event(log_path, "a periodic checkpoint", "checkpoint", 120)
    nodes = resil2_lab.hostnames(job(resil2_lab, job_id)["NodeList"])
    pid = int((resil2_lab.lab_dir / "run" / "slurmctld.pid").read_text())
    try:
        os.kill(pid, signal.SIGTERM)
        wait_until("slurmctld to stop", lambda: not Path(f"/proc/{pid}").exists(), 60)
        trigger.touch()
        wait_until(
            "the runtime to find slurmctld away and try to requeue",
            lambda: f"requeueing job {job_id}: step failed with exit 1" in read_text(log_path),
            120,
        )
        assert "slurmctld does not answer; not judging the nodes" in read_text(log_path)
        trigger.unlink()
        away = read_text(state_path)
        assert "event=requeue" not in away, away
        assert "event=fail" not in away, away
    finally:
        up = RESIL2.command("ctld-start", timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "started again" in up.stdout, up.stdout
    rec = wait_done(resil2_lab, job_id, timeout=300)
    log = log_path.read_text()
    ev = events(log)
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) == 1, log[-3000:]
    failed = next(e["step"] for e in ev if e["event"] == "fail")
    resumed = [e["step"] for e in ev if e["event"] == "resume"]
    assert resumed, log[-3000:]
    assert failed - every <= resumed[0] < failed, (failed, resumed)
    assert [e["steps"] for e in ev if e["event"] == "done"] == [total]
    state = state_path.read_text()
    assert "restart=0 event=requeue step failed with exit 1" in state, state
    assert "event=fail" not in state, state
    assert "unresponsive" not in state, state
    for node in nodes:  # no node was judged while slurmctld was away
        rec_n = parse_scontrol_record(
            resil2_lab.run(["scontrol", "show", "node", "-o", node]).stdout
        )
        assert "DOWN" not in rec_n["State"], rec_n
        assert "DRAIN" not in rec_n["State"], rec_n


def test_restart_cap_ends_failed_with_its_reason(resil2_lab: SlurmLab, tmp_path: Path) -> None:
    """15.1: a step that keeps failing with a retryable exit is requeued up to
    ``resilience.max_restarts`` and then the job ends FAILED (never COMPLETED 0:0, so
    ``--wait`` and ``afterok`` see a failure), with ``give-up`` in the state file and in
    ``slurmfm status``."""
    trigger = tmp_path / "fail-always"
    trigger.touch()
    job_id = submit(
        resil2_lab,
        tmp_path,
        *FAST,
        "resilience.max_restarts=1",
        "resilience.retry_exit_codes=[1]",
        "resilience.restart_in_job=false",  # the requeue's cap (in-job: test_real_evidence)
        f"launcher.args=[--steps, '20', --fail-if, '{trigger}']",
    )
    rec = wait_done(resil2_lab, job_id, timeout=300)
    log = (tmp_path / "logs" / f"quickstart_{job_id}.out").read_text()
    assert rec["JobState"] == "FAILED", log[-3000:]
    state = (tmp_path / "logs" / f"quickstart_{job_id}.state").read_text()
    assert rec["ExitCode"] != "0:0"
    assert int(rec["Restarts"]) == 1, state + log[-3000:]
    assert "restart=0 event=requeue step failed with exit 1" in state, state
    assert "restart=1 event=give-up restart cap 1 reached: step failed with exit 1" in state
    st = resil2_lab.slurmfm("status", job_id, "--json")
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    assert info["state"] == "FAILED"
    assert any("event=give-up restart cap 1 reached" in e for e in info["events"]), info


def gpu_standins(tmp: Path, lab: SlurmLab, seven_on_node_id: int | None = None) -> dict[str, str]:
    """What the health gate looks at on a p5 node, standing in on a lab node: ``nvidia-smi
    -L`` listing 8 GPUs (7 on the node whose SLURM_NODEID is ``seven_on_node_id``), which
    notes the step it was asked in (``SLURMFM_STEP``: "launch" in the launch step), and a
    sysfs tree with p5's 32 EFA devices (``SLURMFM_SYSFS``)."""
    bindir = tmp / "gpu-bin"
    bindir.mkdir()
    asked = tmp / "asked"
    asked.mkdir()
    bad = "" if seven_on_node_id is None else str(seven_on_node_id)
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/bash\n"
        f'echo "${{SLURMFM_STEP:-none}}" >> {asked}/"$SLURMD_NODENAME"\n'
        f'n=8; [ "$SLURM_NODEID" = "{bad}" ] && n=7\n'
        'for i in $(seq 0 $((n - 1))); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done\n'
    )
    smi.chmod(0o755)
    for i in range(32):
        (tmp / "sysfs" / "class" / "infiniband" / f"rdmap{i}s0").mkdir(parents=True)
    return {"PATH": f"{bindir}:{lab.env['PATH']}", "SLURMFM_SYSFS": str(tmp / "sysfs")}


def submit_with(lab: SlurmLab, tmp: Path, env: dict[str, str], *sets: str) -> str:
    from lab import REPO_ROOT

    argv = [*lab.slurmfm_argv(), "submit", "recipes/quickstart.yaml"]
    for s in (
        f"storage.checkpoint_root={tmp}/ckpt",
        f"storage.log_dir={tmp}/logs",
        "cluster.instance_type=p5.48xlarge",  # the lab's nodes carry Gres=gpu:8
        "resources.procs_per_node=1",
        "resources.exclusive=true",  # a p5's CPU share would exceed a lab node's 16
        "resilience.health_gate=on",
        "resilience.nccl_transport_check=off",
        "resilience.restart_in_job=false",
        *FAST,
        *sets,
    ):
        argv += ["--set", s]
    proc = lab.run(argv, cwd=REPO_ROOT, timeout=120, env={**lab.env, **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_the_gate_runs_inside_the_launch_step(resil2_lab: SlurmLab, tmp_path: Path) -> None:
    """On 3 nodes the health gate's checks and the observability agents run in the launch
    step itself (no step of their own), every node passes, the training runs on all three,
    and each node's entry ran its agent, which ended with the launch."""
    env = gpu_standins(tmp_path, resil2_lab)
    job_id = submit_with(
        resil2_lab,
        tmp_path,
        env,
        "resources.nodes=3",
        "observability.enabled=on",
        "observability.textfile_dir=null",
        "observability.dcgm_job_mapping_dir=null",
    )
    rec = wait_done(resil2_lab, job_id, timeout=180)
    log = read_text(tmp_path / "logs" / f"quickstart_{job_id}.out")
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    nodes = resil2_lab.hostnames(rec["NodeList"])
    # (srun --label puts the task id first)
    oks = re.findall(r"^(?:\d+: )?slurmfm-health (\S+) OK$", log, re.MULTILINE)
    assert sorted(oks) == sorted(nodes), log[-3000:]
    # every node was checked once, in the launch step
    assert {n: (tmp_path / "asked" / n).read_text() for n in nodes} == dict.fromkeys(
        nodes, "launch\n"
    )
    assert sorted(e["node"] for e in events(log) if e["event"] == "rank") == sorted(nodes)
    # each node's entry forked its agent, which ended with the launch
    obs = tmp_path / "logs" / f"quickstart_{job_id}.observe"
    for n in nodes:
        info = json.loads((obs / f"node_{n}_r0.json").read_text())
        assert info["runs_in"] == "launch entry", info
        assert "end" in info, info


def test_a_node_failing_the_gate_in_the_launch_step_starts_nothing(
    resil2_lab: SlurmLab, tmp_path: Path
) -> None:
    """One of 3 nodes shows 7 of 8 GPUs: it is drained with the reason, no node starts the
    training (each waits for the batch step's word, which never comes), and without requeue
    the job fails with the gate's reason."""
    env = gpu_standins(tmp_path, resil2_lab, seven_on_node_id=1)
    job_id = submit_with(resil2_lab, tmp_path, env, "resources.nodes=3", "resilience.requeue=false")
    rec = wait_done(resil2_lab, job_id, timeout=180)
    log = read_text(tmp_path / "logs" / f"quickstart_{job_id}.out")
    nodes = resil2_lab.hostnames(rec["NodeList"])
    try:
        assert rec["JobState"] == "FAILED", log[-3000:]
        (sick,) = re.findall(
            r"^(?:\d+: )?slurmfm-health (\S+) FAIL 7 GPUs visible, expected 8$", log, re.M
        )
        assert sick == nodes[1], log[-3000:]
        assert f"health gate failed on: {sick}" in log
        assert not [e for e in events(log) if e["event"] == "rank"], log[-3000:]
        node = parse_scontrol_record(
            resil2_lab.run(["scontrol", "show", "node", "-o", sick]).stdout
        )
        assert "DRAIN" in node["State"], node
        assert node["Reason"].startswith("slurmfm: health gate: 7 GPUs visible"), node
        state = read_text(tmp_path / "logs" / f"quickstart_{job_id}.state")
        assert "event=give-up requeue disabled: health gate failed on " + sick in state, state
    finally:
        resil2_lab.run(["scontrol", "update", f"NodeName={','.join(nodes)}", "State=RESUME"])
