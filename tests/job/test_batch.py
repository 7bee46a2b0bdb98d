"""The batch step's decisions end to end, with a fake srun/scontrol and an injected clock."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmfm.checkpoint import mark_done
from slurmfm.job import install
from slurmfm.job import slurm as sl
from slurmfm.job.batch import Batch, ask_digest
from slurmfm.job.cli import parser
from slurmfm.job.options import BatchOptions


class Step:
    """A stand-in for the launch srun: ``during`` runs while the batch step waits on it."""

    def __init__(self, rc: int, during: Callable[[], None] | None = None) -> None:
        self.rc = rc
        self.during = during
        self.signals: list[int] = []
        self.done = False
        self.pid = 4242
        self.on_signal: Callable[[], None] | None = None  # the training, told to save

    def poll(self) -> int | None:
        return self.rc if self.done else None

    def wait(self, timeout: float | None = None) -> int:
        if not self.done and self.during is not None:
            during, self.during = self.during, None
            during()
            raise subprocess.TimeoutExpired("srun", timeout or 0)
        self.done = True
        return self.rc

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if self.on_signal is not None:
            self.on_signal()

    def terminate(self) -> None:
        self.done = True


class Slurm:
    """Answers the runtime's scontrol/srun calls; records them."""

    def __init__(
        self,
        dead: Sequence[str] = (),
        ctld: bool = True,
        health: str = "",
        admin: bool = True,
        job: str = "JobId=77 JobState=PENDING ReqNodeList=(null) ExcNodeList=(null)",
        sacct: tuple[int, str] = (1, "Slurm accounting storage is disabled"),
        probe: str | None = None,
    ) -> None:
        self.dead = set(dead)
        self.probe = probe  # what the probe step prints instead of the names that answered
        self.ctld = ctld
        self.health = health
        self.admin = admin  # False: a job owner, who may not drain or down a node
        self.job = job  # what `scontrol show job -o` prints
        self.sacct = sacct
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        a = list(argv)
        self.calls.append(a)
        if a[:2] == ["scontrol", "update"] and a[2].startswith("NodeName=") and not self.admin:
            return 1, "Invalid user id"
        if a[:4] == ["scontrol", "show", "job", "-o"]:
            return (0, self.job) if self.ctld else (1, "Unable to contact slurm controller")
        if a[0] == "sacct":
            return self.sacct
        if a[:2] == ["scontrol", "ping"]:
            return (0, "Slurmctld(primary) at c is UP") if self.ctld else (1, "DOWN")
        if a[:2] == ["scontrol", "requeue"]:
            return (0, "") if self.ctld else (1, "Unable to contact slurm controller")
        if a[0] == "srun" and "printenv" in a and self.probe is not None:
            return 1, self.probe
        if a[0] == "srun" and "printenv" in a:
            return 1, "\n".join(h for h in ("n1", "n2") if h not in self.dead)
        if a[0] == "srun" and "health" in a:
            return (1 if "FAIL" in self.health else 0), self.health
        return 0, ""


def saves(box: list[Batch], tmp: Path, step: int = 95) -> Callable[[], None]:
    """The training at the pre-timeout signal: once told, it saves a complete checkpoint (the
    proof) and exits 0."""

    def save() -> None:
        name = f"step_{step:09d}"
        (tmp / "ckpt" / name).mkdir()
        (tmp / "ckpt" / "latest").write_text(name + "\n")

    def during() -> None:
        box[0].on_usr2(signal.SIGUSR2, None)
        assert box[0].step is not None
        box[0].step.on_signal = save  # type: ignore[attr-defined]

    return during


def make(tmp: Path, step: Step, slurm: Slurm, *opts: str, restart: int = 0) -> Batch:
    a = parser().parse_args(
        [
            "batch",
            "--runtime",
            "rt.pyz",
            "--drain",
            "1",
            # the tests below were written for a requeue at every end (not the defaults)
            "--restart-in-job",
            "0",
            "--retry-exit",
            "any",
            *opts,
            "--",
            "srun",
            "python3",
            "train.py",
            "--token=s3cr3t",
        ]
    )
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NAME": "rt",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_RESTART_COUNT": str(restart),
        "SLURMFM_LOG_DIR": str(tmp),
        "SLURMFM_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "SLURMFM_HOST_ORDER": "n1 n2",
        "HF_TOKEN": "s3cr3t",
    }
    (tmp / "ckpt").mkdir(exist_ok=True)
    popen: Any = lambda argv, env=None, **kw: step  # noqa: E731
    o = BatchOptions.from_namespace(a)
    b = Batch(o, env, run=slurm, popen=popen, clock=lambda: 0.0, sleep=lambda s: None)
    b.launch = a.argv[1:]  # type: ignore[attr-defined]
    return b


def go(b: Batch) -> int:
    return b.main([], b.launch)  # type: ignore[attr-defined]


def state(tmp: Path) -> list[str]:
    return [line.split(" ", 2)[2] for line in (tmp / "rt_77.state").read_text().splitlines()]


def test_exit_zero_finishes_and_prints_the_launch_without_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert go(make(tmp_path, Step(0), Slurm(), "--secret", "HF_TOKEN")) == 0
    assert state(tmp_path) == ["event=finished exit 0"]
    out = capsys.readouterr().out
    assert "slurmfm: launch: srun python3 train.py '--token=<secret>'\n" in out
    assert "s3cr3t" not in out


def test_save_signal_forwarded_then_requeue_recorded_after_it_happened(tmp_path: Path) -> None:
    box: list[Batch] = []
    step = Step(0, during=saves(box, tmp_path))
    slurm = Slurm()
    box.append(make(tmp_path, step, slurm, "--done-check", "marker", "--signal-grace-s", "0"))
    assert go(box[0]) == 0
    assert step.signals == [signal.SIGUSR2]
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path) == [
        "event=signal USR2 before the time limit",
        "event=requeue saved before the time limit (training exit 0): "
        "new checkpoint step_000000095",
    ]


@pytest.mark.parametrize("rc", [0, 1])
def test_pre_timeout_save_without_a_new_checkpoint_is_recorded_as_failed(
    tmp_path: Path, rc: int
) -> None:
    """A save that did not happen (disk full, read-only) is never claimed: recorded as failed."""
    (tmp_path / "ckpt" / "step_000000020").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest").write_text("step_000000020\n")
    box: list[Batch] = []
    step = Step(rc, during=lambda: box[0].on_usr2(signal.SIGUSR2, None))
    slurm = Slurm()
    box.append(make(tmp_path, step, slurm, "--done-check", "marker"))
    assert go(box[0]) == 0
    lines = state(tmp_path)
    assert lines[-2] == (
        "event=save-failed no new complete checkpoint after the pre-timeout signal "
        f"(training exit {rc})"
    )
    assert lines[-1].startswith(f"event=requeue pre-timeout save failed (training exit {rc}")
    assert not any("saved before" in line for line in lines)


def test_signal_after_the_work_is_done_finishes(tmp_path: Path) -> None:
    box: list[Batch] = []

    def train() -> None:  # the training finishes (a plain marker, written by this attempt)
        (tmp_path / "ckpt" / "DONE").write_text("done\n")
        box[0].on_usr2(signal.SIGUSR2, None)

    step = Step(0, during=train)
    box.append(make(tmp_path, step, Slurm(), "--done-check", "marker"))
    assert go(box[0]) == 0
    assert state(tmp_path)[-1] == "event=finished exit 0 (all work done before the time limit)"


