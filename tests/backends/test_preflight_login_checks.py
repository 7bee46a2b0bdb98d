"""What the login node can check before anything is queued: files, Pyxis, $SLURM_CONF."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmfm.backends.preflight import PreflightError, file_checks, preflight, require_files
from slurmfm.backends.slurm_cli import SlurmCLI
from slurmfm.errors import BackendError
from slurmfm.recipe.loader import validate

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeCLI:
    """A cluster with room for the job; ``pyxis`` says whether srun has the plugin."""

    def __init__(self, pyxis: bool) -> None:
        self.pyxis = pyxis
        self.asked: list[str] = []

    def has_pyxis(self) -> bool:
        return self.pyxis

    def partition(self, name: str) -> dict[str, str] | None:
        self.asked.append("partition")
        return {"State": "UP", "TotalNodes": "16", "MaxTime": "UNLIMITED"}

    def node_features(self, partition: str | None) -> set[str]:
        return set()

    def test_only(self, script: str, *, extra_args: Sequence[str] = ()) -> str:
        self.asked.append("test_only")
        return "Job 1 to start now on node001"


def recipe(**extra: Any) -> Any:
    data: dict[str, Any] = {
        "name": "w",
        "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
        "resources": {"nodes": 1, "procs_per_node": 1},
        "launcher": {"kind": "torchrun", "script": "missing/train.py"},
    }
    data.update(extra)
    return validate(data)


def test_a_missing_training_script_fails_with_the_path_and_the_rule() -> None:
    (check,) = file_checks(recipe())
    assert check.name == "launcher.script"
    assert "no such file on this login node: missing/train.py" in check.message
    assert "relative to the file" in check.message
    assert file_checks(recipe(launcher={"kind": "torchrun", "script": __file__})) == []


def test_a_module_or_a_script_inside_a_container_is_not_a_login_node_file(tmp_path: Path) -> None:
    assert file_checks(recipe(launcher={"kind": "torchrun", "script": "x", "module": True})) == []
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"")
    assert file_checks(recipe(container={"image": str(image)})) == []


def test_a_missing_image_file_fails_and_a_registry_image_is_not_checked() -> None:
    (check,) = file_checks(recipe(container={"image": "/nonexistent/img.sqsh"}))
    assert check.name == "container.image"
    assert "no such image file on this login node: /nonexistent/img.sqsh" in check.message
    assert file_checks(recipe(container={"image": "nvcr.io#nvidia/pytorch:25.01-py3"})) == []


def test_require_files_raises_one_line_per_problem() -> None:
    with pytest.raises(PreflightError) as err:
        require_files([recipe(container={"image": "/nonexistent/img.sqsh"})])
    assert str(err.value).splitlines() == [
        "preflight: container.image: no such image file on this login node: "
        "/nonexistent/img.sqsh (a recipe file's relative paths are relative to the file; "
        "a registry image is written REGISTRY#IMAGE:TAG)"
    ]


def test_a_container_recipe_without_pyxis_fails_before_slurm_is_asked() -> None:
    cli = FakeCLI(pyxis=False)
    r = recipe(container={"image": "nvcr.io#nvidia/pytorch:25.01-py3"})
    report = preflight(r, "#!/bin/bash\n", cli)  # type: ignore[arg-type]
    assert [c.name for c in report.failures()] == ["container"]
    assert "srun --help` lists no --container-image" in report.failures()[0].message
    assert cli.asked == []  # no --test-only of a job that cannot run
    ok = FakeCLI(pyxis=True)
    assert preflight(r, "#!/bin/bash\n", ok).ok  # type: ignore[arg-type]
    assert "test_only" in ok.asked


def test_has_pyxis_reads_srun_help(tmp_path: Path) -> None:
    """Pyxis' SPANK options are listed by ``srun --help`` (its installation guide's check)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(
        "#!/bin/sh\necho 'Usage: srun [OPTIONS...] executable [args...]'\n"
        'if [ -n "$PYXIS" ]; then echo "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH"; fi\n'
    )
    srun.chmod(0o755)
    assert not SlurmCLI({"PATH": str(bin_dir)}).has_pyxis()
    assert SlurmCLI({"PATH": str(bin_dir), "PYXIS": "1"}).has_pyxis()


def test_a_missing_slurm_conf_is_one_clear_line_before_any_slurm_command(
    tmp_path: Path,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "ran"
    for name in ("sbatch", "scontrol"):
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 60\n")
        exe.chmod(0o755)
    cli = SlurmCLI({"PATH": str(bin_dir), "SLURM_CONF": str(tmp_path / "nope.conf")})
    with pytest.raises(BackendError) as err:
        cli.version()
    assert str(err.value) == (
        f"SLURM_CONF={tmp_path / 'nope.conf'}: no such file; point SLURM_CONF at the "
        "cluster's slurm.conf or unset it (Slurm then finds its own)"
    )
    assert not marker.exists()  # Slurm's minute of retries never started


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", *args],
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def test_cli_submit_of_a_missing_script_exits_2_before_slurm_is_asked(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "name: w\ncluster: {instance_type: lab-cpu, partition: batch}\n"
        "resources: {nodes: 1, procs_per_node: 1}\n"
        "launcher: {kind: torchrun, script: train.py}\n"
        f"storage: {{checkpoint_root: {tmp_path}/c, log_dir: {tmp_path}/l}}\n"
    )
    env = {"PATH": os.path.dirname(sys.executable), "HOME": str(tmp_path)}  # no sbatch
    proc = _cli("submit", str(tmp_path / "r.yaml"), env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"preflight: launcher.script: no such file on this login node: {tmp_path}/train.py "
        "(a recipe file's relative paths are relative to the file)"
    ]
    assert not (tmp_path / "l").exists()  # nothing made, nothing queued


def test_cli_status_with_a_missing_slurm_conf_exits_2_at_once(tmp_path: Path) -> None:
    env = {
        "PATH": os.path.dirname(sys.executable),
        "HOME": str(tmp_path),
        "SLURM_CONF": str(tmp_path / "gone.conf"),
    }
    proc = _cli("status", "12", env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"SLURM_CONF={tmp_path / 'gone.conf'}: no such file")


def test_validate_warns_of_a_missing_script_and_submit_refuses_it(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(
        "name: w\ncluster: {instance_type: lab-cpu, partition: batch}\n"
        "resources: {nodes: 1, procs_per_node: 1}\n"
        "launcher: {kind: torchrun, script: train.py}\n"
    )
    env = {"PATH": os.path.dirname(sys.executable), "HOME": str(tmp_path)}
    proc = _cli("validate", str(tmp_path / "r.yaml"), env=env, cwd=tmp_path)
    assert proc.returncode == 0
    assert (
        f"warning: launcher.script: no such file on this login node: {tmp_path}/train.py"
        in proc.stderr
    )
