"""Exported topologies loaded by REAL slurmctld builds (22.05.8 host, 24.11.5, 26.05.5 chroots).

Each suite gets its own lab directory and ports (``/var/tmp/slurmfm-lab/topo-<suite>``), so the
shared host lab used by other tests is never touched. A session fixture brings the lab up
(idempotent: reused when healthy with the right node count) and the tests install files with
``scripts/slurm-lab topology FILE --plugin ...``. Tests skip unless ``SLURMFM_LAB_SUITES`` names
the suite, and fail instead when ``SLURMFM_REQUIRE_SLURM=1`` and the lab cannot come up.
Take the labs down with ``scripts/slurm-lab --lab /var/tmp/slurmfm-lab/topo-<suite> down``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from lab import OwnLab, SlurmLab, own_lab_fixture

from slurmfm.catalog.slurm_features import SlurmVersion, UnsupportedBySlurm
from slurmfm.topology.model import Topology
from slurmfm.topology.scontrol import parse_scontrol_topology, slurm_node_states
from slurmfm.topology.slurm_model import block_order
from slurmfm.topology.topology_conf import export_block, export_tree, parse_topology_conf
from slurmfm.topology.topology_yaml import export_yaml

sys.path.insert(0, str(Path(__file__).parent))
import ec2gen

from slurmfm.topology.ec2 import parse_topology_json, to_topology

# This module's own labs, on ports of no other lab (scripts/README-lab.md, "Ports").
OWN_LABS = {
    "host": OwnLab("topo-host", ctld_port=16917, slurmd_port=17201, nodes=64),
    "trixie": OwnLab("topo-trixie", ctld_port=16927, slurmd_port=17301, nodes=36, suite="trixie"),
    "sid": OwnLab("topo-sid", ctld_port=16937, slurmd_port=17401, nodes=36, suite="sid"),
}
LabFactory = Callable[[str], SlurmLab]


@pytest.fixture(scope="session")
@own_lab_fixture(*OWN_LABS.values())
def own_lab() -> LabFactory:
    """``own_lab(suite)``: this module's private lab of that suite, up and healthy."""
    cache: dict[str, SlurmLab] = {}

    def get(suite: str) -> SlurmLab:
        if suite not in cache:
            cache[suite] = OWN_LABS[suite].up()
        return cache[suite]

    return get


def install(lab: SlurmLab, text: str, plugin: str, tmp_path: Path) -> None:
    f = tmp_path / f"exported.{plugin}"
    f.write_text(text)
    proc = OWN_LABS[lab.suite].command("topology", str(f), "--plugin", plugin)
    assert proc.returncode == 0, f"{text}\n{proc.stdout}{proc.stderr}"


def scontrol_topology(lab: SlurmLab, name: str | None = None) -> Topology:
    proc = lab.run(["scontrol", "show", "topology", *([name] if name else [])])
    assert proc.returncode == 0, proc.stderr
    return parse_scontrol_topology(proc.stdout)


def lab_topology(n: int, *, seed: int, gb200: bool) -> Topology:
    """A generated EC2-like topology whose instances are named like the lab's nodes."""
    kind = "p6e-gb200.36xlarge" if gb200 else "p5.48xlarge"
    resp = ec2gen.generate_response(
        n, instance_type=kind, seed=seed, ultraservers=gb200, leaf_size_range=(4, 12)
    )
    names = {inst["InstanceId"]: f"node{i + 1:03d}" for i, inst in enumerate(resp["Instances"])}
    return to_topology(parse_topology_json(resp), names)


SUITE_PARAMS = [
    pytest.param("host", marks=pytest.mark.slurm),
    pytest.param("trixie", marks=pytest.mark.slurm_newer),
    pytest.param("sid", marks=pytest.mark.slurm_newer),
]
NEWER = [p for p in SUITE_PARAMS if p.values[0] != "host"]


@pytest.mark.parametrize("suite", SUITE_PARAMS)
def test_tree_loaded_by_real_slurm(suite: str, own_lab: LabFactory, tmp_path: Path) -> None:
    lab = own_lab(suite)
    t = lab_topology(lab.nodes, seed=11, gb200=False)
    assert t.depth >= 3
    install(lab, export_tree(t, lab.version), "tree", tmp_path)
    live = scontrol_topology(lab)
    assert live.kind == "tree"
    assert live.shape() == t.shape()  # nn- switch names and every node's leaf, as exported
    states = slurm_node_states(lab.run(["sinfo", "-N", "-h", "-o", "%N %T"]).stdout)
    assert set(states) == set(t.nodes)


@pytest.mark.parametrize("suite", NEWER)
def test_block_loaded_by_real_slurm(suite: str, own_lab: LabFactory, tmp_path: Path) -> None:
    lab = own_lab(suite)
    t = lab_topology(36, seed=5, gb200=True)
    assert len(t.domains()) == 2
    text = export_block(t, lab.version)
    assert "BlockSizes=18,36" in text
    install(lab, text, "block", tmp_path)
    live = scontrol_topology(lab)
    expected = parse_topology_conf(text)
    assert live == expected
    assert block_order(live) == block_order(expected)
    assert {frozenset(live.nodes_under(b)) for b in live.leaves} == {
        frozenset(m) for m in t.domains().values()
    }