def test_stale_marker_of_a_shorter_run_does_not_end_a_longer_one(tmp_path: Path) -> None:
    """15.2: a finished 20-step run's marker; the run now asks for 240 and saved at step 95."""
    box: list[Batch] = []
    step = Step(0, during=saves(box, tmp_path))
    slurm = Slurm()
    box.append(make(tmp_path, step, slurm, "--done-check", "marker", "--signal-grace-s", "0"))
    old = {"ask": "a20", "job_id": "12", "steps": 20}
    (tmp_path / "ckpt" / "DONE").write_text(json.dumps(old))
    assert go(box[0]) == 0
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path)[-1] == (
        "event=requeue saved before the time limit (training exit 0): "
        "new checkpoint step_000000095; stale DONE marker (written by job 12 for another launch, steps 20)"
    )


def test_marker_for_this_ask_finishes_and_the_step_is_told_the_ask(tmp_path: Path) -> None:
    box: list[Batch] = []
    seen: dict[str, str] = {}

    def train() -> None:
        seen["ask"] = box[0].env["SLURMFM_ASK"]
        mark_done(tmp_path / "ckpt", steps=240, env=box[0].env)
        box[0].on_usr2(signal.SIGUSR2, None)

    box.append(make(tmp_path, Step(0, during=train), Slurm(), "--done-check", "marker"))
    assert go(box[0]) == 0
    assert seen["ask"] == ask_digest(["srun", "python3", "train.py", "--token=s3cr3t"])
    assert state(tmp_path)[-1] == "event=finished exit 0 (all work done before the time limit)"


def test_plain_marker_older_than_the_attempt_is_stale(tmp_path: Path) -> None:
    """An exit 0 without the signal and an old plain DONE: the work was not shown done."""
    slurm = Slurm()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "DONE").write_text("done\n")
    assert go(make(tmp_path, Step(0), slurm, "--done-check", "marker")) == 0
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path)[-1].endswith("; stale DONE marker (plain, older than this attempt)")


def test_restart_cap_after_a_save_ends_failed(tmp_path: Path) -> None:
    """15.1: giving up is a FAILED job with its reason, never COMPLETED 0:0."""
    box: list[Batch] = []
    step = Step(0, during=saves(box, tmp_path))
    slurm = Slurm()
    box.append(
        make(tmp_path, step, slurm, "--max-restarts", "3", "--signal-grace-s", "0", restart=3)
    )
    assert go(box[0]) == 3
    assert not any(c[:2] == ["scontrol", "requeue"] for c in slurm.calls)
    assert state(tmp_path)[-1].startswith("event=give-up restart cap 3 reached: saved before")


def test_dead_node_is_downed_and_the_job_requeues(tmp_path: Path) -> None:
    slurm = Slurm(dead=["n2"])
    assert go(make(tmp_path, Step(1), slurm)) == 0
    probes = [c for c in slurm.calls if c[0] == "srun"]
    assert len(probes) == 1  # one parallel step for every node
    down = [c for c in slurm.calls if c[:2] == ["scontrol", "update"]]
    assert down == [
        [
            "scontrol",
            "update",
            "NodeName=n2",
            "State=DOWN",
            "Reason=slurmfm: did not answer after a failed step (job 77)",
        ]
    ]
    assert state(tmp_path)[-1] == "event=requeue step failed with exit 1; unresponsive: n2"


def test_a_probe_step_slurm_refused_downs_no_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen on the lab under load: the probe asked for memory the failed launch step still
    held; srun's refusal named no node, and the runtime downed both nodes of its own job
    (Slurm then requeued it for a node failure, past the restart cap). A refused probe judges
    no node; the job requeues for the step's failure alone and the log says why."""
    refused = (
        "srun: error: Unable to create step for job 77: Memory required by task is not available"
    )
    slurm = Slurm(probe=refused + "\n")
    assert go(make(tmp_path, Step(1), slurm)) == 0
    assert not [c for c in slurm.calls if c[:2] == ["scontrol", "update"]]
    assert state(tmp_path)[-1] == "event=requeue step failed with exit 1"
    assert f"the node probe did not start ({refused}); not judging the nodes" in (
        capsys.readouterr().err
    )


def test_slurmctld_away_no_node_judged_and_requeue_failure_recorded(tmp_path: Path) -> None:
    """15.4: an unreachable slurmctld is not a dead node; a failed requeue is not recorded
    as a requeue."""
    slurm = Slurm(ctld=False)
    b = make(tmp_path, Step(1), slurm, "--requeue-tries", "2", "--requeue-away-s", "0")
    assert go(b) == 1
    assert not any(c[0] == "srun" or c[:2] == ["scontrol", "update"] for c in slurm.calls)
    assert [c for c in slurm.calls if c[:2] == ["scontrol", "requeue"]] == [
        ["scontrol", "requeue", "77"]
    ] * 2
    assert state(tmp_path) == [
        "event=fail requeue failed (Unable to contact slurm controller): step failed with exit 1"
    ]


def test_deterministic_failure_fails_at_once(tmp_path: Path) -> None:
    """12.7: with retryable exit codes named, an argument error does not burn restarts."""
    slurm = Slurm()
    assert go(make(tmp_path, Step(2), slurm, "--retry-exit", "1,134")) == 2
    assert not any(c[:2] == ["scontrol", "requeue"] for c in slurm.calls)
    assert state(tmp_path)[-1].startswith("event=fail exit 2 (not a retryable exit code")


def test_argument_error_fails_at_once_by_default_killed_rank_requeues(tmp_path: Path) -> None:
    """12.7: with the rendered default (no retryable codes) exit 2 fails, exit 137 requeues."""
    slurm = Slurm()
    assert go(make(tmp_path, Step(2), slurm, "--retry-exit", "none")) == 2
    assert not any(c[:2] == ["scontrol", "requeue"] for c in slurm.calls)
    assert "resilience.retry_exit_codes" in state(tmp_path)[-1]
    (tmp_path / "rt_77.state").unlink()
    slurm = Slurm()
    assert go(make(tmp_path, Step(137), slurm, "--retry-exit", "none")) == 0
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path)[-1].startswith(
        "event=requeue step failed with exit 137 (killed by signal 9) [signature "
    )


def test_health_gate_as_owner_requeues_off_the_failed_node(tmp_path: Path) -> None:
    """12.6: a node the owner may not drain is excluded: requeuehold, ExcNodeList, release."""
    slurm = Slurm(
        health="slurmfm-health n1 OK\nslurmfm-health n2 FAIL 7 GPUs visible, expected 8\n",
        admin=False,
    )
    assert go(make(tmp_path, Step(0), slurm, "--health", "1", "--gpus", "8")) == 3
    scontrol = [c for c in slurm.calls if c[0] == "scontrol" and "NodeName=n2" not in c]
    assert scontrol == [
        ["scontrol", "requeuehold", "77"],
        ["scontrol", "show", "job", "-o", "77"],
        ["scontrol", "update", "JobId=77", "ExcNodeList=n2"],
        ["scontrol", "release", "77"],
    ]
    assert state(tmp_path)[-1] == "event=requeue health gate failed on n2 (excluded n2)"


def test_dead_node_as_owner_requeues_off_it(tmp_path: Path) -> None:
    """12.6: a dead node the owner may not set DOWN is excluded from the requeued job."""
    slurm = Slurm(dead=["n2"], admin=False)
    assert go(make(tmp_path, Step(1), slurm)) == 0
    assert ["scontrol", "update", "JobId=77", "ExcNodeList=n2"] in slurm.calls
    assert ["scontrol", "release", "77"] in slurm.calls
    assert not any(c[:2] == ["scontrol", "requeue"] for c in slurm.calls)
    assert state(tmp_path)[-1].endswith("unresponsive: n2 (excluded n2)")


