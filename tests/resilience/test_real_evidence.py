"""Failures judged by evidence, on the real local Slurm (22.05) with real torch (gloo) and the
real torchrun: the quickstart's training with one injected fault (train_faults.py).

Each of these ended wrongly before the runtime read evidence: an ImportError on one node of
two came back from srun as a TERMed task (143) and was requeued up to the cap; a RuntimeError
or a killed worker after hours of progress is torchrun's exit 1, which failed the job under the
default ``retry_exit_codes: none``; a pre-timeout save that failed was recorded as "saved";
Megatron-LM run by ``--train-samples`` ended COMPLETED at its first early exit 0.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import (
    REPO_ROOT,
    OwnLab,
    SlurmLab,
    live_pids,
    own_lab_fixture,
    read_text,
    signal_batch_until_recorded,
    wait_until,
)
from test_real_slurm_resilience import (
    FAST,
    STANDINS,
    _resil,
    events,
    submit,
    wait_done,
    wait_for_event,
)

from slurmfm.backends.slurm_cli import parse_scontrol_record
from slurmfm.job.node import parent

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]

EVID = OwnLab("evidence", ctld_port=19117, slurmd_port=17181, nodes=4)
# A second lab of the same kind, so that these torch tests (about 9 minutes together on a
# loaded machine) run on two workers.
EVID2 = OwnLab("evidence2", ctld_port=19137, slurmd_port=17161, nodes=4)
FAULTS = Path(__file__).resolve().parent / "train_faults.py"
# One torch worker per node: the faults are torch's across nodes (an import error on one node,
# a killed worker, a hang in all_reduce, a failed save), and each worker is about 5 s of CPU on
# the lab's two shared cores. The quickstart's two per node stay in tests/e2e/test_quickstart.py.
ONE_PER_NODE = "resources.procs_per_node=1"


@pytest.fixture(scope="module")
@own_lab_fixture(EVID)
def ev_lab() -> Iterator[SlurmLab]:
    yield from _resil(EVID)


@pytest.fixture(scope="module")
@own_lab_fixture(EVID2)
def ev2_lab() -> Iterator[SlurmLab]:
    yield from _resil(EVID2)


def state_of(tmp: Path, job_id: str) -> str:
    return read_text(tmp / "logs" / f"quickstart_{job_id}.state")


def log_of(tmp: Path, job_id: str) -> str:
    return read_text(tmp / "logs" / f"quickstart_{job_id}.out")


def test_import_error_on_one_node_fails_at_once_naming_the_error_and_the_node(
    ev_lab: SlurmLab, tmp_path: Path
) -> None:
    job_id = submit(
        ev_lab,
        tmp_path,
        ONE_PER_NODE,
        f"launcher.script={FAULTS}",
        "env.TEST_FAULT=import:1",
        "resilience.max_restarts=3",
    )
    rec = wait_done(ev_lab, job_id, timeout=300)
    log = log_of(tmp_path, job_id)
    assert rec["JobState"] == "FAILED", log[-3000:]
    assert int(rec["Restarts"]) == 0, log[-3000:]
    victims = {e["node"] for e in events(log) if e["event"] == "fault"}
    assert len(victims) == 1, log[-3000:]
    (victim,) = victims
    fail = [x for x in state_of(tmp_path, job_id).splitlines() if " event=fail " in x]
    assert len(fail) == 1, state_of(tmp_path, job_id)
    assert "ModuleNotFoundError: No module named 'slurmfm_test_no_such_module'" in fail[0]
    assert f"on {victim}" in fail[0]
    assert "before any progress" in fail[0]
    assert "event=requeue" not in state_of(tmp_path, job_id)


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("raise", "RuntimeError: injected fault at step 12 on "),
        ("kill", "a worker killed by signal 9 on "),
    ],
)
def test_failure_after_progress_is_retried_inside_the_allocation_and_resumes(
    ev_lab: SlurmLab, tmp_path: Path, fault: str, words: str
) -> None:
    """torchrun exits 1 for both; after progress each is retried, in the same job: the step
    runs again on the same nodes (no requeue, no credential wait), counted as a restart.

    The killed run's goodput ledger (``slurmfm report --json``) is checked against the test's
    own clock (:func:`check_ledger`): for it each step sleeps 0.8 s, so that training is a
    measurable part of the wall time."""
    total, every = 30, 5
    timeline = tmp_path / "timeline"
    sleep = ", --sleep, '0.8'" if fault == "kill" else ""
    submitted = time.time()
    job_id = submit(
        ev_lab,
        tmp_path,
        ONE_PER_NODE,
        f"launcher.script={FAULTS}",
        f"env.TEST_FAULT={fault}:12:{tmp_path / 'fault-once'}",
        f"env.TEST_TIMELINE={timeline}",
        "resilience.max_restarts=2",
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '{every}'{sleep}]",
    )
    rec = wait_done(ev_lab, job_id, timeout=600)
    log = log_of(tmp_path, job_id)
    ev = events(log)
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) == 0, log[-3000:]  # never requeued
    state = state_of(tmp_path, job_id)
    relaunch = [x for x in state.splitlines() if "restart=0 event=relaunch " in x]
    assert len(relaunch) == 1, state
    assert words in relaunch[0], state
    assert "after progress (new checkpoint step_000000010" in relaunch[0], state
    assert "(in-job restart 1, restart 1 of 2)" in relaunch[0], state
    assert "event=requeue" not in state
    assert [e["step"] for e in ev if e["event"] == "resume"] == [10]
    assert [e["steps"] for e in ev if e["event"] == "done"] == [total]
    if fault == "kill":
        check_ledger(ev_lab, job_id, rec, submitted, timeline)


def check_ledger(
    lab: SlurmLab, job_id: str, rec: dict[str, str], submitted: float, timeline: Path
) -> None:
    """The goodput ledger of a run killed at step 12 and resumed from step 10, against what
    the test measured itself: its submission time, Slurm's end time, and the training's own
    timeline (every report, unthrottled; train_faults.py ``TEST_TIMELINE``).

    Kept training is the first launch from its first step to the save of step 10, then the
    second launch from its first step to its last: the ETTR is that over the wall time.
    """
    from slurmfm.job.goodput import epoch

    lines = [x.split() for x in read_text(timeline).splitlines()]
    first, second = [], []
    for t, pid, step, saved in lines:
        (first if not second and (not first or first[0][1] == pid) else second).append(
            (float(t), pid, int(step), saved)
        )
    assert first, lines
    assert second, lines
    kept_until = next(t for t, _, step, saved in first if step == 10 and saved == "10")
    productive = (kept_until - first[0][0]) + (second[-1][0] - second[0][0])
    ended = epoch(rec["EndTime"])
    assert ended is not None, rec
    # from before the submit command (its CLI starts first) to Slurm's EndTime (truncated)
    wall = ended + 1 - submitted
    kill_at = next(t for t, _, step, _ in first if step == 12)
    proc = lab.slurmfm("report", job_id, "--json")
    assert proc.returncode == 0, proc.stderr
    led = json.loads(proc.stdout)["goodput"]
    (failure,) = led["failures"]
    assert "signal 9" in failure["reason"], failure
    assert failure["recomputed_steps"] <= 2, failure
    lost = failure["detection"] + failure["restart"] + failure["recomputed"]
    # from the save of step 10 to training again: the recomputed steps 11-12, the detection
    # after the kill, the relaunch up to the first new step
    assert abs(lost - (second[0][0] - kept_until)) < 1.5, (led, kill_at, kept_until)
    assert abs(led["parts"]["productive"] - productive) < 1.0, (led, productive)
    assert wall - 10.0 < led["wall_s"] <= wall + 1.0, (led, wall)
    # The ETTR from the test's own clocks: the wall time lies between Slurm's SubmitTime and
    # EndTime (both truncated to the second) and the test's clock from before the submit
    # command started (its CLI start-up can take seconds on a loaded machine), so the bound is
    # the productive time (+-1 s) over the longest and the shortest of those walls.
    slurm_submit = epoch(rec["SubmitTime"])
    assert slurm_submit is not None, rec
    shortest = ended - (slurm_submit + 1)
    lo, hi = (productive - 1.0) / (wall + 1.0), (productive + 1.0) / shortest
    assert lo <= led["ettr"] <= hi, (led, productive, wall, shortest)
    assert abs(sum(led["parts"].values()) - led["wall_s"]) < 1e-6, led
    # Slurm's SubmitTime: after the test's clock started (the submit command's start-up)
    assert submitted - 1.0 <= led["start"] <= submitted + 10.0, led


def test_failed_pre_timeout_save_is_recorded_as_failed(ev2_lab: SlurmLab, tmp_path: Path) -> None:
    """The save fails (read-only directory); the record must not say it saved.

    The pre-timeout signal is Slurm's own request for ``--signal=B:USR2@N``, sent at once with
    ``scancel --batch --signal=USR2`` (https://slurm.schedmd.com/scancel.html).
    """
    job_id = submit(
        ev2_lab,
        tmp_path,
        ONE_PER_NODE,
        f"launcher.script={FAULTS}",
        "env.TEST_FAULT=save",
        "resilience.max_restarts=2",
        "launcher.args=[--steps, '80', --checkpoint-every, '5', --sleep, '0.1']",
    )
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    wait_for_event(log_path, "a periodic checkpoint", "checkpoint", 240)
    signal_batch_until_recorded(ev2_lab, job_id, tmp_path / "logs" / f"quickstart_{job_id}.state")
    rec = wait_done(ev2_lab, job_id, timeout=600)
    log = log_of(tmp_path, job_id)
    state = state_of(tmp_path, job_id)
    assert any(e["event"] == "fault" for e in events(log)), log[-3000:]
    assert "restart=0 event=save-failed no new complete checkpoint after the pre-timeout" in state
    assert "restart=0 event=requeue pre-timeout save failed (training exit " in state, state
    assert "saved before the time limit" not in state
    # the next attempt resumes from the last periodic checkpoint and finishes
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert [e["steps"] for e in events(log) if e["event"] == "done"] == [80]


def test_time_limit_without_the_pre_timeout_signal_requeues_and_resumes(
    ev2_lab: SlurmLab, tmp_path: Path
) -> None:
    """Slurm's pre-timeout USR2 never reaches the job (a CI run lost one sent with scancel):
    at the time limit's TERM the runtime requeues from the last checkpoint, as the signal
    would have, instead of ending TIMEOUT with the run unfinished.

    The script is the one ``submit`` sends (``--dry-run -o``) without its ``#SBATCH
    --signal`` line, so Slurm sends no USR2; once training runs the limit is cut to one
    minute (``scontrol update TimeLimit``), so Slurm itself ends the attempt with TERM. It
    takes 1.5 to 2 minutes: limits are whole minutes and slurmctld tests them every 30 s
    (``PERIODIC_TIMEOUT``, SchedMD/slurm:src/slurmctld/controller.c).
    """
    # about 100 s of training: more than the first minute and slurmctld's next look at it
    total, every = 1000, 50
    out = tmp_path / "sent"
    proc = ev2_lab.slurmfm(
        "submit",
        "recipes/quickstart.yaml",
        "--dry-run",
        "--slurm-version",
        "22.05",
        "-o",
        str(out),
        *[
            x
            for s in (
                f"storage.checkpoint_root={tmp_path}/ckpt",
                f"storage.log_dir={tmp_path}/logs",
                *FAST,
                "resilience.max_restarts=2",
                f"launcher.args=[--steps, '{total}', --checkpoint-every, '{every}', "
                "--sleep, '0.1']",
            )
            for x in ("--set", s)
        ],
    )
    assert proc.returncode == 0, proc.stderr
    lines = (out / "quickstart.sh").read_text().splitlines(keepends=True)
    kept = [x for x in lines if not x.startswith("#SBATCH --signal=")]
    assert len(kept) == len(lines) - 1
    argv = json.loads((out / "quickstart.argv.json").read_text())
    (tmp_path / "logs").mkdir(mode=0o755)  # submit makes it; a dry run does not
    sent = ev2_lab.run(argv, input="".join(kept), cwd=REPO_ROOT)
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.strip().split(";")[0]
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    state_path = tmp_path / "logs" / f"quickstart_{job_id}.state"
    wait_for_event(log_path, "a periodic checkpoint", "checkpoint", 120)
    cut = ev2_lab.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=1"])
    assert cut.returncode == 0, cut.stderr
    wait_until(
        "the requeue at the limit's TERM",
        lambda: (
            "event=requeue the time limit came without the pre-timeout signal"
            in read_text(state_path)
        ),
        150,
        lambda: read_text(state_path),
    )
    # the requeued attempt gets a limit it can finish in
    back = ev2_lab.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"])
    assert back.returncode == 0, back.stderr
    rec = wait_done(ev2_lab, job_id, timeout=300)
    log = log_path.read_text()
    ev = events(log)
    state = state_path.read_text()
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) == 1, state
    assert "event=signal" not in state  # no USR2 ever came
    assert "restart=0 event=stop the time limit (Slurm: " in state
    first = ev[: next(i for i, e in enumerate(ev) if e["event"] == "resume")]
    last_complete = max(e["step"] for e in first if e["event"] == "checkpoint")
    assert [e["step"] for e in ev if e["event"] == "resume"] == [last_complete]
    assert [e["steps"] for e in ev if e["event"] == "done"] == [total]


def test_megatron_by_samples_early_exit_requeues_and_the_finished_run_does_not(
    ev2_lab: SlurmLab, tmp_path: Path
) -> None:
    """Megatron-LM's exit 0 at ``--exit-interval`` (or ``--exit-duration-in-mins``) is not the
    end of a run by samples: 400 samples at a batch of 4 are 100 iterations; the stand-in
    (Megatron's contract: tests/standins/megatron_pretrain.py) exits 0 at iteration 60."""
    recipe = tmp_path / "megs.yaml"
    recipe.write_text(
        json.dumps(
            {
                "name": "megs",
                # the lab's nodes have 8 GPU GRES each, so a GPU launcher can run there
                "cluster": {"instance_type": "p5.48xlarge", "partition": "batch"},
                "resources": {"nodes": 2, "procs_per_node": 2, "time_limit": "00:10:00"},
                "parallelism": {"tp": 1, "pp": 1},
                "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
                "observability": {"enabled": "off"},
                "launcher": {
                    "kind": "megatron",
                    "python": str(STANDINS / "torchrun.py"),
                    "megatron_path": str(STANDINS),
                    "entrypoint": "megatron_pretrain.py",
                    "model_args": {
                        "train-samples": 400,
                        "global-batch-size": 4,
                        "exit-interval": 60,
                    },
                },
                "storage": {
                    "checkpoint_root": str(tmp_path / "ckpt"),
                    "log_dir": str(tmp_path / "logs"),
                },
            }
        )
    )
    proc = ev2_lab.slurmfm("submit", str(recipe))
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    rec = wait_done(ev2_lab, job_id, timeout=400)
    log = read_text(tmp_path / "logs" / f"megs_{job_id}.out")
    state = read_text(tmp_path / "logs" / f"megs_{job_id}.state")
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) == 1, state
    ev = events(log)
    assert [e["iteration"] for e in ev if e["event"] == "exit-interval" and e["rank"] == 0] == [60]
    assert [e["iteration"] for e in ev if e["event"] == "done" and e["rank"] == 0] == [100]
    assert "restart=0 event=requeue exit 0 before the work was done (completion check)" in state
    tracker = tmp_path / "ckpt" / "megs" / "megs" / "latest_checkpointed_iteration.txt"
    wait_until("the tracker", tracker.exists, 5)
    assert tracker.read_text().strip() == "100"


def test_megatron_without_a_known_count_finishes_on_megatrons_own_end_line(
    ev2_lab: SlurmLab, tmp_path: Path
) -> None:
    """Issue 40: the iteration count is not in ``model_args`` (here it comes through
    ``extra_args``), so no count can be checked; the completion check is Megatron's own
    ``[after training is done]`` line. The early exit 0 at ``--exit-interval`` prints none and
    requeues; the run that reaches the end prints it and completes."""
    recipe = tmp_path / "megl.yaml"
    recipe.write_text(
        json.dumps(
            {
                "name": "megl",
                "cluster": {"instance_type": "p5.48xlarge", "partition": "batch"},
                "resources": {"nodes": 2, "procs_per_node": 2, "time_limit": "00:10:00"},
                "parallelism": {"tp": 1, "pp": 1},
                "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
                "observability": {"enabled": "off"},
                "launcher": {
                    "kind": "megatron",
                    "python": str(STANDINS / "torchrun.py"),
                    "megatron_path": str(STANDINS),
                    "entrypoint": "megatron_pretrain.py",
                    "model_args": {"exit-interval": 60},
                    "extra_args": ["--train-iters", "100"],
                },
                "storage": {
                    "checkpoint_root": str(tmp_path / "ckpt"),
                    "log_dir": str(tmp_path / "logs"),
                },
            }
        )
    )
    proc = ev2_lab.slurmfm("submit", str(recipe))
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    rec = wait_done(ev2_lab, job_id, timeout=400)
    log = read_text(tmp_path / "logs" / f"megl_{job_id}.out")
    state = read_text(tmp_path / "logs" / f"megl_{job_id}.state")
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) == 1, state
    assert log.count("[after training is done]") == 1
    assert "restart=0 event=requeue exit 0 before the work was done (completion check)" in state


