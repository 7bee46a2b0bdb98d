"""What one attempt of the batch step was given: one frozen value (issue 37, item 7).

Why a value of its own: the batch step (:mod:`.batch`) kept what Slurm and the batch script
handed it (options, environment, host order, restart count, the rendezvous port prepare
picked, the heterogeneous components, the spare pool) in the same bag of mutable attributes
as what the step learns while it runs (the launch, its evidence, the signal). Read from one
value that nothing changes, a relaunch in the allocation cannot start from a half-updated
copy of its own start, and a reader sees at once what an attempt depends on. What does change
while an attempt runs (the order after a spare swap, the exports of a relaunch) lives beside
it in the step's working state (:class:`.batch_state.BatchState`).

Standard library only, Python 3.8: this module travels in the job runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from . import hetjob
from . import spares as sp
from .options import BatchOptions


class Attempt(NamedTuple):
    """One attempt (one ``SLURM_RESTART_COUNT``) of the batch step, as it started."""

    opts: BatchOptions
    env: Mapping[str, str]  # read-only snapshot of the batch step's environment at start
    restart: int  # SLURM_RESTART_COUNT: Slurm's requeues before this attempt
    order: tuple[str, ...]  # prepare's host order (SLURMFM_HOST_ORDER)
    het: tuple[hetjob.Component, ...]  # components beyond the first of a hetjob (or none)
    first_port: int  # the rendezvous port prepare picked (SLURMFM_RDZV_PORT; 0: none)
    pool: sp.Pool | None  # spare nodes set aside by prepare (resources.spare_nodes)

    @classmethod
    def start(cls, opts: BatchOptions, env: Mapping[str, str] | None = None) -> Attempt:
        """The attempt the batch step runs, from its options and environment (the process's
        own when ``env`` is None)."""
        snap = dict(os.environ if env is None else env)
        return cls(
            opts,
            MappingProxyType(snap),
            int(snap.get("SLURM_RESTART_COUNT", "0") or 0),
            tuple(snap.get("SLURMFM_HOST_ORDER", "").split()),
            tuple(
                hetjob.components(
                    getattr(opts, "component", []) or [],
                    getattr(opts, "component_env", []) or [],
                    getattr(opts, "component_unset", []) or [],
                )
            ),
            int(snap.get("SLURMFM_RDZV_PORT", "0") or 0),
            sp.from_env(snap),
        )
