"""Cluster topology: the model (nodes, fabric tree, NVLink domains), importers and exporters."""

from slurmfm.topology.model import ROOT, Node, Switch, Topology, TopologyError

__all__ = ["ROOT", "Node", "Switch", "Topology", "TopologyError"]
