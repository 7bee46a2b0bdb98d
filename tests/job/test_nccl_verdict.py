"""The NCCL transport verdict across aws-ofi-nccl versions, with an injected clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmfm.job.nccl import verdict, watch

FIXTURES = Path(__file__).parent.parent / "resilience" / "fixtures"


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("NCCL INFO NET/OFI Selected provider is efa, fabric is efa", "efa"),  # 1.14+
        ("NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)", "efa"),  # <= 1.13
        ("NCCL INFO Using network AWS Libfabric", "efa"),
        ("NCCL INFO Using network Libfabric", "efa"),
        ("NCCL INFO Using network Socket", "socket"),
        ("NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>", "socket"),
        ("NCCL INFO Bootstrap : Using eth0", None),
    ],
)
def test_verdict_lines(line: str, want: str | None) -> None:
    assert verdict("x\n" + line + "\n") == want


def test_fixture_logs() -> None:
    assert verdict((FIXTURES / "nccl-efa.log").read_text()) == "efa"


def test_watch_times_out_without_sleeping(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    got = watch(str(tmp_path / "nccl-*"), 10, lambda: True, clock=lambda: now[0], sleep=sleep)
    assert got is None
    assert now[0] >= 10


def test_watch_sees_a_late_line(tmp_path: Path) -> None:
    calls = [0]

    def sleep(s: float) -> None:
        calls[0] += 1
        if calls[0] == 2:
            (tmp_path / "nccl-1-r0-n1-9.log").write_text("Using network Socket\n")

    got = watch(str(tmp_path / "nccl-*"), 100, lambda: True, clock=lambda: 0.0, sleep=sleep)
    assert got == "socket"
