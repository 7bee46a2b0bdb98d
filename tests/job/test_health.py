"""The per-node health gate, with a fake command runner and an injected sleep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slurmfm.job.health import check_node, imex_domain_problem, parse_report


def smi(n: int):  # type: ignore[no-untyped-def]
    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        if argv[0] == "nvidia-smi":
            return 0, "".join(f"GPU {i}: NVIDIA H100 (UUID: GPU-{i})\n" for i in range(n))
        if argv[0] == "dcgmi":
            return 1, "diag failed"
        return 127, "not found"

    return run


def efa(root: Path, n: int) -> None:
    d = root / "class" / "infiniband"
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"rdmap{i}s0").mkdir(exist_ok=True)


def test_gpu_count(tmp_path: Path) -> None:
    assert check_node(8, 0, run=smi(8), sysfs=str(tmp_path)) is None
    assert check_node(8, 0, run=smi(7), sysfs=str(tmp_path)) == "7 GPUs visible, expected 8"
    fail = check_node(8, 0, run=lambda a, t: (9, "NVIDIA-SMI has failed\nmore"))
    assert fail == "nvidia-smi failed: NVIDIA-SMI has failed"


def test_efa_is_retried_like_aws_three_times_five_seconds(tmp_path: Path) -> None:
    """A late EFA driver: the count is right on the third try; no real sleeping."""
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        efa(tmp_path, 16 if len(slept) >= 2 else 8)

    efa(tmp_path, 8)
    assert check_node(0, 16, sysfs=str(tmp_path), sleep=sleep) is None
    assert slept == [5.0, 5.0]


def test_efa_gives_up_after_the_tries(tmp_path: Path) -> None:
    slept: list[float] = []
    efa(tmp_path, 31)
    why = check_node(0, 32, sysfs=str(tmp_path), sleep=slept.append, efa_tries=3, efa_delay_s=0.1)
    assert why == "31 EFA devices, expected 32 (after 3 tries)"
    assert slept == [0.1, 0.1]


def test_dcgm_and_imex(tmp_path: Path) -> None:
    assert check_node(0, 0, dcgm_level=2, run=smi(0)) == "dcgmi diag -r 2 failed"
    dev = tmp_path / "dev"
    dev.mkdir()
    why = check_node(0, 0, imex=True, dev=str(dev), run=smi(0))
    assert why is not None
    assert "nvidia-caps-imex-channels" in why
    (dev / "nvidia-caps-imex-channels").mkdir()
    assert check_node(0, 0, imex=True, dev=str(dev), run=smi(0)) is None  # no imex-ctl: skip
    not_ready = check_node(
        0, 0, imex=True, dev=str(dev), run=lambda a, t: (0, "Domain: DOWN"), sleep=lambda s: None
    )
    assert not_ready == "nvidia-imex-ctl -N: IMEX domain state not reported (after 3 tries)"


# The shape of `nvidia-imex-ctl -N` output (NVIDIA IMEX guide, "IMEX Service Command Service":
# https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/cmdservice.html).
IMEX_UP = """\
Connectivity Table Legend:
I - Invalid - Node wasn't reachable, no connection status available
C - Connected - Ready for operation

3/25/2025 10:39:43.659
Nodes:
Node #0   - 10.0.0.1   - READY
Node #1   - 10.0.0.2   - READY

 Nodes From\\To  0   1
       0        C   C
       1        C   C
Domain State: UP
"""


def test_imex_ctl_output_is_parsed(tmp_path: Path) -> None:
    assert imex_domain_problem(0, IMEX_UP) is None
    degraded = (
        IMEX_UP.replace("10.0.0.2   - READY", "10.0.0.2   - UNAVAILABLE")
        .replace("C   C\n       1        C   C", "C   I\n       1        I   C")
        .replace("Domain State: UP", "Domain State: DEGRADED")
    )
    assert imex_domain_problem(0, degraded) == (
        "IMEX domain state DEGRADED; 10.0.0.2 is UNAVAILABLE"
    )
    # "READY" alone (the old test) is no longer enough: the domain must say UP
    assert imex_domain_problem(0, "READY\n") == "IMEX domain state not reported"
    assert imex_domain_problem(1, "cannot connect to the IMEX daemon\n") == (
        "exit 1: cannot connect to the IMEX daemon"
    )


def test_imex_gate_retries_and_fails_only_the_nodes_the_status_names(tmp_path: Path) -> None:
    """A domain that is not UP fails the nodes the status names (after the EFA check's
    retries), not every node of an IMEX node file that lists the whole compute resource."""
    degraded = (
        IMEX_UP.replace("10.0.0.2   - READY", "10.0.0.2   - UNAVAILABLE")
        .replace("C   C\n       1        C   C", "C   I\n       1        I   C")
        .replace("Domain State: UP", "Domain State: DEGRADED")
    )
    dev = tmp_path / "dev"
    (dev / "nvidia-caps-imex-channels").mkdir(parents=True)
    calls: list[list[str]] = []
    slept: list[float] = []

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        calls.append(list(argv))
        return 0, degraded

    def check(addrs: list[str], tries: int = 3) -> str | None:
        calls.clear()
        return check_node(
            0,
            0,
            imex=True,
            dev=str(dev),
            run=run,
            sleep=slept.append,
            efa_tries=tries,
            efa_delay_s=5.0,
            local_addrs=addrs,
        )

    # the named node fails, after 3 tries 5 s apart (like the EFA count)
    why = check(["n2", "10.0.0.2"])
    assert why == (
        "nvidia-imex-ctl -N: IMEX domain state DEGRADED; 10.0.0.2 is UNAVAILABLE (after 3 tries)"
    )
    assert calls == [["nvidia-imex-ctl", "-N"]] * 3
    assert slept == [5.0, 5.0]
    # a READY node of the same degraded domain passes at once
    assert check(["n1", "10.0.0.1"]) is None
    assert len(calls) == 1
    # a status that names no node (daemon down, nothing listed) fails every node
    assert imex_domain_problem(0, "Domain State: DOWN\n", {"10.0.0.1"}) == (
        "IMEX domain state DOWN"
    )
    # a domain that comes UP on the second try passes
    answers = [(1, "cannot connect to the IMEX daemon"), (0, IMEX_UP)]

    def late(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        return answers.pop(0)

    assert (
        check_node(0, 0, imex=True, dev=str(dev), run=late, sleep=slept.append, local_addrs=[])
        is None
    )
    assert answers == []


def test_report_parsing() -> None:
    text = "slurmfm-health n1 OK\nnoise\nslurmfm-health n2 FAIL 7 GPUs visible, expected 8\n"
    assert parse_report(text) == (["n1"], [("n2", "7 GPUs visible, expected 8")])
