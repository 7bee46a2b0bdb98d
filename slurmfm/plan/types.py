"""The seam between planning and rendering.

A :class:`Placement` is everything the renderer needs from a planner; rendering works without
one (Slurm chooses the nodes and ranks follow the allocation's host order), so the spine is
usable before any topology is known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Placement:
    """Node choice and rank order for one job.

    ``nodes``: host names in rank order (node i holds ranks i*G .. i*G+G-1); requested exactly
    with ``--nodelist`` in ``pin`` mode. ``rank_key``: a map from host name to a sort key carried
    into the script, so that in ``constrain`` mode the job orders whatever nodes Slurm gave it by
    the fabric. ``switches``/``segment`` become ``--switches``/``--segment``.
    """

    mode: Literal["none", "pin", "constrain"] = "none"
    nodes: tuple[str, ...] = ()
    rank_key: dict[str, str] = field(default_factory=dict)
    switches: str | None = None
    segment: int | None = None
    explanation: tuple[str, ...] = ()
