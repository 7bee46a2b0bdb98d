"""The batch step's working state and the helpers every phase uses (issue 37, item 7).

What the attempt was given is one frozen value, :attr:`BatchState.given`
(:class:`.attempt.Attempt`); what it learns while it runs (the launch step, its evidence,
the signal, the spare swaps) are the attributes set here. The phases build on this class,
one module each: launch (:mod:`.batch_launch`), act (:mod:`.batch_act`), gate
(:mod:`.batch_gate`), watch (:mod:`.batch_watch`), judge (:mod:`.batch_judge`), and
:class:`.batch.Batch` runs them in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import evidence as ev
from . import hetjob, install
from . import slurm as sl
from .attempt import Attempt
from .hang import HangWatch
from .health import run_command
from .options import BatchOptions
from .progress import Progress
from .state import StateFile, state_path

if TYPE_CHECKING:
    from .health import Runner


def log(msg: str, err: bool = False) -> None:
    print("slurmfm: " + msg, file=sys.stderr if err else sys.stdout, flush=True)


class BatchState:
    """The working state of one run of the batch step."""

    def __init__(
        self,
        opts: BatchOptions,
        env: dict[str, str] | None = None,
        run: Runner = run_command,
        popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.given = Attempt.start(opts, env)
        # the working environment: a launch's exports (evidence, spares, a relaunch's port)
        # are added to it; what the attempt started with stays in self.given.env
        self.env = dict(self.given.env)
        self.run = run
        self.popen = popen
        self.clock = clock
        self.sleep = sleep
        # A requeue, a release, a Requeue=0: retried while slurmctld is away.
        self.retry = sl.Retry(
            opts.requeue_tries, opts.requeue_delay_s, sleep=sleep, away_s=opts.requeue_away_s
        )
        log_dir = self.env.get("SLURMFM_LOG_DIR", ".")
        self.state = StateFile(
            self.env.get("SLURMFM_STATE_FILE") or state_path(log_dir, self.env), self.restart
        )
        self.order = list(self.given.order)  # the nodes trained on now (spares swap them)
        self.signalled = False
        self.step: subprocess.Popen[bytes] | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.observers: list[subprocess.Popen[bytes]] = []
        self.agents_started = False
        self.obs_ready: bool | None = None  # the observe directory (observe_dir)
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
        self.progress: Progress | None = None  # the running launch's (start_launch)
        # a server alone in its job: its health watch (server_watch)
        self.serving = False
        self.server_log: tuple[str, int] | None = None
        self.unhealthy_since: float | None = None
        self.next_health = 0.0
        self.unhealthy = ""  # why the server was stopped ("" it was not)
        self.first_progress_said = False
        self.hung = ""  # what the hang watch saw when it stopped the step
        self.relaunches = 0  # in-job restarts of this attempt (counted against max_restarts)
        # The health gate runs in the launch step (see in_step), set by _main.
        self.health_on = False
        self.in_step = False
        self.fabric_done = False
        self.pool = self.given.pool  # spare nodes (resources.spare_nodes) as swapped so far

    # --- what the attempt was given (self.given), by the names the phases use ------------
    @property
    def o(self) -> BatchOptions:
        """The batch step's options."""
        return self.given.opts

    @o.setter
    def o(self, opts: BatchOptions) -> None:
        # a new value, not a changed one (tests set options on a made Batch)
        self.given = self.given._replace(opts=opts)

    @property
    def restart(self) -> int:
        """``SLURM_RESTART_COUNT``: Slurm's requeues before this attempt."""
        return self.given.restart

    @property
    def het(self) -> tuple[hetjob.Component, ...]:
        """Components beyond the first of a heterogeneous job (empty otherwise)."""
        return self.given.het

    @property
    def first_port(self) -> int:
        """The rendezvous port prepare picked: what the launch's words carry (move_port)."""
        return self.given.first_port

    @first_port.setter
    def first_port(self, port: int) -> None:
        self.given = self.given._replace(first_port=port)

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

    def all_nodes_srun(self, *cmd: str, overlap: bool = False) -> list[str]:
        return self.component_srun(None, [*install.argv(), *cmd], overlap)

    def component(self, argv: Sequence[str]) -> hetjob.Component | None:
        """The component an srun command line runs in (None: the first one)."""
        g = hetjob.step_group(argv)
        return next((c for c in self.het if c.group == g), None)

    def step_env(self, argv: Sequence[str]) -> dict[str, str]:
        """The environment of a step: its own component's NCCL/EFA profile applied."""
        return hetjob.step_env(self.env, self.component(argv))

    def progress_now(self) -> dict[str, str]:
        return ev.progress_mark(
            self.env.get("SLURMFM_CHECKPOINT_DIR", ""), self.env.get("SLURMFM_PROGRESS_FILE", "")
        )

    def restarts_used(self) -> int:
        """Restarts so far: Slurm's requeues and this attempt's in-job relaunches."""
        return self.restart + self.relaunches

    def pool_live(self) -> list[str]:
        return list(self.pool.live) if self.pool is not None else []

    def endpoint_base(self) -> str:
        return os.path.join(
            self.env.get("SLURMFM_LOG_DIR", "."), "endpoints", self.env.get("SLURMFM_RUN_ID", "run")
        )
