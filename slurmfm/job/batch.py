"""The batch step: health gate, observability agents, server readiness, the launch, signals,
and the finish / requeue / fail decision with its record.

The batch script ``exec``s into ``python3 RUNTIME batch [options] -- srun ...``, so this process
*is* the batch shell Slurm signals with ``--signal=B:USR2@T``. On USR2 it records the signal and
either forwards USR2 to the launch ``srun`` (Slurm passes it to every process of the step) and
repeats it every ``resignal_s`` until the step ends (a process still starting up ignores it),
or, for a launch in a container, starts one host step on every node that signals the training
processes there (``forward``), or, for a launcher without a save protocol, requeues at once.

One attempt follows the life docs/job-runtime.md describes, one module per phase (issue 37,
item 7; the class was 1,245 lines with 53 methods): what the attempt was given is one frozen
value (:class:`.attempt.Attempt`, ``Batch.given``) beside its working state
(:mod:`.batch_state`); then gate (:mod:`.batch_gate`), launch (:mod:`.batch_launch`), watch
(:mod:`.batch_watch`), judge (:mod:`.batch_judge`) and act (:mod:`.batch_act`). Each is a
class built on the one whose methods it calls (state, launch, act, gate, watch, judge), so
that each reads on its own and mypy checks every call across them; :class:`Batch` runs the
phases in the life's order. The names this module had are kept (re-exported here).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Sequence

from . import decide as dec
from . import gate
from . import slurm as sl
from .attempt import Attempt
from .batch_act import LIMIT_WITHOUT_SIGNAL, flush_and_exit, term_ignored
from .batch_gate import SWAPPED
from .batch_judge import JudgeSteps, retry_codes
from .batch_launch import (
    ask_digest,
    in_container,
    in_step,
    masked,
    runs_node_entry,
    with_auto_resume,
    with_evidence_mount,
)
from .batch_state import BatchState, log
from .node import IN_ENTRY
from .options import BatchOptions

__all__ = [
    "LIMIT_WITHOUT_SIGNAL",
    "SWAPPED",
    "Attempt",
    "Batch",
    "BatchOptions",
    "BatchState",
    "ask_digest",
    "dump_json",
    "flush_and_exit",
    "in_container",
    "in_step",
    "log",
    "masked",
    "retry_codes",
    "runs_node_entry",
    "term_ignored",
    "with_auto_resume",
    "with_evidence_mount",
]


class Batch(JudgeSteps):
    """One run of the batch step; ``opts`` are its options (:class:`.options.BatchOptions`)."""

    def main(self, serve_argv: Sequence[str], launch_argv: Sequence[str]) -> int:
        """Run the job; with expedited requeue, a non-zero end the runtime chose stays an end."""
        rc = self._main(serve_argv, launch_argv)
        if rc != 0 and self.o.expedite and not self.requeued:
            # --requeue=expedite would requeue this job held (sl.no_requeue says why)
            me = sl.self_id(self.env)
            if not sl.no_requeue(me, self.run, self.retry):
                log(f"could not set Requeue=0 on job {me}: Slurm may hold it requeued", err=True)
        return rc

    def run_step(self, serve_argv: Sequence[str], launch_argv: Sequence[str]) -> int | None:
        """Run the step once and carry out the decision: the job's exit code, or None when
        the step is to run again in this allocation (:meth:`relaunch`)."""
        o = self.o
        self.marker_before = dec.marker_stamp(self.env.get("SLURMFM_CHECKPOINT_DIR", ""))
        launch_argv = self.move_port(self.on_spares(launch_argv))
        if launch_argv and o.fabric_test != "off" and not self.fabric_done:
            self.fabric_done = True  # once per attempt, before its first launch (.fabric)
            code = self.fabric_check(launch_argv)
            if code is not None:
                return code
        if launch_argv:
            launch_argv, started, code = self.start_training(serve_argv, launch_argv)
            if not started:
                return code
        else:
            log("launch: " + masked(serve_argv, o.secret, self.env))
            self.step, self.server = self.server, None
            self.step_started = self.clock()
            self.serving = True
        if o.nccl_check != "off":
            threading.Thread(target=self.nccl_watch, daemon=True).start()
        rc = self.wait_step()
        return self.after_step(128 - rc if rc < 0 else rc, serve_argv, launch_argv)

    def start_training(
        self, serve_argv: Sequence[str], launch_argv: Sequence[str]
    ) -> tuple[list[str], bool, int | None]:
        """Start the launch step, through the gate where it runs in the step: (the launch as
        started, whether it started, else :meth:`run_step`'s answer)."""
        o = self.o
        log("launch: " + masked(launch_argv, o.secret, self.env))
        # SLURMFM_STEP marks the launch's processes for `forward` (found by environment).
        env = dict(self.step_env(launch_argv), SLURMFM_STEP="launch")
        env.update(self.evidence_env())
        # a node entry in a container writes its report where the batch step reads it
        launch_argv = with_evidence_mount(launch_argv, self.evidence_dir)
        if "--auto-resume=1" in launch_argv:
            # a replay after a node replacement recomputes its order (node.replayed)
            env["SLURMFM_LAUNCH_NODELIST"] = self.env.get("SLURM_JOB_NODELIST", "")
        gated = self.in_step and self.health_on
        if gated and not self.evidence_dir:
            # no private directory for the verdicts: the separate gate step
            code = self.health_gate([serve_argv, launch_argv])
            if code is not None:
                return launch_argv, False, code
            gated = False
        if gated:
            # every task reads the batch step's word on stdin (srun --input=all)
            env.update({gate.ENV: self.gate_spec(), "SLURM_STDINMODE": "all"})
        if o.observe and self.in_step and self.observe_dir():
            env[IN_ENTRY] = "1"  # each node's entry forks its agent: no step of theirs
        self.step = self.start_launch(launch_argv, env, gated)
        self.step_started = self.clock()
        if gated:
            code = self.gate_open(self.step)
            if code == SWAPPED:
                return launch_argv, False, None  # again, on the spare (not a restart)
            if code is not None:
                return launch_argv, False, code
            self.step_started = self.clock()
        if o.observe and not self.in_step:
            self.observe_start()  # once the launch is on its way (gated: every node passed)
        return launch_argv, True, None

    def after_step(
        self, rc: int, serve_argv: Sequence[str], launch_argv: Sequence[str]
    ) -> int | None:
        """The step ended ``rc``: judge it and carry out the decision (:meth:`run_step`)."""
        o = self.o
        if self.nccl_socket:
            self.state.record("fail", "NCCL fell back to sockets")
            return 3
        if self.server is not None and self.server.poll() is None:
            log("trainer finished (exit %d); stopping the %s server" % (rc, o.serve_kind))
            self.stop_server()
        if self.gave_up:  # already recorded at the signal
            return rc or dec.GIVE_UP_EXIT
        dead = self.probe_dead(rc)
        retry = retry_codes(o.retry_exit)
        after = self.progress_now()
        verdict = None
        saved = None
        if self.signalled:
            saved = self.saved_on_signal(rc, after)
        elif rc != 0 and not o.hyperpod and launch_argv:
            verdict = self.judge(rc, dead, retry, after, launch_argv)
        d = dec.decide(
            rc,
            self.signalled,
            self.finished() if rc == 0 else False,
            dead,
            retry,
            o.hyperpod,
            verdict,
            saved,
        )
        if self.unhealthy and not dead:
            d = dec.Decision("requeue", self.unhealthy, rc or 1)
        if self.done_note:
            log("completion check: " + self.done_note)
            if d.action == "requeue" and self.done_note.startswith("stale"):
                d = d._replace(reason=f"{d.reason}; {self.done_note}")
        if dead and self.pool is not None and self.spare_for_dead(dead):
            dead = []
        if self.relaunch(d, dead, serve_argv, launch_argv):
            return None
        return self.act_on_end(d, dead)

    def _main(self, serve_argv: Sequence[str], launch_argv: Sequence[str]) -> int:
        o = self.o
        self.container_steps = [list(a) for a in (serve_argv, launch_argv) if a]
        last = self.state.last("requeue")
        log(
            "job %s start %d (at most %d restarts)%s"
            % (
                self.env.get("SLURM_JOB_ID", "?"),
                self.restart,
                o.max_restarts,
                "; last requeue: " + last if last else "",
            )
        )
        signal.signal(signal.SIGUSR2, self.on_usr2)
        # scancel and the end of the time limit send TERM: clean up (endpoint files, agents)
        # as the bash EXIT trap did, then end as TERM would.
        signal.signal(signal.SIGTERM, self.on_term)
        # After the handlers: asking Slurm may take seconds, and a signal must not kill the
        # step meanwhile. A missing reason never stops the job.
        with contextlib.suppress(Exception):
            self.note_unasked_restart()
        self.containers_remove(earlier=True)
        if self.env.get("SLURMFM_EARLY_USR2"):  # it came while the batch script prepared
            self.on_usr2(signal.SIGUSR2, None)
        try:
            health_on = bool(o.health and (o.gpus or o.efa or o.dcgm or o.imex)) or any(
                c.health for c in self.het
            )
            self.health_on = health_on
            self.in_step = in_step(serve_argv, launch_argv, o.runtime, bool(self.het), o.hyperpod)
            if health_on and not self.in_step:
                code = self.health_gate([serve_argv, launch_argv])
                if code is not None:
                    return code
            if o.observe and serve_argv:
                self.observe_start()  # a server takes minutes to be ready: its metrics too
            if serve_argv:
                code = self.start_server(serve_argv)
                if code is not None:
                    return code
            if not o.hyperpod and os.path.isdir(o.hyperpod_marker):
                # A HyperPod node, though the recipe's flavor is not hyperpod: its auto-resume
                # is an srun option (AWS docs "sagemaker-hyperpod-resiliency-slurm-auto-resume").
                launch_argv = with_auto_resume(launch_argv)
                serve_argv = with_auto_resume(serve_argv)
            self.ask = ask_digest(launch_argv or serve_argv)
            # The training writes it into its DONE marker (slurmfm.checkpoint.mark_done).
            self.env["SLURMFM_ASK"] = self.ask
            while True:
                code = self.run_step(serve_argv, launch_argv)
                if code is not None:
                    return code
                if health_on and not self.in_step:
                    # the nodes are checked again before the step runs on them once more
                    # (in the launch step itself where it runs the node entry)
                    code = self.health_gate([serve_argv, launch_argv])
                    if code is not None:
                        return code
                if serve_argv and not launch_argv:  # a server alone, relaunched (server_watch)
                    code = self.start_server(serve_argv)
                    if code is not None:
                        return code
        finally:
            self.cleanup()


def dump_json(value: object) -> str:
    return json.dumps(value, sort_keys=True)