def test_health_gate_drains_and_requeues(tmp_path: Path) -> None:
    slurm = Slurm(
        health="slurmfm-health n1 OK\nslurmfm-health n2 FAIL 7 GPUs visible, expected 8\n"
    )
    step = Step(0)
    assert go(make(tmp_path, step, slurm, "--health", "1", "--gpus", "8")) == 3
    assert not step.done  # never launched
    assert [
        "scontrol",
        "update",
        "NodeName=n2",
        "State=DRAIN",
        "Reason=slurmfm: health gate: 7 GPUs visible, expected 8",
    ] in slurm.calls
    assert state(tmp_path)[-1] == "event=requeue health gate failed on n2"


def test_no_save_protocol_requeues_at_the_signal(tmp_path: Path) -> None:
    """12.3: a launcher that does not save on the signal is requeued at once."""
    box: list[Batch] = []
    step = Step(0, during=lambda: box[0].on_usr2(signal.SIGUSR2, None))
    slurm = Slurm()
    box.append(make(tmp_path, step, slurm, "--save-protocol", "0"))
    assert exits_of(box[0]) == [0]
    assert step.signals == []
    assert state(tmp_path)[-1] == "event=requeue time limit near (launcher saves periodically)"


def reported(tmp: Path, step: int) -> None:
    """The training's progress report (``report_progress``) in the job's progress file."""
    d = tmp / "rt_77.evidence"
    d.mkdir(mode=0o700, exist_ok=True)
    (d / "progress.json").write_text(json.dumps({"step": step, "time": float(step)}))


