"""The optional pyslurm backend: used only when it imports in a child process and matches the
cluster's Slurm major.minor. Tested against tests/fakes/pyslurm (pyslurm 25.11's documented API),
because no Slurm 25.11 is reachable here."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from slurmfm.backends.pyslurm_backend import PySlurmBackend, probe
from slurmfm.errors import BackendError, RenderError
from slurmfm.request import ArraySpec, Dependency, SubmitRequest

FAKES = Path(__file__).resolve().parent.parent / "fakes"


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(FAKES)
    env["FAKE_PYSLURM_DB"] = str(tmp_path / "db.json")
    return env


@pytest.fixture
def fake_module(fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("FAKE_PYSLURM_DB", fake_env["FAKE_PYSLURM_DB"])
    monkeypatch.syspath_prepend(str(FAKES))
    sys.modules.pop("pyslurm", None)
    mod = importlib.import_module("pyslurm")
    yield mod
    sys.modules.pop("pyslurm", None)


def test_probe_matches_major_minor(fake_env: dict[str, str]) -> None:
    ok = probe("25.11.4", env=fake_env)
    assert ok.usable, ok.reason
    assert ok.version == "25.11.2"
    bad = probe("22.05.8", env=fake_env)
    assert not bad.usable
    assert "built for Slurm 25.11, the cluster runs 22.05.8" in bad.reason


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


def test_submit_status_cancel_through_fake(fake_module: ModuleType) -> None:
    be = PySlurmBackend(fake_module)
    assert be.version() == "25.11.2"
    script = "#!/bin/bash\n#SBATCH --job-name=demo\n#SBATCH --nodes=2\nsrun true\n"
    res = be.submit(SubmitRequest.of_script(script), env={"PATH": "/usr/bin"})
    st = be.status(res.job_id)
    assert st.state == "PENDING"
    assert st.name == "demo"
    assert st.source == "pyslurm"
    be.cancel(res.job_id)
    assert be.status(res.job_id).state == "CANCELLED"


def test_errors_are_backend_errors(fake_module: ModuleType) -> None:
    be = PySlurmBackend(fake_module)
    with pytest.raises(BackendError, match="Invalid partition"):
        be.submit(
            SubmitRequest.of_script("#!/bin/bash\n#SBATCH --partition=nosuch\n"), env={"A": "1"}
        )
    with pytest.raises(BackendError, match="does not exist"):
        be.status("424242")


def test_environment_is_always_passed(fake_module: ModuleType) -> None:
    # pyslurm 24.11 failed with "batch job cannot run without an environment" when omitted.
    be = PySlurmBackend(fake_module)
    assert be.submit(SubmitRequest.of_script("#!/bin/bash\n")).job_id


def test_structured_options_reach_pyslurm(fake_module: ModuleType, tmp_path: Path) -> None:
    # What sbatch's command line carries for the CLI backend (--array, --dependency,
    # --kill-on-invalid-dep) is set on JobSubmitDescription; nothing is edited in the script.
    import dataclasses
    import json

    req = dataclasses.replace(
        SubmitRequest.of_script("#!/bin/bash\n#SBATCH --job-name=arr\n"),
        array=ArraySpec("0-3%2", 4, 2),
        dependency=Dependency.of([("afterok", "7")]),
        kill_on_invalid_dep=True,
    )
    res = PySlurmBackend(fake_module).submit(req, env={"A": "1"})
    job = json.loads((tmp_path / "db.json").read_text())["jobs"][res.job_id]
    assert job["array"] == "0-3%2"
    assert job["dependencies"] == "afterok:7"
    assert job["kill_on_invalid_dependency"] is True
    with pytest.raises(RenderError, match="no job id yet"):
        PySlurmBackend(fake_module).submit(
            dataclasses.replace(req, dependency=Dependency.of([("afterok", "<a>")]))
        )
