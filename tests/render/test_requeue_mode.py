"""How the job asks Slurm to requeue it (issue 15 item 15: the restart delay)."""

from __future__ import annotations

from pathlib import Path

import pytest
from render_helpers import recipe, render

from slurmfm.errors import UnsupportedError


def sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH --requeue")]


def test_plain_requeue_by_default() -> None:
    assert sbatch_lines(render(recipe(), "26.05")) == ["#SBATCH --requeue"]


def test_expedited_requeue_on_slurm_25_11_and_later() -> None:
    r = recipe(resilience__expedited_requeue=True)
    text = render(r, "26.05")
    assert sbatch_lines(text) == ["#SBATCH --requeue=expedite"]
    # the reason and what the cluster must allow are next to it
    i = text.splitlines().index("#SBATCH --requeue=expedite")
    assert "enable_expedited_requeue" in text.splitlines()[i - 1]


def test_expedited_requeue_before_25_11_is_refused() -> None:
    r = recipe(resilience__expedited_requeue=True)
    with pytest.raises(UnsupportedError, match=r"needs Slurm >= 25.11; target is 24.11"):
        render(r, "24.11")


def test_no_requeue_wins_over_expedite() -> None:
    r = recipe(resilience__expedited_requeue=True, resilience__requeue=False)
    assert "#SBATCH --no-requeue" in render(r, "22.05")


def test_cli_refusal_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    f = tmp_path / "r.yaml"
    f.write_text(
        "name: r\n"
        "cluster: {instance_type: p5.48xlarge, partition: gpu, slurm_version: '24.11'}\n"
        "resources: {nodes: 2}\n"
        "launcher: {kind: torchrun, script: /fsx/train.py}\n"
        "resilience: {expedited_requeue: true}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "render", "--no-cache", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "expedited_requeue" in proc.stderr
