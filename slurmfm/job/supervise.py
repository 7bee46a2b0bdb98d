"""The batch step's supervisor: the job survives a kill of the runtime process.

The batch script ``exec``s the runtime, so a ``kill -9`` of it (an operator, the OOM killer on
the batch host) ended the batch step at once: the job ended FAILED with nothing recorded,
though its launch step, an srun child, kept training (seen on the lab). Slurm offers nothing
for this inside the job, so the batch process forks: the child is the runtime
(:class:`slurmfm.job.batch.Batch`), the parent only waits for it and passes on the signals
Slurm sends the batch step (USR2 before the time limit, TERM at its end or a cancel). When
the child ends by a signal the runtime could not handle (it handles USR2 and TERM and ends
with an exit code), the parent records why and requeues within ``max_restarts`` (recorded
once done, like every requeue), or records the failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import slurm as sl
from .health import run_command
from .state import StateFile

if TYPE_CHECKING:
    from .health import Runner

FORWARDED = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGCONT)


def supervise(
    run_batch: Callable[[], int],
    state: StateFile,
    env: dict[str, str],
    max_restarts: int,
    requeue_enabled: bool,
    run: Runner = run_command,
    retry: sl.Retry = sl.DEFAULT_RETRY,
) -> int:
    """Run ``run_batch`` in a child process; the job's exit code."""
    pid = os.fork()
    if pid == 0:  # the runtime
        code = 1
        try:
            os.environ["SLURMFM_SUPERVISED"] = "1"
            code = run_batch()
        finally:
            for stream in (sys.stdout, sys.stderr):  # os._exit flushes nothing
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)
    sent: list[int] = []

    def forward(signum: int, frame: object) -> None:
        sent.append(signum)
        with contextlib.suppress(OSError):
            os.kill(pid, signum)

    old = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        _, status = os.waitpid(pid, 0)
        return _judge(status, sent, state, env, max_restarts, requeue_enabled, run, retry)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _judge(
    status: int,
    sent: list[int],
    state: StateFile,
    env: dict[str, str],
    max_restarts: int,
    requeue_enabled: bool,
    run: Runner,
    retry: sl.Retry,
) -> int:
    """The job's exit code once the runtime ended with ``status``."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    sig = os.WTERMSIG(status)
    if sig in sent and sig != signal.SIGKILL:
        return 128 + sig  # it died of what Slurm sent: Slurm is ending the job
    why = "the job runtime was killed (signal %d); its launch step may still have run" % sig
    restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    if not requeue_enabled or restart >= max_restarts:
        cap = "requeue disabled" if not requeue_enabled else "restart cap %d reached" % max_restarts
        state.record("give-up", "%s: %s" % (cap, why))
        return 128 + sig
    for s in FORWARDED:
        signal.signal(s, signal.SIG_IGN)  # the requeue's own TERM must not end this first
    ok, out = sl.requeue(sl.self_id(env), run, retry)
    if ok:
        state.record("requeue", why)
        return 0
    state.record("fail", "requeue failed (%s): %s" % (out, why))
    return 128 + sig