@pytest.fixture
def no_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime must not end itself here: its ``os._exit`` (after a requeue at the signal)
    would end pytest with exit 0 and hide the failure."""
    import slurmfm.job.batch as bm

    def refuse(code: int) -> None:
        raise AssertionError(f"the runtime exited {code}")

    monkeypatch.setattr(bm.os, "_exit", refuse)


def exits_of(b: Batch) -> list[int]:
    """Run ``b`` with the runtime's own exit (``os._exit`` after a requeue at the signal)
    caught: the codes it exited with."""
    import slurmfm.job.batch as bm

    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    orig = bm.os._exit
    bm.os._exit = fake_exit  # type: ignore[assignment]
    try:
        with pytest.raises(SystemExit):
            go(b)
    finally:
        bm.os._exit = orig
    return exits


def test_signal_while_the_launch_is_still_starting_requeues_at_once(tmp_path: Path) -> None:
    """The training reported progress in an earlier launch and none since this one began: a
    save could hold nothing newer, so the job is requeued at the signal instead of waiting
    for a save until the limit."""
    reported(tmp_path, 61)
    box: list[Batch] = []
    step = Step(0, during=lambda: box[0].on_usr2(signal.SIGUSR2, None))
    slurm = Slurm()
    box.append(make(tmp_path, step, slurm, "--done-check", "marker", "--signal-grace-s", "0"))
    assert exits_of(box[0]) == [0]
    assert step.signals == []  # no save asked for
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path) == [
        "event=signal USR2 before the time limit",
        "event=requeue time limit near before the launch trained (no progress since it "
        "started): nothing newer to save",
    ]


@pytest.mark.usefixtures("no_exit")
def test_signal_while_starting_twice_in_a_row_asks_for_the_save(tmp_path: Path) -> None:
    """The attempt before was requeued at the signal for the same reason: this one is asked to
    save, so that a start-up longer than the time before the signal still makes progress."""
    reported(tmp_path, 61)
    (tmp_path / "rt_77.state").write_text(
        "2026-12-07T13:00:00Z restart=0 event=requeue time limit near before the launch "
        "trained (no progress since it started): nothing newer to save\n"
    )
    box: list[Batch] = []
    step = Step(0, during=saves(box, tmp_path))
    slurm = Slurm()
    box.append(
        make(tmp_path, step, slurm, "--done-check", "marker", "--signal-grace-s", "0", restart=1)
    )
    assert go(box[0]) == 0
    assert step.signals == [signal.SIGUSR2]
    assert state(tmp_path)[-1].startswith("event=requeue saved before the time limit")


@pytest.mark.usefixtures("no_exit")
def test_signal_after_the_launch_trained_asks_for_the_save(tmp_path: Path) -> None:
    """The same, but the launch reported a step before the signal: the save is asked for."""
    reported(tmp_path, 61)
    box: list[Batch] = []
    save = saves(box, tmp_path)

    def trained_then_signal() -> None:
        reported(tmp_path, 62)
        save()

    step = Step(0, during=trained_then_signal)
    slurm = Slurm()
    box.append(make(tmp_path, step, slurm, "--done-check", "marker", "--signal-grace-s", "0"))
    assert go(box[0]) == 0
    assert step.signals == [signal.SIGUSR2]
    assert state(tmp_path)[-1] == (
        "event=requeue saved before the time limit (training exit 0): new checkpoint step_000000095"
    )


@pytest.mark.usefixtures("no_exit")
def test_signal_in_a_first_launch_without_any_report_asks_for_the_save(tmp_path: Path) -> None:
    """No report before this launch: whether it trained cannot be told, so it is asked to
    save as before (test_save_signal_forwarded_then_requeue_recorded_after_it_happened)."""
    box: list[Batch] = []
    step = Step(0, during=saves(box, tmp_path))
    box.append(make(tmp_path, step, Slurm(), "--done-check", "marker", "--signal-grace-s", "0"))
    assert go(box[0]) == 0
    assert step.signals == [signal.SIGUSR2]


@pytest.mark.usefixtures("no_exit")
def test_signal_while_starting_with_requeue_off_keeps_the_launch(tmp_path: Path) -> None:
    """Where it may not requeue, the give-up is recorded and the launch runs on."""
    reported(tmp_path, 61)
    box: list[Batch] = []
    step = Step(0, during=lambda: box[0].on_usr2(signal.SIGUSR2, None))
    slurm = Slurm()
    box.append(make(tmp_path, step, slurm, "--requeue", "0", "--signal-grace-s", "0"))
    go(box[0])
    assert not any(c[:2] == ["scontrol", "requeue"] for c in slurm.calls)
    assert state(tmp_path)[1].startswith("event=give-up requeue disabled: time limit near before")


def test_no_save_protocol_without_requeue_keeps_serving_to_the_limit(tmp_path: Path) -> None:
    """A server whose requeue is off records the give-up at the signal and keeps running."""
    box: list[Batch] = []
    step = Step(0, during=lambda: box[0].on_usr2(signal.SIGUSR2, None))
    slurm = Slurm()
    box.append(make(tmp_path, step, slurm, "--save-protocol", "0", "--requeue", "0"))
    assert go(box[0]) == 3  # the step ended after the give-up: never COMPLETED
    assert step.done
    assert not any(c[:2] == ["scontrol", "requeue"] for c in slurm.calls)
    assert state(tmp_path) == [
        "event=signal USR2 before the time limit",
        "event=give-up requeue disabled: time limit near (launcher saves periodically)",
    ]


def test_first_forward_waits_for_the_grace_after_the_step_started(tmp_path: Path) -> None:
    """A step that just started gets the save signal only after signal_grace_s."""
    now = [100.0]
    step = Step(0)
    b = make(tmp_path, step, Slurm(), "--signal-grace-s", "2", "--resignal-s", "10")
    b.clock = lambda: now[0]
    b.step, b.step_started = step, 100.0  # type: ignore[assignment]
    b.on_usr2(signal.SIGUSR2, None)
    b.forward_signal()
    assert step.signals == []
    now[0] = 102.0
    b.forward_signal()
    b.forward_signal()
    assert step.signals == [signal.SIGUSR2]  # then again only after resignal_s
    now[0] = 112.0
    b.forward_signal()
    assert step.signals == [signal.SIGUSR2] * 2


def test_term_after_the_signal_requeues_from_the_last_checkpoint(tmp_path: Path) -> None:
    """15.3: a save that outlasts the window still requeues when Slurm ends the job."""
    slurm = Slurm()
    b = make(tmp_path, Step(0), slurm, "--requeue-tries", "1")
    b.signalled = True
    assert term(b) == [0]
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path)[-1] == "event=requeue the step outlasted the save window"


def test_a_signal_before_the_runtime_took_over_is_not_lost(tmp_path: Path) -> None:
    """The batch script passes an early USR2 on (SLURMFM_EARLY_USR2); the runtime acts on it."""
    step = Step(0)
    slurm = Slurm()
    b = make(tmp_path, step, slurm, "--signal-grace-s", "0")
    b.env["SLURMFM_EARLY_USR2"] = "1"
    assert go(b) == 0
    assert step.signals == [signal.SIGUSR2]
    assert state(tmp_path)[0] == "event=signal USR2 before the time limit"


@pytest.mark.parametrize("imex", ["0", "1"])
def test_the_health_step_gets_the_checks_the_batch_step_was_given(
    tmp_path: Path, imex: str
) -> None:
    """``batch`` and ``health`` share one option group (slurmfm.job.cli._health_options):
    what the batch step passes to its health step parses there into the same checks."""
    slurm = Slurm(health="slurmfm-health n1 OK\nslurmfm-health n2 OK\n")
    checks = ["--gpus", "8", "--efa", "32", "--dcgm", "2", "--imex", imex, "--efa-tries", "4"]
    b = make(tmp_path, Step(0), slurm, "--health", "1", *checks, "--efa-delay-s", "2.5")
    assert go(b) == 0
    (call,) = [c for c in slurm.calls if c[0] == "srun" and "health" in c]
    h = parser().parse_args(call[call.index("health") :])
    assert (h.gpus, h.efa, h.dcgm, h.efa_tries, h.efa_delay_s) == (8, 32, 2, 4, 2.5)
    assert h.imex is (imex == "1")


# --- issue 15.16a: restarts and stops the runtime did not ask for leave their reason ----------

RUNNING_AGAIN = (
    "JobId=77 JobState=RUNNING Reason=None Restarts=1 SubmitTime=2026-12-01T18:34:23 "
    "EndTime=Unknown"
)


def term(b: Batch) -> list[int]:
    """Deliver TERM to the batch step; the exit codes it would have ended with."""
    import slurmfm.job.batch as bm

    exits: list[int] = []
    orig = bm.os._exit
    bm.os._exit = exits.append  # type: ignore[assignment]
    try:
        b.on_term(signal.SIGTERM, None)
    finally:
        bm.os._exit = orig
    return exits


def test_restart_after_the_runtimes_own_requeue_adds_no_reason(tmp_path: Path) -> None:
    (tmp_path / "rt_77.state").write_text(
        "2026-12-01T10:00:00Z restart=0 event=requeue step failed with exit 137\n"
    )
    slurm = Slurm(job=RUNNING_AGAIN)
    assert go(make(tmp_path, Step(0), slurm, restart=1)) == 0
    assert state(tmp_path)[1:] == ["event=finished exit 0"]
    assert not any(c[0] == "sacct" for c in slurm.calls)


def test_restart_nobody_in_the_runtime_asked_for_records_slurms_reason(tmp_path: Path) -> None:
    """An older requeue of the runtime (attempt 0) does not explain attempt 2."""
    (tmp_path / "rt_77.state").write_text(
        "2026-12-01T10:00:00Z restart=0 event=requeue step failed with exit 137\n"
    )
    slurm = Slurm(job=RUNNING_AGAIN.replace("Restarts=1", "Restarts=2"))
    assert go(make(tmp_path, Step(0), slurm, restart=2)) == 0
    lines = state(tmp_path)
    assert lines[1] == (
        "event=restart requeued by Slurm or an operator (not by slurmfm): "
        "scontrol: requeued at 2026-12-01T18:34:23, Restarts=2"
    )
    assert lines[2] == "event=finished exit 0"


def test_unasked_restart_reason_uses_accounting_and_the_last_stop(tmp_path: Path) -> None:
    (tmp_path / "rt_77.state").write_text(
        "2026-12-01T10:00:00Z restart=0 event=stop requeued by Slurm or an operator "
        "(scontrol requeue, preemption, a failed node) (Slurm: JobState=COMPLETING "
        "Reason=None Restarts=1)\n"
    )
    sacct = (
        "77|REQUEUED|0:15|n[1-2]|2026-12-01T09:00:00|2026-12-01T10:00:00\n"
        "77|RUNNING|0:0|n[1-2]|2026-12-01T10:02:00|Unknown\n"
    )
    slurm = Slurm(job=RUNNING_AGAIN, sacct=(0, sacct))
    assert go(make(tmp_path, Step(0), slurm, restart=1)) == 0
    why = state(tmp_path)[1]
    assert why.startswith("event=restart requeued by Slurm or an operator (not by slurmfm): ")
    assert "the last attempt recorded at its TERM: requeued by Slurm or an operator" in why
    assert (
        "sacct: the last attempt ended REQUEUED (exit 0:15) at 2026-12-01T10:00:00 on n[1-2]" in why
    )
    sacct_call = next(c for c in slurm.calls if c[0] == "sacct")
    assert sacct_call[:4] == ["sacct", "-j", "77", "--duplicates"]


def test_unasked_restart_without_slurmctld_still_says_so_and_the_job_runs(
    tmp_path: Path,
) -> None:
    slurm = Slurm(ctld=False)
    assert go(make(tmp_path, Step(0), slurm, restart=1)) == 0
    assert state(tmp_path) == [
        "event=restart requeued by Slurm or an operator (not by slurmfm): Slurm does not say why",
        "event=finished exit 0",
    ]


@pytest.mark.parametrize(
    ("job", "restart", "reason"),
    [
        # 22.05 on the lab: scancel and scontrol requeue of a running job, at the TERM
        (
            "JobState=COMPLETING Reason=None Restarts=0 EndTime=2026-12-01T18:34:23",
            0,
            "cancelled (scancel by the owner or an admin) "
            "(Slurm: JobState=COMPLETING Reason=None Restarts=0)",
        ),
        (
            "JobState=COMPLETING Reason=None Restarts=2 EndTime=Unknown",
            1,
            "requeued by Slurm or an operator (scontrol requeue, preemption, a failed node) "
            "(Slurm: JobState=COMPLETING Reason=None Restarts=2)",
        ),
        (
            "JobState=COMPLETING Reason=TimeLimit Restarts=0",
            0,
            "the time limit (Slurm: JobState=COMPLETING Reason=TimeLimit Restarts=0)",
        ),
        (
            "JobState=PREEMPTED Reason=None Restarts=0",
            0,
            "preempted (Slurm: JobState=PREEMPTED Reason=None Restarts=0)",
        ),
        (
            "JobState=RUNNING Reason=None Restarts=0",
            0,
            "TERM sent to the running job (scancel --signal or kill), the job goes on "
            "(Slurm: JobState=RUNNING Reason=None Restarts=0)",
        ),
    ],
)
def test_term_records_what_slurm_says_before_exiting(
    tmp_path: Path, job: str, restart: int, reason: str
) -> None:
    slurm = Slurm(job="JobId=77 " + job)
    b = make(tmp_path, Step(0), slurm, "--stop-query-s", "2", restart=restart)
    assert term(b) == [128 + signal.SIGTERM]
    assert state(tmp_path) == ["event=stop " + reason]
    assert [c for c in slurm.calls if c[:3] == ["scontrol", "show", "job"]] == [
        ["scontrol", "show", "job", "-o", "77"]
    ]


AT_THE_LIMIT = "JobId=77 JobState=COMPLETING Reason=TimeLimit Restarts=0"


def test_time_limit_without_the_save_signal_requeues_from_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    """Slurm's pre-timeout USR2 never reached the job (one sent with scancel was lost in a CI
    run): at the limit's TERM during the launch the runtime requeues as the signal would
    have, instead of ending TIMEOUT with the run unfinished."""
    slurm = Slurm(job=AT_THE_LIMIT)
    b = make(tmp_path, Step(0), slurm, "--stop-query-s", "2", "--max-restarts", "3")
    b.launching = True
    assert term(b) == [0]
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path) == [
        "event=stop the time limit (Slurm: JobState=COMPLETING Reason=TimeLimit Restarts=0)",
        "event=requeue the time limit came without the pre-timeout signal; "
        "resuming from the last checkpoint",
    ]


@pytest.mark.parametrize(
    ("job", "launching", "signalled", "opts", "last"),
    [
        # cancelled, not the limit: the job ends
        ("JobId=77 JobState=COMPLETING Reason=None Restarts=0", True, False, (), "event=stop"),
        # the limit between launches (the launch had ended): nothing left to resume
        (AT_THE_LIMIT, False, False, (), "event=stop"),
        # the signal came: its own path (the save, or the save window outlasted)
        (AT_THE_LIMIT, True, True, ("--save-protocol", "0"), "event=stop"),
        # requeue disabled, or the restart cap reached: said, and the job ends
        (AT_THE_LIMIT, True, False, ("--requeue", "0"), "event=give-up requeue disabled"),
        (AT_THE_LIMIT, True, False, ("--max-restarts", "0"), "event=give-up restart cap"),
    ],
)
def test_time_limit_without_the_signal_requeues_only_a_running_launch_within_its_cap(
    tmp_path: Path,
    job: str,
    launching: bool,
    signalled: bool,
    opts: tuple[str, ...],
    last: str,
) -> None:
    slurm = Slurm(job=job)
    b = make(tmp_path, Step(0), slurm, "--stop-query-s", "2", *opts)
    b.launching, b.signalled, b.gave_up = launching, signalled, signalled
    assert term(b) == [128 + signal.SIGTERM]
    assert ["scontrol", "requeue", "77"] not in slurm.calls
    assert state(tmp_path)[-1].startswith(last), state(tmp_path)


def test_term_question_is_bounded_and_an_unanswered_one_is_recorded(tmp_path: Path) -> None:
    timeouts: list[float] = []
    slurm = Slurm(ctld=False)

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        timeouts.append(timeout)
        return slurm(argv, timeout)

    b = make(tmp_path, Step(0), slurm, "--stop-query-s", "2.5")
    b.run = run
    assert term(b) == [128 + signal.SIGTERM]
    assert timeouts == [2.5]
    assert state(tmp_path) == ["event=stop TERM; slurmctld did not answer within 2.5 s"]


def test_term_after_the_runtimes_own_requeue_asks_nothing(tmp_path: Path) -> None:
    slurm = Slurm()
    b = make(tmp_path, Step(0), slurm, "--requeue-tries", "1")
    b.signalled = True
    assert term(b) == [0]
    assert state(tmp_path) == ["event=requeue the step outlasted the save window"]
    assert not any(c[:3] == ["scontrol", "show", "job"] for c in slurm.calls)
    assert term(b) == []  # a second TERM while the first is handled does nothing more


def test_own_requeue_is_recorded_before_term_can_arrive(tmp_path: Path) -> None:
    """The TERM a requeue brings must find it recorded: the record is made under ignored TERM."""
    from slurmfm.job import decide as dec

    b = make(tmp_path, Step(0), Slurm())
    seen: list[object] = []
    record = b.state.record

    def spy(event: str, detail: str = "") -> None:
        seen.append((event, signal.getsignal(signal.SIGTERM)))
        record(event, detail)

    b.state.record = spy  # type: ignore[method-assign]
    before = signal.signal(signal.SIGTERM, b.on_term)
    try:
        assert b.act(dec.Decision("requeue", "step failed with exit 137", 137)) == 0
    finally:
        signal.signal(signal.SIGTERM, before)
    assert seen == [("requeue", signal.SIG_IGN)]
    assert b.requeued


@pytest.mark.parametrize("expedite", ["0", "1"])
def test_an_expedited_job_that_ends_itself_is_not_requeued_held(
    tmp_path: Path, expedite: str
) -> None:
    """15.15: with --requeue=expedite Slurm requeues a batch script's non-zero exit *held*
    (26.05); a failure or give-up sets Requeue=0 first, so the job ends FAILED. A requeue the
    runtime asked for, or a clean finish, leaves the flag alone."""
    unset = ["scontrol", "update", "JobId=77", "Requeue=0"]
    slurm = Slurm()
    failing = make(tmp_path, Step(2), slurm, "--expedite", expedite, "--retry-exit", "none")
    assert go(failing) == 2  # not retryable: fails at once
    assert (unset in slurm.calls) is (expedite == "1")
    for rc, end in ((0, "finished"), (137, "requeue")):
        (tmp_path / end).mkdir()
        slurm = Slurm()
        assert go(make(tmp_path / end, Step(rc), slurm, "--expedite", expedite)) == 0
        assert unset not in slurm.calls


def test_container_launch_gets_the_forward_from_one_host_step(tmp_path: Path) -> None:
    """A launch in a container (no runtime there): at the save signal one host step on every
    node (`forward`, --overlap beside the launch) TERMs the workers; it is started once, not
    again every resignal_s (a new job step each time on every node), and the launch srun gets
    no USR2 (Slurm would pass it to squashfuse too)."""
    now = [100.0]
    step = Step(0)
    started: list[list[str]] = []
    fwd_step = Step(0)

    def popen(argv: list[str], env: object = None) -> Step:
        started.append(list(argv))
        return fwd_step

    b = make(tmp_path, step, Slurm(), "--signal-grace-s", "0", "--container-forward", "TERM")
    b.popen = popen  # type: ignore[assignment]
    b.clock = lambda: now[0]
    b.step, b.step_started = step, 100.0  # type: ignore[assignment]
    b.on_usr2(signal.SIGUSR2, None)
    for t in (100.0, 110.0, 120.0, 130.0):  # the save window: USR2 resent every 10 s
        now[0] = t
        b.forward_signal()
    assert step.signals == []
    per_node = sl.srun_per_node(2)  # one task on each of the job's 2 nodes, beside the launch
    assert started == [[*per_node, *sl.OVERLAP, *install.argv(), "forward", "--signal", "TERM"]]
    b.cleanup()  # the step ended: a forward step still running is ended with it
    assert fwd_step.done


def test_nemo_in_a_container_gets_the_forward_to_its_tasks(tmp_path: Path) -> None:
    started: list[list[str]] = []
    step = Step(0)
    b = make(tmp_path, step, Slurm(), "--signal-grace-s", "0", "--container-forward", "USR2")
    b.o = b.o._replace(container_forward_tasks=True)
    b.popen = lambda argv, env=None: started.append(list(argv)) or Step(0)  # type: ignore[assignment]
    b.step, b.step_started = step, 0.0  # type: ignore[assignment]
    b.on_usr2(signal.SIGUSR2, None)
    b.forward_signal()
    assert started[0][-4:] == ["forward", "--signal", "USR2", "--tasks"]
    assert step.signals == []


def test_a_container_launch_gets_the_evidence_directory_mounted(tmp_path: Path) -> None:
    """Issue 37: the node entry runs in the container, so the job's evidence directory (node
    reports, torch's error file, the progress file beside it) is mounted at the same path;
    a host launch is unchanged, and a path Pyxis' mount list cannot carry is not mounted."""
    from slurmfm.job.batch import in_container, in_step, with_evidence_mount

    ev = str(tmp_path / "j_1.evidence" / "r0-l1")
    top = str(tmp_path / "j_1.evidence")
    argv = ["srun", "--container-image=i", "--container-mounts=/a:/a", "sh", "-c", "p", "x"]
    assert in_container(argv)
    assert with_evidence_mount(argv, ev)[2] == f"--container-mounts=/a:/a,{top}:{top}"
    bare = ["srun", "--container-image=i", "sh", "-c", "p", "x"]
    assert with_evidence_mount(bare, ev)[1:3] == [
        "--container-image=i",
        f"--container-mounts={top}:{top}",
    ]
    host = ["srun", "python3", "rt.pyz", "node", "--", "x"]
    assert not in_container(host)
    assert with_evidence_mount(host, ev) == host
    assert with_evidence_mount(argv, "/a,b/j.evidence/r0-l1") == argv
    assert with_evidence_mount(argv, "") == argv
    # the entry runs in the container, but the gate and the agents keep their host steps
    entry = ["srun", "--container-image=i", "sh", "-c", "p", "x", "python3", "rt.pyz", "node"]
    assert not in_step([], entry, "rt.pyz", False, False)
    assert in_step([], host, "rt.pyz", False, False)


