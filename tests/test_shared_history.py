"""Issue 38, 7: ``fm.history()`` skips a malformed line of the user's own history with a
warning, and checks the history's directory when reading (as when writing); the directory
case with two real users of one group (tests/team.py).

Before: one line with a field of the wrong type made ``fm.history()`` raise (TypeError), and a
history in a directory that was a link or open to others was read.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest
from team import ALICE, MALLORY, Raised, as_user, team_dir

from slurmfm.history import Submission, read


def good(job: str) -> str:
    return Submission(job_id=job, name="n").to_json()


@pytest.mark.parametrize(
    "bad",
    [
        '{"job_id": "2", "argv": 5}',
        '{"job_id": "2", "name": ["x"]}',
        '{"job_id": "2", "extra": "x"}',
        "[" * 100000,
        "not json",
    ],
)
def test_a_malformed_line_is_skipped_with_a_warning(tmp_path: Path, bad: str) -> None:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    path = d / "history.jsonl"
    path.write_text(f"{good('1')}\n{bad}\n{good('3')}\n")
    path.chmod(0o600)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        subs = read(path)
    assert [s.job_id for s in subs] == ["1", "3"]
    assert any(f"{path}:2: history: not a submission record" in str(w.message) for w in seen)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")
def test_a_history_in_another_users_or_open_directory_is_refused() -> None:
    team = team_dir()
    try:
        theirs = team / "logs" / "mallory-state"

        def forge() -> None:
            theirs.mkdir(mode=0o777)
            theirs.chmod(0o777)

        as_user(MALLORY, forge)

        def alice_reads(where: str) -> list[str]:
            return [s.job_id for s in read(Path(where) / "history.jsonl")]

        with pytest.raises(Raised, match="belongs to another user"):
            as_user(ALICE, alice_reads, str(theirs))
        link = team / "logs" / "alice-state"
        as_user(ALICE, os.symlink, str(theirs), str(link))
        with pytest.raises(Raised, match="not a directory"):
            as_user(ALICE, alice_reads, str(link))
        own = team / "logs" / "alice-open"
        as_user(ALICE, os.mkdir, str(own), 0o775)
        with pytest.raises(Raised, match="writable by others"):
            as_user(ALICE, alice_reads, str(own))
    finally:
        shutil.rmtree(team, ignore_errors=True)
