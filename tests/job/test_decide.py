"""The finish / requeue / fail decision (issues 12.2, 12.7, 15.1, 15.3)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmfm.job.decide import (
    GIVE_UP_EXIT,
    Decision,
    apply_cap,
    decide,
    marker_stamp,
    marker_verdict,
    megatron_finished,
    megatron_log_finished,
)


def test_signal_then_saved_requeues_unless_finished() -> None:
    assert decide(0, True, False).action == "requeue"
    saved = decide(0, True, None, saved="new checkpoint step_000000040")
    assert saved.reason == (
        "saved before the time limit (training exit 0): new checkpoint step_000000040"
    )
    # never a save claimed without its proof
    assert "no checkpoint to confirm a save" in decide(0, True, None).reason
    failed = decide(1, True, None, saved="")
    assert failed.action == "requeue"
    assert failed.reason.startswith("pre-timeout save failed (training exit 1")
    assert decide(0, True, True) == Decision(
        "finished", "exit 0 (all work done before the time limit)", 0
    )


def test_late_save_still_requeues() -> None:
    """15.3: the step outlasted the window and was killed; the last checkpoint is good."""
    d = decide(143, True, False)
    assert d.action == "requeue"
    assert "training exit 143" in d.reason


def test_non_retryable_exit_fails_at_once() -> None:
    """12.7: an argument error fails without burning restarts; node loss still requeues."""
    assert decide(2, False, False, retryable=[1, 134]).action == "fail"
    assert decide(134, False, False, retryable=[1, 134]).action == "requeue"
    d = decide(2, False, False, unresponsive=["n3"], retryable=[1])
    assert d.action == "requeue"
    assert d.reason.endswith("unresponsive: n3")
    assert decide(1, False, False).action == "requeue"  # default: every exit is retryable


def test_give_up_never_exits_zero() -> None:
    """15.1: the restart cap after a pre-timeout save must not end COMPLETED 0:0."""
    d = apply_cap(
        decide(0, True, False, saved="new checkpoint step_1"),
        restart=3,
        max_restarts=3,
        requeue_enabled=True,
    )
    assert d.action == "fail"
    assert d.exit_code == GIVE_UP_EXIT
    assert d.reason.startswith("restart cap 3 reached: saved before the time limit")
    off = apply_cap(decide(1, False, False), 0, 3, requeue_enabled=False)
    assert off.action == "fail"
    assert off.exit_code == 1
    assert off.reason.startswith("requeue disabled")
    assert apply_cap(decide(0, False, None), 9, 3, True).action == "finished"


def test_megatron_exit_zero_short_of_train_iters_requeues(tmp_path: Path) -> None:
    """12.2: Megatron exits 0 after --exit-duration-in-mins; that is not done."""
    assert megatron_finished(str(tmp_path), 1000) is False
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("500\n")
    assert megatron_finished(str(tmp_path), 1000) is False
    d = decide(0, False, megatron_finished(str(tmp_path), 1000))
    assert d.action == "requeue"
    assert "before the work was done" in d.reason
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1000\n")
    assert decide(0, False, megatron_finished(str(tmp_path), 1000)).action == "finished"


def test_megatrons_end_line_is_megatrons_own_and_the_launchers() -> None:
    from slurmfm.job.decide import MEGATRON_END
    from slurmfm.launchers.megatron import END_LINE

    assert MEGATRON_END == END_LINE  # the runtime is standard-library only: one fact, twice
    assert megatron_log_finished(["[after training is done] datetime: 2026-12-06 23:00:00 "])
    assert megatron_log_finished(["0: [after training is done] datetime: x"])  # srun --label
    assert not megatron_log_finished(["[exiting program at iteration 40] datetime: x"])
    assert not megatron_log_finished(["[exiting program after receiving SIGTERM.] datetime: x"])
    assert not megatron_log_finished([])


def test_marker_counts_only_for_the_ask_and_job_that_wrote_it(tmp_path: Path) -> None:
    """15.2: the run directory outlives a run; its DONE says what was asked and by whom."""
    assert marker_verdict(str(tmp_path), "a240", "13", None) == ("absent", "")
    (tmp_path / "DONE").write_text(json.dumps({"ask": "a20", "job_id": "12", "steps": 20}))
    before = marker_stamp(str(tmp_path))
    assert marker_verdict(str(tmp_path), "a240", "12", before) == (
        "stale",
        "stale DONE marker (written by job 12 for another launch, steps 20)",
    )
    # the same command line in another job: what it asked may differ (environment, data)
    assert marker_verdict(str(tmp_path), "a20", "13", before) == (
        "stale",
        "stale DONE marker (written by job 12, not this job)",
    )
    assert marker_verdict(str(tmp_path), "a20", "12", before)[0] == "done"


def test_plain_marker_counts_only_when_this_attempt_wrote_it(tmp_path: Path) -> None:
    (tmp_path / "DONE").write_text("done\n")
    before = marker_stamp(str(tmp_path))
    assert marker_verdict(str(tmp_path), "a", "1", before)[0] == "stale"
    (tmp_path / "new").write_text("done\n")
    os.replace(tmp_path / "new", tmp_path / "DONE")  # as mark_done writes it: a new file
    assert marker_verdict(str(tmp_path), "a", "1", before) == (
        "done",
        "plain DONE marker written during this attempt",
    )
    assert marker_verdict(str(tmp_path), "a", "1", None)[0] == "done"  # absent at the start


@pytest.mark.parametrize(
    ("rc", "signalled", "dead", "retry", "action"),
    [
        (2, False, [], [], "fail"),  # argparse error
        (1, False, [], [], "fail"),  # ImportError, unknown srun option (no Pyxis)
        (1, False, ["n2"], [], "requeue"),  # a node is gone
        (137, False, [], [], "requeue"),  # srun: a task killed by SIGKILL (OOM killer)
        (143, False, [], [], "requeue"),  # srun: a task killed by TERM
        (129, False, [], [], "requeue"),
        (128, False, [], [], "fail"),
        (75, False, [], [75], "requeue"),  # the recipe's retry_exit_codes
        (1, True, [], [], "requeue"),  # pre-timeout save, step ended non-zero
        (0, True, [], [], "requeue"),  # pre-timeout save
        (1, False, [], None, "requeue"),  # 'any'
    ],
)
def test_decision_table(
    rc: int, signalled: bool, dead: list[str], retry: list[int] | None, action: str
) -> None:
    """12.7: only node failures, signals, the save and the recipe's codes requeue."""
    assert decide(rc, signalled, False, dead, retry).action == action