def test_a_container_launch_mounts_the_evidence_and_reads_node_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The launch the batch step starts carries the mount of its evidence directory, and the
    report a node entry in the image wrote there is judged as on the host."""
    from slurmfm.job.evidence import write_private

    started: list[list[str]] = []

    def launch(argv: list[str], env: Any = None, **kw: Any) -> Step:
        started.append(list(argv))
        mount = next(w for w in argv if w.startswith("--container-mounts="))
        top = Path(mount.split(",")[-1].split(":")[0])
        (d,) = top.iterdir()
        report = {"node": "n2", "exit": 1, "exc_type": "ModuleNotFoundError"}
        report["message"] = "No module named 'flash_attn'"
        write_private(str(d / "n2.json"), json.dumps(report))
        return Step(1)

    slurm = Slurm()
    b = make(tmp_path, Step(1), slurm, "--retry-exit", "none")
    b.popen = launch  # type: ignore[assignment]
    b.launch = [  # type: ignore[attr-defined]
        "srun",
        "--container-image=i",
        "--container-mounts=/fsx:/fsx",
        "sh",
        "-c",
        "p",
        "slurmfm-node",
        "python3",
        "rt.pyz",
        "node",
        "--",
        "python3",
        "train.py",
    ]
    assert go(b) != 0
    out = capsys.readouterr()
    assert started
    assert started[0][2].startswith("--container-mounts=/fsx:/fsx,")
    assert "ModuleNotFoundError: No module named 'flash_attn' on n2 before any progress" in (
        out.out + out.err
    )


def test_a_checkpoint_written_before_the_signal_is_no_proof_of_the_save(tmp_path: Path) -> None:
    """A periodic checkpoint of the same step (before USR2) must not pass for the save."""
    box: list[Batch] = []

    def during() -> None:
        (tmp_path / "ckpt" / "step_000000005").mkdir()
        (tmp_path / "ckpt" / "latest").write_text("step_000000005\n")
        box[0].on_usr2(signal.SIGUSR2, None)

    box.append(make(tmp_path, Step(1, during=during), Slurm(), "--done-check", "marker"))
    assert go(box[0]) == 0
    assert state(tmp_path)[-2].startswith("event=save-failed")


def steps_of(b: Batch, *rcs: int) -> list[Step]:
    """The launch srun of each run of the step, in turn."""
    runs = [Step(rc) for rc in rcs]
    it = iter(runs)
    b.popen = lambda argv, env=None, **kw: next(it)  # type: ignore[assignment,misc]
    return runs


def test_a_retryable_failure_on_healthy_nodes_relaunches_in_the_allocation(
    tmp_path: Path,
) -> None:
    slurm = Slurm()
    b = make(tmp_path, Step(0), slurm, "--restart-in-job", "1", "--retry-exit", "none")
    runs = steps_of(b, 137, 0)
    assert go(b) == 0
    assert all(r.done for r in runs)
    assert not any(c[:2] == ["scontrol", "requeue"] for c in slurm.calls)  # no requeue
    lines = state(tmp_path)
    assert lines[0].startswith("event=relaunch step failed with exit 137 (killed by signal 9)")
    assert lines[0].endswith("(in-job restart 1, restart 1 of 3)")
    assert lines[-1] == "event=finished exit 0"


def launches_of(b: Batch, *rcs: int) -> list[tuple[list[str], dict[str, str]]]:
    """Each run of the step's launch: its words and environment."""
    seen: list[tuple[list[str], dict[str, str]]] = []
    it = iter([Step(rc) for rc in rcs])

    def popen(argv: list[str], env: dict[str, str] | None = None, **kw: object) -> Step:
        seen.append((list(argv), dict(env or {})))
        return next(it)

    b.popen = popen  # type: ignore[assignment]
    return seen


