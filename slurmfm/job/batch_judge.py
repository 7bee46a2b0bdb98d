"""The batch step's judge phase: what a launch's end means (issue 37, item 7).

The failed launch classified from its evidence (:mod:`.classify`), the completion check of an
exit 0, and the signature the last failure left.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import classify as cl
from . import decide as dec
from . import evidence as ev
from . import slurm as sl
from .batch_launch import runs_node_entry
from .batch_state import log
from .batch_watch import WatchSteps


class JudgeSteps(WatchSteps):
    """The batch step's judge phase (mixed into :class:`.batch.Batch`)."""

    def previous_signature(self) -> str:
        """The signature the last attempt failed with: this job's last launch, or the
        requeue the previous attempt recorded."""
        if self.last_signature:
            return self.last_signature
        e = self.state.last_entry("requeue")
        if e is not None and e[0] == self.restart - 1:
            return cl.signature_in(e[1])
        return ""

    def judge(
        self,
        rc: int,
        dead: Sequence[str],
        retry: Sequence[int] | None,
        after: dict[str, str],
        argv: Sequence[str],
    ) -> cl.Verdict:
        """Classify the failed launch from its evidence; log what was seen."""
        if self.progress is not None:
            progress, note = self.progress.since_start()
            self.say_first_progress()
        else:
            progress, note = ev.progress_since(self.mark_before, after)
        nodes = ev.read_reports(self.evidence_dir) if self.evidence_dir else ()
        lines = self.srun_lines
        for line in ev.log_since(self.log_start):
            lines(line)
        e = cl.Evidence(
            rc,
            nodes=nodes,
            tasks=tuple(lines.tasks),
            srun_errors=tuple(lines.errors),
            oom=lines.oom,
            lost=tuple(dead),
            progress=progress,
            progress_note=note,
            previous=self.previous_signature(),
            retryable=retry,
            reported=runs_node_entry(argv, self.o.runtime) and bool(self.evidence_dir),
            hang=self.hung,
        )
        if not self.ctld_away:
            state = sl.last_step_state(sl.self_id(self.env), self.run)
            e = e._replace(step_state=state)
            self.node_failed = state == "NODE_FAIL"
        v = cl.classify(e)
        first = cl.first_failure(nodes)
        log(
            "failure evidence: srun exit %d; first failure: %s; progress: %s; %s"
            % (
                rc,
                "%s exit %d %s" % (first.node, first.exit, first.exc_type)
                if first is not None
                else "no node report",
                note or ("none" if progress is False else "unknown"),
                "retry" if v.retry else "fail",
            ),
            err=True,
        )
        self.last_signature = v.signature
        return v

    def finished(self) -> bool | None:
        ckpt = self.env.get("SLURMFM_CHECKPOINT_DIR", "")
        kind, _, arg = self.o.done_check.partition(":")
        if kind == "megatron":
            return dec.megatron_finished(ckpt, int(arg))
        if kind == "megatron-log":
            return dec.megatron_log_finished(ev.log_since(self.log_start))
        if kind == "marker":
            verdict, self.done_note = dec.marker_verdict(
                ckpt, self.ask, self.env.get("SLURM_JOB_ID", ""), self.marker_before
            )
            if verdict == "done":
                return True
            if verdict == "stale":
                # What another ask finished says nothing about this one: not done.
                return False
            # Without the pre-timeout signal an exit 0 stays "done" for scripts that never
            # write the marker; after the signal only the marker says the work is finished.
            return False if self.signalled else None
        return None

    def probe_dead(self, rc: int) -> list[str]:
        """After a failed step: the nodes (spares too) that do not answer the probe. None
        judged after the save signal, under HyperPod (its own agent does) or while slurmctld
        is away (no step could ask: :attr:`ctld_away` is set)."""
        o = self.o
        if rc == 0 or self.signalled or o.hyperpod:
            return []
        if not sl.controller_up(self.run):
            self.ctld_away = True
            log("slurmctld does not answer; not judging the nodes", err=True)
            return []
        spare = list(self.pool.spares) if self.pool is not None else []
        found = sl.probe(self.order + spare, self.run, o.probe_timeout_s)
        if found.unknown:
            log("the node probe did not start (%s); not judging the nodes" % found.unknown, True)
        return list(found.dead)

    def saved_on_signal(self, rc: int, after: dict[str, str]) -> str | None:
        """After the save signal: what the step saved (:func:`.evidence.saved_since`), with
        "" recorded as a failed save."""
        saved = ev.saved_since(self.mark_at_signal or self.mark_before, after)
        if saved and rc != 0:
            # A training that saved on the signal exits 0; a checkpoint beside a failed
            # exit is a periodic one finishing, not the save that was asked for.
            log("after the save signal: %s, but the training exited %d" % (saved, rc))
            saved = ""
        if saved == "":
            self.state.record(
                "save-failed",
                "no new complete checkpoint after the pre-timeout signal (training exit %d)" % rc,
            )
        return saved


def retry_codes(spec: str) -> list[int] | None:
    """``--retry-exit``: 'any' (None: every exit retried), 'none' or a comma list of codes."""
    if spec == "any":
        return None
    return [int(x) for x in spec.split(",") if x and x != "none"]
