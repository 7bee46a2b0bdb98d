"""The pre-flight fabric test (slurmfm/job/fabric.py): nccl-tests' output read, judged, acted on."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from test_batch import Slurm, Step, go, make, state

from slurmfm.job import fabric

STANDIN = Path(__file__).resolve().parents[1] / "standins" / "all_reduce_perf"


def standin(busbw: float = 420.0, ntasks: int = 16, node: str = "n1", sick: str = "") -> str:
    env = {
        **os.environ,
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": str(ntasks),
        "SLURMD_NODENAME": node,
        "SLURMFM_STANDIN_BUSBW": str(busbw),
        "SLURMFM_STANDIN_SICK": sick,
    }
    done = subprocess.run(
        [sys.executable, str(STANDIN)], env=env, capture_output=True, text=True, check=False
    )
    return done.stdout


def test_the_table_nccl_tests_prints_is_read_by_its_header() -> None:
    fig = fabric.parse(standin(420.0))
    assert fig.peak_busbw == 420.0
    assert fig.peak_size == 17179869184
    assert fig.avg_busbw is not None
    assert 0 < fig.avg_busbw < 420.0
    assert fig.wrong == 0
    assert fig.sick == ()
    # srun --label prefixes every line with the task
    labelled = "\n".join("0: " + line for line in standin(300.0).splitlines())
    assert fabric.parse(labelled).peak_busbw == 300.0


def test_a_layout_with_more_columns_is_read_by_the_header_too() -> None:
    """nccl-tests' per-iteration layout puts more columns between the two busbw ones."""
    text = (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong "
        "i_min i_max i_p99 i_cv%     time   algbw   busbw #wrong i_min i_max i_p99 i_cv%\n"
        "   1048576        262144     float     sum      -1    10.0   100.0   187.5      0 "
        "1 2 3 4    11.0    95.0   190.25      0 1 2 3 4\n"
        "# Out of bounds values : 3 FAILED\n"
    )
    fig = fabric.parse(text)
    assert fig.peak_busbw == 190.25
    assert fig.wrong == 3


def test_a_failing_host_is_named_from_nccl_tests_and_sruns_lines() -> None:
    text = standin(sick="n3", node="n3") + "srun: error: n4: task 12: Exited with exit code 3\n"
    assert fabric.parse(text).sick == ("n3", "n4")


@pytest.mark.parametrize(
    ("text", "rc", "ok", "words"),
    [
        (standin(420.0), 0, True, ["peak busbw 420.00 GB/s", "floor 389.60 GB/s"]),
        (standin(300.0), 0, False, ["peak busbw 300.00 GB/s", "below the floor"]),
        ("all_reduce_perf: command not found", 127, False, ["exited 127", "no all_reduce_perf"]),
    ],
)
def test_judge(text: str, rc: int, ok: bool, words: Sequence[str]) -> None:
    v = fabric.judge(fabric.parse(text), 389.6, rc, ["n1", "n2"])
    assert v.ok is ok
    for w in words:
        assert w in v.summary


def test_only_a_minority_of_failing_nodes_is_singled_out() -> None:
    """One rank's failure makes its peers fail too: most nodes failing blames none."""
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    one = fabric.parse(standin(sick="n3", node="n3"))
    assert fabric.judge(one, 389.6, 1, nodes).sick == ("n3",)
    many = fabric.Figures(None, 0, None, -1, ("n1", "n2", "n3"))
    v = fabric.judge(many, 389.6, 1, nodes)
    assert v.sick == ()
    assert "failed on n1 n2 n3" in v.summary
    stranger = fabric.Figures(None, 0, None, -1, ("login1",))
    assert fabric.judge(stranger, 0, 1, nodes).sick == ()