@pytest.mark.parametrize("fixed", [False, True])
def test_a_relaunch_in_the_allocation_takes_a_rendezvous_port_of_its_own(
    tmp_path: Path, fixed: bool
) -> None:
    """A process of the failed launch (or another job's on the node) can hold the port:
    torch's store failed with EADDRINUSE on the relaunch as well, and the job ended in a
    crash loop (seen in CI). A port the recipe fixed stays."""
    b = make(tmp_path, Step(0), Slurm(), "--restart-in-job", "1")
    b.launch = ["srun", "python3", "-m", "torch.distributed.run", "--master-port=23014", "t.py"]  # type: ignore[attr-defined]
    b.env.update(SLURMFM_RDZV_PORT="23014", MASTER_PORT="23014", SLURMD_NODENAME="n9")
    if not fixed:
        b.env["SLURMFM_RDZV_RANGE"] = "20000+6000"
    b.first_port = 23014
    seen = launches_of(b, 1, 1, 0)
    assert go(b) == 0
    ports = [[w for w in argv if w.startswith("--master-port=")] for argv, _ in seen]
    envs = [env["MASTER_PORT"] for _, env in seen]
    if fixed:
        assert ports == [["--master-port=23014"]] * 3
        assert envs == ["23014"] * 3
        return
    # job 77: (77*7 + restart*131) % 6000, restart counting the relaunches
    assert ports == [["--master-port=23014"], ["--master-port=20670"], ["--master-port=20801"]]
    assert envs == ["23014", "20670", "20801"]
    assert [env["SLURMFM_RDZV_PORT"] for _, env in seen] == envs


