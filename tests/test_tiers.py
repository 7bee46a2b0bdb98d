"""The tiers and xdist groups that tests/conftest.py derives from the fixtures a test uses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from lab import GROUP_SECONDS, REPO_ROOT


def pytest_run(*args: str, **more_env: str) -> str:
    drop = ("SLURMFM_LAB_ROOT", "SLURMFM_LAB", "SLURMFM_REAL_FILES_OUT", "SLURMFM_REAL_FILES")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=REPO_ROOT,
        env={**env, "SLURMFM_REQUIRE_SLURM": "0", **more_env},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def collected(marker: str, *paths: str) -> set[str]:
    out = pytest_run("--collect-only", "-q", "-m", marker, *paths)
    return {line.split("[")[0] for line in out.splitlines() if "::" in line}


def test_tiers_come_from_the_fixtures() -> None:
    real = collected("real", "tests/test_slurm_lab.py", "tests/render/test_script_props.py")
    script = collected("script", "tests/test_slurm_lab.py", "tests/render/test_script_props.py")
    unit = collected("unit", "tests/test_slurm_lab.py", "tests/render/test_script_props.py")
    # a shared lab fixture, an own-lab fixture (own_lab_fixture)
    assert "tests/test_slurm_lab.py::test_version_matches_lab" in real
    assert "tests/test_slurm_lab.py::test_up_restarts_a_slurmd_whose_registration_was_lost" in real
    # the stand-in cluster of the job runtime tests
    assert any(n.startswith("tests/render/test_script_props.py::") for n in script)
    assert (
        "tests/test_slurm_lab.py::test_lab_ports_stay_out_of_the_ephemeral_range_and_apart" in unit
    )
    assert not real & script
    assert not real & unit
    assert not script & unit


def test_the_unit_tier_names_the_files_the_real_tier_collects(tmp_path: Path) -> None:
    """scripts/run-tests' real tier collects only the files the unit tier named: every file
    with a real test, none without, whatever -m deselects."""
    paths = ("tests/test_slurm_lab.py", "tests/render/test_script_props.py", "tests/test_tiers.py")
    out = tmp_path / "real-files"
    pytest_run("--collect-only", "-q", "-m", "not real", *paths, SLURMFM_REAL_FILES_OUT=str(out))
    named = out.read_text(encoding="utf-8").splitlines()
    assert named == [str(REPO_ROOT / "tests" / "test_slurm_lab.py")]
    assert not list(tmp_path.glob("*.tmp"))
    # the real tier, given the list (and, as scripts/run-tests, no file named): no other file
    # is even imported, and nothing of the real tier is lost
    listed = pytest_run("--collect-only", "-q", "tests", SLURMFM_REAL_FILES=str(out))
    files = {line.split("::")[0] for line in listed.splitlines() if "::" in line}
    assert files == {"tests/test_slurm_lab.py"}, listed[-2000:]
    real = pytest_run("--collect-only", "-q", "-m", "real", "tests", SLURMFM_REAL_FILES=str(out))
    assert {line.split("[")[0] for line in real.splitlines() if "::" in line} == collected(
        "real", *paths
    )


def test_one_lab_never_runs_on_two_workers() -> None:
    """--dist loadgroup keeps each lab's tests on one worker (the lab's xdist group), also on
    pytest 9.2, where xdist alone no longer groups (pytest-dev/pytest-xdist#1386)."""
    out = pytest_run(
        "-p", "xdist", "-n", "2", "--dist", "loadgroup", "-m", "real", "-v",
        "tests/plan/test_slurm_sim.py", "tests/test_slurm_lab.py",
    )  # fmt: skip
    workers: dict[str, set[str]] = {}
    for worker, group in re.findall(r"\[(gw\d+)\] .*?::\S+@(\S+)", out):
        workers.setdefault(group, set()).add(worker)
    assert workers.get("sim-host"), out[-3000:]
    assert {g: len(w) for g, w in workers.items()} == dict.fromkeys(workers, 1), workers


def test_longest_lab_groups_start_first() -> None:
    """With --no-loadscope-reorder the workers take the groups in collection order, which
    conftest sorts by lab.GROUP_SECONDS, longest first, although the short groups' file is named
    first here."""
    out = pytest_run(
        "-p", "xdist", "-n", "1", "--dist", "loadgroup", "--no-loadscope-reorder", "-m", "real",
        "-v", "tests/test_slurm_lab.py", "tests/plan/test_slurm_sim.py",
    )  # fmt: skip
    groups = [g for _, g in re.findall(r"\[(gw\d+)\] .*?::\S+@(\S+)", out)]
    assert {"sim-host", "nudge-host"} <= set(groups), out[-3000:]
    weights = [GROUP_SECONDS.get(g, 0) for g in groups]
    assert weights == sorted(weights, reverse=True), groups


def test_a_test_that_waits_for_a_build_runs_last_in_its_group() -> None:
    """``last_in_group`` (the pyslurm tests, which wait for run-tests' background build) moves a
    test behind the rest of its lab's group, although its file is collected first here."""
    out = pytest_run(
        "-p", "xdist", "-n", "1", "--dist", "loadgroup", "--no-loadscope-reorder", "-m", "real",
        "-v", "tests/backends/test_pyslurm_backend.py", "tests/test_slurm_lab.py",
    )  # fmt: skip
    host = [t for t, g in re.findall(r"\[gw\d+\] .*? (\S+?)@(\S+)", out) if g == "shared-host"]
    waits = [i for i, t in enumerate(host) if "test_pyslurm_backend.py" in t]
    assert waits, out[-3000:]
    assert len(host) > len(waits)
    assert waits == list(range(len(host) - len(waits), len(host))), host


def test_a_host_c_test_runs_its_host_variant_on_the_third_host_lab() -> None:
    """``pytest.mark.host_c`` moves a module's 22.05 variant off the shared host lab's group (the
    real tier's longest) into the third host lab's; its 24.11 and 26.05 variants stay in their
    shared labs' groups."""
    out = pytest_run(
        "-p", "xdist", "-n", "1", "--dist", "loadgroup", "-m", "real", "-v",
        "tests/e2e/test_dependencies.py", "-k", "singleton",
    )  # fmt: skip
    groups = dict(re.findall(r"\[gw\d+\] .*?::test_singleton\S*\[(\w+)\]@(\S+)", out))
    assert groups == {"host": "host-c", "trixie": "shared-trixie", "sid": "shared-sid"}, out[-3000:]
