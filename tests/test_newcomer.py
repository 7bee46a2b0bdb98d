"""What a newcomer hit on a fresh machine (issue 13): each promise of the README's first
steps, checked as a user would run it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from lab import REPO_ROOT, SlurmLab

README = REPO_ROOT / "README.md"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_readme_never_names_a_fixed_job_id() -> None:
    """The preflight's `sbatch --test-only` uses up a job id, so a first job is never job 3:
    the README's example takes the id `submit` prints."""
    text = README.read_text()
    assert not re.search(r"slurmfm (status|cancel) \d+", text)
    assert "job=$(slurmfm submit recipes/quickstart.yaml)" in text
    assert 'slurmfm status "$job"' in text


def test_validate_of_a_pipeline_file_points_to_pipeline_validate() -> None:
    path = "recipes/pipelines/pretrain-then-eval.yaml"
    proc = cli("validate", path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(
        rf"{re.escape(path)}:\d+: stages: .*slurmfm pipeline validate {path}", lines[0]
    )
    assert "required field is missing" not in proc.stderr


def _lab_topology_json() -> dict[str, object]:
    """The shape scripts/slurm-lab writes (write_topology_json), for 4 nodes in 2 leaves."""

    def sw(
        level: int, parent: str | None, nodes: list[str], children: list[str]
    ) -> dict[str, object]:
        return {"level": level, "parent": parent, "nodes": nodes, "children": children}

    return {
        "plugin": "tree",
        "source": "generated",
        "levels": 2,
        "switches": {
            "leaf1": sw(0, "core", ["node003", "node001"], []),
            "leaf2": sw(0, "core", ["node002", "node004"], []),
            "core": sw(1, None, ["node003", "node001", "node002", "node004"], ["leaf1", "leaf2"]),
        },
        "nodes": {
            f"node00{i}": {
                "leaf": "leaf1" if i in (1, 3) else "leaf2",
                "addr": "127.0.0.1",
                "port": 17000 + i,
            }
            for i in range(1, 5)
        },
    }


def test_plan_accepts_the_labs_topology_json(tmp_path: Path) -> None:
    f = tmp_path / "topology.json"
    f.write_text(json.dumps(_lab_topology_json()))
    proc = cli("plan", "--topology", str(f), "--nodes", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert sorted(plan["nodes"]) in (["node001", "node003"], ["node002", "node004"])


def test_plan_accepts_a_running_labs_topology_json(slurm_lab: SlurmLab) -> None:
    proc = cli("plan", "--topology", str(slurm_lab.lab_dir / "topology.json"), "--nodes", "4")
    assert proc.returncode == 0, proc.stderr
    assert "leaves (1)" in proc.stdout


def test_ci_run_passes_its_arguments_on(tmp_path: Path) -> None:
    (tmp_path / ".ci").mkdir()
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO_ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    fake = tmp_path / "scripts" / "run-tests"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run"), "-k", "a b", "-x"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "CI": "true"},
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["-k", "a b", "-x"]


def test_package_metadata_has_an_spdx_license() -> None:
    """A license table makes setuptools print ~85 lines of deprecation warnings before the
    quickstart's own output; the SPDX string (PEP 639) does not."""
    import tomllib

    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert any(r.startswith("setuptools>=77") for r in meta["build-system"]["requires"])
