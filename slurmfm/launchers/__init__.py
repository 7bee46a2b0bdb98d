"""The launchers slurmfm can start, one module each (see :mod:`slurmfm.launchers.base`).

Each module holds its recipe section (a pydantic model), its checks, its launch line, its
completion check, its save protocol and the runtime options that follow. The schema and the
renderer ask :func:`spec`; this registry is the only list of kinds. Adding a launcher: a
module with its model and its spec, its model in ``Launcher`` (and ``ServeLauncher`` for a
server), its spec in ``SPECS``, a recipe under ``recipes/`` and its golden script
(``scripts/update-golden``); the schema's leaf-field list names any new field
(tests/recipe/test_input_safety.py says which).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from slurmfm.launchers.base import LauncherSpec, LaunchLine
from slurmfm.launchers.megatron import MEGATRON, MegatronLauncher
from slurmfm.launchers.nemo import NEMO, NemoLauncher
from slurmfm.launchers.ray import RAY, RayLauncher
from slurmfm.launchers.serving import ServerSpec
from slurmfm.launchers.sglang import SGLANG, SglangLauncher
from slurmfm.launchers.torchrun import TORCHRUN, TorchrunLauncher
from slurmfm.launchers.vllm import VLLM, VllmLauncher

__all__ = [
    "SAVE_ON_SIGNAL_LAUNCHERS",
    "SERVE_KINDS",
    "SPECS",
    "LaunchLine",
    "Launcher",
    "LauncherSpec",
    "MegatronLauncher",
    "NemoLauncher",
    "RayLauncher",
    "ServeLauncher",
    "ServerSpec",
    "SglangLauncher",
    "TorchrunLauncher",
    "VllmLauncher",
    "server_spec",
    "spec",
]

Launcher = Annotated[
    TorchrunLauncher
    | MegatronLauncher
    | NemoLauncher
    | VllmLauncher
    | SglangLauncher
    | RayLauncher,
    Field(discriminator="kind"),
]
ServeLauncher = Annotated[VllmLauncher | SglangLauncher, Field(discriminator="kind")]

SPECS: dict[str, LauncherSpec] = {s.kind: s for s in (TORCHRUN, MEGATRON, NEMO, VLLM, SGLANG, RAY)}
SERVE_KINDS = tuple(k for k, s in SPECS.items() if s.server)
# Launchers whose training saves when signalled (their spec's save_signal).
SAVE_ON_SIGNAL_LAUNCHERS = tuple(k for k, s in SPECS.items() if s.save_signal)


def spec(kind: str) -> LauncherSpec:
    """The spec of a launcher kind (a recipe's ``launcher.kind``)."""
    return SPECS[kind]


def server_spec(kind: str) -> ServerSpec:
    """The spec of a server kind (``vllm``, ``sglang``)."""
    s = SPECS[kind]
    if not isinstance(s, ServerSpec):
        raise KeyError(f"{kind} is not a server")
    return s
