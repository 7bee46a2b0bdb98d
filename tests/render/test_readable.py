"""Every shipped recipe renders to a script a person reads in one sitting (issue 11 part 3):
at most 250 lines (the runtime payload is one), the launch ``srun`` within the first 160, and
every ``#SBATCH`` line and export with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmfm import api

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml")) + sorted(
    p for p in (ROOT / "recipes" / "pipelines").glob("*.yaml") if "stages:" not in p.read_text()
)


def launch_line(lines: list[str]) -> int:
    """1-based line of the launch srun (the server's for a server-only job)."""
    for i, line in enumerate(lines):
        if line.startswith("slurmfm_serve=(srun ") or line.startswith("  srun "):
            return i + 1
    raise AssertionError("no launch srun")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_short_script_launch_near_the_top(path: Path) -> None:
    text = api.dry_run(api.load(path), slurm_version="24.11").text
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= 250, len(lines)
    assert launch_line(lines) <= 160  # 150 before the runtime check (slurmfm_checked)
    assert lines[-1].startswith("# slurmfm-runtime sha256=")
    for i, line in enumerate(lines):
        if line.startswith(("#SBATCH --", "export ")) and not line.startswith(
            ("#SBATCH --job-name", "#SBATCH --time", "#SBATCH --output")
        ):
            # a reason above it: a comment in its paragraph (a block under one comment)
            j = i - 1
            while j >= 0 and lines[j] and not lines[j].startswith("# "):
                j -= 1
            assert j >= 0, (path.stem, line)
            assert lines[j].startswith("# "), (path.stem, line)


def test_gb200_health_gate_checks_the_imex_channel() -> None:
    """Issue 12.4: the host health gate checks IMEX where NVLink spans instances."""
    gb200 = api.dry_run(
        api.load(ROOT / "recipes" / "gb200-llama3-405b.yaml"), slurm_version="24.11"
    )
    assert "--imex 1" in gb200.text
    p5 = api.dry_run(api.load(ROOT / "recipes" / "llama3-8b-p5-fsdp.yaml"), slurm_version="24.11")
    assert "--imex 0" in p5.text
    assert "--efa-tries 3 --efa-delay-s 5" in p5.text  # issue 12.6: as AWS retries
