"""The command line: one clear line per problem, exit status 2, nothing half-written."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from lab import REPO_ROOT, SlurmLab

from slurmfm.cli import main

QUICK = str(REPO_ROOT / "recipes" / "quickstart.yaml")


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_help_lists_commands() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "--help"], capture_output=True, text=True, check=True
    )
    for cmd in ("submit", "render", "validate", "status", "cancel"):
        assert cmd in proc.stdout


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys; from slurmfm.cli import main\n"
        "heavy = [m for m in ('pydantic', 'jinja2', 'rich', 'networkx', 'ruamel', 'boto3')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_validate_ok() -> None:
    code, out, _ = run("validate", QUICK)
    assert code == 0
    assert "ok: quickstart, 2 x lab-cpu, world size 4" in out


def test_validate_error_is_one_located_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlauncher:\n  kind: torchrun\n  script: t.py\n  nproc: 3\n")
    code, out, err = run("validate", str(bad))
    assert code == 2
    assert out == ""
    assert (
        err.strip()
        == f"{bad}:5: launcher.nproc: unknown field (check the spelling; see the recipe reference in the README)"
    )


def test_render_to_file_is_atomic_and_bad_input_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    code, _, _ = run("render", QUICK, "-o", str(out))
    assert code == 0
    assert out.read_text().startswith("#!/bin/bash\n")
    assert out.stat().st_mode & 0o111
    # A failing render must leave the previous file untouched and no temp files behind.
    before = out.read_text()
    code, _, err = run("render", QUICK, "--set", "resources.nodes=0", "-o", str(out))
    assert code == 2
    assert err.startswith("<override>: resources.nodes: Input should be greater than or equal to 1")
    assert out.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]
    fresh = tmp_path / "new" / "job.sh"
    code, _, _ = run("render", QUICK, "--set", "parallelism.tp=3", "-o", str(fresh))
    assert code == 2
    assert not fresh.exists()


def test_render_refuses_unsafe_values_with_exit_2(tmp_path: Path) -> None:
    code, _, err = run("render", QUICK, "--set", "storage.log_dir=/fsx/my logs")
    assert code == 2
    assert "storage.log_dir" in err
    assert "cannot carry safely" in err


def test_render_for_versions_and_flavors() -> None:
    code, out, _ = run("render", QUICK, "--slurm-version", "24.11")
    assert code == 0
    assert "# Slurm target 24.11;" in out
    code, out, _ = run("render", QUICK, "--set", "cluster.flavor=hyperpod")
    assert code == 0
    sbatch = [line for line in out.splitlines() if line.startswith("#SBATCH")]
    assert not any("auto-resume" in line for line in sbatch)
    assert "--auto-resume=1" in out


def test_dry_run_shows_command_and_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    code, out, _ = run("submit", QUICK, "--dry-run", "--set", "secrets=[HF_TOKEN]")
    assert code == 0
    assert out.startswith("# dry run: would run sbatch --parsable with this script on stdin")
    assert "# needs from the environment: HF_TOKEN; missing now: HF_TOKEN" in out


def test_submit_without_secret_fails_before_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # nothing could be submitted anyway
    code, _, err = run("submit", QUICK, "--set", "secrets=[HF_TOKEN]")
    assert code == 2
    # Checked before Slurm is asked anything: sbatch is not even on PATH here.
    assert "<environment>: secrets: not set in the submitting environment: HF_TOKEN" in err


def test_status_of_bad_id_exits_2() -> None:
    code, _, err = run("status", "12;rm")
    assert code == 2
    assert "is not a Slurm job id" in err


def test_version_option() -> None:
    code, out, _ = run("--version")
    assert code == 0
    assert "0.1.0" in out


@pytest.mark.slurm
def test_submit_status_cancel_via_cli(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    env = dict(slurm_lab.env)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "slurmfm.cli", *args],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )

    sets = [
        "--set",
        f"storage.log_dir={tmp_path}/logs",
        "--set",
        f"storage.checkpoint_root={tmp_path}/ckpt",
        "--set",
        "launcher.args=[--steps, '1000', --sleep, '1']",
    ]
    sub = cli("submit", "recipes/quickstart.yaml", *sets)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    assert (tmp_path / "logs").is_dir()  # created before sbatch (sbatch would not)
    st = cli("status", job_id)
    assert st.returncode == 0
    assert "quickstart" in st.stdout
    cancel = cli("cancel", job_id)
    assert cancel.returncode == 0
    assert cancel.stdout.strip() == f"cancelled {job_id}"
    bad = cli("submit", "recipes/quickstart.yaml", *sets, "--set", "cluster.partition=nosuch")
    assert bad.returncode == 2
    assert "invalid partition" in bad.stderr.lower()
    pys = cli("submit", "recipes/quickstart.yaml", *sets, "--backend", "pyslurm")
    assert pys.returncode == 2
    assert "pyslurm backend unavailable" in pys.stderr


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI as a user runs it (bytes: some inputs below are not UTF-8)."""
    return subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", *args], capture_output=True, cwd=REPO_ROOT
    )


def _one_clean_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("kind", ["fifo", "symlink", "chardev", "directory"])
def test_output_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    """Issue 15 item 9: -o replaced a character device and symlinks with 0755 scripts."""
    target = tmp_path / "out"
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(victim)
    elif kind == "chardev":
        if os.geteuid() != 0:
            pytest.skip("mknod of a character device needs root")
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
    else:
        target.mkdir()
    before = os.lstat(target)
    commands = [["submit", "--dry-run", QUICK]]
    if kind != "directory":  # render's -o is declared a file: click refuses a directory
        commands.append(["render", QUICK])
    for args in commands:
        err = _one_clean_line(_cli(*args, "-o", str(target)))
        assert err.startswith(f"{target}: (output): exists and is ")
        after = os.lstat(target)
        assert (after.st_mode, after.st_ino, after.st_rdev) == (
            before.st_mode,
            before.st_ino,
            before.st_rdev,
        )
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim"]


def test_output_keeps_an_existing_files_mode(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    out.write_text("old\n")
    out.chmod(0o600)
    proc = _cli("render", QUICK, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_text().startswith("#!/bin/bash\n")
    fresh = tmp_path / "fresh.sh"
    assert _cli("render", QUICK, "-o", str(fresh)).returncode == 0
    assert fresh.stat().st_mode & 0o100  # a new script is executable
