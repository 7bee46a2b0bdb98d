"""topology.yaml on real Slurm 26.05: ring and torus3d entries as data, and a cluster without
switches or blocks (partition ``Topology=`` tags, every topology flat) read live.

Our own 8-node sid chroot lab (26.05.5), on ports of no other lab. Real 26.05.5's slurmctld
does not start on an empty topology.yaml (``[]``: it dumped core on this lab), so HyperPod's
empty file is checked by the importer (unit tests below) and the live cluster without a
topology by the nearest state 26.05 runs: flat topologies named by partition tags, for which
``scontrol show topology`` prints nothing, as it does for topology/flat.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from lab import OwnLab, SlurmLab, own_lab_fixture

from slurmfm import api
from slurmfm.catalog.slurm_features import UnsupportedBySlurm
from slurmfm.topology.model import TopologyError
from slurmfm.topology.store import load_any
from slurmfm.topology.topology_yaml import export_yaml_doc, read_topology_yaml

YAML_SID = OwnLab("yaml-sid", 16877, 18501, nodes=8, suite="sid")

# block (the cluster default), a ring for partition debug, a torus3d for partition cube
NEWER_KINDS = """\
- topology: racks
  cluster_default: true
  block:
    block_sizes: [4, 8]
    blocks:
      - block: b1
        nodes: node[001-004]
      - block: b2
        nodes: node[005-008]
- topology: ring8
  cluster_default: false
  ring:
    rings:
      - ring: r0
        nodes: node[001-008]
- topology: cube
  cluster_default: false
  torus3d:
    toruses:
      - name: pod1
        dims: {x: 2, y: 2, z: 2}
        nodes: node[001-008]
        placements:
          - dims: {x: 2, y: 2, z: 1}
"""


def test_ring_and_torus3d_entries_are_read_and_written_as_data() -> None:
    doc = read_topology_yaml(NEWER_KINDS)
    assert doc.kinds == {"racks": "block", "ring8": "ring", "cube": "torus3d"}
    assert doc.default == "racks"
    assert doc.rings["ring8"][0].nodes == tuple(f"node{i:03d}" for i in range(1, 9))
    torus = doc.toruses["cube"][0]
    assert torus.dims == (2, 2, 2)
    assert torus.extra == {"placements": [{"dims": {"x": 2, "y": 2, "z": 1}}]}
    assert doc.summary() == (
        "block 'racks' (8 nodes), ring 'ring8' (1 rings, 8 nodes), torus3d 'cube' (1 toruses)"
    )
    text = export_yaml_doc(doc, "26.05")
    assert read_topology_yaml(text) == doc  # round trip
    with pytest.raises(UnsupportedBySlurm, match=r"\(ring\) needs Slurm >= 26.05"):
        export_yaml_doc(doc, "25.11")
    # planning still takes the tree/block entry, and says what else the file holds
    assert read_topology_yaml(text).topologies["racks"].kind == "block"


def test_an_empty_topology_yaml_is_read_and_explained(tmp_path: Path) -> None:
    """HyperPod's automatic topology management can leave ``[]``: accepted, and the planner's
    error says what the file holds and what to use instead."""
    doc = read_topology_yaml("[]\n")
    assert doc.order == ()
    assert doc.summary() == "no topology at all (an empty list, [])"
    assert export_yaml_doc(doc, "25.11").endswith("---\n[]\n")
    f = tmp_path / "slurm-topology"  # no .yaml suffix: the content says what it is
    f.write_text("[]\n")
    with pytest.raises(TopologyError, match=r"holds no topology at all.*--topology live"):
        load_any(f)
    f.write_text("- topology: hp\n  cluster_default: true\n  flat: true\n")
    with pytest.raises(TopologyError, match=r"holds flat 'hp'"):
        load_any(f, fmt="yaml")


@pytest.fixture(scope="module")
@own_lab_fixture(YAML_SID)
def yaml_lab() -> SlurmLab:
    return YAML_SID.up()


def install(lab: SlurmLab, text: str, tags: dict[str, str], tmp_path: Path) -> None:
    """topology.yaml ``text``, each partition of ``tags`` with ``Topology=`` its value."""
    conf = lab.slurm_conf
    lines = []
    for raw in conf.read_text().splitlines():
        line = re.sub(r" Topology=\S+", "", raw)
        m = re.match(r"PartitionName=(\S+) ", line)
        if m and m.group(1) in tags:
            line += f" Topology={tags[m.group(1)]}"
        lines.append(line)
    conf.write_text("\n".join(lines) + "\n")
    f = tmp_path / "topology.yaml"
    f.write_text(text)
    proc = YAML_SID.command("topology", str(f), "--plugin", "yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slurm_newer
def test_exported_ring_and_torus3d_load_in_slurm_26_05(yaml_lab: SlurmLab, tmp_path: Path) -> None:
    lab = yaml_lab
    text = export_yaml_doc(read_topology_yaml(NEWER_KINDS), lab.version)
    install(lab, text, {"debug": "ring8", "batch": "racks"}, tmp_path)
    ring = lab.run(["scontrol", "show", "topology", "ring8"])
    assert ring.returncode == 0, ring.stderr
    assert "RingName=r0 Nodes=node[001-008] RingSize=8" in ring.stdout
    cube = lab.run(["scontrol", "show", "topology", "cube"])
    assert "TorusName=pod1 Dims=2x2x2" in cube.stdout
    # the cluster default is the block: --topology live plans on it
    topo = api.load_topology("live", env=lab.env)
    assert topo.kind == "block"
    assert len(topo.nodes) == 8


@pytest.mark.slurm_newer
def test_live_topology_without_switches_or_blocks_is_a_flat_fabric(
    yaml_lab: SlurmLab, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lab = yaml_lab
    flat = "- topology: hp-flat\n  cluster_default: true\n  flat: true\n"
    install(lab, flat, {"batch": "hp-flat", "debug": "hp-flat"}, tmp_path)
    shown = lab.run(["scontrol", "show", "topology"])
    assert shown.returncode == 0
    assert shown.stdout.strip() == ""  # what slurmfm had refused ("no topology configured")
    with caplog.at_level(logging.WARNING, logger="slurmfm.topology"):
        topo = api.load_topology("live", env=lab.env)
    assert sorted(topo.nodes) == [f"node{i:03d}" for i in range(1, 9)]
    assert len(topo.leaves) == 1
    note = " ".join(r.getMessage() for r in caplog.records)
    assert "reports no switches or blocks" in note
    assert "batch -> hp-flat, debug -> hp-flat" in note
    assert "one flat fabric of 8 nodes" in note
    out = lab.slurmfm("topology", "show", "--live", "--no-nodes")
    assert out.returncode == 0, out.stderr
    assert "one flat fabric of 8 nodes" in out.stderr
