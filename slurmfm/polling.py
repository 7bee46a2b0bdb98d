"""One way to wait for Slurm: poll with a growing interval, up to a cap, until a deadline.

Why backoff: every poll is an RPC to slurmctld (``squeue``/``sacct``, or the REST and SSH
backends' round trips), and a research script that waits on a day-long job at a fixed half
second sends 170,000 of them. The peers poll slowly (TorchX's ``wait`` every 10 s,
pytorch/torchx ``torchx/runner/api.py``; submitit throttles its watcher's ``sacct`` calls,
facebookincubator/submitit ``submitit/slurm/slurm.py``). Starting fast keeps a short job's wait
short; growing by a quarter each poll keeps the delay after a job's end under a quarter of the
time waited so far, and the cap bounds it at ``most`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


class _Ends(Protocol):
    @property
    def done(self) -> bool: ...

    @property
    def state(self) -> str: ...


E = TypeVar("E", bound=_Ends)

FIRST_S = 1.0
"""The first interval of ``Job.wait`` and ``slurmfm submit --wait``."""
MOST_S = 60.0
"""The longest interval: a job that ended is noticed within a minute."""
FACTOR = 1.25


def intervals(first: float, most: float, factor: float = FACTOR) -> Callable[[], float]:
    """A function returning the next interval: ``first``, then ``factor`` times longer, at most
    ``most`` (a ``first`` of 0 stays 0: tests of fast fakes poll without sleeping)."""
    state = {"next": max(0.0, first)}

    def step() -> float:
        now = state["next"]
        state["next"] = min(most, now * factor)
        return now

    return step


def poll_until(
    probe: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: float,
    first: float = FIRST_S,
    most: float = MOST_S,
    on_timeout: Callable[[T], Exception],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``probe()`` until ``done`` holds for its answer, which is returned; past ``timeout``
    seconds, raise ``on_timeout(last answer)``. Never sleeps past the deadline."""
    deadline = clock() + timeout
    nxt = intervals(first, most)
    while True:
        value = probe()
        if done(value):
            return value
        left = deadline - clock()
        if left <= 0:
            raise on_timeout(value)
        sleep(min(nxt(), left))


def wait_for_end(
    status: Callable[[], E],
    job_id: str,
    *,
    timeout: float,
    first: float = FIRST_S,
    most: float = MOST_S,
) -> E:
    """A job's ``status()`` once it is done (any end), polled with backoff; a
    :class:`~slurmfm.errors.BackendError` naming its state after ``timeout`` seconds. Every
    backend's ``wait`` and ``Job.wait`` are this."""
    from slurmfm.errors import BackendError

    def late(st: E) -> Exception:
        return BackendError(f"job {job_id} still {st.state} after {timeout:.0f} s")

    return poll_until(
        status, lambda st: st.done, timeout=timeout, first=first, most=most, on_timeout=late
    )
