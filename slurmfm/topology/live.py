"""The live cluster's topology: ``scontrol show topology``, or a flat fabric when it has none.

Why a flat fallback: a cluster can run without a network topology -- topology/flat, or a
topology.yaml whose entries are all ``flat`` (Slurm 26.05 prints nothing for either) -- and
SageMaker HyperPod's automatic topology management (from April 2026) has left clusters with an
empty ``topology.yaml`` (``[]``) while partitions still carry ``Topology=`` tags. There is no
switch or block to plan by, but the nodes and their states are real: ``--topology live``
plans on one flat fabric of every node ``sinfo`` lists and says what it found, instead of
failing. A ring or torus3d topology (26.05) is refused with its name: slurmfm plans on tree
and block fabrics only (:class:`slurmfm.topology.topology_yaml.TopologyYaml`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from slurmfm.errors import BackendError
from slurmfm.topology.model import Node, Topology, TopologyError

__all__ = ["flat_topology", "no_topology_note", "read_live"]

FLAT_SWITCH = "flat"


class _Cluster(Protocol):
    def show_topology(self) -> str: ...
    def node_states(self) -> str: ...
    def partition_topologies(self) -> dict[str, str | None]: ...


def flat_topology(nodes: list[str]) -> Topology:
    """Every node under one switch: what a cluster without a topology gives the planner."""
    if not nodes:
        raise TopologyError("the cluster lists no nodes (sinfo)")
    return Topology.from_parents([Node(n) for n in nodes], dict.fromkeys(nodes, FLAT_SWITCH), {})


def no_topology_note(partitions: Mapping[str, str | None], nodes: int) -> str:
    """What ``--topology live`` found on a cluster without switches or blocks."""
    tagged = {p: t for p, t in partitions.items() if t}
    tags = (
        "; partitions name topologies "
        + ", ".join(f"{p} -> {t}" for p, t in sorted(tagged.items()))
        + " (none of them a tree or block)"
        if tagged
        else ""
    )
    return (
        "live topology: scontrol show topology reports no switches or blocks (topology/flat, "
        f"or a topology.yaml that is flat or empty, []){tags}: planning on one flat fabric of "
        f"{nodes} nodes"
    )


def read_live(cluster: _Cluster) -> tuple[Topology, list[str]]:
    """(topology with node states, notes about what was found) for the live cluster."""
    from slurmfm.topology.scontrol import parse_scontrol_topology, slurm_node_states

    states = slurm_node_states(cluster.node_states())
    try:
        text = cluster.show_topology()
    except BackendError as exc:
        if "no topology configured" not in str(exc):
            raise
        text = ""
    notes: list[str] = []
    if text.strip():
        first = text.split()[0]
        if first.startswith(("RingName=", "TorusName=")):
            kind = "ring" if first.startswith("RingName=") else "torus3d"
            raise TopologyError(
                f"scontrol show topology: a {kind} topology (Slurm 26.05); slurmfm plans on "
                "tree and block fabrics only"
            )
        topo = parse_scontrol_topology(text)
    else:
        topo = flat_topology(sorted(states))
        notes.append(no_topology_note(cluster.partition_topologies(), len(states)))
    return topo.with_states({n: states.get(n, "unknown") for n in topo.nodes}), notes
