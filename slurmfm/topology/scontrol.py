"""What a live cluster prints: ``scontrol show topology`` and ``sinfo`` node states.

Lines as printed by real 22.05.8 (tree), 24.11.5 and 26.05.5 (block), checked on this repo's
slurm-lab (scripts/slurm-lab).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from slurmfm.topology.hostlist import expand_hostlist
from slurmfm.topology.model import Topology, TopologyError
from slurmfm.topology.slurm_model import (
    block_topology,
    hostlist_field,
    tree_from_switches,
)


def parse_scontrol_topology(text: str) -> Topology:
    """Parse ``scontrol show topology [NAME]`` output (tree or block) into a Topology.

    Tree lines are ``SwitchName=X Level=N LinkSpeed=S Nodes=<all nodes below> [Switches=...]``;
    a switch without ``Switches=`` is a leaf and its ``Nodes=`` are its own. Block lines are
    ``BlockName=X BlockIndex=I Nodes=... BlockSize=B``; the ``AggregatedBlock=`` lines (24.11,
    26.05) are derived data and skipped. Levels printed by Slurm are checked against the model's.
    """
    source = "scontrol show topology"
    switches: dict[str, tuple[int, Sequence[str], Sequence[str]]] = {}
    levels: dict[str, int] = {}
    blocks: list[tuple[int, str, list[str]]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        fields: dict[str, str] = {}
        for tok in line.split():
            key, sep, value = tok.partition("=")
            if sep:
                fields[key] = value
        if "SwitchName" in fields:
            name = fields["SwitchName"]
            kids = (
                hostlist_field(fields["Switches"], where, "Switches=")
                if fields.get("Switches")
                else []
            )
            nodes = (
                []
                if kids
                else (
                    hostlist_field(fields["Nodes"], where, "Nodes=") if fields.get("Nodes") else []
                )
            )
            switches[name] = (lineno, nodes, kids)
            if fields.get("Level", "").isdigit():
                levels[name] = int(fields["Level"])
        elif "BlockName" in fields:
            try:
                index = int(fields.get("BlockIndex", str(len(blocks))))
            except ValueError as exc:
                raise TopologyError(f"{where}: bad BlockIndex") from exc
            nodes = hostlist_field(fields["Nodes"], where, "Nodes=") if fields.get("Nodes") else []
            blocks.append((index, fields["BlockName"], nodes))
        elif "AggregatedBlock" in fields:
            continue
        else:
            raise TopologyError(f"{where}: unrecognised line {line[:60]!r}")
    if switches and blocks:
        raise TopologyError(f"{source}: both switches and blocks in the output")
    if blocks:
        blocks.sort()
        return block_topology([(n, m) for _, n, m in blocks], source=source)
    if not switches:
        raise TopologyError(f"{source}: no topology in the output (is TopologyPlugin set?)")
    topo = tree_from_switches(switches, {}, source, record_order=True)
    for s, lvl in levels.items():
        if topo.level(s) != lvl:
            raise TopologyError(
                f"{source}: switch {s!r} is Level={lvl} in Slurm but {topo.level(s)} in the model"
            )
    return topo


StateName = Literal["idle", "allocated", "mixed", "down", "drain", "unknown"]

_STATE_MAP: dict[str, StateName] = {
    "idle": "idle",
    "planned": "idle",  # idle, earmarked by backfill for a pending job (23.02+)
    "alloc": "allocated",
    "allocated": "allocated",
    "comp": "allocated",
    "completing": "allocated",
    "resv": "allocated",
    "reserved": "allocated",
    "blocked": "allocated",  # idle but held by --exclusive=topo (26.05, seen on the lab)
    "mix": "mixed",
    "mixed": "mixed",
    "drain": "drain",
    "drained": "drain",
    "draining": "drain",
    "drng": "drain",
    "down": "down",
    "fail": "down",
    "failing": "down",
    "future": "down",
    "futr": "down",
    "inval": "down",
    "maint": "down",
    "boot": "down",
    "reboot": "down",
    "powered_down": "down",
    "power_down": "down",
    "powering_down": "down",
    "unk": "unknown",
    "unknown": "unknown",
}


def normalize_state(raw: str) -> StateName:
    """One Slurm node state (``sinfo %T``/``%t``) -> idle/allocated/mixed/down/drain/unknown.

    A ``*`` suffix means "not responding": Slurm will not start jobs there, so it counts as down.
    Other suffixes (``~`` powered down, ``#`` powering up, ``!``, ``%``, ``$``, ``@``, ``^``, ``-``)
    do not change the base state. Compound states (``idle+drain``, ``mixed+drain``) report drain.
    """
    s = raw.strip().lower()
    not_responding = "*" in s
    s = s.rstrip("*~#!%$@^-")
    parts = [p for p in re.split(r"[+]", s) if p]
    states = [_STATE_MAP.get(p, "unknown") for p in parts] or ["unknown"]
    if not_responding:
        return "down"
    worst: StateName
    for worst in ("down", "drain"):
        if worst in states:
            return worst
    return states[0]


def slurm_node_states(text: str) -> dict[str, str]:
    """``sinfo -N -h -o '%N %T'`` output -> ``{node: normalised state}``.

    A node listed once per partition appears several times; the least usable state wins. The
    first column may also be a hostlist (``sinfo -h -o '%N %T'`` without ``-N``).
    """
    rank = {"down": 5, "drain": 4, "unknown": 3, "allocated": 2, "mixed": 1, "idle": 0}
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 2:
            raise TopologyError(f"sinfo:{lineno}: expected 'NODE STATE', got {line!r}")
        state = normalize_state(parts[1])
        try:
            names = expand_hostlist(parts[0])
        except ValueError as exc:
            raise TopologyError(f"sinfo:{lineno}: {exc}") from exc
        for n in names:
            if n not in out or rank[state] > rank[out[n]]:
                out[n] = state
    return out
