"""The batch step's gate phase: nodes checked before the launch runs on them (issue 37,
item 7).

The separate health-gate step or the gate inside the launch step (:mod:`.gate`), the IMEX
check inside the container, the fabric test (:mod:`.fabric`), the systemic-failure rule
(:mod:`.systemic`), and spares standing in for nodes that failed a check or did not answer.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Sequence

from . import decide as dec
from . import fabric, gate, hetjob
from . import spares as sp
from .batch_act import ActSteps
from .batch_state import log
from .health import parse_report
from .systemic import systemic

# gate_open's answer when the gate failed nodes and spares took their places: the launch
# did not start, and runs again (no exit code of the job's).
SWAPPED = -1
# The state file's reason for a requeue at the time limit that no save signal preceded.
LIMIT_WITHOUT_SIGNAL = (
    "the time limit came without the pre-timeout signal; resuming from the last checkpoint"
)


class GateSteps(ActSteps):
    """The batch step's gate phase (mixed into :class:`.batch.Batch`)."""

    def health_gate(self, steps: Sequence[Sequence[str]] = ()) -> int | None:
        """Check every component's nodes with that component's expectations.

        ``steps``: the job's srun command lines (server, launch). Where a component expects
        the IMEX channel and its step runs in a container, a short step in the same image
        with the same mounts then checks the channel is visible inside it too. A node that
        fails the host checks is drained and the job requeued off it; a channel the host has
        but the container lacks is the job's configuration (its mounts, Enroot's hooks), the
        same on any node: the job fails with the reason, nothing drained. Where the launch
        runs the node entry, the same checks run inside the launch step instead
        (:meth:`gate_open`); this separate step is for the other launches.
        """
        o = self.o
        first = hetjob.Component(0, 0, bool(o.health), o.gpus, o.efa, bool(o.imex))
        out_all = ""
        worst = 0
        checked = []
        for comp in [first, *self.het]:
            if not comp.health or not (comp.gpus or comp.efa or o.dcgm or comp.imex):
                continue
            where = None if comp is first else comp
            checked.append((comp, where))
            ho = o.health_options(comp.gpus, comp.efa, comp.imex)
            cmd = ["health", *ho.to_argv(always=ho.defaults())]
            # every node's verdict is wanted (spares stand in only when all are known), so a
            # cluster's KillOnBadExit=1 must not end the healthy nodes' checks early
            argv = self.component_srun(where, ["--kill-on-bad-exit=0", "python3", o.runtime, *cmd])
            rc, out = self.run(argv, o.health_timeout_s)
            out_all += out
            worst = worst or rc
        sys.stdout.write(out_all)
        ok, bad = parse_report(out_all)
        code = self.systemic_fail(bad, len(ok) + len(bad))
        if code is not None:
            return code
        if (worst == 0 and not bad) or self.take_spares(ok, bad, self.pool_live()):
            return self.container_gate([w for c, w in checked if c.imex], steps)
        return self.gate_failed(bad, worst)

    def fabric_check(self, launch_argv: Sequence[str]) -> int | None:
        """The fabric test (:mod:`.fabric`): None to go on, else the attempt's end."""
        o = self.o
        nodes = self.order or [self.env.get("SLURMD_NODENAME", "")]
        argv = fabric.srun_argv(
            int(self.env.get("SLURM_JOB_NUM_NODES", "") or len(nodes)),
            o.fabric_tasks,
            o.fabric_mpi,
            launch_argv,
            o.fabric_cmd,
            o.fabric_args.split(),
            bool(self.het),
        )
        log("fabric test: " + " ".join(argv))
        rc, out = self.run(argv, o.fabric_timeout_s)
        sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
        v = fabric.judge(fabric.parse(out), o.fabric_floor_gbs, rc, nodes)
        self.state.record("fabric", ("ok: " if v.ok else "failed: ") + v.summary)
        log("fabric test %s: %s" % ("passed" if v.ok else "failed", v.summary), err=not v.ok)
        if v.ok or o.fabric_test == "warn":
            return None
        if v.sick:  # excluded as a node failing the health gate is
            undrained = [n for n in v.sick if not self.drain(n, "fabric test: " + v.summary)]
            d = dec.Decision(
                "requeue", "fabric test singled out %s: %s" % (" ".join(v.sick), v.summary), 3
            )
            return self.act(d, exclude=undrained) or 3
        return self.act(dec.Decision("fail", "fabric test: " + v.summary, 3))

    def gate_spec(self) -> str:
        """What the gate inside the launch step checks (:mod:`.gate`): the first component's
        expectations, as the separate gate's ``health`` step is told them."""
        o = self.o
        gpus, efa = (o.gpus, o.efa) if o.health else (0, 0)
        return gate.spec(gpus, efa, o.dcgm, bool(o.imex), o.efa_tries, o.efa_delay_s)

    def gate_open(self, step: subprocess.Popen[bytes]) -> int | None:
        """The gate inside the launch step: wait for every node's verdict, then let the
        launch start (None) or stop it and act as the separate gate does on a failure. A
        step that ended with no failed verdict is judged as any failed launch (None)."""
        nodes = self.order or [self.env.get("SLURMD_NODENAME", "")]
        deadline = self.clock() + self.o.health_timeout_s
        seen = gate.results(self.evidence_dir)
        while len(seen) < len(nodes) and step.poll() is None and self.clock() < deadline:
            self.sleep(0.05)
            seen = gate.results(self.evidence_dir)
        bad = [(node, why) for node, why in sorted(seen.items()) if why is not None]
        stdin = step.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                if len(seen) >= len(nodes) and not bad:
                    stdin.write(gate.GO)
                stdin.close()  # end-of-file: a node that has no word does not start
        if (not bad and len(seen) >= len(nodes)) or (not bad and step.poll() is not None):
            return None
        if not bad:  # still running without a verdict from some: those are the sick ones
            late = "no health verdict within %g s" % self.o.health_timeout_s
            bad = [(node, late) for node in nodes if node not in seen]
        try:
            step.wait(timeout=60)
        except subprocess.TimeoutExpired:
            step.terminate()
            step.wait()
        ok = [node for node, why in seen.items() if why is None]
        code = self.systemic_fail(bad, len(nodes))
        if code is not None:
            return code
        if self.take_spares(ok, bad, self.order):
            return SWAPPED  # nothing started: the launch runs again with the spare in
        return self.gate_failed(bad, gate.NOT_STARTED)

    def systemic_fail(self, bad: Sequence[tuple[str, str]], checked: int) -> int | None:
        """Fail the job, draining nothing, where the gate failed many nodes for one reason
        (:mod:`.systemic`: the job's configuration); None otherwise."""
        s = systemic(bad, checked)
        if s is None:
            return None
        sys.stdout.flush()  # the gate's report before what is done about it
        log(s.reason(), err=True)
        return self.act(dec.Decision("fail", s.reason(), 2))

    def gate_failed(self, bad: Sequence[tuple[str, str]], worst: int) -> int:
        """Nodes failed the gate (``bad``; empty: unknown, the gate's steps ended ``worst``):
        drain them where permitted, and requeue off them."""
        undrained = [node for node, why in bad if not self.drain(node, "health gate: " + why)]
        sick = " ".join(n for n, _ in bad) or "some node"
        log(
            "health gate failed on: %s" % (sick if bad else "unknown nodes (exit %d)" % worst),
            True,
        )
        code = self.act(
            dec.Decision("requeue", f"health gate failed on {sick}", 3), exclude=undrained
        )
        return code or 3

    def container_gate(
        self, comps: Sequence[hetjob.Component | None], steps: Sequence[Sequence[str]]
    ) -> int | None:
        """The in-container IMEX check of each component in ``comps``; None when it passed."""
        for comp in comps:
            rc, out = self.container_imex_check(comp, steps)
            sys.stdout.write(out)
            _, bad = parse_report(out)
            if rc == 0 and not bad:
                continue
            where = " ".join(n for n, _ in bad) or "its nodes (exit %d)" % rc
            why = bad[0][1] if bad else "the container step failed"
            reason = "IMEX channel check inside the container failed on %s: %s" % (where, why)
            log(reason, True)
            return self.act(dec.Decision("fail", reason, 2))
        return None

    def container_imex_check(
        self, comp: hetjob.Component | None, steps: Sequence[Sequence[str]]
    ) -> tuple[int, str]:
        """Look for the IMEX channel inside the container of ``comp``'s step, if it has one.

        Same image and mounts as that step (its own Pyxis options), so a channel directory
        Enroot does not provide and no mount brings in fails here, before the launch, and not
        as an NCCL error minutes into the run (NCCL falls back or fails without it:
        NVIDIA/nccl src/mnnvl.cc).
        """
        group = 0 if comp is None else comp.group
        for argv in steps:
            g = hetjob.step_group(argv)
            words = hetjob.container_words(argv)
            if (0 if g is None else g) != group or not any(
                w.startswith("--container-image") for w in words
            ):
                continue
            cmd = [*words, "sh", "-c", hetjob.CONTAINER_IMEX_CHECK]
            rc, out = self.run(self.component_srun(comp, cmd), self.o.health_timeout_s)
            if rc != 0 and "slurmfm-health" not in out:
                last = (out.strip().splitlines() or [""])[-1]
                log("IMEX check in the container failed (exit %d): %s" % (rc, last), True)
            return rc, out
        return 0, ""

    def take_spares(
        self, ok: Sequence[str], bad: Sequence[tuple[str, str]], checked: Sequence[str]
    ) -> bool:
        """A health gate that failed nodes the spares can stand in for: drain them, swap
        them out (:func:`spares.replace`), and go on in this allocation; True when it did.

        Only when every node the gate ``checked`` reported (a node that said nothing may be
        any node) and the spares cover the failed training nodes. The separate gate checks
        the spares too; the gate inside the launch step (:meth:`gate_open`) checks the
        training nodes only, so a spare it brings in is checked by the next launch's gate.
        """
        if self.pool is None or not bad:
            return False
        failed = [n for n, _ in bad]
        if set(checked) - set(ok) - set(failed):
            return False
        swap = sp.replace(self.pool, failed)
        if swap is None:
            log("health gate: not enough healthy spares for %s" % " ".join(failed), err=True)
            return False
        sys.stdout.flush()  # the gate's report before what is done about it
        for node, why in bad:
            self.drain(node, "health gate: " + why)
        self.use_swap(swap, "health gate failed on " + " ".join(failed))
        return True

    def spare_for_dead(self, dead: Sequence[str]) -> bool:
        """Nodes that did not answer the probe, swapped for spares: True when the step can
        run again in this allocation.

        Each is drained, not set DOWN: a DOWN node of the allocation makes Slurm end (and
        requeue) the whole job. Should Slurm find the node dead itself (``SlurmdTimeout``),
        it requeues the job as it would without spares. The job is not submitted with
        ``--no-kill``, which would keep it through a lost node: with it, the loss of the
        batch host ends the job FAILED instead of requeued (seen on the lab, 22.05:
        "Killing JobId=N StepId=batch due to failed node"; without it "requeue job JobId=N
        due to failure of node"), and the batch host is one of the training nodes.
        """
        o = self.o
        if self.pool is None or not o.restart_in_job or self.restarts_used() >= o.max_restarts:
            return False  # the requeue path downs them and applies the cap
        swap = sp.replace(self.pool, dead)
        if swap is None:
            return False
        why = "did not answer after a failed step (job {})".format(self.env.get("SLURM_JOB_ID", ""))
        for h in dead:
            self.drain(h, why)
        self.use_swap(swap, "unresponsive: " + " ".join(dead))
        self.node_failed = False  # the lost node is out of the next launch
        return True
