"""The batch step's act phase: carrying out a decision (issue 37, item 7).

Requeue (with the TERM it brings ignored), fail or give up, each recorded only after it
happened; drain or down a node; relaunch in the allocation; and what a TERM from Slurm means
(:meth:`on_term`, :meth:`record_stop`) and what an unasked restart was
(:meth:`note_unasked_restart`). The decision itself is :mod:`.decide`'s.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

from . import decide as dec
from . import slurm as sl
from . import spares as sp
from .batch_launch import LaunchSteps
from .batch_state import log

# gate_open's answer when the gate failed nodes and spares took their places: the launch
# did not start, and runs again (no exit code of the job's).
SWAPPED = -1
# The state file's reason for a requeue at the time limit that no save signal preceded.
LIMIT_WITHOUT_SIGNAL = (
    "the time limit came without the pre-timeout signal; resuming from the last checkpoint"
)


class ActSteps(LaunchSteps):
    """The batch step's act phase (mixed into :class:`.batch.Batch`)."""

    def act(self, d: dec.Decision, recorded: bool = False, exclude: Sequence[str] = ()) -> int:
        """Carry out a decision; record it only after it happened (``recorded``: already).

        ``exclude``: failed nodes Slurm was not told about (the owner may not drain them);
        the requeued job is kept off them (see :func:`slurm.requeue_excluding`).
        """
        d = dec.apply_cap(d, self.restarts_used(), self.o.max_restarts, self.o.requeue)
        if d.action == "finished":
            self.state.record("finished", d.reason)
            return 0
        if d.action == "requeue":
            me = sl.self_id(self.env)
            log(f"requeueing job {me}: {d.reason}")
            with term_ignored():
                # requeuehold makes slurmd TERM this job at once; the update and release that
                # follow must not die with it (the children inherit the ignored TERM).
                ok, why, note = sl.requeue_excluding(me, exclude, self.run, self.retry)
                if ok:
                    # Still under the ignored TERM: the TERM the requeue brings must find
                    # the requeue recorded, or the next attempt would take it for one
                    # slurmfm did not ask for.
                    self.requeued = True
                    if not recorded:
                        self.state.record("requeue", d.reason + (f" ({note})" if note else ""))
            if note:
                log(f"requeued job {me}: {note}", err=not note.startswith("excluded"))
            if ok:
                return 0
            self.state.record("fail", f"requeue failed ({why}): {d.reason}")
            log(f"could not requeue job {me}: {why}", err=True)
            return d.exit_code or dec.GIVE_UP_EXIT
        event = "give-up" if d.reason.startswith(("restart cap", "requeue disabled")) else "fail"
        self.state.record(event, d.reason)
        log(f"not requeueing: {d.reason}", err=True)
        return d.exit_code or dec.GIVE_UP_EXIT

    def drain(self, node: str, why: str, state: str = "DRAIN") -> bool:
        """Set ``node`` to ``state`` when permitted; True when Slurm took it."""
        if not self.o.drain:
            log(f"{node} failed a check: {why} (resilience.drain_unhealthy is off)", True)
            return False
        if self.o.hyperpod:
            # HyperPod replaces a node whose drain reason starts with Action:Replace (AWS docs
            # "sagemaker-hyperpod-resiliency-slurm-replace-faulty-instance").
            why = "Action:Replace " + why
        if sl.set_node(node, state, why, self.run):
            log(f"set {node} {state}: {why}", err=True)
            return True
        log(f"could not set {node} {state} (not permitted?): {why}; ask an admin", err=True)
        return False

    def relaunch(
        self,
        d: dec.Decision,
        dead: Sequence[str],
        serve_argv: Sequence[str],
        launch_argv: Sequence[str],
    ) -> bool:
        """Restart inside the allocation instead of requeueing: True when it will.

        A requeue gives the allocation back, waits out the job credential (``cred_expire``,
        120 s by default before 25.11) and then the queue, though the nodes are usually fine.
        So a retryable failure on nodes that all answered relaunches the step in this job,
        counted against ``max_restarts``. Requeued instead: an exit 0 short of the work (Megatron
        ends early to leave the time limit to the next allocation), a node lost (the allocation
        cannot continue), the pre-timeout signal (the time limit is the allocation's), a
        server beside the trainer, HyperPod (its auto-resume replays the step itself).
        The health gate runs again first (:meth:`_main`); a node it fails requeues off it,
        or, with spare nodes, is swapped for a spare (:meth:`take_spares`).
        """
        o = self.o
        alone = bool(self.unhealthy) and not launch_argv  # a server alone, stopped unhealthy
        if not (
            o.restart_in_job
            and d.action == "requeue"
            and d.exit_code != 0  # an early exit 0 (Megatron's exit-duration) wants a new limit
            and (launch_argv or alone)
            and (not serve_argv or alone)
            and not dead
            and not self.signalled
            and not o.hyperpod
            and not self.stopping
            and not self.ctld_away  # a new step needs slurmctld; the requeue path waits for it
            and not self.node_failed  # the allocation lost a node (accounting says)
        ):
            return False
        if self.restarts_used() >= o.max_restarts:
            return False  # the requeue path applies the cap and records the give-up
        self.relaunches += 1
        why = "%s (in-job restart %d, restart %d of %d)" % (
            d.reason,
            self.relaunches,
            self.restarts_used(),
            o.max_restarts,
        )
        self.state.record("relaunch", why)
        log("relaunching the step in this allocation: " + why)
        self.done_note = ""
        self.next_signal = None
        return True

    def record_stop(self) -> dict[str, str]:
        """Record what the TERM means, as Slurm says at this moment; the job record read.

        ``scancel``, an operator's ``scontrol requeue``, preemption and the time limit all
        reach the batch step as TERM, followed by KILL after ``KillWait`` (default 30 s,
        https://slurm.schedmd.com/slurm.conf.html#OPT_KillWait), so the question to
        slurmctld has a short bound (``--stop-query-s``) and its answer is written before
        anything else is cleaned up. A TERM that follows this attempt's own requeue is not
        asked about: the requeue is recorded already.
        """
        me = sl.self_id(self.env)
        rec = sl.job_record(me, self.run, self.o.stop_query_s)
        why = sl.stop_reason(rec, self.restart) or (
            "TERM; slurmctld did not answer within %g s" % self.o.stop_query_s
        )
        self.state.record("stop", why)
        log("TERM received: " + why, err=True)
        return rec

    def note_unasked_restart(self) -> None:
        """Record why this attempt runs when slurmfm did not requeue the last one.

        The runtime records each requeue it asks for with the number of the attempt it ends
        (``restart=N-1`` in the state file), so attempt N finds it. Without it the restart
        was Slurm's (a node failure with ``--requeue``, a failed launch) or an operator's
        (``scontrol requeue``, preemption); what Slurm and the last attempt's own TERM record
        say is recorded as the reason (:func:`slurm.restart_reason`).
        """
        if self.restart <= 0:
            return
        own = self.state.last_entry("requeue")
        if own is not None and own[0] == self.restart - 1:
            return
        stop = self.state.last_entry("stop")
        previous = stop[1] if stop is not None and stop[0] == self.restart - 1 else ""
        why = sl.restart_reason(sl.self_id(self.env), previous, self.run, 10.0)
        self.state.record("restart", why)
        log("restart %d: %s" % (self.restart, why))

    def on_term(self, signum: int, frame: object) -> None:
        if self.stopping:  # a second TERM while the first is handled
            return
        self.stopping = True
        code = 128 + signum
        if self.signalled and self.o.save_protocol and not self.gave_up:
            # The save outlasted the window and Slurm is ending the job at its time limit
            # requeue from the last checkpoint instead of ending TIMEOUT.
            with contextlib.suppress(Exception):
                d = dec.Decision("requeue", "the step outlasted the save window", code)
                if self.act(d) == 0:
                    code = 0
        if not self.requeued:
            rec: dict[str, str] = {}
            with contextlib.suppress(Exception):
                rec = self.record_stop()
            if self.launching and not self.signalled and sl.at_time_limit(rec, self.restart):
                # Slurm's pre-timeout USR2 (--signal=B:USR2@N) never came: lost on its way (a
                # CI run on the lab lost one sent with scancel), or sent before the runtime
                # could take it. Requeue as the signal would have, within the same cap, from
                # the last checkpoint, instead of ending TIMEOUT with the run unfinished.
                with contextlib.suppress(Exception):
                    if self.act(dec.Decision("requeue", LIMIT_WITHOUT_SIGNAL, code)) == 0:
                        code = 0
        with contextlib.suppress(Exception):
            self.cleanup()
        flush_and_exit(code)

    def use_swap(self, swap: sp.Swap, why: str) -> None:
        self.pool = swap.pool
        self.order = list(swap.pool.order)
        self.state.record("spare", "%s: %s" % (why, swap.describe()))
        log("spare nodes: %s: %s" % (why, swap.describe()), err=True)

    def act_on_end(self, d: dec.Decision, dead: Sequence[str]) -> int:
        """Carry out the decision on an ended step (:meth:`.batch.Batch.after_step`): this
        attempt's named containers removed, the nodes that did not answer set DOWN, then
        :meth:`act`."""
        capped = dec.apply_cap(d, self.restarts_used(), self.o.max_restarts, self.o.requeue)
        recorded = False
        why = "did not answer after a failed step (job {})".format(self.env.get("SLURM_JOB_ID", ""))
        if not dead:
            # Before a requeue: once Slurm requeues the job, no step of it starts here.
            self.containers_remove()
        undowned: list[str] = []
        for h in dead:
            if not self.drain(h, why, "DOWN"):
                undowned.append(h)
            elif not recorded and capped.action == "requeue":
                # A node set DOWN makes Slurm requeue this job itself at once (seen on
                # the lab: it may end this step before `scontrol requeue` returns), so
                # the requeue is recorded as soon as its cause happened.
                self.state.record("requeue", capped.reason)
                recorded = True
                self.requeued = True
        return self.act(d, recorded, exclude=[] if recorded else undowned)


def flush_and_exit(code: int) -> None:
    """``os._exit`` (no cleanup handlers in a signal handler) after what was printed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def term_ignored() -> Iterator[None]:
    """Ignore SIGTERM (in this process and the commands it starts) for the block.

    Only the main thread may change signal handlers; elsewhere the block runs unchanged.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