@pytest.mark.slurm_newer
@pytest.mark.parametrize("suite", ["sid"])  # names the lab: its xdist group (tests/conftest.py)
def test_yaml_tree_and_block_partitions_on_26_05(
    suite: str, own_lab: LabFactory, tmp_path: Path
) -> None:
    """topology.yaml with a tree (partition batch) and a block (partition debug) topology.

    The lab's slurm.conf has no ``Topology=`` on its partitions and slurm-lab cannot add it, so
    the block one is attached at run time with ``scontrol update PartitionName=debug
    Topology=debug`` (accepted by 26.05.5); a restart would drop that.
    """
    lab = own_lab(suite)
    tree = lab_topology(36, seed=11, gb200=False)
    gb = lab_topology(36, seed=5, gb200=True)
    text = export_yaml({"batch": tree, "debug": gb}, lab.version)
    install(lab, text, "yaml", tmp_path)
    assert scontrol_topology(lab).shape() == tree.shape()  # the cluster default
    assert scontrol_topology(lab, "batch").shape() == tree.shape()
    live_gb = scontrol_topology(lab, "debug")
    assert live_gb.kind == "block"
    assert {frozenset(live_gb.nodes_under(b)) for b in live_gb.leaves} == {
        frozenset(m) for m in gb.domains().values()
    }
    upd = lab.run(["scontrol", "update", "PartitionName=debug", "Topology=debug"])
    assert upd.returncode == 0, upd.stderr
    assert "Topology=debug" in lab.run(["scontrol", "show", "partition", "debug"]).stdout
    # behaviour: in the block partition a 2-node job may not span two blocks
    debug_nodes = lab.hostnames("node[001-004]")
    a = debug_nodes[0]
    other = next((n for n in debug_nodes if gb.leaf(n) != gb.leaf(a)), None)
    if other is not None:
        spans = lab.run(
            ["sbatch", "--test-only", "-p", "debug", "-N2", "-w", f"{a},{other}", "--wrap", "true"]
        )
        assert spans.returncode != 0, spans.stderr
        in_tree = lab.run(
            ["sbatch", "--test-only", "-p", "batch", "-N2", "-w", f"{a},{other}", "--wrap", "true"]
        )
        assert in_tree.returncode == 0, in_tree.stderr


@pytest.mark.slurm
@pytest.mark.parametrize("suite", ["host"])
def test_block_refused_by_exporter_and_real_22_05(
    suite: str, own_lab: LabFactory, tmp_path: Path
) -> None:
    lab = own_lab(suite)
    version = SlurmVersion.parse(lab.version)
    assert version < SlurmVersion(23, 11)
    gb = lab_topology(36, seed=5, gb200=True)
    with pytest.raises(
        UnsupportedBySlurm, match=rf"topology/block needs Slurm >= 23\.11.*{lab.version}"
    ):
        export_block(gb, lab.version)
    # the lab script refuses too ...
    f = tmp_path / "block.conf"
    f.write_text(export_block(gb, "24.11"))
    proc = OWN_LABS["host"].command("topology", str(f), "--plugin", "block")
    assert proc.returncode != 0
    assert "topology/block needs Slurm >= 23.11" in proc.stderr
    # ... and 22.05.8 really has no such plugin: its PluginDir has topology_tree.so only
    config = lab.run(["scontrol", "show", "config"]).stdout
    plugin_dir = Path(
        next(
            ln.split("=", 1)[1].strip() for ln in config.splitlines() if ln.startswith("PluginDir")
        )
    )
    assert (plugin_dir / "topology_tree.so").exists()
    assert not (plugin_dir / "topology_block.so").exists()
    assert "topology/tree" in config  # the lab kept its tree and is still healthy


@pytest.mark.slurm_newer
@pytest.mark.parametrize("suite", ["trixie"])
def test_yaml_refused_by_exporter_and_real_24_11(
    suite: str, own_lab: LabFactory, tmp_path: Path
) -> None:
    lab = own_lab(suite)
    assert SlurmVersion.parse(lab.version) < SlurmVersion(25, 5)
    parts = {"batch": lab_topology(36, seed=11, gb200=False)}
    with pytest.raises(
        UnsupportedBySlurm, match=rf"topology\.yaml needs Slurm >= 25\.05.*{lab.version}"
    ):
        export_yaml(parts, lab.version)
    f = tmp_path / "topology.yaml"
    f.write_text(export_yaml(parts, "26.05"))
    proc = OWN_LABS["trixie"].command("topology", str(f), "--plugin", "yaml")
    assert proc.returncode != 0
    assert "topology.yaml needs Slurm >= 25.05" in proc.stderr
    # 24.11's library does not even know the file name; 26.05's does (sanity check)
    chroot = Path(lab.config["CHROOT"])
    lib = chroot / "usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so"
    assert lib.exists()
    assert b"topology.yaml" not in lib.read_bytes()
    sid_lib = chroot.parent / "sid/usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so"
    if sid_lib.exists():
        assert b"topology.yaml" in sid_lib.read_bytes()
