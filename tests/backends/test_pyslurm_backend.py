"""The optional pyslurm backend against real pyslurm on a real cluster of the same release.

pyslurm 22.5.3 on the host lab's Slurm 22.05 and pyslurm 24.11.0 on the trixie lab's 24.11,
each built from pyslurm's branch for that release (../shared/vendor/, scripts/pyslurm-lab;
scripts/run-tests builds both in the background, a test run alone builds what is missing). Each
backend call runs in a child process (tests/backends/pyslurm_driver.py), inside the chroot for
the trixie lab. What pyslurm did is judged by Slurm itself: ``scontrol`` and the job's own
output, and the CLI backend's status of the same job, never by the backend under test.

Bugs these tests found in the backend as it was written against a fake pyslurm (each test here
failed on it): the script was passed as text (real pyslurm wants a path: "The script path you
provided is not valid."), a bare-minutes ``--time`` made ``submit`` raise a TypeError, and a
successful job's exit code came back as "" (pyslurm's int 0) where ``scontrol`` says ``0:0``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pytest
from lab import REPO_ROOT, SlurmLab, await_background, slurm_required, wait_until

from slurmfm.backends.pyslurm_backend import PySlurmBackend, probe, sbatch_header_options
from slurmfm.backends.slurm_cli import SlurmCLI

DRIVER = Path(__file__).with_name("pyslurm_driver.py")
PYSLURM_LAB = REPO_ROOT / "scripts" / "pyslurm-lab"
# The real tests wait for pyslurm's build in the background (scripts/run-tests): they run last
# in their lab's xdist group, when it has long ended (tests/conftest.py).
pytestmark = pytest.mark.last_in_group


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


class Pyslurm:
    """Real pyslurm for one lab: builds it when missing, runs the driver with it."""

    def __init__(self, lab: SlurmLab, workdir: Path) -> None:
        self.lab = lab
        self.workdir = workdir
        self.chroot = lab.config.get("CHROOT", "")
        name = "pyslurm" if lab.suite == "host" else f"pyslurm-{lab.suite}"
        await_background(name)
        build = ["build"] if not self.chroot else ["chroot", lab.suite, self.chroot]
        env = {**os.environ, "SLURMFM_PYTHON": sys.executable}
        proc = subprocess.run(
            [str(PYSLURM_LAB), *build], env=env, capture_output=True, text=True, timeout=1200
        )
        if proc.returncode != 0:
            msg = f"pyslurm for {lab.suite} did not build:\n{proc.stderr[-3000:]}"
            if slurm_required():
                pytest.fail(msg)
            pytest.skip(msg)
        where = subprocess.run(
            [str(PYSLURM_LAB), "path", lab.suite], env=env, capture_output=True, text=True
        )
        self.path = where.stdout.strip()

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The driver with this lab's environment and pyslurm (in the lab's chroot if any)."""
        env = {
            **self.lab.env,
            "PYTHONPATH": f"{self.path}:{REPO_ROOT}",
            "TMPDIR": str(self.workdir / "tmp"),
        }
        argv = [sys.executable, str(DRIVER), *args]
        if self.chroot:
            argv = ["chroot", self.chroot, "/bin/bash", "-c", 'cd -- "$1" && shift && exec "$@"',
                    "pyslurm", str(self.workdir), *argv]  # fmt: skip
        return subprocess.run(
            argv, env=env, cwd=self.workdir, capture_output=True, text=True, timeout=120
        )

    def call(self, *args: str) -> Any:
        proc = self.run(*args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def error(self, *args: str) -> str:
        proc = self.run(*args)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        return str(json.loads(proc.stdout.strip().splitlines()[-1])["error"])

    def submit(self, body: str, *directives: str, **opts: object) -> dict[str, Any]:
        name = f"pys-{uuid.uuid4().hex[:8]}"
        script = self.workdir / f"{name}.sh"
        lines = [f"#SBATCH --job-name={name}", f"#SBATCH --output={self.workdir}/%j.out"]
        script.write_text("\n".join(["#!/bin/bash", *lines, *directives, body, ""]))
        out: dict[str, Any] = self.call("submit", str(script), json.dumps(opts))
        return out


@pytest.fixture
def pyslurm(each_lab: SlurmLab, tmp_path: Path) -> Pyslurm:
    """Real pyslurm on the host lab (22.05) and the trixie lab (24.11)."""
    (tmp_path / "tmp").mkdir()
    tmp_path.chmod(0o755)  # jobs write their output here
    return Pyslurm(each_lab, tmp_path)


def _scontrol(lab: SlurmLab, job_id: str) -> list[dict[str, str]]:
    proc = lab.run(["scontrol", "show", "job", "-o", job_id])
    assert proc.returncode == 0, proc.stderr
    return [
        dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        for line in proc.stdout.splitlines()
    ]


def test_the_probe_and_the_version_are_pyslurm_s_own(pyslurm: Pyslurm) -> None:
    """pyslurm.version is a function in 22.5.x and a submodule in 24.11: both give the
    version, which matches the cluster's release; another release is refused, with why."""
    lab = pyslurm.lab
    ok = pyslurm.call("probe", lab.version)
    assert ok["usable"], ok
    assert _major_minor(ok["version"]) == _major_minor(lab.version)
    assert pyslurm.call("version") == ok["version"]
    bad = pyslurm.call("probe", "25.11.2")
    assert not bad["usable"]
    assert "the cluster runs 25.11.2" in bad["reason"]


def test_submit_runs_the_script_from_a_private_file_and_reports_as_scontrol(
    pyslurm: Pyslurm,
) -> None:
    """The script reaches pyslurm as a private file (0600 in a 0700 directory), removed once
    submitted; a bare-minutes --time and --partition work; the job runs the script; its status through
    pyslurm is what scontrol (the CLI backend) says of the same job, exit code included."""
    lab = pyslurm.lab
    sub = pyslurm.submit(
        'echo "ran $SLURM_JOB_ID"; exit 0', "#SBATCH --time=5", "#SBATCH --partition=debug"
    )
    job_id, seen = sub["job_id"], sub["seen"]
    assert seen["is_file"], seen
    assert seen["mode"] == 0o600, seen
    assert seen["dir_mode"] == 0o700, seen
    assert not seen["left_behind"], seen
    assert not any((pyslurm.workdir / "tmp").iterdir())  # nothing left in TMPDIR
    fields = lab.wait_job(job_id)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["TimeLimit"] == "00:05:00", fields
    assert fields["Partition"] == "debug", fields  # every slurmfm script names its partition
    assert (pyslurm.workdir / f"{job_id}.out").read_text() == f"ran {job_id}\n"
    mine = pyslurm.call("status", job_id)
    cli = SlurmCLI(lab.env).status(job_id)
    for key in ("state", "reason", "nodes", "exit_code", "restarts", "name", "stdout"):
        assert mine[key] == getattr(cli, key), (key, mine, cli)
    assert mine["exit_code"] == "0:0"
    assert mine["source"] == "pyslurm"


def test_array_dependency_and_cancel_reach_slurm(pyslurm: Pyslurm) -> None:
    """What sbatch's command line carries for the CLI backend (--array, --dependency,
    --kill-on-invalid-dep) is set on pyslurm's JobSubmitDescription, and Slurm acts on it;
    a cancel through pyslurm ends a running job; errors are BackendErrors."""
    lab = pyslurm.lab
    arr = pyslurm.submit("true", "#SBATCH --time=00:02:00", array="0-2")["job_id"]
    failing = pyslurm.submit("exit 3", "#SBATCH --time=00:02:00")["job_id"]
    waiting = pyslurm.submit(
        "true",
        "#SBATCH --time=00:02:00",
        dependency=f"afterok:{failing}",
        kill_on_invalid_dep=True,
    )["job_id"]
    running = pyslurm.submit("sleep 300", "#SBATCH --time=00:10:00")["job_id"]

    def array_done() -> bool:
        recs = _scontrol(lab, arr)
        return len(recs) == 3 and all(r["JobState"] == "COMPLETED" for r in recs)

    wait_until(f"array {arr}: 3 tasks done", array_done, 120, lambda: str(_scontrol(lab, arr)))
    assert sorted(r["ArrayTaskId"] for r in _scontrol(lab, arr)) == ["0", "1", "2"]
    # afterok on a job that failed: with kill_on_invalid_dependency Slurm cancels the waiter
    assert lab.wait_job(failing)["JobState"] == "FAILED"
    assert lab.wait_job(waiting)["JobState"] == "CANCELLED"
    mine = pyslurm.call("status", failing)
    assert mine["exit_code"] == SlurmCLI(lab.env).status(failing).exit_code == "3:0"
    assert mine["state"] == "FAILED"

    def started() -> bool:
        return _scontrol(lab, running)[0]["JobState"] == "RUNNING"

    wait_until(f"job {running} running", started, 60)
    assert pyslurm.call("cancel", running) == "cancelled"
    assert lab.wait_job(running)["JobState"] == "CANCELLED"

    assert "pyslurm: job 999999" in pyslurm.error("status", "999999")
    script = pyslurm.workdir / "bad.sh"
    script.write_text("#!/bin/bash\n#SBATCH --partition=nosuch\ntrue\n")
    assert "invalid partition" in pyslurm.error("submit", str(script)).lower()
    # options pyslurm cannot take (--segment: not in its table, dropped without a word;
    # --gpus-per-node: no such field, an AttributeError): refused, naming them, nothing queued
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=seg-refused\n#SBATCH --gpus-per-node=2\n"
        "#SBATCH --segment=2\ntrue\n"
    )
    assert "cannot take #SBATCH --gpus-per-node, --segment" in pyslurm.error("submit", str(script))
    queued = lab.run(["squeue", "-h", "-n", "seg-refused"])
    assert queued.returncode == 0
    assert queued.stdout == ""


