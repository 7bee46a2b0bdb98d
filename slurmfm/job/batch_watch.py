"""The batch step's watch phase: while the launch runs (issue 37, item 7).

The wait on the launch step with, at each poll, the save signal's forwarding, the hang and
start-up watch (:mod:`.hang`), a server's health watch, the line on the time to first
progress, and the NCCL transport check (a thread); USR2 arrives here too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from . import decide as dec
from . import evidence as ev
from . import nccl, pd, serve
from .batch_act import flush_and_exit
from .batch_gate import GateSteps
from .batch_state import log
from .hang import HangWatch

# The state file's reason for a requeue at the save signal of a launch still starting.
UNTRAINED = (
    "time limit near before the launch trained (no progress since it started): nothing "
    "newer to save"
)


class WatchSteps(GateSteps):
    """The batch step's watch phase (mixed into :class:`.batch.Batch`)."""

    def wait_step(self) -> int:
        step = self.step
        if step is None:  # pragma: no cover - main() sets it first
            return 0
        self.launching = True
        try:
            while True:
                self.forward_signal()
                hang = self.hang
                if hang is not None and not self.hung and not self.signalled and hang.hung():
                    self.stop_hung(hang, step)
                elif hang is None and self.progress is not None:
                    self.progress.poll()
                if not self.unhealthy and not self.signalled:
                    why = self.server_gone()
                    if why or self.server_watch():
                        self.stop_unhealthy(step, why)
                self.say_first_progress()
                try:
                    rc = step.wait(timeout=self.o.poll_s)
                except subprocess.TimeoutExpired:
                    continue
                if self.progress is not None:
                    # a launch that ended between two reads: its lines since the last one
                    # (a short run's first progress came and went between them)
                    self.progress.poll(force=True)
                    self.say_first_progress()
                return rc
        finally:
            self.launching = False

    def forward_signal(self) -> None:
        step = self.step
        if self.next_signal is None or step is None or step.poll() is not None:
            return
        if self.clock() >= max(self.next_signal, self.step_started + self.o.signal_grace_s):
            if not self.forwarded:
                # The save is asked for now: only a checkpoint newer than this proves it.
                self.forwarded = True
                self.mark_at_signal = self.progress_now()
            if self.o.container_forward == "none":
                with contextlib.suppress(OSError):
                    step.send_signal(signal.SIGUSR2)
            elif self.forwarder is None:
                self.forward_start()
            self.next_signal = self.clock() + self.o.resignal_s

    def on_usr2(self, signum: int, frame: object) -> None:
        if self.signalled:
            return
        self.signalled = True
        # What a save must beat: a checkpoint the step wrote before the signal proves none.
        self.mark_at_signal = self.progress_now()
        self.state.record("signal", "USR2 before the time limit")
        if not self.o.save_protocol:
            # No save protocol (a server, save_on_signal false): requeue now; the run resumes
            # from its last periodic checkpoint. When it may not requeue, it runs to the limit.
            self.requeue_at_signal("time limit near (launcher saves periodically)")
            return
        if self.untrained():
            # Still starting: a save now could hold nothing newer than the checkpoint the
            # launch resumed from, and waiting for one keeps the allocation to the limit
            # (seen on the lab at load 99: start-up outlasted a 3-minute limit's first two
            # minutes, and the launch then idled 60 s until the limit ended it).
            self.requeue_at_signal(UNTRAINED)
            return
        log("USR2 received: asking the training processes to save and exit")
        # A step that has just started may still hold processes that have not installed their
        # handlers yet: the first USR2 goes no earlier than signal_grace_s after its start.
        self.next_signal = max(self.clock(), self.step_started + self.o.signal_grace_s)

    def requeue_at_signal(self, reason: str) -> None:
        """Requeue at the save signal without asking for a save (the run resumes from its
        last checkpoint) and end this attempt; where it may not requeue, record the give-up
        and run on to the limit."""
        d = dec.apply_cap(
            dec.Decision("requeue", reason, 0),
            self.restarts_used(),
            self.o.max_restarts,
            self.o.requeue,
        )
        if d.action != "requeue":
            log("USR2 received: not requeueing: %s" % d.reason, err=True)
            self.state.record("give-up", d.reason)
            self.gave_up = True
            return
        log("USR2 received: requeueing now; the run resumes from its last checkpoint")
        if self.act(d) == 0:
            self.cleanup()
            flush_and_exit(0)
        self.gave_up = True  # the failed requeue is recorded; keep running

    def untrained(self) -> bool:
        """At the save signal: True when the running launch has not trained yet, so that a
        save could hold nothing newer than the checkpoint it resumed from.

        Only where that can be told: the training reports progress (``report_progress``
        wrote the progress file before this launch began, so it writes again at its first
        step here: the first report of a process is never throttled), and since the launch
        began neither the file nor the checkpoints moved and no step line was seen. A
        training that reports nothing, or a first launch with no report yet, is asked to
        save as before. Never twice in a row: after a requeue for this reason the next
        attempt is asked to save, so that a start-up longer than the time before the signal
        still gains a step per two attempts instead of none."""
        p = self.progress
        if not self.launching or p is None or p.first_s is not None:
            return False
        if not p.first_mark.get("progress") or self.state.last("requeue") == UNTRAINED:
            return False
        return ev.progress_since(p.first_mark, self.progress_now())[0] is False

    def nccl_watch(self) -> None:
        step = self.step
        # only this attempt's own directory (the script's mktemp -d): a look-alike planted in
        # the shared log directory is never read
        pattern = os.path.join(os.path.dirname(self.env.get("SLURMFM_NCCL_LOG", "")), "*")
        v = nccl.watch(
            pattern, self.o.nccl_timeout_s, lambda: step is not None and step.poll() is None
        )
        if v == "efa":
            log("NCCL transport check: EFA (aws-ofi-nccl) in use")
        elif v == "socket":
            log(
                "NCCL transport check: NCCL fell back to TCP sockets instead of EFA; check the "
                f"aws-ofi-nccl plugin path and FI_PROVIDER (see {pattern})",
                err=True,
            )
            if self.o.nccl_check == "fail" and step is not None:
                self.nccl_socket = True
                step.terminate()
        elif step is not None and step.poll() is None:
            log(
                f"NCCL transport check: no NCCL network line within {self.o.nccl_timeout_s:g} s",
                err=True,
            )

    def server_gone(self) -> str:
        """A server beside the trainer (a train-and-serve job) that has ended while the
        trainer runs: why, else "". The trainer would fail or wait on it (a rollout asks it),
        so the step is stopped and requeued with the server's evidence, as for one that stops
        answering (:meth:`server_watch`). A server alone is the step itself: its end is the
        step's."""
        server = self.server
        if server is None or self.serving:
            return ""
        rc = server.poll()
        if rc is None:
            return ""
        return "%s server beside the trainer ended (%s)" % (
            self.o.serve_kind,
            "signal %d" % -rc if rc < 0 else "exit %d" % rc,
        )

    def server_watch(self) -> bool:
        """A server, alone in its job or beside the trainer: True once its health endpoint
        has not answered for ``unhealthy_timeout_s`` (asked every ``ready_poll_s``). No
        training hang watch applies to a server; this is its own."""
        o = self.o
        if not ((self.serving or self.server is not None) and o.unhealthy_timeout_s > 0):
            return False
        now = self.clock()
        if now < self.next_health:
            return False
        self.next_health = now + o.ready_poll_s
        url = self.env.get("SLURMFM_SERVE_URL", "") + o.health_path
        if self.env.get(pd.ENV):  # SGLang prefill/decode: the router with healthy servers
            ok = serve.pd_check(self.env.get("SLURMFM_SERVE_URL", "") + serve.ROUTER_READY)
        else:
            ok = serve.http_ok(url, timeout_s=min(10.0, o.ready_poll_s * 2))
        if ok:
            self.unhealthy_since = None
            return False
        if self.unhealthy_since is None:
            self.unhealthy_since = now
        return now - self.unhealthy_since >= o.unhealthy_timeout_s

    def stop_unhealthy(self, step: subprocess.Popen[bytes], why: str = "") -> None:
        """Stop a server whose health endpoint stopped answering (or, beside the trainer,
        that ended: ``why``) with its stderr's last lines in the log and in the reason: the
        evidence of why (judged in :meth:`run_step`). Beside the trainer, ``step`` is the
        trainer's: it is stopped too, and the server after it (:meth:`after_step`)."""
        o = self.o
        since = self.clock() - (self.unhealthy_since or self.clock())
        tail = [x for x in ev.log_since(self.server_log) if x.strip() and "slurmfm:" not in x]
        self.unhealthy = why or "%s server%s not healthy for %d s (%s%s)" % (
            o.serve_kind,
            "" if self.serving else " beside the trainer",
            since,
            self.env.get("SLURMFM_SERVE_URL", ""),
            o.health_path,
        )
        if tail:
            self.unhealthy += "; last stderr: " + tail[-1].strip()[:300]
        log(self.unhealthy + "; stopping it", err=True)
        for line in tail[-20:]:
            log("  | " + line, err=True)
        step.terminate()  # srun passes TERM to every task, then KILL after KillWait
        deadline = self.clock() + 60.0
        while step.poll() is None and self.clock() < deadline:
            self.sleep(0.5)

    def say_first_progress(self) -> None:
        """The job log's line on each launch's time to its first progress, so that users can
        size ``resilience.startup_timeout``."""
        p = self.progress
        if p is None or p.first_s is None or self.first_progress_said:
            return
        self.first_progress_said = True
        log(
            "launch %d: first progress %.0f s after the start (%s)"
            % (self.launches, p.first_s, p.first_what or p.what)
        )

    def stop_hung(self, h: HangWatch, step: subprocess.Popen[bytes]) -> None:
        """A hang, or no first progress within the start-up allowance: stacks of every worker
        into the log, then the step is stopped (see :mod:`.hang`); it ends and is judged like
        any failure, as a hang or a start-up stop."""
        self.hung = h.reason()
        what = "start-up" if h.starting else "hang"
        log("%s: %s; dumping the workers' stacks, then stopping the step" % (what, self.hung), True)
        # every node's workers stopped before any is aborted (see .hang); the second step
        # runs whatever the first did, so that no worker stays stopped
        for phase in ("stacks", "abort"):
            _, out = self.run(self.all_nodes_srun(phase, overlap=True), self.o.probe_timeout_s)
            sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
            sys.stdout.flush()
        deadline = self.clock() + 30.0
        while step.poll() is None and self.clock() < deadline:
            self.sleep(0.5)
        if step.poll() is None:
            step.terminate()  # srun passes TERM to every task, then KILL after KillWait
