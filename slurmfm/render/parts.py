"""The typed parts a script is assembled from, shared by the modules that build them:
environment lines, heterogeneous components, the health gate's and observability's
settings, and the wrapping of long option lists (part of :mod:`slurmfm.render.script`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class EnvLine:
    """One ``export NAME=VALUE`` line with the reason it is there."""

    name: str
    shell_value: str
    why: str
    origin: str  # "profile", "user", "slurmfm"
    expands: bool = False  # value holds a command substitution: assign, then export (SC2155)


@dataclass(frozen=True)
class Component:
    """One heterogeneous component of the job, for what the job runtime does per component.

    Why: a hetjob's server may run on another instance type than the trainer, so its NCCL/EFA
    profile and its health expectations (GPUs, EFA devices) are its own. ``env`` holds the
    profile lines of this component that differ from the batch script's exports (component 0's
    profile) and ``unset`` the exported profile names its own profile lacks: the runtime applies
    both on that component's step only. ``health`` is what the health gate must find on each of
    its nodes.
    """

    group: int
    instance: str
    env: tuple[EnvLine, ...]
    unset: tuple[str, ...]
    health: HealthGate
    nodes: int = 0
    imex: bool = False


@dataclass(frozen=True)
class HealthGate:
    """What the per-node health gate expects, from the instance catalog."""

    enabled: bool
    gpus: int
    efa: int


@dataclass(frozen=True)
class Observe:
    """What the observability include needs (slurmfm/render/templates/observe.sh.j2)."""

    enabled: bool
    textfile_dir: str = "''"
    dcgm_dir: str = "''"
    efa: int = 0
    interval: int = 15
    gpus: int = 0
    recipe: str = "''"
    job_json: str = "{}"  # the job's description for the agent (literal JSON)


def _wrap(words: list[str], width: int = 88) -> list[str]:
    """Shell words grouped into lines of at most ``width`` characters (one word may exceed)."""
    lines: list[str] = []
    for w in words:
        if lines and len(lines[-1]) + 1 + len(w) <= width:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return lines
