"""Issue 38, 4: the observability agent's DCGM job mapping files, in a directory every job of
the node shares, are read and written with the rules of every shared file (slurmfm.job.fsafe);
two real users of one group (tests/team.py).

Before: a plain ``open()``: a link mallory planted as GPU 0's file made alice's agent copy
alice's token file's contents, with her job id, into a 0644 file mallory reads (in a
group-writable directory); a FIFO (in the documented 1777 directory) blocked the agent: no
GPU metrics, no warning.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from team import ALICE, MALLORY, as_user, gid, team_dir, uid

from slurmfm.job import agent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")


@pytest.fixture
def team() -> Iterator[Path]:
    d = team_dir()
    secret = d / "alice-token"
    secret.write_text("hf_alice_only\n")
    os.chown(secret, uid(ALICE), gid())
    secret.chmod(0o600)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _map(directory: str) -> list[int]:
    import signal

    signal.alarm(20)  # a blocked open fails the test instead of hanging it
    agent._warned.clear()
    return agent.map_gpus(directory, "4242", [0, 1])


def test_a_planted_link_never_carries_my_file_into_the_mapping(
    team: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    mapdir = team / "logs"  # group-writable, not sticky: the case the issue found
    as_user(MALLORY, os.symlink, str(team / "alice-token"), str(mapdir / "0"))
    assert as_user(ALICE, _map, str(mapdir)) == [1]
    assert (mapdir / "0").is_symlink()  # not replaced by a copy of the token
    assert "hf_alice_only" not in "".join(
        p.read_text() for p in mapdir.iterdir() if p.is_file() and not p.is_symlink()
    )
    assert (mapdir / "1").read_text() == "4242\n"
    assert stat.S_IMODE((mapdir / "1").stat().st_mode) == 0o644  # dcgm-exporter reads it
    err = capfd.readouterr().err
    assert "ignored DCGM job mapping file" in err
    assert "GPU 0 not mapped" in err


def test_a_planted_fifo_never_blocks_the_agent(team: Path) -> None:
    mapdir = team / "dcgm"
    mapdir.mkdir()
    mapdir.chmod(0o1777)  # the documented mapping directory
    as_user(MALLORY, os.mkfifo, str(mapdir / "0"))
    assert as_user(ALICE, _map, str(mapdir)) == [1]


def test_another_users_mapping_file_is_neither_trusted_nor_written(team: Path) -> None:
    mapdir = team / "dcgm"
    mapdir.mkdir()
    mapdir.chmod(0o1777)

    def plant() -> None:
        (mapdir / "0").write_text("9999\n")  # hers; before, it stopped the mapping of GPU 1

    as_user(MALLORY, plant)
    assert as_user(ALICE, _map, str(mapdir)) == [1]
    assert (mapdir / "0").read_text() == "9999\n"
    assert (mapdir / "0").stat().st_uid == uid(MALLORY)
