"""tests/lab.py's wait for run-tests' background labs: a test needing a chroot lab or Pyxis
waits for that lab's exit status, and fails with its log when it did not come up."""

from __future__ import annotations

import threading
from pathlib import Path

import lab
import pytest


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLURMFM_LAB_ROOT", str(tmp_path))
    monkeypatch.setenv(lab.PENDING_ENV, "trixie,pyxis")
    (tmp_path / "logs").mkdir()
    return tmp_path


def test_waits_for_the_labs_status(root: Path) -> None:
    done = threading.Timer(0.3, lambda: (root / "logs" / "up-trixie.rc").write_text("0\n"))
    done.start()
    lab.await_background("trixie", timeout=30)
    assert (root / "logs" / "up-trixie.rc").is_file()


def test_a_failed_lab_fails_the_test_with_its_log(root: Path) -> None:
    (root / "logs" / "up-pyxis.log").write_text("make: *** [all] Error 2\n")
    (root / "logs" / "up-pyxis.rc").write_text("2\n")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)exit 2.*Error 2"):
        lab.await_background("pyxis")


def test_labs_not_started_in_the_background_are_not_waited_for(root: Path) -> None:
    lab.await_background("host", timeout=0.01)  # returns at once: nothing pending by that name
    lab.await_background("sid", timeout=0.01)


def test_a_lab_that_never_ends_times_out(root: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="was not up after"):
        lab.await_background("trixie", timeout=0.01)
