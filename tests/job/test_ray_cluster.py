"""The node entry of a Ray cluster (``launcher.kind: ray``): slurmfm/job/node.py
``run_ray_driver`` and ``follow_head`` on top of the vLLM-over-Ray sequence."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmfm.job import node
from slurmfm.job.options import NodeOptions


class Child:
    """A ``ray start --block`` that runs until told (poll: None) or ends with ``rc``."""

    def __init__(self, ends_after: int | None = None, rc: int = 1) -> None:
        self.polls = 0
        self.ends_after = ends_after
        self.rc = rc

    def poll(self) -> int | None:
        self.polls += 1
        return self.rc if self.ends_after is not None and self.polls > self.ends_after else None


def follow(child: Child, head_up: list[bool]) -> tuple[int, list[list[str]]]:
    started: list[list[str]] = []

    def popen(argv: list[str], env: dict[str, str]) -> Child:
        started.append(argv)
        return child

    ups = list(head_up)
    call = node.follow_head(
        "10.0.0.1",
        23000,
        popen=popen,  # type: ignore[arg-type]
        up=lambda h, p: ups.pop(0),
        sleep=lambda s: None,
    )
    return call(["ray", "start", "--block"], {}), started


def test_a_worker_ends_with_0_once_the_head_it_joined_is_gone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The head stops its Ray when the driver ends: the worker follows within two polls,
    instead of waiting out the raylet's GCS reconnect timeout and exiting 1."""
    rc, started = follow(Child(), [True, True, False, True, False, False])
    assert rc == 0
    assert started == [["ray", "start", "--block"]]
    assert "the Ray head 10.0.0.1:23000 is gone" in capsys.readouterr().out


def test_no_ray_start_before_the_head_is_up() -> None:
    """A head not up yet is the head still starting: no `ray start` (a Python start that
    imports Ray) until its port answers; run_ray_node retries the answer until its deadline."""
    rc, started = follow(Child(), [False])
    assert rc == node.HEAD_NOT_UP
    assert started == []


def test_the_worker_retries_until_the_head_is_up_within_the_join_deadline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ups = [False, False]
    started: list[list[str]] = []
    clock = iter([0.0, 1.0, 2.0, 99.0])

    def popen(argv: list[str], env: dict[str, str]) -> Child:
        started.append(argv)
        return Child()

    call = node.follow_head(
        "10.0.0.1",
        23000,
        popen=popen,  # type: ignore[arg-type]
        up=lambda h, p: ups.pop(0) if ups else False,
        sleep=lambda s: None,
    )
    rc = node.run_ray_node(
        ["drv"],
        1,
        "10.0.0.1",
        "10.0.0.2",
        "ray",
        "python3",
        23000,
        2,
        10.0,
        {"SLURM_JOB_ID": "5"},
        call=call,
        clock=lambda: next(clock),
        sleep=lambda s: None,
        stop=lambda owner: None,
        make_temp=lambda prefix: "/nonexistent/ray-temp",
    )
    assert rc == 1
    assert started == []  # never up: never a `ray start`
    assert "Ray worker could not join 10.0.0.1:23000 within 10 s" in capsys.readouterr().err


def test_a_worker_whose_ray_dies_reports_its_exit() -> None:
    rc, _ = follow(Child(ends_after=3, rc=137), [True, True, True, True])
    assert rc == 137


def test_head_listening_sees_a_port_open_and_closed() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    assert node.head_listening("127.0.0.1", port)
    srv.close()
    assert not node.head_listening("127.0.0.1", port)


def driver_call(rank: int, port: str, env: dict[str, str]) -> dict[str, Any]:
    got: dict[str, Any] = {}

    def run_node(*args: Any, **kw: Any) -> int:
        got["args"], got["kw"] = args, kw
        return 7

    ray = {"ray": "ray", "python": "py", "port": port, "nodes": "4", "timeout": "30"}
    rc = node.run_ray_driver(
        ["python3", "drv.py"], rank, "n1", "10.0.0.9", ray, env, run_node, stop=lambda o: None
    )
    assert rc == 7
    return got


ENV = {"SLURMFM_RDZV_HOST": "10.0.0.1", "SLURMFM_RDZV_PORT": "21234", "SLURM_JOB_ID": "5"}


def test_the_cluster_takes_the_jobs_rendezvous_host_and_port() -> None:
    """Node 0 of the host order is the head (SLURMFM_RDZV_HOST, its NodeAddr) on the port the
    batch step picked out of the ephemeral range for this job and restart."""
    got = driver_call(0, "rdzv", ENV)
    argv, rank, head, own, ray, python, port, nnodes, timeout, _env = got["args"]
    assert (argv, rank, head, own, ray, python) == (
        ["python3", "drv.py"],
        0,
        "10.0.0.1",
        "10.0.0.9",
        "ray",
        "py",
    )
    assert (port, nnodes, timeout) == (21234, 4, 30.0)
    assert got["kw"]["what"] == "the driver"
    assert "call" not in got["kw"]  # the head's `ray start --head` returns at once
    assert driver_call(0, "6380", ENV)["args"][6] == 6380  # the recipe's fixed port