def test_a_rank_hanging_in_all_reduce_is_caught_stacks_dumped_and_retried(
    ev_lab: SlurmLab, tmp_path: Path
) -> None:
    """Rank 1 stops at its 12th all_reduce; the other ranks wait inside it (gloo would wait 30
    minutes). With ``hang_timeout: 45s`` the runtime sees no progress, dumps every worker's
    stack into the log (faulthandler on SIGABRT; py-spy where installed), stops the step and
    relaunches it in the allocation; the run resumes from its last checkpoint. The timeout
    also covers the relaunch's start-up (torch's import and rendezvous), which on a loaded
    2-core machine took over 30 s: the same window then read as a second hang (CI sim)."""
    total, every, timeout = 30, 5, 45
    job_id = submit(
        ev_lab,
        tmp_path,
        ONE_PER_NODE,
        f"launcher.script={FAULTS}",
        f"env.TEST_FAULT=hang:12:{tmp_path / 'fault-once'}",
        f"resilience.hang_timeout={timeout}s",
        "resilience.max_restarts=2",
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '{every}']",
    )
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    wait_for_event(log_path, "the hang", "fault", 240)
    t_hang = time.monotonic()
    wait_until(
        "the hang caught",
        lambda: "slurmfm: hang: no progress for" in read_text(log_path),
        timeout + 60,
        lambda: read_text(log_path)[-3000:],
    )
    assert time.monotonic() - t_hang <= timeout + 60
    rec = wait_done(ev_lab, job_id, timeout=400)
    log = log_of(tmp_path, job_id)
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) == 0, log[-3000:]
    after = log[log.index("slurmfm: hang: no progress for") :]
    assert "slurmfm-stacks " in after  # each node's workers listed
    # faulthandler's dumps on SIGABRT: a waiting rank's stack is in the collective (every
    # node's workers are stopped before any is aborted: slurmfm/job/hang.py), and the
    # hanging rank's own
    assert "in all_reduce" in after
    assert "in stuck" in after
    state = state_of(tmp_path, job_id)
    relaunch = [x for x in state.splitlines() if "restart=0 event=relaunch " in x]
    assert len(relaunch) == 1, state
    assert "hang: no progress for" in relaunch[0], state
    ev = events(log)
    assert [e["step"] for e in ev if e["event"] == "resume"] == [10]
    assert [e["steps"] for e in ev if e["event"] == "done"] == [total]


