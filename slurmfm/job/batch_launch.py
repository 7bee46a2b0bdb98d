"""The batch step's launch phase: the steps it starts and stops (issue 37, item 7).

The launch ``srun`` with its evidence directory, progress and hang watch (:meth:`start_launch`),
a server and its readiness, the observability agents' step, the ``forward`` step of a
container launch, the removal of named containers, and the launch words rewritten for spares
and for a relaunch's own rendezvous port. Split from one 1,200-line class so that each phase
of an attempt reads on its own; the order of the phases is :class:`.batch.Batch`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence

from . import evidence as ev
from . import fsafe, hetjob, install, masking, pd, serve
from . import hosts as hs
from . import spares as sp
from .batch_state import BatchState, log
from .hang import HangWatch, hang_env
from .options import ContainerRemoveOptions, ForwardOptions
from .progress import Progress


class LaunchSteps(BatchState):
    """The batch step's launch phase (mixed into :class:`.batch.Batch`)."""

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

    def start_server(self, argv: Sequence[str]) -> int | None:
        o = self.o
        self.server_log = ev.log_position()  # its stderr tail is read from here (server_watch)
        self.unhealthy, self.unhealthy_since = "", None
        self.server = self.popen(list(argv), env=self.step_env(argv))
        url = self.env.get("SLURMFM_SERVE_URL", "") + o.health_path
        # SGLang prefill/decode (.pd): every server, then the router in front of them, ready
        # once it has registered them (its /health answers from its start)
        pd_info = serve.pd_servers(self.env)
        urls: list[str] = [url]
        check: Callable[[str], bool] = serve.http_ok
        if pd_info:
            router = self.env.get("SLURMFM_SERVE_URL", "") + serve.ROUTER_READY
            urls = [s.url + o.health_path for s in pd_info[1]] + [router]
            check = serve.pd_check
        log(f"waiting up to {o.ready_timeout_s:g} s for {' '.join(urls)}")
        server = self.server
        why = serve.wait_all(
            urls,
            lambda: server.poll() is None,
            o.ready_timeout_s,
            o.ready_poll_s,
            kind=o.serve_kind,
            check=check,
            clock=self.clock,
            sleep=self.sleep,
        )
        if why is not None:
            log(why, err=True)
            self.state.record("fail", "%s server not healthy" % o.serve_kind)
            self.stop_server()
            return 1
        e = self.env
        order = e.get("SLURMFM_SERVE_ORDER", "")
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
                "nodes": order,
                "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **serve.replica_info(o.serve_front, o.serve_replicas, order.split(), pd_info),
                **({"disaggregation": pd.endpoint_info(*pd_info)} if pd_info else {}),
            },
        )
        self.state.record("ready", "url={}".format(e.get("SLURMFM_SERVE_URL", "")))
        log(
            "{} server ready at {} (endpoint file {}.json)".format(
                o.serve_kind, e.get("SLURMFM_SERVE_URL", ""), self.endpoint_base()
            )
        )
        return None

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.terminate()
            self.server.wait()

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

    def containers_remove(self, earlier: bool = False) -> None:
        """Remove this attempt's named containers from its nodes (render.container._container_opts
        names one per attempt and role): Pyxis keeps them after the step, with the image's
        whole file system, and by default for good. Once per attempt; a failure is logged.
        ``earlier``: at a restart's start, those its earlier attempts left on these nodes
        (an end this runtime could not reach: a scancel past KillWait, a node reboot)."""
        if earlier:
            steps = list(self.container_steps) if self.restart > 0 else []
        else:
            steps, self.container_steps = self.container_steps, []
        for argv in steps:
            names = [
                w.split("=", 1)[1]
                for w in hetjob.container_words(argv)
                if w.startswith("--container-name=")
            ]
            if not names:
                continue
            remove = ContainerRemoveOptions(name=names[0], earlier=earlier)
            cmd = [*install.argv(), "container-remove", *remove.to_argv()]
            rc, out = self.run(self.component_srun(self.component(argv), cmd), 120)
            if rc != 0:
                log("could not remove container %s: %s" % (names[0], out.strip()), err=True)

    def cleanup(self) -> None:
        if self.o.serve_kind:
            serve.drop_endpoint(self.endpoint_base(), self.env.get("SLURM_JOB_ID", ""))
        self.observe_stop()
        self.forward_stop()
        self.containers_remove()

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

    def move_port(self, argv: Sequence[str]) -> list[str]:
        """The launch of an in-job relaunch on a rendezvous port of its own.

        Why: a process of the failed launch that outlived it (or another job's, on a node
        shared with it) may still hold the port, and torch's store then fails with EADDRINUSE
        on every relaunch: a crash loop with nothing wrong in the training. The new port is
        the one prepare picks for this restart count (:func:`.hosts.choose_port`, with the
        relaunches counted): deterministic, out of the ephemeral range, checked free where the
        first node of the order is this host. A port the recipe fixed (``rdzv_port``) stays.
        """
        span = self.env.get("SLURMFM_RDZV_RANGE", "")
        if not (self.relaunches and span and self.first_port):
            return list(argv)
        lo, _, width = span.partition("+")
        head = self.order[0] if self.order else ""
        port = hs.rendezvous_port(
            int(self.env.get("SLURM_JOB_ID", "0") or 0),
            self.restarts_used(),
            int(lo),
            int(width),
            hs.ephemeral_range(),
            here=head == self.env.get("SLURMD_NODENAME"),
        )
        if str(port) != self.env.get("SLURMFM_RDZV_PORT"):
            log("rendezvous port %d for in-job restart %d" % (port, self.relaunches))
        self.env.update(SLURMFM_RDZV_PORT=str(port), MASTER_PORT=str(port))
        return hs.with_port(argv, self.first_port, port)

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
        # one definition of progress for the hang watch and the judgement (.progress)
        self.progress = Progress(self.progress_now, self.log_start, self.clock)
        self.first_progress_said = False
        self.hang = (
            HangWatch(
                self.o.hang_timeout_s,
                self.clock,
                self.progress_now,
                self.log_start,
                startup_s=self.o.startup_timeout_s,
                progress=self.progress,
            )
            if self.o.hang_timeout_s > 0
            else None
        )
        if gated:
            return self.popen(list(argv), env=env, stdin=subprocess.PIPE)
        return self.popen(list(argv), env=env)


