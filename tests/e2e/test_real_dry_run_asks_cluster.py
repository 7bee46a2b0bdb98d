"""The dry run is the submission: ``submit --dry-run`` and ``plan --topology live`` ask a
reachable cluster for its Slurm version, as ``submit`` does, and say when they could not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lab import REPO_ROOT, SlurmLab

pytestmark = [pytest.mark.slurm]

QUICK = str(REPO_ROOT / "recipes" / "quickstart.yaml")


def test_submit_dry_run_renders_for_the_clusters_slurm(each_lab: SlurmLab) -> None:
    """On 22.05 and 24.11: the version the cluster reports, never the assumed 22.05."""
    slurm_lab = each_lab
    proc = slurm_lab.slurmfm("submit", QUICK, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert f"# Slurm target {slurm_lab.version}; flavor generic." in proc.stdout
    assert "assumed" not in proc.stdout
    # The script submit would send, byte for byte: rendered for the same version.
    pinned = slurm_lab.slurmfm("submit", QUICK, "--dry-run", "--slurm-version", slurm_lab.version)
    assert pinned.stdout == proc.stdout


def test_plan_live_plans_for_the_clusters_slurm(each_lab: SlurmLab) -> None:
    slurm_lab = each_lab
    proc = slurm_lab.slurmfm("plan", QUICK, "--topology", "live", "--explain")
    assert proc.returncode == 0, proc.stderr
    assert "Slurm version unknown" not in proc.stdout + proc.stderr
    assert f"Slurm {slurm_lab.version} runs only these rules" in proc.stdout


def test_dry_run_says_when_no_cluster_answered(tmp_path: Path) -> None:
    env = {"PATH": os.path.dirname(sys.executable), "HOME": str(tmp_path)}  # no sbatch
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "submit", QUICK, "--dry-run"],
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning: Slurm version: could not ask the cluster (sbatch: command not found" in (
        proc.stderr
    )
    assert "(assumed: recipe says auto and no cluster was asked)" in proc.stdout