def runtime_pids(job_id: str) -> list[int]:
    """The batch runtime processes of ``job_id``: ``python3 -I -S -c "$slurmfm_checked" batch ...``
    with the job's id in their environment (the supervisor and, below it, the runtime)."""
    found = []
    for pid in live_pids("SLURM_JOB_ID", job_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-c" in argv and argv[argv.index(b"-c") + 2 :][:1] == [b"batch"]:
            found.append(pid)
    return found


def test_a_kill_of_the_runtime_is_recorded_and_the_job_requeued(
    ev2_lab: SlurmLab, tmp_path: Path
) -> None:
    """``kill -9`` of the batch runtime used to end the job FAILED with nothing recorded; its
    supervisor (the batch step's own process) records it and requeues. Stand-ins: Slurm and
    the runtime are the subject, not torch."""
    total, every = 60, 5
    job_id = submit(
        ev2_lab,
        tmp_path,
        ONE_PER_NODE,
        *FAST,
        "resilience.max_restarts=2",
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '{every}', --sleep, '0.2']",
    )
    log_path = tmp_path / "logs" / f"quickstart_{job_id}.out"
    wait_for_event(log_path, "a checkpoint", "checkpoint", 120)
    pids = runtime_pids(job_id)
    child = [p for p in pids if parent(p) in pids]
    assert len(child) == 1, pids
    os.kill(child[0], signal.SIGKILL)
    rec = wait_done(ev2_lab, job_id, timeout=400)
    log = log_of(tmp_path, job_id)
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert int(rec["Restarts"]) == 1, log[-3000:]
    state = state_of(tmp_path, job_id)
    assert "restart=0 event=requeue the job runtime was killed (signal 9)" in state, state
    assert [e["steps"] for e in events(log) if e["event"] == "done"] == [total]