def test_workers_follow_the_head() -> None:
    got = driver_call(1, "rdzv", ENV)
    assert callable(got["kw"]["call"])


def test_the_driver_is_watched_like_a_training_launch(tmp_path: Path) -> None:
    """The head's launch is the driver: its exit and its exception are this node's report in
    the attempt's evidence (slurmfm/job/evidence.py), which the batch step judges."""
    evidence = tmp_path / "ev"
    evidence.mkdir(mode=0o700)
    got = driver_call(0, "rdzv", dict(ENV, SLURMFM_EVIDENCE_DIR=str(evidence)))
    launch = got["kw"]["launch"]
    code = "import sys; sys.stderr.write('Traceback (most recent call last):\\n'); "
    code += "raise ValueError('reward model missing')"
    rc = launch([sys.executable, "-c", code], "none", {"PATH": os.environ["PATH"]})
    assert rc == 1
    report = json.loads((evidence / "n1.json").read_text())
    assert report["exit"] == 1
    assert report["exc_type"] == "ValueError"
    assert "reward model missing" in report["message"]


def fake(tmp: Path, name: str, body: str) -> str:
    path = tmp / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_node_entry_runs_the_driver_on_the_head_once_every_node_joined(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The whole head path of the entry: `ray start --head` on the job's port and node 0's
    address, the count of alive nodes, then the driver with RAY_ADDRESS, and the report."""
    out = tmp_path / "ray-args"
    ray = fake(tmp_path, "ray", f'echo "$*" >> {out}\n')
    python = fake(tmp_path, "python", "echo 2\n")  # ray_alive's count: both nodes alive
    evidence = tmp_path / "ev"
    evidence.mkdir(mode=0o700)
    env = {
        "PATH": os.environ["PATH"],
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_ID": "5",
        "SLURMFM_HOST_ORDER": "n1 n2",
        "SLURMFM_NODE_ADDRS": "n1=127.0.0.1 n2=127.0.0.2",
        "SLURMFM_RDZV_HOST": "127.0.0.1",
        "SLURMFM_RDZV_PORT": "21234",
        "SLURMFM_EVIDENCE_DIR": str(evidence),
    }
    opts = NodeOptions(ray=ray, ray_python=python, ray_port="rdzv", ray_nodes="2", ray_driver=True)
    settings = NodeOptions.from_argv(opts.to_argv()).ray_settings()
    driver = [sys.executable, "-c", "import os; print('driver at', os.environ['RAY_ADDRESS'])"]
    assert node.main(driver, 0, "none", ray=settings, env=env) == 0
    words = out.read_text().split()
    assert words[:4] == ["start", "--head", "--port=21234", "--node-ip-address=127.0.0.1"]
    # no dashboard (fixed ports two jobs on a node would share), no usage report
    assert words[-2:] == ["--include-dashboard=false", "--disable-usage-stats"]
    printed = capfd.readouterr().out
    assert "slurmfm: Ray cluster has 2 nodes; starting the driver" in printed
    assert "driver at 127.0.0.1:21234" in printed
    assert json.loads((evidence / "n1.json").read_text())["exit"] == 0


def test_node_entry_of_a_worker_ends_when_the_head_stops(tmp_path: Path) -> None:
    """A worker's entry joins (`ray start --address --block`, here a sleep) and ends with 0
    when the head's port closes, stopping its own `ray start`."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    ray = fake(tmp_path, "ray", "exec sleep 60\n")
    env = {
        "PATH": os.environ["PATH"],
        "SLURMD_NODENAME": "n2",
        "SLURM_JOB_ID": "5",
        "SLURMFM_HOST_ORDER": "n1 n2",
        "SLURMFM_NODE_ADDRS": "n1=127.0.0.1 n2=127.0.0.1",
        "SLURMFM_RDZV_HOST": "127.0.0.1",
        "SLURMFM_RDZV_PORT": str(port),
    }
    settings = {"ray": ray, "python": "python3", "port": "rdzv", "nodes": "2"}
    settings.update(timeout="30", driver="1")
    closer = threading.Timer(1.0, srv.close)
    closer.start()
    try:
        assert node.main(["python3", "drv.py"], 0, "none", ray=settings, env=env) == 0
    finally:
        closer.cancel()
        srv.close()
    owner = "5..n2"  # the Slurm node name: the lab's nodes share one address
    assert node.stop_own_ray(owner) == []  # its `ray start` (the sleep) was stopped


def test_a_failed_head_start_is_tried_again_until_the_deadline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A raylet whose dashboard agent missed Ray's fixed 15 s for its port files aborts the
    head's start (seen on the lab's busy cores); the next try, with the imports warm, starts.
    What the failed start left is stopped first (its GCS holds the port)."""
    calls: list[list[str]] = []
    stopped: list[str] = []
    rcs = [1, 0]
    launched: list[list[str]] = []

    def call(argv: Sequence[str], env: dict[str, str]) -> int:
        calls.append(list(argv))
        return rcs.pop(0)

    rc = node.run_ray_node(
        ["drv"],
        0,
        "10.0.0.1",
        "10.0.0.1",
        "ray",
        "python3",
        23000,
        2,
        60.0,
        {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"},
        run=lambda argv, t: (0, "2"),
        call=call,
        clock=lambda: 0.0,
        sleep=lambda s: None,
        launch=lambda argv, fwd, env: launched.append(list(argv)) or 0,
        stop=stopped.append,
        make_temp=lambda prefix: "/nonexistent/ray-temp",
        head_retry=True,
    )
    assert rc == 0
    assert len(calls) == 2
    assert calls[0] == calls[1]
    assert calls[0][:3] == ["ray", "start", "--head"]
    assert stopped == ["5.0.10.0.0.1", "5.0.10.0.0.1"]  # after the failed try, and at the end
    assert launched == [["drv"]]
    assert "ray start --head failed; starting it again" in capsys.readouterr().err


def test_a_failed_join_stops_what_it_left_before_the_next_try() -> None:
    stopped: list[str] = []
    call = node.follow_head(
        "10.0.0.1",
        23000,
        popen=lambda argv, env: Child(ends_after=0, rc=1),  # type: ignore[arg-type,return-value]
        up=lambda h, p: True,
        sleep=lambda s: None,
        stop=stopped.append,
    )
    assert call(["ray", "start"], {"SLURMFM_RAY_OWNER": "5.0.10.0.0.2"}) == 1
    assert stopped == ["5.0.10.0.0.2"]


def test_the_head_waits_for_the_nodes_in_one_process() -> None:
    """One Python that connects once and counts until enough nodes joined or the time is up
    (its last line is the count), not a Python start per poll (vLLM's ray_alive)."""
    runs: list[tuple[list[str], float]] = []

    def run(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        runs.append((list(argv), timeout_s))
        return 0, "1\n1\n2\n"

    assert node.ray_wait_alive("py", "10.0.0.1:23000", 2, 30.0, run) == 2
    [(argv, timeout)] = runs
    assert argv[0] == "py"
    assert argv[-3:] == ["10.0.0.1:23000", "2", "30"]
    assert "ray.nodes()" in argv[2]
    assert timeout > 30.0  # the program's own wait ends first
    assert node.ray_wait_alive("py", "a:1", 2, 5.0, lambda a, t: (1, "Traceback")) == 0


def test_a_head_that_starts_its_ray_again_is_not_the_end() -> None:
    """The head's port closes when its start failed and it tries again (head_retry), too:
    the worker ends only once the head's report says the driver ended."""
    ended = iter([False, False, True])
    ups = [True, False, False, False, False]
    call = node.follow_head(
        "10.0.0.1",
        23000,
        popen=lambda argv, env: Child(),  # type: ignore[arg-type,return-value]
        up=lambda h, p: ups.pop(0),
        sleep=lambda s: None,
        ended=lambda: next(ended),
    )
    assert call(["ray", "start", "--block"], {}) == 0
    assert ups == []  # it went on polling while the head had no report


def test_no_worker_joins_before_the_head_marked_its_ray_started() -> None:
    """A GCS port open is not yet a head: its raylet registers later, and a worker joining
    before fails ("No node info found for head node in GCS") while loading the head's cores."""
    started: list[list[str]] = []
    call = node.follow_head(
        "10.0.0.1",
        23000,
        popen=lambda argv, env: started.append(argv) or Child(),  # type: ignore[arg-type,func-returns-value]
        up=lambda h, p: True,
        sleep=lambda s: None,
        ready=lambda: False,
    )
    assert call(["ray", "start", "--block"], {}) == node.HEAD_NOT_UP
    assert started == []


def test_the_head_marks_its_ray_started_for_the_workers(tmp_path: Path) -> None:
    evidence = tmp_path / "ev"
    evidence.mkdir(mode=0o700)
    env = dict(ENV, SLURMFM_EVIDENCE_DIR=str(evidence), SLURMFM_HOST_ORDER="n1 n2")
    count = driver_call(0, "rdzv", env)["kw"]["count"]
    assert not (evidence / "n1.ray-head").exists()
    assert count("py", "10.0.0.1:21234", 2, 5.0, lambda a, t: (0, "2\n")) == 2
    assert (evidence / "n1.ray-head").read_text() == "10.0.0.1:21234\n"
    ready = driver_call(1, "rdzv", env)["kw"]["call"]
    assert callable(ready)


def test_a_cancelled_head_stops_its_own_ray(tmp_path: Path) -> None:
    """scancel ends the step with TERM; the head's Ray daemons left the step's process tree,
    so its entry stops them (by the owner mark) before it exits."""
    stopped: list[str] = []

    def run_node(*args: Any, **kw: Any) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # Slurm's TERM while the cluster runs
        return 0

    ray = {"ray": "ray", "python": "py", "port": "rdzv", "nodes": "2", "timeout": "30"}
    env = dict(ENV, SLURMD_NODENAME="n1", SLURM_STEP_ID="0")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as ended:
        node.run_ray_driver(["drv"], 0, "n1", "10.0.0.1", ray, env, run_node, stop=stopped.append)
    assert ended.value.code == 128 + signal.SIGTERM
    assert stopped == ["5.0.n1"]
    assert signal.getsignal(signal.SIGTERM) == before
