"""Waiting on Slurm polls with backoff (slurmfm.polling): fast at first, at most once a minute."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmfm.errors import BackendError
from slurmfm.polling import intervals, poll_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_intervals_grow_by_a_quarter_up_to_the_cap() -> None:
    nxt = intervals(1.0, 60.0)
    seen = [nxt() for _ in range(30)]
    assert seen[:4] == [1.0, 1.25, 1.5625, 1.953125]
    assert max(seen) == 60.0
    assert seen[-1] == 60.0
    assert all(b >= a for a, b in itertools.pairwise(seen))


def test_a_zero_first_interval_never_sleeps() -> None:
    nxt = intervals(0.0, 60.0)
    assert [nxt() for _ in range(5)] == [0.0] * 5


def test_a_day_long_wait_asks_slurm_a_few_thousand_times_at_most() -> None:
    clock = Clock()
    calls = []

    def probe() -> int:
        calls.append(clock.now)
        return len(calls)

    with pytest.raises(BackendError):
        poll_until(
            probe,
            lambda _: False,
            timeout=86400,
            on_timeout=lambda n: BackendError(f"{n}"),
            sleep=clock.sleep,
            clock=lambda: clock.now,
        )
    # at 0.5 s fixed this was 172,800 queries; at most one a minute after the first minutes
    assert len(calls) < 86400 / 60 + 30
    assert max(clock.sleeps) == 60.0


@given(end=st.floats(min_value=0.0, max_value=20000.0))
def test_the_end_is_seen_within_a_quarter_of_the_wait_or_a_minute(end: float) -> None:
    """Whenever the job ends, the poll that sees it comes at most a second plus a quarter of
    the time waited before the end later, and never more than the 60 s cap."""
    clock = Clock()
    seen = poll_until(
        lambda: clock.now,
        lambda now: now >= end,
        timeout=10**6,
        on_timeout=lambda _: BackendError("late"),
        sleep=clock.sleep,
        clock=lambda: clock.now,
    )
    assert seen >= end
    assert seen - end <= min(60.0, 1.0 + 0.25 * end) + 1e-9


def test_the_deadline_is_kept() -> None:
    clock = Clock()
    with pytest.raises(BackendError, match="still RUNNING"):
        poll_until(
            lambda: "RUNNING",
            lambda _: False,
            timeout=10.0,
            on_timeout=lambda s: BackendError(f"still {s}"),
            sleep=clock.sleep,
            clock=lambda: clock.now,
        )
    assert clock.now == pytest.approx(10.0)