def test_a_node_failing_the_gate_at_the_restart_is_swapped_for_the_spare_without_a_requeue(
    ev_lab: SlurmLab, tmp_path: Path
) -> None:
    """Two training nodes and one spare (``resources.spare_nodes: 1``, so 3 of the lab's 4).
    Rank 0 raises after progress; at the restart the health gate, run again on every node, fails
    the node that held rank 0 (a ``dcgmi`` stand-in, the gate's DCGM check, fails there once the
    fault happened). The runtime drains it, puts the spare in its place (node rank 0, so the
    rendezvous moves with it) and relaunches in the same allocation: no requeue."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    mark = tmp_path / "fault-once"
    dcgmi = bindir / "dcgmi"
    victim_file = tmp_path / "victim"
    dcgmi.write_text(
        "#!/bin/sh\n"
        "# once the fault ran, the node that held rank 0 then (first in the host order) is\n"
        "# broken for good; the order changes with the swap, so that node is written down\n"
        f"if [ -e {mark} ]; then\n"
        f'  if [ ! -e {victim_file} ] && [ "$SLURMD_NODENAME" = "${{SLURMFM_HOST_ORDER%% *}}" ]; then\n'
        f'    echo "$SLURMD_NODENAME" > {victim_file}\n'
        "  fi\n"
        f'  if [ "$SLURMD_NODENAME" = "$(cat {victim_file} 2>/dev/null)" ]; then\n'
        '    echo "dcgmi: GPU 0 failed the diagnostic"; exit 1\n'
        "  fi\n"
        "fi\n"
    )
    dcgmi.chmod(0o755)
    total, every = 30, 5
    sets = [
        f"storage.checkpoint_root={tmp_path}/ckpt",
        f"storage.log_dir={tmp_path}/logs",
        f"launcher.script={FAULTS}",
        f"env.TEST_FAULT=raise:12:{mark}",
        ONE_PER_NODE,
        "resources.spare_nodes=1",
        "resilience.health_gate=on",
        "resilience.dcgm_level=1",
        "resilience.max_restarts=2",
        f"launcher.args=[--steps, '{total}', --checkpoint-every, '{every}']",
    ]
    proc = ev_lab.run(
        [*ev_lab.slurmfm_argv(), "submit", "recipes/quickstart.yaml"]
        + [x for s in sets for x in ("--set", s)],
        cwd=REPO_ROOT,
        env=dict(ev_lab.env, PATH=f"{bindir}:{ev_lab.env['PATH']}"),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    victim = ""
    try:
        rec = wait_done(ev_lab, job_id, timeout=600)
        log = log_of(tmp_path, job_id)
        state = state_of(tmp_path, job_id)
        ranks = [e for e in events(log) if e["event"] == "rank" and e["local_rank"] == 0]
        first, second = ranks[:2], ranks[2:]
        victim = next(e["node"] for e in first if e["node_rank"] == 0)
        assert rec["JobState"] == "COMPLETED", log[-3000:]
        assert int(rec["Restarts"]) == 0, log[-3000:]  # never requeued
        assert len(ev_lab.hostnames(rec["NodeList"])) == 3  # N + K allocated
        assert "event=requeue" not in state, state
        (spare,) = set(ev_lab.hostnames(rec["NodeList"])) - {e["node"] for e in first}
        (swap,) = [x for x in state.splitlines() if " event=spare " in x]
        assert f"health gate failed on {victim}: {victim} replaced by spare {spare}" in swap
        assert len([x for x in state.splitlines() if " event=relaunch " in x]) == 1, state
        # the spare took node rank 0; the healthy node kept its rank; the world is still 2
        assert sorted((e["node_rank"], e["node"]) for e in second) == sorted(
            (e["node_rank"], spare if e["node"] == victim else e["node"]) for e in first
        )
        assert {e["world_size"] for e in ranks} == {2}
        assert [e["step"] for e in events(log) if e["event"] == "resume"] == [10]
        assert [e["steps"] for e in events(log) if e["event"] == "done"] == [total]
        node = parse_scontrol_record(ev_lab.run(["scontrol", "-o", "show", "node", victim]).stdout)
        assert "DRAIN" in node["State"], node
    finally:
        if victim:
            ev_lab.run(["scontrol", "update", f"NodeName={victim}", "State=RESUME"])