def test_a_relaunchs_port_replaces_the_rendezvous_endpoints_port_only() -> None:
    from slurmfm.job import hosts

    argv = ["--rdzv-endpoint=10.0.0.1:23014", "--master_port=23014", "--lr=23014", "x"]
    assert hosts.with_port(argv, 23014, 20670) == [
        "--rdzv-endpoint=10.0.0.1:20670",
        "--master_port=20670",
        "--lr=23014",
        "x",
    ]


def test_in_job_restarts_count_against_the_cap(tmp_path: Path) -> None:
    slurm = Slurm()
    b = make(
        tmp_path,
        Step(0),
        slurm,
        "--restart-in-job",
        "1",
        "--max-restarts",
        "2",
        "--retry-exit",
        "1",
    )
    steps_of(b, 1, 1, 1)
    assert go(b) == 1
    lines = state(tmp_path)
    assert [x.split()[0] for x in lines] == ["event=relaunch", "event=relaunch", "event=give-up"]
    assert lines[-1].startswith("event=give-up restart cap 2 reached: step failed with exit 1")
    assert not any(c[:2] == ["scontrol", "requeue"] for c in slurm.calls)


def test_a_lost_node_or_slurmctld_away_requeues_instead(tmp_path: Path) -> None:
    slurm = Slurm(dead=["n2"])
    b = make(tmp_path, Step(0), slurm, "--restart-in-job", "1")
    steps_of(b, 1)
    assert go(b) == 0
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert not any("event=relaunch" in x for x in state(tmp_path))
    (tmp_path / "rt_77.state").unlink()
    away = Slurm(ctld=False)
    b = make(tmp_path, Step(0), away, "--restart-in-job", "1", "--requeue-tries", "1")
    steps_of(b, 1)
    go(b)
    assert not any("event=relaunch" in x for x in state(tmp_path))


def test_a_checkpoint_beside_a_failed_exit_is_not_the_save(tmp_path: Path) -> None:
    """A periodic checkpoint finishing after the save signal, then the save itself failing
    (exit 1): a failed save, recorded as such (seen on the lab)."""
    box: list[Batch] = []
    step = Step(1, during=saves(box, tmp_path))
    box.append(make(tmp_path, step, Slurm(), "--done-check", "marker", "--signal-grace-s", "0"))
    assert go(box[0]) == 0
    assert state(tmp_path)[-2].startswith("event=save-failed")
    assert state(tmp_path)[-1].startswith("event=requeue pre-timeout save failed (training exit 1")


def test_an_early_exit_zero_requeues_for_a_new_time_limit(tmp_path: Path) -> None:
    slurm = Slurm()
    b = make(tmp_path, Step(0), slurm, "--restart-in-job", "1", "--done-check", "megatron:100")
    steps_of(b, 0)
    assert go(b) == 0
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path)[-1].startswith("event=requeue exit 0 before the work was done")


def test_megatrons_end_line_is_its_completion_where_the_count_is_not_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--done-check megatron-log``: an exit 0 is done only when Megatron printed its
    end-of-training line in this launch's log (an --exit-interval exit 0 prints none)."""
    from slurmfm.job import evidence

    lines: list[str] = ["iteration 50/ 100 | consumed samples: 800"]
    monkeypatch.setattr(evidence, "log_since", lambda start, cap=0: list(lines))
    slurm = Slurm()
    b = make(tmp_path, Step(0), slurm, "--restart-in-job", "1", "--done-check", "megatron-log")
    steps_of(b, 0)
    assert go(b) == 0
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path)[-1].startswith("event=requeue exit 0 before the work was done")
    (tmp_path / "rt_77.state").unlink()
    lines.append("[after training is done] datetime: 2026-12-06 23:10:00.000000 ")
    done = Slurm()
    b = make(tmp_path, Step(0), done, "--restart-in-job", "1", "--done-check", "megatron-log")
    steps_of(b, 0)
    assert go(b) == 0
    assert ["scontrol", "requeue", "77"] not in done.calls


def test_the_attempts_named_containers_are_removed_at_its_end(tmp_path: Path) -> None:
    """Pyxis keeps a named container on its nodes: the runtime removes the attempt's, on every
    node of the launch, once."""
    slurm = Slurm()
    argv = ["srun", "--container-image=i.sqsh", "--container-name=slurmfm-77-0-launch", "sh"]
    b = make(tmp_path, Step(0), slurm)
    assert b.main([], argv) == 0
    removes = [c for c in slurm.calls if "container-remove" in c]
    assert removes == [
        [
            *sl.srun_per_node(2),
            *install.argv(),
            "container-remove",
            "--name",
            "slurmfm-77-0-launch",
        ]
    ]
    b.cleanup()
    assert len([c for c in slurm.calls if "container-remove" in c]) == 1


