"""The batch step: health gate, observability agents, server readiness, the launch, signals,
and the finish / requeue / fail decision with its record.

The batch script ``exec``s into ``python3 RUNTIME batch [options] -- srun ...``, so this process
*is* the batch shell Slurm signals with ``--signal=B:USR2@T``. On USR2 it records the signal and
either forwards USR2 to the launch ``srun`` (Slurm passes it to every process of the step) and
repeats it every ``resignal_s`` until the step ends (a process still starting up ignores it),
or, for a launch in a container, starts one host step on every node that signals the training
processes there (``forward``), or, for a launcher without a save protocol, requeues at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from . import classify as cl
from . import decide as dec
from . import evidence as ev
from . import fsafe, gate, hetjob, install, nccl, serve
from . import slurm as sl
from . import spares as sp
from .hang import HangWatch, hang_env
from .health import parse_report, run_command
from .node import IN_ENTRY
from .options import CONTAINER_ENTRY, BatchOptions, ContainerRemoveOptions, ForwardOptions
from .state import StateFile, state_path

if TYPE_CHECKING:
    from .health import Runner


def log(msg: str, err: bool = False) -> None:
    print("slurmfm: " + msg, file=sys.stderr if err else sys.stdout, flush=True)


def masked(argv: Sequence[str], secrets: Sequence[str], env: dict[str, str]) -> str:
    """The launch command as one shell line (shlex), with secret values replaced and the
    runtime's check program shown by its name in the script."""
    values = [env[s] for s in secrets if env.get(s)]
    out = []
    for word in argv:
        if word == install.CHECKED:
            out.append("$slurmfm_checked")
            continue
        shown = word
        for v in values:
            shown = shown.replace(v, "<secret>")
        out.append(shown)
    return " ".join(w if w == "$slurmfm_checked" else shlex.quote(w) for w in out)


