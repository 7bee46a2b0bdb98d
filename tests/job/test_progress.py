"""Progress, one definition (slurmfm.job.progress) for the judgement and the hang watch; the
start-up allowance (resilience.startup_timeout); what a start-up stop is judged as."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmfm.job import evidence as ev
from slurmfm.job.classify import Evidence, classify
from slurmfm.job.hang import HangWatch
from slurmfm.job.progress import Progress, span, step_line

MEGATRON = " [2026-12-06 23:00:00] iteration      120/    1000 | consumed samples:   61440 |"
NEMO = "Training epoch 0, iteration 20/99 | lr: 1e-05 | global_batch_size: 32 | loss: 2.1"
LIGHTNING = "Epoch 1:  45%|████▌     | 450/1000 [00:45<00:55,  9.90it/s, v_num=0, loss=1.23]"
TRAINER = "{'loss': 1.2345, 'grad_norm': 0.5, 'learning_rate': 4e-05, 'epoch': 0.12}"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("line", "framework"),
    [
        (MEGATRON, "Megatron-LM iteration"),
        ("0: " + MEGATRON, "Megatron-LM iteration"),  # srun --label
        (NEMO, "NeMo iteration"),
        (LIGHTNING, "Lightning step"),
        (TRAINER, "Trainer log"),
    ],
)
def test_each_frameworks_own_step_line_is_progress(line: str, framework: str) -> None:
    got = step_line(line)
    assert got is not None
    assert got[0] == framework


@pytest.mark.parametrize(
    "line",
    [
        "iteration took 3 s",
        "Validation DataLoader 0:  50%|█████     | 5/10 [00:01<00:01]",
        "{'eval_loss': 1.0, 'epoch': 1.0}",
        "building the data index (iteration over 1000 files / 7 shards)",
    ],
)
def test_other_lines_are_not(line: str) -> None:
    assert step_line(line) is None


def test_a_line_counts_once_a_bar_redrawn_at_the_same_step_does_not(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("old output " + MEGATRON + "\n")
    clock = Clock()
    p = Progress(lambda: {}, (str(log), log.stat().st_size), clock)
    clock.t = 10
    assert not p.poll(force=True)  # what was there before the launch is not its progress
    with log.open("a") as fh:
        fh.write(LIGHTNING + "\r" + LIGHTNING + "\n")
    clock.t = 20
    assert p.poll(force=True)
    assert p.first_s == 20
    with log.open("a") as fh:
        fh.write(LIGHTNING + "\n")  # the same step again
    clock.t = 30
    assert not p.poll(force=True)
    assert p.last == 20
    assert p.since_start() == (True, "last Lightning step 450/1000")


def test_the_judgement_counts_the_step_lines_and_the_checkpoints(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("")
    mark = {"checkpoint": "", "tracker": "", "progress": ""}
    p = Progress(lambda: dict(mark), (str(log), 0), Clock())
    assert p.since_start() == (None, "")  # nothing could tell
    mark["tracker"] = "500"
    assert p.since_start() == (True, "Megatron tracker at 500")
    with log.open("a") as fh:
        fh.write(NEMO + "\n")
    assert p.since_start() == (True, "Megatron tracker at 500, last NeMo iteration 20/99")


def test_the_start_up_allowance_until_the_first_progress_then_the_hang_timeout(
    tmp_path: Path,
) -> None:
    clock = Clock()
    log = tmp_path / "job.out"
    log.write_text("")
    w = HangWatch(60, clock, lambda: {}, (str(log), 0), startup_s=3600)
    clock.t = 1800
    assert not w.hung()  # 30 minutes into the start: longer than hang_timeout, within 1h
    with log.open("a") as fh:
        fh.write(MEGATRON + "\n")
    clock.t = 2000
    assert not w.hung()
    assert w.progress.first_s == 2000
    clock.t = 2059
    assert not w.hung()
    clock.t = 2065  # (the watch looks every 5 s)
    assert w.hung()  # hang_timeout after the first progress
    assert w.reason() == "no progress for 65 s (last: Megatron-LM iteration 120/1000)"


def test_no_first_progress_within_the_allowance_says_so(tmp_path: Path) -> None:
    clock = Clock()
    mark = {"progress": ""}
    w = HangWatch(60, clock, lambda: dict(mark), None, startup_s=3600)
    clock.t = 3599
    assert not w.hung()
    clock.t = 3605
    assert w.hung()
    assert w.starting
    assert w.reason() == "no first progress within 1h: 3605 s since the launch started"
    # no allowance (startup_timeout: none): the hang timeout from the start, as before
    clock.t = 0
    w = HangWatch(60, clock, lambda: dict(mark), None)
    clock.t = 61
    assert w.hung()
    assert w.reason().startswith("no progress for 61 s")
    mark["progress"] = json.dumps({"step": 1})
    clock.t = 200
    assert not w.hung()


def test_a_start_up_stop_is_retried_and_is_a_crash_loop_only_when_it_repeats() -> None:
    stop = "no first progress within 1h: 3601 s since the launch started"
    first = classify(Evidence(1, hang=stop))
    assert first.retry
    assert first.reason.startswith("start-up: no first progress within 1h")
    hang = classify(Evidence(1, hang="no progress for 61 s (last: x)"))
    assert hang.signature != first.signature
    # after a hang, a start-up stop is no repeat; after a start-up stop, a hang neither
    assert classify(Evidence(1, hang=stop, previous=hang.signature)).retry
    assert classify(Evidence(1, hang="no progress for 61 s", previous=first.signature)).retry
    again = classify(Evidence(1, hang=stop, previous=first.signature))
    assert not again.retry
    assert again.reason.startswith("crash loop: stopped in start-up again")


@pytest.mark.parametrize(("s", "text"), [(3600, "1h"), (1800, "30m"), (45, "45s"), (90, "90s")])
def test_spans_read_as_recipes_write_them(s: int, text: str) -> None:
    assert span(s) == text


def test_progress_file_reports_count_as_before(tmp_path: Path) -> None:
    pf = tmp_path / "progress.json"
    mark = lambda: ev.progress_mark("", str(pf))  # noqa: E731
    p = Progress(mark, None, Clock())
    pf.write_text(json.dumps({"step": 7}))
    assert p.since_start() == (True, "reported step 7")