def test_a_failure_after_megatrons_iteration_lines_relaunches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37: the NCCL watchdog case. Every task exits 1 (torchrun's SignalException on
    srun's TERM), no checkpoint since the start; Megatron's own iteration lines in the job log
    are progress (slurmfm.job.progress), so the launch is relaunched in the allocation, and
    the log says when the launch first made progress. Before: 'progress: unknown; fail'."""
    from slurmfm.job import evidence as ev

    log = tmp_path / "job.out"
    log.write_text("before the launch\n")
    monkeypatch.setattr(ev, "log_position", lambda fd=2: (str(log), log.stat().st_size))
    slurm = Slurm()
    b = make(tmp_path, Step(0), slurm, "--restart-in-job", "1", "--retry-exit", "none")

    def iterations() -> None:
        with log.open("a") as fh:
            fh.write(" [2026-12-06 23:00:00] iteration      100/  100000 | consumed samples: 1 |\n")
            fh.write("srun: error: n2: task 1: Exited with exit code 1\n")

    runs = [Step(1, during=iterations), Step(0)]
    it = iter(runs)
    b.popen = lambda argv, env=None, **kw: next(it)  # type: ignore[assignment]
    assert go(b) == 0
    lines = state(tmp_path)
    assert lines[0].startswith("event=relaunch "), lines
    assert "after progress (last Megatron-LM iteration 100/100000)" in lines[0], lines
    out = capsys.readouterr()
    assert "launch 1: first progress 0 s after the start (Megatron-LM iteration 100/100000)" in (
        out.out
    )
    assert "progress: last Megatron-LM iteration 100/100000; retry" in out.err


def test_a_restart_first_removes_its_earlier_attempts_containers(tmp_path: Path) -> None:
    """Issue 37: attempt 2 starts by removing the named containers attempts 0 and 1 left on
    its nodes (one step, `container-remove --earlier`), and ends by removing its own."""
    slurm = Slurm()
    b = make(tmp_path, Step(0), slurm, restart=2)
    b.launch = ["srun", "--container-image=i", "--container-name=slurmfm-77-2-launch", "x"]  # type: ignore[attr-defined]
    assert go(b) == 0
    removes = [c[c.index("container-remove") :] for c in slurm.calls if "container-remove" in c]
    assert removes == [
        ["container-remove", "--name", "slurmfm-77-2-launch", "--earlier"],
        ["container-remove", "--name", "slurmfm-77-2-launch"],
    ]
    # a first attempt has no earlier one
    slurm = Slurm()
    first = tmp_path / "first"
    first.mkdir()
    b = make(first, Step(0), slurm)
    b.launch = ["srun", "--container-image=i", "--container-name=slurmfm-77-0-launch", "x"]  # type: ignore[attr-defined]
    assert go(b) == 0
    assert ["--earlier"] not in [c[-1:] for c in slurm.calls]


@pytest.fixture
def health_server() -> Iterator[tuple[dict[str, bool], str]]:
    """A /health endpoint on 127.0.0.1 that answers 200 while ``health["ok"]``, else 503:
    (health, its base URL)."""
    import http.server
    import threading

    health = {"ok": True}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if health["ok"] else 503)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield health, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()


def test_a_server_whose_health_stops_answering_is_relaunched_then_fails(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    health_server: tuple[dict[str, bool], str],
) -> None:
    """Issue 37: a server alone in its job (no training hang watch) whose /health stops
    answering for unhealthy_timeout_s is stopped with its stderr tail in the log, relaunched
    in the allocation, and the job fails with that reason once the restarts are used up."""
    from slurmfm.job import evidence as ev

    health, url = health_server
    log = tmp_path / "job.out"
    log.write_text("")
    now = [0.0]

    class Server:
        """The server srun: healthy at first, then /health answers 503 until TERMed."""

        pid = 4243

        def __init__(self) -> None:
            self.rc: int | None = None
            health["ok"] = True

        def poll(self) -> int | None:
            return self.rc

        def wait(self, timeout: float | None = None) -> int:
            if self.rc is None:
                now[0] += 5
                health["ok"] = False
                with log.open("a") as fh:
                    fh.write("0: ERROR engine core died: CUDA error: an illegal memory access\n")
                raise subprocess.TimeoutExpired("srun", timeout or 0)
            return self.rc

        def terminate(self) -> None:
            self.rc = 143

        def send_signal(self, sig: int) -> None:
            self.rc = 143

    servers: list[Server] = []

    def popen(argv: list[str], env: Any = None, **kw: Any) -> Server:
        servers.append(Server())
        return servers[-1]

    slurm = Slurm()
    opts = ["--serve-words", "3", "--serve-kind", "vllm", "--unhealthy-timeout-s", "10"]
    opts += ["--ready-poll-s", "1", "--restart-in-job", "1", "--max-restarts", "1"]
    b = make(tmp_path, Step(0), slurm, *opts)
    b.popen = popen  # type: ignore[assignment]
    b.clock = lambda: now[0]
    b.env["SLURMFM_SERVE_URL"] = url
    monkeypatch.setattr(ev, "log_position", lambda fd=2: (str(log), log.stat().st_size))
    code = b.main(["srun", "vllm", "serve"], [])
    assert code != 0
    assert len(servers) == 2  # started, relaunched once, then the cap
    lines = state(tmp_path)
    relaunch = [x for x in lines if x.startswith("event=relaunch vllm server not healthy for")]
    assert relaunch, lines
    assert "last stderr: 0: ERROR engine core died: CUDA error" in relaunch[0]
    assert lines[-1].startswith("event=give-up restart cap 1 reached: vllm server not healthy"), (
        lines
    )
    err = capsys.readouterr().err
    assert "  | 0: ERROR engine core died" in err


@pytest.mark.parametrize("failure", ["unhealthy", "ended"])
def test_a_server_beside_the_trainer_that_fails_stops_the_step_and_requeues(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    health_server: tuple[dict[str, bool], str],
    failure: str,
) -> None:
    """A train-and-serve job (the server on the last node, the trainer beside it): a server
    whose /health stops answering for unhealthy_timeout_s, or that ends, while the trainer
    runs stops the trainer's step and requeues the job with the server's stderr tail as the
    reason (the trainer would fail or wait on its rollouts); before, nothing watched a server
    once it was ready unless it was alone in its job."""
    from slurmfm.job import evidence as ev

    health, url = health_server
    log = tmp_path / "job.out"
    log.write_text("")
    now = [0.0]

    class Server:
        """The server's srun: it keeps running (or ends) as the test says."""

        pid = 4243

        def __init__(self) -> None:
            self.rc: int | None = None
            self.terms = 0

        def poll(self) -> int | None:
            return self.rc

        def wait(self, timeout: float | None = None) -> int:
            return self.rc if self.rc is not None else 143

        def terminate(self) -> None:
            self.terms += 1
            self.rc = 143

    class Trainer(Step):
        """The trainer's srun: runs until terminated (or 60 s); 5 s pass at each wait, and
        the server fails at the first."""

        def __init__(self) -> None:
            super().__init__(0)
            self.terms = 0

        def wait(self, timeout: float | None = None) -> int:
            if self.done:
                return self.rc
            now[0] += 5
            if now[0] >= 60:  # unwatched, the training would end by itself (or wait forever)
                self.done = True
                return self.rc
            if server.rc is None:
                health["ok"] = False
                with log.open("a") as fh:
                    fh.write("0: ERROR engine core died: CUDA error: an illegal memory access\n")
                if failure == "ended":
                    server.rc = 1
            raise subprocess.TimeoutExpired("srun", timeout or 0)

        def terminate(self) -> None:
            self.terms += 1
            self.done, self.rc = True, 143

    server, trainer = Server(), Trainer()

    def popen(argv: list[str], env: Any = None, **kw: Any) -> Any:
        return server if argv[:2] == ["srun", "vllm"] else trainer

    slurm = Slurm()
    opts = ["--serve-words", "3", "--serve-kind", "vllm", "--unhealthy-timeout-s", "10"]
    opts += ["--ready-poll-s", "1", "--restart-in-job", "1", "--max-restarts", "3"]
    b = make(tmp_path, trainer, slurm, *opts)
    b.popen = popen  # type: ignore[assignment]
    b.clock = lambda: now[0]
    b.env["SLURMFM_SERVE_URL"] = url
    monkeypatch.setattr(ev, "log_position", lambda fd=2: (str(log), log.stat().st_size))
    code = b.main(["srun", "vllm", "serve"], b.launch)  # type: ignore[attr-defined]
    assert code == 0  # requeued
    assert trainer.terms == 1
    assert server.rc is not None  # stopped after the trainer (or ended by itself)
    assert ["scontrol", "requeue", "77"] in slurm.calls
    lines = state(tmp_path)
    (req,) = [x for x in lines if x.startswith("event=requeue ")]
    if failure == "ended":
        assert req.startswith("event=requeue vllm server beside the trainer ended (exit 1)"), lines
    else:
        assert req.startswith("event=requeue vllm server beside the trainer not healthy for 1"), (
            lines
        )
    assert "last stderr: 0: ERROR engine core died: CUDA error" in req, lines
    assert not [x for x in lines if x.startswith("event=relaunch")], lines
    assert "  | 0: ERROR engine core died" in capsys.readouterr().err


def test_a_launch_that_ends_between_two_reads_still_says_its_first_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A short launch whose iteration lines came and went before the watch read them (the
    container slow-start test missed its line in a CI simulation): the end is read too, and
    of the lines read at once the first progress is the earliest (the real Pyxis slow-start
    test named "20/20", printed after "10/20")."""
    from slurmfm.job import evidence as ev

    log = tmp_path / "job.out"
    log.write_text("before the launch\n")
    monkeypatch.setattr(ev, "log_position", lambda fd=2: (str(log), log.stat().st_size))

    class EndsAtOnce(Step):
        def wait(self, timeout: float | None = None) -> int:
            if not self.done:
                with log.open("a") as fh:
                    fh.write(" [2026-12-07 04:00:00] iteration       10/      20 | x |\n")
                    fh.write(" [2026-12-07 04:00:09] iteration       20/      20 | x |\n")
                self.done = True
            return self.rc

    b = make(tmp_path, EndsAtOnce(0), Slurm())
    assert go(b) == 0
    assert "launch 1: first progress 0 s after the start (Megatron-LM iteration 10/20)" in (
        capsys.readouterr().out
    )