def masked(argv: Sequence[str], secrets: Sequence[str], env: dict[str, str]) -> str:
    """The launch command as one shell line (shlex), with secret values replaced and the
    script's programs shown by their names in the script."""
    from .safepath import RUN_MODULE, SHELL_VAR

    named = {install.CHECKED: "$slurmfm_checked", RUN_MODULE: f'"${SHELL_VAR}"'}
    return masking.line(argv, env, secrets, named)


def in_container(argv: Sequence[str]) -> bool:
    """Whether a launch runs in a Pyxis container (an ``srun`` with ``--container-image``)."""
    return any(w.startswith("--container-image") for w in hetjob.container_words(argv))


def with_evidence_mount(argv: Sequence[str], evidence_dir: str) -> list[str]:
    """A launch in a container with the job's evidence directory (the parent of the
    launch's own, where the progress file is too) mounted at the same path, so that the node
    entry in the image writes its report, torch's error file and NCCL's flight recorder
    where the batch step reads them. Added to the step's ``--container-mounts`` (Pyxis takes
    one list; a path with the list's separators is not mounted: no node reports then, as
    before, and the entry finds no directory). A launch on the host is returned unchanged."""
    words = list(argv)
    top = os.path.dirname(evidence_dir)
    if not evidence_dir or not in_container(words) or any(c in top for c in ",:"):
        return words
    mount = "%s:%s" % (top, top)
    at = 0
    for i, w in enumerate(words):
        if w.startswith("--container-mounts="):
            words[i] = w + "," + mount
            return words
        if w.startswith("--container-image"):
            at = i + (0 if "=" in w else 1)
    words.insert(at + 1, "--container-mounts=" + mount)
    return words


def in_step(
    serve_argv: Sequence[str], launch_argv: Sequence[str], runtime: str, het: bool, hyperpod: bool
) -> bool:
    """Whether the health gate (:mod:`.gate`) and the observability agents
    (:func:`.agent.fork`) run inside the launch step rather than in steps of their own: where
    the launch runs this runtime's node entry on the host, alone (no server beside it, one
    component), not in a container (the gate's checks and the agents read the host's files,
    which the image does not see), and is not replayed by HyperPod's auto-resume (a replayed
    step would wait for a word that was already given)."""
    return bool(
        launch_argv
        and not serve_argv
        and not het
        and not hyperpod
        and "--auto-resume=1" not in launch_argv
        and runs_node_entry(launch_argv, runtime)
        and not in_container(launch_argv)
    )


def runs_node_entry(argv: Sequence[str], runtime: str) -> bool:
    """Does the launch run the per-node entry (``python3 RUNTIME node``), whose reports it
    then expects? (Every rendered launch does, in a container too.)"""
    words = list(argv)
    entry = (runtime, install.CHECKED)
    return any(w == "node" and i > 0 and words[i - 1] in entry for i, w in enumerate(words))


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
