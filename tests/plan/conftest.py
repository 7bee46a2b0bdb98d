"""Fixtures the placement tests share."""

from __future__ import annotations

import os

import pytest

from slurmfm.plan import simulate as sim


@pytest.fixture(scope="module")
def simgrid() -> None:
    """Skip without Debian's ``python3-simgrid``, or fail where the run requires it
    (scripts/run-tests installs it and sets ``SLURMFM_REQUIRE_SIMGRID=1``)."""
    if not sim.available():
        if os.environ.get("SLURMFM_REQUIRE_SIMGRID") == "1":
            pytest.fail(
                "SimGrid required (SLURMFM_REQUIRE_SIMGRID=1) but python3-simgrid is missing"
            )
        pytest.skip("SimGrid not installed (apt-get install python3-simgrid)")
