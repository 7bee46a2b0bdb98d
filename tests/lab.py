"""Access to the real local Slurm lab started by ``scripts/slurm-lab``.

The fixtures in ``conftest.py`` use :func:`find_lab` to locate a running lab:

* ``slurm_lab``: the lab named by ``$SLURMFM_LAB`` (a lab directory), else the
  default host lab ``${SLURMFM_LAB_ROOT:-/var/tmp/slurmfm-lab}/host``.
* ``slurm_lab_suite(suite)``: a newer-Slurm chroot lab (``trixie``/``sid``), only
  if ``$SLURMFM_LAB_SUITES`` (comma list) names the suite.

A lab that is not up makes the test skip, or fail when ``SLURMFM_REQUIRE_SLURM=1``
(CI sets it). Client commands must run with :attr:`SlurmLab.env`: it carries
``SLURM_CONF`` and, for chroot suites, the wrapper directory first on ``PATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
LAB_SCRIPT = REPO_ROOT / "scripts" / "slurm-lab"
SUITES = ("host", "trixie", "sid")


def lab_root() -> Path:
    return Path(os.environ.get("SLURMFM_LAB_ROOT", "/var/tmp/slurmfm-lab"))


def slurm_required() -> bool:
    return os.environ.get("SLURMFM_REQUIRE_SLURM", "") == "1"


def requested_suites() -> set[str]:
    raw = os.environ.get("SLURMFM_LAB_SUITES", "")
    return {s.strip() for s in raw.split(",") if s.strip()}


def _read_kv(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _source_env(env_sh: Path) -> dict[str, str]:
    """The environment after sourcing env.sh into the current one."""
    proc = subprocess.run(
        ["bash", "-c", '. "$1" && env -0', "slurm-lab-env", str(env_sh)],
        capture_output=True,
        check=True,
    )
    env: dict[str, str] = {}
    for item in proc.stdout.split(b"\0"):
        key, sep, value = item.decode().partition("=")
        if sep:
            env[key] = value
    return env


@dataclass(frozen=True)
class SlurmLab:
    """A running lab: where it is, what it is, and how to talk to it."""

    lab_dir: Path
    suite: str
    env: dict[str, str]
    version: str
    topology: dict[str, Any]
    config: dict[str, str]

    @property
    def jobs_dir(self) -> Path:
        return self.lab_dir / "jobs"

    @property
    def slurm_conf(self) -> Path:
        return Path(self.env["SLURM_CONF"])

    @property
    def nodes(self) -> int:
        return int(self.config["NODES"])

    @property
    def gpus_per_node(self) -> int:
        return int(self.config["GPUS"])

    def run(self, args: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """subprocess.run with the lab's environment, text output captured."""
        kw.setdefault("env", self.env)
        kw.setdefault("text", True)
        kw.setdefault("capture_output", True)
        return subprocess.run(list(args), check=False, **kw)

    def slurmfm(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the ``slurmfm`` CLI (this checkout's) from the repository root against the lab."""
        import sys

        return self.run(
            [sys.executable, "-m", "slurmfm.cli", *args], cwd=REPO_ROOT, timeout=timeout
        )

    def lab_command(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``scripts/slurm-lab --lab <dir> ARGS`` (needs root)."""
        return self.run([str(LAB_SCRIPT), "--lab", str(self.lab_dir), *args], timeout=300)

    def hostnames(self, hostlist: str) -> list[str]:
        """Expand a Slurm hostlist with ``scontrol show hostnames``."""
        proc = self.run(["scontrol", "show", "hostnames", hostlist])
        if proc.returncode != 0:
            raise RuntimeError(f"scontrol show hostnames {hostlist}: {proc.stderr}")
        return proc.stdout.split()

    def wait_job(self, job_id: str, timeout: float = 60.0) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job has finished; return its fields."""
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            proc = self.run(["scontrol", "show", "job", "-o", job_id])
            if proc.returncode == 0:
                fields = dict(tok.split("=", 1) for tok in proc.stdout.split() if "=" in tok)
                state = fields.get("JobState", "")
                if state not in {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", ""}:
                    return fields
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} not finished after {timeout}s: {fields}")


def _problem(lab_dir: Path) -> str | None:
    """Why the lab at lab_dir cannot be used, or None if it is up and healthy."""
    if not (lab_dir / "lab.conf").is_file() or not (lab_dir / "env.sh").is_file():
        return f"no Slurm lab at {lab_dir} (start one with scripts/slurm-lab up)"
    if os.geteuid() != 0:
        return "the Slurm lab needs root"
    proc = subprocess.run(
        [str(LAB_SCRIPT), "--lab", str(lab_dir), "status"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        return f"Slurm lab at {lab_dir} is not healthy:\n{proc.stdout}{proc.stderr}"
    return None


def find_lab(lab_dir: Path, *, required: bool) -> SlurmLab:
    """Return the lab at lab_dir, or skip (fail if required) when it is not up."""
    problem = _problem(lab_dir)
    if problem is not None:
        if required:
            pytest.fail(problem)
        pytest.skip(problem)
    config = _read_kv(lab_dir / "lab.conf")
    env = _source_env(lab_dir / "env.sh")
    topology: dict[str, Any] = json.loads((lab_dir / "topology.json").read_text())
    version_out = subprocess.run(
        ["sinfo", "--version"], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return SlurmLab(
        lab_dir=lab_dir,
        suite=config.get("SUITE", "host"),
        env=env,
        version=version_out[-1] if version_out else config.get("VERSION", ""),
        topology=topology,
        config=config,
    )


def default_lab_dir() -> Path:
    explicit = os.environ.get("SLURMFM_LAB")
    return Path(explicit) if explicit else lab_root() / "host"


def host_lab() -> SlurmLab:
    return find_lab(default_lab_dir(), required=slurm_required())


SuiteLabFactory = Callable[[str], SlurmLab]


def suite_lab_factory() -> SuiteLabFactory:
    """A cached ``suite -> SlurmLab`` lookup for newer-Slurm chroot labs."""
    cache: dict[str, SlurmLab] = {}

    def get(suite: str) -> SlurmLab:
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; expected one of {SUITES}")
        if suite not in requested_suites():
            pytest.skip(f"suite {suite} not in SLURMFM_LAB_SUITES")
        if suite not in cache:
            cache[suite] = find_lab(lab_root() / suite, required=slurm_required())
        return cache[suite]

    return get