class Batch:
    """One run of the batch step; ``opts`` are its options (:class:`.options.BatchOptions`)."""

    def __init__(
        self,
        opts: BatchOptions,
        env: dict[str, str] | None = None,
        run: Runner = run_command,
        popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.o = opts
        self.env = dict(os.environ if env is None else env)
        self.run = run
        self.popen = popen
        self.clock = clock
        self.sleep = sleep
        # A requeue, a release, a Requeue=0: retried while slurmctld is away.
        self.retry = sl.Retry(
            opts.requeue_tries, opts.requeue_delay_s, sleep=sleep, away_s=opts.requeue_away_s
        )
        self.restart = int(self.env.get("SLURM_RESTART_COUNT", "0") or 0)
        log_dir = self.env.get("SLURMFM_LOG_DIR", ".")
        self.state = StateFile(
            self.env.get("SLURMFM_STATE_FILE") or state_path(log_dir, self.env), self.restart
        )
        self.order = self.env.get("SLURMFM_HOST_ORDER", "").split()
        self.signalled = False
        self.step: subprocess.Popen[bytes] | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.observers: list[subprocess.Popen[bytes]] = []
        self.agents_started = False
        self.obs_ready: bool | None = None  # the observe directory (observe_dir)
        # Components beyond the first of a heterogeneous job (empty otherwise).
        self.het = hetjob.components(
            getattr(opts, "component", []) or [],
            getattr(opts, "component_env", []) or [],
            getattr(opts, "component_unset", []) or [],
        )
        self.next_signal: float | None = None
        self.forwarder: subprocess.Popen[bytes] | None = None  # the `forward` step, once
        self.container_steps: list[list[str]] = []  # steps with a named container
        self.nccl_socket = False
        self.gave_up = False
        self.step_started = 0.0
        self.launching = False  # waiting for the launch step (wait_step)
        self.ask = ""
        self.marker_before: tuple[int, int, int] | None = None
        self.done_note = ""
        self.requeued = False  # this attempt requeued the job itself
        self.stopping = False
        # Evidence of the launch (see evidence.py, classify.py): its directory, srun's lines,
        # what showed progress when it started, the last failure's signature.
        self.launches = 0
        self.evidence_dir = ""
        self.srun_lines = ev.SrunLines()
        self.log_start: tuple[str, int] | None = None
        self.mark_before: dict[str, str] = {}
        self.mark_at_signal: dict[str, str] = {}
        self.forwarded = False  # the save signal has reached the step
        self.last_signature = ""
        self.ctld_away = False
        self.node_failed = False
        self.hang: HangWatch | None = None
        self.hung = ""  # what the hang watch saw when it stopped the step
        self.relaunches = 0  # in-job restarts of this attempt (counted against max_restarts)
        # The health gate runs in the launch step (see in_step), set by _main.
        self.health_on = False
        self.in_step = False
        self.pool = sp.from_env(self.env)  # spare nodes (resources.spare_nodes), or None

    # --- decisions -------------------------------------------------------------------------
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

    # --- steps -----------------------------------------------------------------------------
    def all_nodes_srun(self, *cmd: str, overlap: bool = False) -> list[str]:
        return self.component_srun(None, [*install.argv(), *cmd], overlap)

    def component_srun(
        self, comp: hetjob.Component | None, cmd: Sequence[str], overlap: bool = False
    ) -> list[str]:
        """One task on each node of ``comp`` (None: the first component, the batch's own)."""
        if comp is None:
            n = self.env.get("SLURM_JOB_NUM_NODES", str(len(self.order) or 1))
            argv = sl.srun_per_node(n, 0 if self.het else None)
            if self.pool is not None and self.pool.gone:  # nodes swapped out (spares.py)
                argv = sl.srun_per_node(len(self.pool.live))
                argv.append("--exclude=" + ",".join(self.pool.gone))
        else:
            argv = sl.srun_per_node(comp.nodes, comp.group)
        if overlap:
            argv.extend(sl.OVERLAP)
        return argv + list(cmd)

    def component(self, argv: Sequence[str]) -> hetjob.Component | None:
        """The component an srun command line runs in (None: the first one)."""
        g = hetjob.step_group(argv)
        return next((c for c in self.het if c.group == g), None)

    def step_env(self, argv: Sequence[str]) -> dict[str, str]:
        """The environment of a step: its own component's NCCL/EFA profile applied."""
        return hetjob.step_env(self.env, self.component(argv))

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
        if (worst == 0 and not bad) or self.take_spares(ok, bad, self.pool_live()):
            return self.container_gate([w for c, w in checked if c.imex], steps)
        return self.gate_failed(bad, worst)

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
        if self.take_spares(ok, bad, self.order):
            return SWAPPED  # nothing started: the launch runs again with the spare in
        return self.gate_failed(bad, gate.NOT_STARTED)

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

    def observe_dir(self) -> bool:
        """Make the job's observe directory ready for the agents (once): its ``job.json``,
        no stop file of an earlier attempt. False where it cannot be made (no job metrics)."""
        if self.obs_ready is None:
            obs_dir = self.env.get("SLURMFM_OBS_DIR", "")
            try:
                os.makedirs(obs_dir, exist_ok=True)
                stop = self.env.get("SLURMFM_OBS_STOP", "")
                if stop and os.path.exists(stop):
                    os.remove(stop)
                fsafe.replace(os.path.join(obs_dir, "job.json"), self.o.observe_job_json + "\n")
                self.obs_ready = True
            except OSError:
                log(f"observability: cannot create {obs_dir}; no job metrics", err=True)
                self.obs_ready = False
        return self.obs_ready

    def observe_start(self) -> None:
        """Start the observability agents (one step for the job's life, one agent per node of
        every component), without waiting for them: they are not on the way to the launch,
        which starts first (:meth:`run_step`). Each agent writes its start snapshot before it
        looks for the stop file (:mod:`.agent`), so even an attempt that ends before the agents
        are up gets a snapshot from every node, and :meth:`observe_stop` waits for them.
        Where the launch step runs the node entry (:attr:`in_step`), each entry forks its
        node's agent instead (:func:`.agent.fork`) and this step is not started."""
        if self.agents_started:
            return
        self.agents_started = True
        if not self.observe_dir():
            return
        self.observers = [self.popen(self.all_nodes_srun("observe", overlap=True), env=self.env)]
        for comp in self.het:
            env = dict(hetjob.step_env(self.env, comp), SLURMFM_OBS_GPUS=str(comp.gpus))
            argv = self.component_srun(comp, [*install.argv(), "observe"], True)
            self.observers.append(self.popen(argv, env=env))

    def observe_stop(self) -> None:
        if not self.observers:
            return
        with contextlib.suppress(OSError):
            fsafe.touch(self.env.get("SLURMFM_OBS_STOP", ""))
        deadline = self.clock() + self.o.observe_start_s
        while any(p.poll() is None for p in self.observers) and self.clock() < deadline:
            self.sleep(0.5)
        for p in self.observers:
            if p.poll() is None:
                p.terminate()
            p.wait()
        self.observers = []

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
            d = dec.apply_cap(
                dec.Decision("requeue", "time limit near (launcher saves periodically)", 0),
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
            return
        log("USR2 received: asking the training processes to save and exit")
        # A step that has just started may still hold processes that have not installed their
        # handlers yet: the first USR2 goes no earlier than signal_grace_s after its start.
        self.next_signal = max(self.clock(), self.step_started + self.o.signal_grace_s)

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

    def forward_start(self) -> None:
        """The save signal for a launch in a container, where no runtime runs: one host step
        on every node signals the training processes it finds there, and each new one until
        the launch ends (node.forward_until_done). Started once, not at every resend: a
        128-node job adds one job step, and the loop never waits on it. The launch ``srun``
        itself gets no signal: Slurm would pass it to every process of the step, Enroot's
        ``squashfuse`` too (render.container._container_forward)."""
        fo = ForwardOptions(signal=self.o.container_forward, tasks=self.o.container_forward_tasks)
        words = ["forward", *fo.to_argv(always=("signal",))]
        try:
            self.forwarder = self.popen(self.all_nodes_srun(*words, overlap=True), env=self.env)
        except OSError as e:
            log("forwarding SIG%s failed: %s" % (self.o.container_forward, e), err=True)

    def start_server(self, argv: Sequence[str]) -> int | None:
        o = self.o
        self.server = self.popen(list(argv), env=self.step_env(argv))
        url = self.env.get("SLURMFM_SERVE_URL", "") + o.health_path
        log(f"waiting up to {o.ready_timeout_s:g} s for {url}")
        server = self.server
        why = serve.wait_ready(
            url,
            lambda: server.poll() is None,
            o.ready_timeout_s,
            o.ready_poll_s,
            kind=o.serve_kind,
            clock=self.clock,
            sleep=self.sleep,
        )
        if why is not None:
            log(why, err=True)
            self.state.record("fail", "%s server not healthy" % o.serve_kind)
            self.stop_server()
            return 1
        e = self.env
        serve.write_endpoint(
            self.endpoint_base(),
            {
                "url": e.get("SLURMFM_SERVE_URL", ""),
                "host": e.get("SLURMFM_SERVE_HEAD", ""),
                "port": int(e.get("SLURMFM_SERVE_PORT", "0") or 0),
                "health": o.health_path,
                "kind": o.serve_kind,
                "model": json.loads(o.serve_model or "null"),
                "job_id": e.get("SLURM_JOB_ID", ""),
                "run_id": e.get("SLURMFM_RUN_ID", ""),
                "nodes": e.get("SLURMFM_SERVE_ORDER", ""),
                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )
        self.state.record("ready", "url={}".format(e.get("SLURMFM_SERVE_URL", "")))
        log(
            "{} server ready at {} (endpoint file {}.json)".format(
                o.serve_kind, e.get("SLURMFM_SERVE_URL", ""), self.endpoint_base()
            )
        )
        return None

    def endpoint_base(self) -> str:
        return os.path.join(
            self.env.get("SLURMFM_LOG_DIR", "."), "endpoints", self.env.get("SLURMFM_RUN_ID", "run")
        )

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            self.server.wait()

    def cleanup(self) -> None:
        if self.o.serve_kind:
            serve.drop_endpoint(self.endpoint_base(), self.env.get("SLURM_JOB_ID", ""))
        self.observe_stop()
        self.forward_stop()
        self.containers_remove()

    def containers_remove(self) -> None:
        """Remove this attempt's named containers from its nodes (render.container._container_opts
        names one per attempt and role): Pyxis keeps them after the step, with the image's
        whole file system, and by default for good. Once per attempt; a failure is logged."""
        steps, self.container_steps = self.container_steps, []
        for argv in steps:
            names = [
                w.split("=", 1)[1]
                for w in hetjob.container_words(argv)
                if w.startswith("--container-name=")
            ]
            if not names:
                continue
            remove = ContainerRemoveOptions(name=names[0])
            cmd = [*install.argv(), "container-remove", *remove.to_argv()]
            rc, out = self.run(self.component_srun(self.component(argv), cmd), 120)
            if rc != 0:
                log("could not remove container %s: %s" % (names[0], out.strip()), err=True)

    def forward_stop(self) -> None:
        """The `forward` step ends with the launch on its node; one still running is ended."""
        fwd = self.forwarder
        if fwd is None or fwd.poll() is not None:
            return
        try:
            fwd.wait(timeout=self.o.poll_s * 4)
        except subprocess.TimeoutExpired:
            fwd.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                fwd.wait(timeout=10)

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

    def restarts_used(self) -> int:
        """Restarts so far: Slurm's requeues and this attempt's in-job relaunches."""
        return self.restart + self.relaunches

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
        if not (
            o.restart_in_job
            and d.action == "requeue"
            and d.exit_code != 0  # an early exit 0 (Megatron's exit-duration) wants a new limit
            and launch_argv
            and not serve_argv
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

    def pool_live(self) -> list[str]:
        return list(self.pool.live) if self.pool is not None else []

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

    def use_swap(self, swap: sp.Swap, why: str) -> None:
        self.pool = swap.pool
        self.order = list(swap.pool.order)
        self.state.record("spare", "%s: %s" % (why, swap.describe()))
        log("spare nodes: %s: %s" % (why, swap.describe()), err=True)

    def on_spares(self, argv: Sequence[str]) -> list[str]:
        """The launch for the nodes the job trains on now: the original command with each
        swapped node's spare in its place (:func:`spares.rewrite`), and the exports the
        per-node entry ranks itself by."""
        if self.pool is None or not argv:
            return list(argv)
        words, master = sp.rewrite(
            argv, self.pool, sp.parse_addrs(self.env.get("SLURMFM_NODE_ADDRS", ""))
        )
        self.env.update(sp.env_for(self.pool, master))
        return words

    def evidence_env(self) -> dict[str, str]:
        """The launch's evidence directory (mode 0700) and progress file, and the progress
        mark it starts from (see :mod:`.evidence`)."""
        self.launches += 1
        out: dict[str, str] = {}
        d = ev.attempt_dir(
            self.env.get("SLURMFM_LOG_DIR", "."), self.env, self.restart, self.launches
        )
        # the job's own directory, even when its name was taken first (docs/security.md)
        with contextlib.suppress(OSError):
            d = os.path.join(fsafe.claim_dir(os.path.dirname(d)), os.path.basename(d))
        self.evidence_dir = d if ev.private_dir(d) else ""
        if self.evidence_dir:
            out["SLURMFM_EVIDENCE_DIR"] = d
            if not self.env.get("SLURMFM_PROGRESS_FILE"):
                # Progress is evidence (and the hang watch's clock), not only a metric.
                self.env["SLURMFM_PROGRESS_FILE"] = os.path.join(
                    os.path.dirname(d), "progress.json"
                )
        if self.env.get("SLURMFM_PROGRESS_FILE"):
            out["SLURMFM_PROGRESS_FILE"] = self.env["SLURMFM_PROGRESS_FILE"]
        if self.o.hang_timeout_s > 0:
            out.update(hang_env(self.env, self.evidence_dir))
        self.srun_lines = ev.SrunLines()
        self.mark_before = self.progress_now()
        return out

    def progress_now(self) -> dict[str, str]:
        return ev.progress_mark(
            self.env.get("SLURMFM_CHECKPOINT_DIR", ""), self.env.get("SLURMFM_PROGRESS_FILE", "")
        )

    def start_launch(
        self, argv: Sequence[str], env: dict[str, str], gated: bool = False
    ) -> subprocess.Popen[bytes]:
        """Start the launch srun, noting where the job log stands: srun's own lines (which
        task failed first, which were killed for it, an OOM) are read back from there once
        it ended. Not through a pipe: a runtime killed with -9 must not take srun with it
        (a write to a pipe without a reader kills the writer). ``gated``: srun's stdin is a
        pipe from here, for the gate's word (:meth:`gate_open`); srun only reads it."""
        self.log_start = ev.log_position()
        self.hung = ""
        self.hang = (
            HangWatch(self.o.hang_timeout_s, self.clock, self.progress_now, self.log_start)
            if self.o.hang_timeout_s > 0
            else None
        )
        if gated:
            return self.popen(list(argv), env=env, stdin=subprocess.PIPE)
        return self.popen(list(argv), env=env)

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
                try:
                    return step.wait(timeout=self.o.poll_s)
                except subprocess.TimeoutExpired:
                    continue
        finally:
            self.launching = False

    def stop_hung(self, h: HangWatch, step: subprocess.Popen[bytes]) -> None:
        """A hang: stacks of every worker into the log, then the step is stopped (see
        :mod:`.hang`); it ends and is judged like any failure, as a hang."""
        self.hung = "no progress for %d s (last: %s)" % (h.idle_s(), h.what)
        log("hang: %s; dumping the workers' stacks, then stopping the step" % self.hung, True)
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

    def finished(self) -> bool | None:
        ckpt = self.env.get("SLURMFM_CHECKPOINT_DIR", "")
        kind, _, arg = self.o.done_check.partition(":")
        if kind == "megatron":
            return dec.megatron_finished(ckpt, int(arg))
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
        launch_argv = self.on_spares(launch_argv)
        if launch_argv:
            log("launch: " + masked(launch_argv, o.secret, self.env))
            inside = in_container(launch_argv)
            if inside:
                # No runtime runs in the container to print it: the command node 0 runs.
                log("node 0 runs (in the container): " + masked(inside, o.secret, self.env))
            # SLURMFM_STEP marks the launch's processes for `forward` (found by environment).
            env = dict(self.step_env(launch_argv), SLURMFM_STEP="launch")
            env.update(self.evidence_env())
            if "--auto-resume=1" in launch_argv:
                # a replay after a node replacement recomputes its order (node.replayed)
                env["SLURMFM_LAUNCH_NODELIST"] = self.env.get("SLURM_JOB_NODELIST", "")
            gated = self.in_step and self.health_on
            if gated and not self.evidence_dir:
                # no private directory for the verdicts: the separate gate step
                code = self.health_gate([serve_argv, launch_argv])
                if code is not None:
                    return code
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
                    return None  # run the step again, on the spare (not a restart)
                if code is not None:
                    return code
                self.step_started = self.clock()
            if o.observe and not self.in_step:
                self.observe_start()  # once the launch is on its way (gated: every node passed)
        else:
            log("launch: " + masked(serve_argv, o.secret, self.env))
            self.step, self.server = self.server, None
            self.step_started = self.clock()
        watcher = None
        if o.nccl_check != "off":
            watcher = threading.Thread(target=self.nccl_watch, daemon=True)
            watcher.start()
        rc = self.wait_step()
        rc = 128 - rc if rc < 0 else rc
        if self.nccl_socket:
            self.state.record("fail", "NCCL fell back to sockets")
            return 3
        if self.server is not None and self.server.poll() is None:
            log("trainer finished (exit %d); stopping the %s server" % (rc, o.serve_kind))
            self.stop_server()
        if self.gave_up:  # already recorded at the signal
            return rc or dec.GIVE_UP_EXIT
        dead: list[str] = []
        if rc != 0 and not self.signalled and not o.hyperpod:
            if sl.controller_up(self.run):
                spare = list(self.pool.spares) if self.pool is not None else []
                found = sl.probe(self.order + spare, self.run, o.probe_timeout_s)
                dead = found.dead
                if found.unknown:
                    why = found.unknown
                    log("the node probe did not start (%s); not judging the nodes" % why, True)
            else:
                self.ctld_away = True
                log("slurmctld does not answer; not judging the nodes", err=True)
        retry = retry_codes(o.retry_exit)
        after = self.progress_now()
        verdict = None
        saved = None
        if self.signalled:
            saved = ev.saved_since(self.mark_at_signal or self.mark_before, after)
            if saved and rc != 0:
                # A training that saved on the signal exits 0; a checkpoint beside a failed
                # exit is a periodic one finishing, not the save that was asked for.
                log("after the save signal: %s, but the training exited %d" % (saved, rc))
                saved = ""
            if saved == "":
                self.state.record(
                    "save-failed",
                    "no new complete checkpoint after the pre-timeout signal "
                    "(training exit %d)" % rc,
                )
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
        if self.done_note:
            log("completion check: " + self.done_note)
            if d.action == "requeue" and self.done_note.startswith("stale"):
                d = d._replace(reason=f"{d.reason}; {self.done_note}")
        if dead and self.pool is not None and self.spare_for_dead(dead):
            dead = []
        if self.relaunch(d, dead, serve_argv, launch_argv):
            return None
        capped = dec.apply_cap(d, self.restarts_used(), o.max_restarts, o.requeue)
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
        finally:
            self.cleanup()


# gate_open's answer when the gate failed nodes and spares took their places: the launch
# did not start, and runs again (no exit code of the job's).
SWAPPED = -1
# The state file's reason for a requeue at the time limit that no save signal preceded.
LIMIT_WITHOUT_SIGNAL = (
    "the time limit came without the pre-timeout signal; resuming from the last checkpoint"
)


def in_container(argv: Sequence[str]) -> list[str]:
    """The command a launch in a container runs on node 0, or [] for a launch on the host.

    The rendered container launch is ``srun ... sh -c PROGRAM slurmfm-node COMMAND``, where
    PROGRAM sets the node rank from the task id (``$SLURM_PROCID``, 0 on node 0) and execs
    COMMAND (slurmfm.render.container._container_entry).
    """
    words = list(argv)
    if CONTAINER_ENTRY not in words:
        return []
    i = words.index(CONTAINER_ENTRY)
    if i < 2 or words[i - 2] != "-c":
        return []
    prefix = ["PET_NODE_RANK=0"] if "PET_NODE_RANK" in words[i - 1] else []
    return prefix + words[i + 1 :]


def in_step(
    serve_argv: Sequence[str], launch_argv: Sequence[str], runtime: str, het: bool, hyperpod: bool
) -> bool:
    """Whether the health gate (:mod:`.gate`) and the observability agents
    (:func:`.agent.fork`) run inside the launch step rather than in steps of their own: where
    the launch runs this runtime's node entry on the host, alone (no server beside it, one
    component), and is not replayed by HyperPod's auto-resume (a replayed step would wait for
    a word that was already given)."""
    return bool(
        launch_argv
        and not serve_argv
        and not het
        and not hyperpod
        and "--auto-resume=1" not in launch_argv
        and runs_node_entry(launch_argv, runtime)
    )


def flush_and_exit(code: int) -> None:
    """``os._exit`` (no cleanup handlers in a signal handler) after what was printed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def runs_node_entry(argv: Sequence[str], runtime: str) -> bool:
    """Does the launch run the per-node entry (``python3 RUNTIME node``), whose reports it
    then expects? (A container launch does not.)"""
    words = list(argv)
    entry = (runtime, install.CHECKED)
    return any(w == "node" and i > 0 and words[i - 1] in entry for i, w in enumerate(words))


def retry_codes(spec: str) -> list[int] | None:
    """``--retry-exit``: 'any' (None: every exit retried), 'none' or a comma list of codes."""
    if spec == "any":
        return None
    return [int(x) for x in spec.split(",") if x and x != "none"]


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


def with_auto_resume(argv: Sequence[str]) -> list[str]:
    words = list(argv)
    if words[:1] == ["srun"] and "--auto-resume=1" not in words:
        words.insert(1, "--auto-resume=1")
    return words


def ask_digest(argv: Sequence[str]) -> str:
    """What this attempt was asked: a digest of its launch command as the job runs it.

    Steps, samples and every other argument (the NeMo driver text too) change it. The
    training rewrites its marker each time it finds its work done, so the digest need only
    hold for one attempt: what differs between jobs (the rendezvous port) costs nothing.
    """
    import hashlib

    return hashlib.sha256("\0".join(argv).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def dump_json(value: object) -> str:
    return json.dumps(value, sort_keys=True)
