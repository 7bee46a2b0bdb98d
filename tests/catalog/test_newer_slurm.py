"""Slurm 25.11/26.05 options on real Slurm 26.05 (our own sid chroot lab, topology/block).

The lab has 36 nodes of 4 GPUs in 2 blocks of 18 (two GB200 NVL72 racks, BlockSizes=18,36),
on ports of no other lab. ``sbatch --test-only`` predicts nodes without queueing anything, so
each check reads where Slurm would place the job.
"""

from __future__ import annotations

import re
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
