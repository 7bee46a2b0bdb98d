"""Hang detection: a launch that makes no progress for ``resilience.hang_timeout``.

A rank stuck in a collective keeps the whole allocation idle until the time limit (NCCL's
own watchdog aborts only after the process group's timeout, 10 minutes by default, and gloo
waits 30). Progress is defined once, in :mod:`.progress` (a report, a checkpoint, a
framework's own step line in the job log); before a launch's first progress the start-up
allowance (``resilience.startup_timeout``) applies instead of ``hang_timeout``.

On a hang the batch step runs two overlapping steps on every node, one after the other.
``RUNTIME stacks`` dumps each worker's Python stack with py-spy where it is installed (``py-spy
dump``, which leaves the process running) and stops the worker (SIGSTOP). Once that step has
ended, every node's workers are stopped, and ``RUNTIME abort`` sends each SIGABRT and then
SIGCONT: on the pending SIGABRT Python's faulthandler (``PYTHONFAULTHANDLER=1``, exported
with hang detection) prints every thread's stack into the job log before the process ends.
In one step the nodes' workers were aborted at different times: a rank whose peer had already
died left its collective with an error (gloo: the peer closed the connection) and its dump
showed it handling that error, not the collective it had waited in (a CI simulation on the
lab, 2026-12-06). Stopped, no worker sees a peer's end before its own stack is printed.
NCCL's flight recorder is turned on for the same launches
(``TORCH_FR_BUFFER_SIZE``, ``TORCH_NCCL_DUMP_ON_TIMEOUT``, ``TORCH_FR_DUMP_TEMP_FILE``:
pytorch/pytorch torch/csrc/distributed/c10d/FlightRecorder.hpp, ProcessGroupNCCL.hpp), so a
collective that times out leaves its trace in the evidence directory. The step is then
stopped, judged (``hang`` in :mod:`.classify`) and retried.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable

from .classify import STARTUP
from .node import children, environ, launch_tops, stat_fields
from .progress import CHECK_S, Progress, span

STOP_WAIT_S = 5.0  # how long a hang's first phase waits for its workers to stop


def hang_env(env: dict[str, str], evidence_dir: str) -> dict[str, str]:
    """What a launch watched for hangs gets: stack dumps on SIGABRT, NCCL's flight recorder.
    A value the recipe set wins."""
    out = {"PYTHONFAULTHANDLER": "1", "TORCH_FR_BUFFER_SIZE": "2000"}
    out["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    if evidence_dir:
        out["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(evidence_dir, "nccl_trace_rank_")
    return {k: v for k, v in out.items() if k not in env}


class HangWatch:
    """Tells when a launch has made no progress (:mod:`.progress`, the same definition the
    failure judgement uses) for ``timeout_s``, or, before its first progress, for
    ``startup_s`` (``resilience.startup_timeout``; 0: ``timeout_s`` from the start).

    Why an allowance: at scale the first iteration line can take longer than the hang
    timeout (an Enroot import of a 20-30 GB image on 128 nodes, a multi-TB ``torch_dist``
    checkpoint load, Megatron building its data index on a first run); stopped at
    ``hang_timeout``, relaunched and stopped again, such a start was a crash loop and the
    index build began again each time.
    """

    def __init__(
        self,
        timeout_s: float,
        clock: Callable[[], float],
        mark: Callable[[], dict[str, str]],
        log: tuple[str, int] | None,
        startup_s: float = 0.0,
        progress: Progress | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.startup_s = startup_s
        self.clock = clock
        self.progress = progress if progress is not None else Progress(mark, log, clock)
        self.next_check = clock() + min(CHECK_S, timeout_s / 4)

    @property
    def what(self) -> str:
        return self.progress.what

    @property
    def starting(self) -> bool:
        """No progress yet, and the start-up allowance is what applies."""
        return self.progress.first_s is None and self.startup_s > 0

    def limit_s(self) -> float:
        return self.startup_s if self.starting else self.timeout_s

    def idle_s(self) -> float:
        return self.clock() - self.progress.last

    def hung(self) -> bool:
        now = self.clock()
        if now < self.next_check:
            return False
        self.next_check = now + min(CHECK_S, self.timeout_s / 4)
        self.progress.poll(force=True)
        return self.idle_s() >= self.limit_s()

    def reason(self) -> str:
        """What the log and the state file say of the stop (:mod:`.classify` tells a start-up
        stop by its first words, :data:`.classify.STARTUP`)."""
        if self.starting:
            return "%s %s: %d s since the launch started" % (
                STARTUP,
                span(self.startup_s),
                self.idle_s(),
            )
        return "no progress for %d s (last: %s)" % (self.idle_s(), self.what)


def descendants(pid: int, proc: str = "/proc") -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop(), proc)
        out.extend(kids)
        todo.extend(kids)
    return out


def workers(job: str, node: str = "", proc: str = "/proc") -> list[int]:
    """This node's training workers of job ``job``: the launch's processes torchrun (or
    another launcher) gave a ``LOCAL_RANK``."""
    found: list[int] = []
    for top in launch_tops(job, node, proc):
        for pid in [top, *descendants(top, proc)]:
            if "LOCAL_RANK" in environ(pid, proc) and pid not in found:
                found.append(pid)
    return found


def stop_workers(job: str, node: str, pyspy: str | None = None) -> list[str]:
    """A hang's first phase on this node: list the workers, dump each one's stack with py-spy
    where installed, and stop them (SIGSTOP; :func:`abort_workers` is the second phase); the
    lines to print."""
    out = []
    tool = pyspy if pyspy is not None else shutil.which("py-spy") or ""
    pids = workers(job, node)
    for pid in pids:
        rank = environ(pid).get("RANK", "?")
        out.append("slurmfm-stacks %s pid %d rank %s" % (node, pid, rank))
        if tool:
            try:
                proc = subprocess.run(
                    [tool, "dump", "--pid", str(pid)],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
                out.extend(proc.stdout.splitlines() + proc.stderr.splitlines())
            except (OSError, subprocess.TimeoutExpired) as exc:
                out.append("py-spy failed: %s" % exc)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGSTOP)
    # A signal takes effect when its process next runs: the phase ends only once every
    # worker is stopped (or gone), so that the second phase finds none still running.
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline and not all(map(stopped, pids)):
        time.sleep(0.01)
    if not pids:
        out.append("slurmfm-stacks %s: no training process found" % node)
    return out


def stopped(pid: int, proc: str = "/proc") -> bool:
    """Is ``pid`` stopped (state T or t in /proc/PID/stat) or gone?"""
    fields = stat_fields(pid, proc)
    return not fields or fields[0] in ("T", "t", "Z", "X")


def abort_workers(job: str, node: str) -> list[int]:
    """A hang's second phase on this node, once every node's workers are stopped: SIGABRT,
    then SIGCONT, to each worker (a stopped process takes the pending SIGABRT as it goes on,
    before it runs anything else: faulthandler prints its stacks); the pids signalled."""
    pids = workers(job, node)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGABRT)
            os.kill(pid, signal.SIGCONT)
    return pids
