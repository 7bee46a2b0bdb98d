"""Shared pytest fixtures. Real-Slurm lab access lives in tests/lab.py."""

from __future__ import annotations

import pytest
from lab import SlurmLab, SuiteLabFactory, host_lab, suite_lab_factory


@pytest.fixture(scope="session")
def slurm_lab() -> SlurmLab:
    """The running Slurm lab ($SLURMFM_LAB, else the default host lab)."""
    return host_lab()


@pytest.fixture(scope="session")
def slurm_lab_suite() -> SuiteLabFactory:
    """Call with "trixie" or "sid": the running chroot lab of that suite."""
    return suite_lab_factory()


@pytest.fixture(params=["host", "trixie"])
def each_lab(request: pytest.FixtureRequest) -> SlurmLab:
    """The host lab (Slurm 22.05 on Debian 12) and the trixie lab (24.11), when requested."""
    if request.param == "host":
        lab: SlurmLab = request.getfixturevalue("slurm_lab")
        return lab
    factory: SuiteLabFactory = request.getfixturevalue("slurm_lab_suite")
    return factory(request.param)


@pytest.fixture(params=["host", "trixie", "sid"])
def every_lab(request: pytest.FixtureRequest) -> SlurmLab:
    """Each Slurm the project runs: 22.05 (host), 24.11 (trixie) and 26.05 (sid); the chroot
    suites when ``SLURMFM_LAB_SUITES`` names them (``scripts/run-tests`` does)."""
    if request.param == "host":
        lab: SlurmLab = request.getfixturevalue("slurm_lab")
        return lab
    factory: SuiteLabFactory = request.getfixturevalue("slurm_lab_suite")
    return factory(request.param)
