"""On real Slurm: what the login node can check fails before anything is queued, one line,
exit status 2 (a missing training script, a container recipe where srun has no Pyxis, a
partition that does not exist, a $SLURM_CONF that names no file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lab import REPO_ROOT, SlurmLab

pytestmark = [pytest.mark.slurm]

QUICK = str(REPO_ROOT / "recipes" / "quickstart.yaml")


def next_job_id(lab: SlurmLab) -> int:
    """Slurm's next job id: any submission, even ``sbatch --test-only``, takes one."""
    out = lab.run(["scontrol", "show", "config"]).stdout
    m = re.search(r"^NEXT_JOB_ID\s*=\s*(\d+)", out, re.M)
    assert m, out
    return int(m.group(1))


def sets(tmp: Path, *more: str) -> list[str]:
    out = ["--set", f"storage.log_dir={tmp}/logs", "--set", f"storage.checkpoint_root={tmp}/c"]
    for s in more:
        out += ["--set", s]
    return out


def test_a_missing_script_is_refused_before_slurm_sees_the_job(
    slurm_lab: SlurmLab, tmp_path: Path
) -> None:
    before = next_job_id(slurm_lab)
    proc = slurm_lab.slurmfm(
        "submit", QUICK, *sets(tmp_path, f"launcher.script={tmp_path}/nope.py")
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"preflight: launcher.script: no such file on this login node: {tmp_path}/nope.py "
        "(a recipe file's relative paths are relative to the file)"
    ]
    assert next_job_id(slurm_lab) == before  # not even a --test-only
    assert not (tmp_path / "logs").exists()


def test_a_container_recipe_without_pyxis_is_refused(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    image = tmp_path / "image.sqsh"
    image.write_bytes(b"")
    before = next_job_id(slurm_lab)
    proc = slurm_lab.slurmfm("submit", QUICK, *sets(tmp_path, f"container.image={image}"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "preflight: container: Pyxis is not installed here: `srun --help` lists no "
        "--container-image (install Pyxis, https://github.com/NVIDIA/pyxis, or use python_env "
        "instead of container)"
    ]
    assert next_job_id(slurm_lab) == before
    missing = slurm_lab.slurmfm(
        "submit", QUICK, *sets(tmp_path, f"container.image={tmp_path}/gone.sqsh")
    )
    assert missing.returncode == 2
    assert "container.image: no such image file on this login node" in missing.stderr


def test_a_partition_that_does_not_exist_is_one_line(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    proc = slurm_lab.slurmfm("submit", QUICK, *sets(tmp_path, "cluster.partition=nosuch"))
    assert proc.returncode == 2
    assert "preflight: partition: partition 'nosuch' does not exist on this cluster" in (
        proc.stderr.splitlines()
    )


def test_a_missing_slurm_conf_is_refused_at_once(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    env = {**slurm_lab.env, "SLURM_CONF": str(tmp_path / "gone.conf")}
    for args in (["submit", QUICK, *sets(tmp_path)], ["status", "1"]):
        proc = slurm_lab.run([*slurm_lab.slurmfm_argv(), *args], env=env, cwd=REPO_ROOT)
        assert proc.returncode == 2
        assert proc.stderr.splitlines() == [
            f"SLURM_CONF={tmp_path}/gone.conf: no such file; point SLURM_CONF at the cluster's "
            "slurm.conf or unset it (Slurm then finds its own)"
        ]