# ------------------------------------------------------------------ without a cluster
def test_probe_survives_an_import_that_kills_the_interpreter(tmp_path: Path) -> None:
    # Real pyslurm calls libslurm's fatal() (os._exit) without a slurm.conf.
    killer = tmp_path / "pyslurm"
    killer.mkdir()
    (killer / "__init__.py").write_text("import os\nos._exit(1)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = probe("25.11", env=env)
    assert not res.usable
    assert "import pyslurm failed" in res.reason


def test_probe_without_pyslurm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONNOUSERSITE": "1"}
    res = probe("25.11", python=sys.executable, env=env)
    if res.usable:  # a real pyslurm 25.11 is installed on this machine
        pytest.skip("real pyslurm present")
    assert "import pyslurm failed" in res.reason


def test_an_unresolved_dependency_is_refused_before_pyslurm_is_touched() -> None:
    import dataclasses

    from slurmfm.errors import RenderError
    from slurmfm.request import Dependency, SubmitRequest

    req = dataclasses.replace(
        SubmitRequest.of_script("#!/bin/bash\n"), dependency=Dependency.of([("afterok", "<a>")])
    )
    nothing = types.SimpleNamespace()  # no pyslurm at all: the request is refused first
    with pytest.raises(RenderError, match="no job id yet"):
        PySlurmBackend(nothing).submit(req)


def test_the_header_options_are_those_sbatch_reads() -> None:
    text = (
        "#!/bin/bash\n#SBATCH --time=5\n\n# a comment\n#SBATCH -N 2\n  #SBATCH --segment=4\n"
        "srun true\n#SBATCH --after-the-first-command\n"
    )
    assert sbatch_header_options(text) == ["--time", "-N", "--segment"]
