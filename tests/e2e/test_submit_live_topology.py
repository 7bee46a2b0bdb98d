"""`slurmfm submit --topology live` on the real lab: planned, pinned, submitted, and Slurm's
version asked once (it serves both the plan's feature gates and the rendering)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab import REPO_ROOT, SlurmLab

from slurmfm.backends.slurm_cli import parse_scontrol_record

pytestmark = [pytest.mark.slurm]


def test_submit_with_live_topology_asks_the_version_once(
    slurm_lab: SlurmLab, tmp_path: Path
) -> None:
    calls = tmp_path / "sbatch-calls"
    wrappers = tmp_path / "bin"
    wrappers.mkdir()
    sbatch = wrappers / "sbatch"
    real = slurm_lab.run(["bash", "-c", "command -v sbatch"]).stdout.strip()
    sbatch.write_text(f'#!/bin/bash\necho "$*" >>{calls}\nexec {real} "$@"\n')
    sbatch.chmod(0o755)
    env = {**slurm_lab.env, "PATH": f"{wrappers}:{slurm_lab.env['PATH']}"}
    proc = slurm_lab.run(
        [
            *slurm_lab.slurmfm_argv(),
            "submit",
            "recipes/quickstart.yaml",
            "--topology",
            "live",
            "--no-check",
            "--set",
            f"storage.log_dir={tmp_path}/logs",
            "--set",
            f"storage.checkpoint_root={tmp_path}/ckpt",
            "--set",
            "launcher.args=[--steps, '2']",
        ],
        env=env,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.split()[0]
    lines = calls.read_text().splitlines()
    assert lines.count("--version") == 1, lines
    assert "plan: " in proc.stderr
    rec = parse_scontrol_record(slurm_lab.run(["scontrol", "show", "job", "-o", job_id]).stdout)
    slurm_lab.run(["scancel", job_id])
    # pinned: the job asked for exactly the planned nodes
    assert rec.get("ReqNodeList", "(null)") not in ("", "(null)")