def test_the_test_runs_in_the_launchs_container_but_not_its_named_one() -> None:
    launch = [
        "srun",
        "--ntasks=2",
        "--container-image=/fsx/i.sqsh",
        "--container-mounts=/fsx:/fsx",
        "--container-name=slurmfm-1-0-launch",
        "--no-container-mount-home",
        "sh",
        "-c",
        "x",
    ]
    argv = fabric.srun_argv(2, 8, "pmix", launch, "all_reduce_perf", ["-b", "8"])
    assert argv == [
        "srun",
        "--nodes=2",
        "--ntasks=16",
        "--ntasks-per-node=8",
        "--overcommit",
        "--kill-on-bad-exit=0",
        "--mpi=pmix",
        "--container-image=/fsx/i.sqsh",
        "--container-mounts=/fsx:/fsx",
        "--no-container-mount-home",
        "all_reduce_perf",
        "-b",
        "8",
    ]
    assert fabric.srun_argv(1, 1, "", ["srun", "python3"], "/opt/t", [], het=True) == [
        "srun",
        "--het-group=0",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        "--overcommit",
        "--kill-on-bad-exit=0",
        "/opt/t",
    ]


class FabricSlurm(Slurm):
    """The runtime's calls, and the fabric test's step answered with ``out``."""

    def __init__(self, out: str, rc: int = 0) -> None:
        super().__init__()
        self.out, self.rc = out, rc

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        if "all_reduce_perf" in argv:
            self.calls.append(list(argv))
            return self.rc, self.out
        return super().__call__(argv, timeout)


FAIL = ("--fabric-test", "fail", "--fabric-floor-gbs", "389.6", "--fabric-tasks", "8")


def test_below_the_floor_the_attempt_fails_with_the_figures_before_any_launch(
    tmp_path: Path,
) -> None:
    slurm = FabricSlurm(standin(300.0))
    b = make(tmp_path, Step(0), slurm, *FAIL)
    assert go(b) == 3
    assert b.step is None  # the launch never started
    lines = state(tmp_path)
    assert lines[0].startswith("event=fabric failed: peak busbw 300.00 GB/s at 17179869184 B")
    assert lines[-1].startswith("event=fail fabric test: peak busbw 300.00 GB/s")
    assert "floor 389.60 GB/s; below the floor" in lines[-1]
    [test] = [c for c in slurm.calls if "all_reduce_perf" in c]
    assert test[:5] == [
        "srun",
        "--nodes=2",
        "--ntasks=16",
        "--ntasks-per-node=8",
        "--overcommit",
    ]


def test_a_node_the_test_singles_out_is_drained_and_the_job_requeued_off_it(
    tmp_path: Path,
) -> None:
    out = standin(sick="n2", node="n2")
    slurm = FabricSlurm(out, rc=3)
    b = make(tmp_path, Step(0), slurm, *FAIL)
    # three nodes: one failing is a minority
    b.order = ["n1", "n2", "n3"]
    assert go(b) == 3
    assert any(c[:2] == ["scontrol", "update"] and "NodeName=n2" in c for c in slurm.calls)
    assert ["scontrol", "requeue", "77"] in slurm.calls
    assert state(tmp_path)[-1].startswith("event=requeue fabric test singled out n2:")


def test_warn_logs_and_launches_and_a_pass_launches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm = FabricSlurm(standin(300.0))
    b = make(tmp_path, Step(0), slurm, "--fabric-test", "warn", "--fabric-floor-gbs", "389.6")
    assert go(b) == 0
    assert b.step is not None
    assert state(tmp_path)[0].startswith("event=fabric failed: ")
    assert state(tmp_path)[-1] == "event=finished exit 0"
    assert "fabric test failed: peak busbw 300.00 GB/s" in capsys.readouterr().err
    (tmp_path / "rt_77.state").unlink()
    ok = FabricSlurm(standin(420.0))
    b = make(tmp_path, Step(0), ok, *FAIL)
    assert go(b) == 0
    assert state(tmp_path)[0].startswith("event=fabric ok: peak busbw 420.00 GB/s")
    assert state(tmp_path)[-1] == "event=finished exit 0"


def test_the_test_runs_once_per_attempt(tmp_path: Path) -> None:
    """A relaunch inside the allocation reuses the attempt's verdict."""
    slurm = FabricSlurm(standin(420.0))
    b = make(tmp_path, Step(1), slurm, *FAIL, "--restart-in-job", "1", "--max-restarts", "2")
    go(b)
    assert any("event=relaunch" in x for x in state(tmp_path))
    assert len([c for c in slurm.calls if "all_reduce_perf" in c]) == 1
