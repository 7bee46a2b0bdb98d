"""Issue 38, 5: ``slurmfm logs``, ``report`` and ``status`` read only the job user's files, read
a bounded amount in all, and never send a log's control characters to the terminal; with two
real users of one group (tests/team.py) in a 2775 log directory.

Before: a planted ``NAME_JOB_r7.out`` appeared as "restart 7", a planted ``nccl-JOB-r0-*``
made ``report`` say NCCL used sockets, two sparse 300 MB files took ``logs`` to 917 MiB
resident (the cap was per file), and escape sequences reached the terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from team import ALICE, MALLORY, as_user, team_dir, uid

from slurmfm.observe import logs as lg
from slurmfm.observe.report import build_report, render_text

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")

NCCL_FIXTURES = Path(__file__).parent.parent / "resilience" / "fixtures"


@pytest.fixture
def team() -> Iterator[Path]:
    d = team_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def alice_job(logs: Path) -> None:
    as_user(
        ALICE,
        write,
        str(logs / "llama_99.out"),
        "slurmfm: job 99 start 0\nalice trains\n\x1b]0;title\x07done\n",
    )
    as_user(
        ALICE,
        write,
        str(logs / "nccl-99-r0-p5-2-11.log"),
        (NCCL_FIXTURES / "nccl-efa.log").read_text(),
    )


def test_logs_read_only_the_job_users_files_and_say_what_they_ignored(team: Path) -> None:
    logs = team / "logs"
    alice_job(logs)
    as_user(MALLORY, write, str(logs / "llama_99_r7.out"), "mallory's restart 7\n")
    ignored: list[str] = []
    files = lg.log_files(logs, "llama", "99", uid=uid(ALICE), ignored=ignored)
    assert [n for n, _ in files] == [-1]  # before: [-1, 7], "restart 7" with her text
    assert ignored == [f"ignored {logs / 'llama_99_r7.out'} (uid {uid(MALLORY)})"]
    text = "".join(line for _, lines in lg.select(files, "99", None, uid(ALICE)) for line in lines)
    assert "mallory" not in text
    assert "alice trains" in text


def test_report_ignores_a_planted_nccl_log_and_shows_no_escapes(team: Path) -> None:
    logs = team / "logs"
    alice_job(logs)
    as_user(
        MALLORY,
        write,
        str(logs / "nccl-99-r0-p5-1-10.log"),  # sorts first: before, her "socket" won
        (NCCL_FIXTURES / "nccl-socket.log").read_text(),
    )
    rep = build_report(
        "99",
        record={"JobState": "COMPLETED", "UserId": f"{ALICE}({uid(ALICE)})"},
        log_dir=logs,
        name="llama",
    )
    assert [(n.restart, n.transport) for n in rep.nccl] == [(0, "efa")]
    assert f"ignored {logs / 'nccl-99-r0-p5-1-10.log'} (uid {uid(MALLORY)})" in rep.notes
    rep.notes.append("a reason with \x1b]52;c;cGF5bG9hZA==\x07 in it")
    text = render_text(rep)
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "\\x1b]52;c;cGF5bG9hZA==\\x07" in text


def test_control_characters_are_shown_tab_and_newline_kept() -> None:
    assert lg.visible("a\x1b[2J\tb\r\n\x9b\x7f") == "a\\x1b[2J\tb\\x0d\n\\x9b\\x7f"


PEAK = """import resource, sys
from pathlib import Path
from slurmfm.observe import logs as lg
files = lg.log_files(Path(sys.argv[1]), "big", "5", uid=int(sys.argv[2]))
lines = [l for _, ls in lg.select(files, "5", None, int(sys.argv[2])) for l in ls]
print(len(files), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_what_logs_read_is_capped_in_total_however_many_files(team: Path) -> None:
    """Two sparse 300 MB files of the job's user (no quota used): ``logs`` reads their tails,
    at most :data:`MAX_TOTAL` bytes in all."""
    logs = team / "logs"

    def sparse() -> None:
        for name in ("big_5_r0.out", "big_5_r1.out"):
            with open(logs / name, "wb") as fh:
                fh.truncate(300 << 20)
                fh.seek((300 << 20) - 4)
                fh.write(b"end\n")

    as_user(ALICE, sparse)
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", PEAK, str(logs), str(uid(ALICE))],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(repo)},
    ).stdout.split()
    assert out[0] == "2"
    assert int(out[1]) < 200, out  # MiB resident at the peak; before: 900+
