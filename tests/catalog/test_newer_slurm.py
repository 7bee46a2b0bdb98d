"""Slurm 25.11/26.05 options on real Slurm 26.05 (our own sid chroot lab, topology/block).

The lab has 36 nodes of 4 GPUs in 2 blocks of 18 (two GB200 NVL72 racks, BlockSizes=18,36),
on ports of no other lab. ``sbatch --test-only`` predicts nodes without queueing anything, so
each check reads where Slurm would place the job.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from lab import REPO_ROOT, OwnLab, SlurmLab, own_lab_fixture

from slurmfm.catalog.slurm_features import SlurmVersion, supports
from slurmfm.recipe.loader import load_recipe
from slurmfm.render.script import Target, render_script

_BLOCKS = ("--gpus-per-node", "4", "--topology-plugin", "block", "--block-size", "18")
SID_BLOCKS = OwnLab("newer-sid", 16867, 18401, nodes=36, suite="sid", options=_BLOCKS)


@pytest.fixture(scope="module")
@own_lab_fixture(SID_BLOCKS)
def sid_blocks() -> SlurmLab:
    return SID_BLOCKS.up()


def predict(lab: SlurmLab, *args: str) -> tuple[int, str, list[str]]:
    """(exit status, stderr, predicted nodes) of ``sbatch --test-only ARGS``."""
    proc = lab.run(["sbatch", "--test-only", "-o", "/dev/null", *args])
    m = re.search(r" on nodes (\S+)", proc.stderr)
    return proc.returncode, proc.stderr, lab.hostnames(m.group(1)) if m else []


def block_of(lab: SlurmLab) -> dict[str, str]:
    return {n: b for b, spec in lab.topology["blocks"].items() for n in spec["nodes"]}


@pytest.mark.slurm_newer
def test_segment_options_of_25_11_are_accepted_and_place_as_documented(
    sid_blocks: SlurmLab,
) -> None:
    lab = sid_blocks
    assert supports("consolidate_segments", SlurmVersion.parse(lab.version))
    where = block_of(lab)
    wrap = ("--wrap", "true")
    # --spread-segments: each segment on a base block of its own
    rc, err, nodes = predict(lab, "-N", "18", "--segment=9", "--spread-segments", *wrap)
    assert rc == 0, err
    assert sorted(where[n] for n in nodes) == ["block1"] * 9 + ["block2"] * 9
    # --consolidate-segments: both segments packed into one block
    rc, err, nodes = predict(lab, "-N", "18", "--segment=9", "--consolidate-segments", *wrap)
    assert rc == 0, err
    assert len(nodes) == 18
    assert len({where[n] for n in nodes}) == 1
    # an IMEX channel per segment: accepted (it takes effect with switch/nvidia_imex only)
    rc, err, _ = predict(
        lab, "-N", "18", "--segment=9", "--network=unique-channel-per-segment", *wrap
    )
    assert rc == 0, err
    # a whole-UltraServer segment, as slurmfm now renders for 18 GB200 nodes
    rc, err, nodes = predict(lab, "-N", "18", "--segment=18", *wrap)
    assert rc == 0, err
    assert len({where[n] for n in nodes}) == 1


@pytest.mark.slurm_newer
def test_the_rendered_gb200_script_is_accepted_by_slurm_26_05(
    sid_blocks: SlurmLab, tmp_path: Path
) -> None:
    """36 GB200 nodes on 26.05: --segment=18 --consolidate-segments, one segment per rack."""
    lab = sid_blocks
    r = load_recipe(
        REPO_ROOT / "recipes" / "gb200-llama3-405b.yaml",
        {
            "resources.nodes": 36,
            "resources.time_limit": "01:00:00",
            "cluster.partition": "batch",
            "cluster.constraints": "lab",
            "cluster.slurm_version": lab.version,
            "storage.log_dir": str(tmp_path),
        },
    )
    out = render_script(r, Target.for_recipe(r, lab.version))
    assert "#SBATCH --segment=18\n" in out.text
    assert "#SBATCH --consolidate-segments\n" in out.text
    script = tmp_path / "job.sh"
    script.write_text(out.text)
    rc, err, nodes = predict(lab, str(script))
    assert rc == 0, err
    assert len(nodes) == 36
    where = block_of(lab)
    assert sorted(where[n] for n in nodes) == ["block1"] * 18 + ["block2"] * 18


@pytest.mark.slurm_newer
def test_srun_async_is_a_26_05_step_option(sid_blocks: SlurmLab) -> None:
    """26.05 knows srun --async and refuses it outside an allocation (CHANGELOG 26.05.0)."""
    lab = sid_blocks
    assert supports("srun_async", SlurmVersion.parse(lab.version))
    proc = lab.run(["srun", "--async", "true"])
    assert proc.returncode != 0
    assert "--async is only valid for steps submitted within an existing job allocation" in (
        proc.stderr
    )


def _interleaved(lab: SlurmLab, plugin: str) -> tuple[str, dict[str, str]]:
    """A topology whose groups interleave in name order, and each node's group: under tree
    4 leaves (node i on leaf i % 4), under block 2 blocks (odd and even nodes)."""
    names = [f"node{i:03d}" for i in range(1, lab.nodes + 1)]
    if plugin == "tree":
        group = {n: f"leaf{i % 4 + 1}" for i, n in enumerate(names)}
        lines = [
            f"SwitchName={g} Nodes={','.join(n for n in names if group[n] == g)}"
            for g in sorted(set(group.values()))
        ]
        lines += ["SwitchName=spine1 Switches=leaf[1-2]", "SwitchName=spine2 Switches=leaf[3-4]"]
        lines += ["SwitchName=core Switches=spine[1-2]"]
    else:
        group = {n: f"b{i % 2 + 1}" for i, n in enumerate(names)}
        lines = [
            f"BlockName={g} Nodes={','.join(n for n in names if group[n] == g)}"
            for g in ("b1", "b2")
        ]
        lines.append(f"BlockSizes={lab.nodes // 2},{lab.nodes}")
    return "\n".join(lines) + "\n", group


def _ranks(lab: SlurmLab, nodes: int) -> list[tuple[int, str, str]]:
    """(SLURM_PROCID, node, SLURM_TOPOLOGY_ADDR) of each task of a batch job's step: the order
    a plain ``sbatch`` + ``srun`` job (the AWS samples' way) gets."""
    out = lab.jobs_dir / f"order-{nodes}-{time.monotonic_ns()}.out"
    step = 'srun --ntasks-per-node=1 bash -c "echo \\$SLURM_PROCID \\$SLURMD_NODENAME \\$SLURM_TOPOLOGY_ADDR"'
    proc = lab.run(
        ["sbatch", "--parsable", "--exclusive", "-N", str(nodes), "-o", str(out), "--wrap", step]
    )
    assert proc.returncode == 0, proc.stderr
    fields = lab.wait_job(proc.stdout.strip().split(";")[0], timeout=120)
    assert fields["JobState"] == "COMPLETED", fields
    rows = [line.split() for line in out.read_text().splitlines() if line[:1].isdigit()]
    return sorted((int(r[0]), r[1], r[2] if len(r) > 2 else "") for r in rows)


@pytest.mark.slurm_newer
def test_rank_order_of_26_05_under_tree_and_block_with_and_without_topology_param(
    sid_blocks: SlurmLab, tmp_path: Path
) -> None:
    """What rank order a batch job's step gets on Slurm 26.05, measured (issue 42): node-name
    order under both plugins unless ``TopologyParam=SwitchAsNodeRank`` (tree) or
    ``BlockAsNodeRank`` (block) is set, whatever 26.05's changelog suggests; and the order
    slurmfm's runtime computes from the same tasks' ``SLURM_TOPOLOGY_ADDR`` (tree) keeps
    each leaf together either way. The groups interleave in name order, so the two orders
    differ. The lab's own topology is put back at the end."""
    from slurmfm.job.hosts import host_order, natural_key

    lab = sid_blocks
    original = tmp_path / "original.conf"
    original.write_text((lab.lab_dir / "etc" / "topology.conf").read_text())
    seen: dict[tuple[str, str], str] = {}
    try:
        for plugin, param, nodes in (
            ("tree", "", 12),
            ("tree", "SwitchAsNodeRank", 12),
            ("block", "", 24),
            ("block", "BlockAsNodeRank", 24),
        ):
            text, group = _interleaved(lab, plugin)
            topo = tmp_path / f"{plugin}.conf"
            topo.write_text(text)
            args = ["topology", str(topo), "--plugin", plugin]
            proc = lab.lab_command(*args, *(["--topology-param", param] if param else []))
            assert proc.returncode == 0, proc.stdout + proc.stderr
            ranks = _ranks(lab, nodes)
            order = [node for _, node, _ in ranks]
            assert len(order) == nodes
            groups = [group[n] for n in order]
            contiguous = all(
                g not in groups[:i] or groups[i - 1] == g for i, g in enumerate(groups)
            )
            if order == sorted(order, key=natural_key):
                seen[(plugin, param)] = "name"
            elif contiguous:
                seen[(plugin, param)] = "topology"
            else:
                seen[(plugin, param)] = "other: " + " ".join(order)
            if plugin == "tree":  # slurmfm's runtime order: by SLURM_TOPOLOGY_ADDR, then name
                addr = {node: a for _, node, a in ranks}
                assert all(addr[n].endswith(f".{group[n]}.{n}") for n in order), addr
                ours = [group[n] for n in host_order(order, topo_addr=addr)]
                assert all(g not in ours[:i] or ours[i - 1] == g for i, g in enumerate(ours))
    finally:
        lab.lab_command("topology", str(original), "--plugin", "block")
    assert seen == {
        ("tree", ""): "name",
        ("tree", "SwitchAsNodeRank"): "topology",
        ("block", ""): "name",
        ("block", "BlockAsNodeRank"): "topology",
    }
