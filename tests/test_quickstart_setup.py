"""The quickstart's set-up: a second run installs nothing already installed, and the lab
root and ports are per user by default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lab import QUICKSTART_PORT_OFFSETS

REPO_ROOT = Path(__file__).resolve().parent.parent


def fake_venv(tmp: Path) -> tuple[Path, Path]:
    """A venv whose python logs every call; ``-m pip`` does nothing, ``-c`` runs this test's
    Python (which has slurmfm), so ensure_venv's checks see a complete install. Its ``torch``
    is a module with the CPU build's version and nothing else: the subject is the set-up's
    bookkeeping, and each real torch import costs seconds of CPU (ensure_venv makes two)."""
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = tmp / "fake-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text('__version__ = "2.13.0+cpu"\n')
    log = tmp / "calls.log"
    py = venv / "bin" / "python"
    py.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then exit 0; fi\n'
        f'PYTHONPATH={fake}${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n'
    )
    py.chmod(0o755)
    return venv, log


def ensure_venv(venv: Path, extras: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", '. scripts/lib-setup.sh && ensure_venv "$1"', "setup", extras],
        cwd=REPO_ROOT,
        env={**os.environ, "SLURMFM_VENV": str(venv), **env},
        capture_output=True,
        text=True,
        check=True,
    )


def pip_calls(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("-m pip")]


def test_a_second_setup_installs_nothing(tmp_path: Path) -> None:
    venv, log = fake_venv(tmp_path)
    first = ensure_venv(venv, "")
    assert "installing slurmfm" in first.stderr
    assert any("install -q -e ." in c for c in pip_calls(log))
    log.write_text("")
    second = ensure_venv(venv, "")
    assert "nothing to install" in second.stderr
    assert pip_calls(log) == []
    # What an install depends on changed (here the torch version): installed again.
    ensure_venv(venv, "", SLURMFM_TORCH_VERSION="9.9.9")
    assert pip_calls(log)


def test_the_checkout_is_installed_without_an_import_finder(tmp_path: Path) -> None:
    """setuptools' default editable install puts an import finder in a .pth file, which
    ``site`` imports at every start of the venv's Python (pathlib, re, urllib and more): 113 ms
    of CPU for ``python -c pass`` against 23 ms here, in every process that starts the venv's
    Python without -S (CLI calls, stand-ins, pytest workers). Compat mode is a plain path
    line."""
    venv, log = fake_venv(tmp_path)
    ensure_venv(venv, "")
    installs = [c for c in pip_calls(log) if " -e ." in c]
    assert installs, pip_calls(log)
    assert all("--config-settings editable_mode=compat" in c for c in installs), installs
    # The venv this suite runs in, when ensure_venv made it (scripts/run-tests): starting its
    # Python imports none of what the finder needs.
    stamp = Path(sys.prefix) / ".slurmfm-setup-test"
    if stamp.is_file() and "editable=compat" in stamp.read_text():
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; print(sorted({'pathlib', 're'} & set(sys.modules)))",
            ],
            capture_output=True,
            text=True,
            check=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        )
        assert out.stdout.strip() == "[]", out.stdout


def test_pip_compiles_no_bytecode_that_a_pycache_prefix_would_hide(tmp_path: Path) -> None:
    """With PYTHONPYCACHEPREFIX (the test run's) Python reads bytecode only under the prefix:
    what pip compiles beside the sources is never read, so the install skips it; without
    one (a user's quickstart) pip compiles as usual."""
    venv, log = fake_venv(tmp_path)
    ensure_venv(venv, "", PYTHONPYCACHEPREFIX=str(tmp_path / "pyc"))
    calls = pip_calls(log)
    assert calls
    assert all(c.endswith(" --no-compile") for c in calls), calls
    venv, log = fake_venv(tmp_path / "user")
    ensure_venv(venv, "", PYTHONPYCACHEPREFIX="")
    calls = pip_calls(log)
    assert calls
    assert not any("--no-compile" in c for c in calls), calls


def test_the_test_install_satisfies_the_quickstart_but_not_the_reverse(tmp_path: Path) -> None:
    venv, log = fake_venv(tmp_path)
    ensure_venv(venv, "")
    log.write_text("")
    ensure_venv(venv, "test")  # more to install than the base
    assert any("install -q -e .[test]" in c for c in pip_calls(log))
    log.write_text("")
    ensure_venv(venv, "")
    ensure_venv(venv, "test")
    assert pip_calls(log) == []


def quickstart_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURMFM_LAB", "SUDO_"))}
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "quickstart"), "--env"],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    first = out.splitlines()[0].removeprefix("export ").split()
    return dict(kv.split("=", 1) for kv in first)


def test_the_quickstart_lab_is_per_user_by_default() -> None:
    alice = quickstart_env(USER="alice")
    bob = quickstart_env(USER="bob")
    assert alice["SLURMFM_LAB_ROOT"] == "/var/tmp/slurmfm-lab-alice"
    assert bob["SLURMFM_LAB_ROOT"] == "/var/tmp/slurmfm-lab-bob"
    offsets = {int(alice["SLURMFM_LAB_PORT_OFFSET"]), int(bob["SLURMFM_LAB_PORT_OFFSET"])}
    assert len(offsets) == 2
    # tests/lab.py keeps a test run's labs clear of every one of these
    assert offsets <= set(QUICKSTART_PORT_OFFSETS)
    # sudo: the person, not root
    assert quickstart_env(USER="root", SUDO_USER="alice") == alice
    given = quickstart_env(USER="alice", SLURMFM_LAB_ROOT="/var/tmp/x", SLURMFM_LAB_PORT_OFFSET="0")
    assert given == {"SLURMFM_LAB_ROOT": "/var/tmp/x", "SLURMFM_LAB_PORT_OFFSET": "0"}


def test_the_env_lines_are_refused_for_a_root_another_user_could_change(tmp_path: Path) -> None:
    """`eval "$(scripts/quickstart --env)"` sources the lab root's env.sh: for a root that
    another user made (or could change), nothing is printed to be evaluated, one line says
    why, and the exit status is 2. A root that does not exist yet still gets its lines."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURMFM_LAB", "SUDO_"))}
    planted = tmp_path / "labs"
    planted.mkdir()
    (planted / "host").mkdir()
    (planted / "host" / "env.sh").write_text("touch owned\n")
    os.chown(planted, 65534, 65534)
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "quickstart"), "--env"],
        env={**base, "SLURMFM_LAB_ROOT": str(planted)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"quickstart: {planted} belongs to uid 65534, not to root"), line
    assert quickstart_env(SLURMFM_LAB_ROOT=str(tmp_path / "none"))["SLURMFM_LAB_ROOT"] == str(
        tmp_path / "none"
    )
