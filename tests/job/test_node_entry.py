"""The per-node entry: rank insertion, USR2 ignored for the launcher, TERM to its children."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from slurmfm.job import node
from slurmfm.job.node import children, node_addrs, run_ray_node

# A launcher stand-in: records its argv and whether USR2 is ignored, starts one worker that
# records the signal it gets, and waits for it.
LAUNCHER = r"""
import os, signal, subprocess, sys
out = os.environ["OUT"]
with open(out + "/launcher", "w") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\n")
    fh.write("usr2=%s\n" % (signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN))
    fh.write("rank=%s\n" % os.environ["SLURMFM_NODE_RANK"])
worker = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
def got(s, f):
    open(os.environ["OUT"] + "/worker", "w").write(signal.Signals(s).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, got)
open(os.environ["OUT"] + "/ready", "w").close()
while True:
    time.sleep(0.05)
'''])
sys.exit(worker.wait())
"""


def entry(tmp: Path, forward: str, *args: str) -> subprocess.Popen[str]:
    (tmp / "launcher.py").write_text(LAUNCHER)
    env = {
        **os.environ,
        "OUT": str(tmp),
        "SLURMD_NODENAME": "n2",
        "SLURMFM_HOST_ORDER": "n1 n2 n3",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmfm.job",
            "node",
            "--prefix",
            "2",
            "--forward",
            forward,
            "--",
            sys.executable,
            str(tmp / "launcher.py"),
            *args,
        ],
        env=env,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    while not path.exists():
        assert proc.poll() is None, "the entry ended early"
        time.sleep(0.02)


def test_rank_inserted_usr2_ignored_and_term_forwarded(tmp_path: Path) -> None:
    proc = entry(tmp_path, "TERM", "--x", "y")
    wait_for(tmp_path / "ready", proc)
    lines = (tmp_path / "launcher").read_text().splitlines()
    assert lines == ["--node-rank=1 --x y", "usr2=True", "rank=1"]
    proc.send_signal(signal.SIGUSR2)  # as Slurm delivers the save signal to the step
    assert proc.wait(timeout=60) == 0
    assert (tmp_path / "worker").read_text() == "SIGTERM"


def test_node_not_in_order(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SLURMD_NODENAME": "zz",
        "SLURMFM_HOST_ORDER": "n1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.job", "node", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3
    assert "zz is not in the host order" in proc.stderr


def test_children_from_proc() -> None:
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert kid.pid in children(os.getpid())
        fake = Path("/nonexistent-proc")
        assert children(os.getpid(), str(fake)) == []
    finally:
        kid.kill()
        kid.wait()


def test_node_addrs() -> None:
    assert node_addrs("n1=10.0.0.1 n2=") == {"n1": "10.0.0.1", "n2": "n2"}


class RayCalls:
    """Injected ``call``/``run``/``launch`` for run_ray_node: records what each got, with the
    environment, so a test sees the address every Ray and vLLM process was told."""

    def __init__(self, call_rcs: list[int], alive: list[str]) -> None:
        self.call_rcs = call_rcs
        self.alive = alive
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.launched: list[tuple[list[str], dict[str, str]]] = []

    def call(self, argv: Sequence[str], env: dict[str, str]) -> int:
        self.calls.append((list(argv), dict(env)))
        return self.call_rcs.pop(0) if self.call_rcs else 0

    def run(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        return 0, self.alive.pop(0)

    def launch(self, argv: Sequence[str], forward: str, env: dict[str, str]) -> int:
        self.launched.append((list(argv), dict(env)))
        return 0


def ray_node(rank: int, rec: RayCalls) -> int:
    return run_ray_node(
        ["vllm", "serve", "m"],
        rank,
        "10.0.0.1",
        "10.0.0.2" if rank else "10.0.0.1",
        "ray",
        "python3",
        6379,
        2,
        60.0,
        {"PATH": "/bin"},
        run=rec.run,
        call=rec.call,
        clock=lambda: 0.0,
        sleep=lambda s: None,
        launch=rec.launch,
    )


def test_ray_worker_pins_its_own_address_on_every_attempt() -> None:
    """vLLM's run_cluster.sh: each worker gives Ray its own address and VLLM_HOST_IP. Before,
    only the head had --node-ip-address; a worker on a multi-NIC host picked one itself."""
    rec = RayCalls(call_rcs=[1, 0], alive=[])  # the head is not up at the first try
    assert ray_node(1, rec) == 0
    assert [argv for argv, _ in rec.calls] == [
        ["ray", "start", "--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2", "--block"]
    ] * 2
    assert all(env["VLLM_HOST_IP"] == "10.0.0.2" for _, env in rec.calls)
    assert rec.launched == []  # only node 0 serves


def test_ray_head_pins_its_address_and_serves_with_vllm_host_ip() -> None:
    rec = RayCalls(call_rcs=[0], alive=["1", "2"])  # the worker joins at the second poll
    assert ray_node(0, rec) == 0
    head_start, stop = rec.calls
    assert head_start[0] == ["ray", "start", "--head", "--port=6379", "--node-ip-address=10.0.0.1"]
    assert head_start[1]["VLLM_HOST_IP"] == "10.0.0.1"
    assert stop[0] == ["ray", "stop"]
    [(argv, env)] = rec.launched
    assert argv == ["vllm", "serve", "m"]
    assert env["VLLM_HOST_IP"] == "10.0.0.1"
    assert env["PATH"] == "/bin"


def test_node_entry_takes_its_own_nodeaddr_for_ray(tmp_path: Path) -> None:
    """The entry looks this node up in SLURMFM_NODE_ADDRS (Slurm's NodeAddr per host), not
    the head's address and not its hostname."""
    out = tmp_path / "ray-args"
    ray = tmp_path / "ray"
    ray.write_text(f'#!/bin/sh\necho "$* VLLM_HOST_IP=$VLLM_HOST_IP" >> {out}\n')
    ray.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "SLURMD_NODENAME": "n2",
        "SLURMFM_HOST_ORDER": "n1 n2",
        "SLURMFM_NODE_ADDRS": "n1=10.0.0.1 n2=10.0.0.2",
        "SLURMFM_SERVE_HEAD": "10.0.0.1",
    }
    spec = {"ray": str(ray), "python": sys.executable, "port": "6379", "nodes": "2", "timeout": "5"}
    assert node.main(["vllm", "serve", "m"], 0, "none", ray=spec, env=env) == 0
    assert out.read_text() == (
        "start --address=10.0.0.1:6379 --node-ip-address=10.0.0.2 --block VLLM_HOST_IP=10.0.0.2\n"
    )


def test_container_program_then_host_forward(tmp_path: Path) -> None:
    """Issue 11, a launch in a container: the rendered ``sh`` program (no slurmfm in the
    image) gives the launcher its node rank from the task id and the ignored USR2; the host
    step ``runtime forward`` finds the launch by its environment and TERMs its children only."""
    from slurmfm.job.batch import CONTAINER_ENTRY
    from slurmfm.render.script import _container_entry

    (tmp_path / "launcher.py").write_text(LAUNCHER)
    program = shlex.split(_container_entry(1, torchrun=True, nccl_log=False))[0]
    job = f"t{os.getpid()}"  # no other process on this machine has this job id
    env = {**os.environ, "OUT": str(tmp_path), "SLURM_JOB_ID": job, "SLURM_PROCID": "2"}
    argv = ["sh", "-c", program, CONTAINER_ENTRY, sys.executable, str(tmp_path / "launcher.py")]
    proc = subprocess.Popen([*argv, "--x"], env={**env, "SLURMFM_STEP": "launch"}, text=True)
    try:
        wait_for(tmp_path / "ready", proc)
        lines = (tmp_path / "launcher").read_text().splitlines()
        assert lines == ["--x", "usr2=True", "rank=2"]
        assert node.launch_tops(job) == [proc.pid]  # sh exec'd the launcher: same process
        fwd = subprocess.run(
            [sys.executable, "-m", "slurmfm.job", "forward", "--signal", "TERM"],
            env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "SIGTERM to 1 training process(es)" in fwd.stdout
        assert proc.wait(timeout=60) == 0  # the launcher ended with its worker, not by TERM
        assert (tmp_path / "worker").read_text() == "SIGTERM"
    finally:
        proc.kill()
        proc.wait()


def test_launch_tops_from_a_fake_proc(tmp_path: Path) -> None:
    """Only processes of this job's launch step count; a top is one whose parent is not."""

    def pid(n: int, ppid: int, env: dict[str, str]) -> None:
        d = tmp_path / str(n)
        d.mkdir()
        (d / "stat").write_text(f"{n} (python3 (x)) S {ppid} 1 1 0")
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))

    launch = {"SLURM_JOB_ID": "9", "SLURMFM_STEP": "launch"}
    pid(10, 1, launch)  # torchrun
    pid(11, 10, launch)  # its workers
    pid(12, 10, launch)
    pid(20, 1, {"SLURM_JOB_ID": "9"})  # the agent step of the same job
    pid(30, 1, {"SLURM_JOB_ID": "8", "SLURMFM_STEP": "launch"})  # another job
    pid(40, 1, {**launch, "SLURMD_NODENAME": "n2"})  # the same job's launcher on another node
    assert node.launch_tops("9", proc=str(tmp_path)) == [10, 40]
    assert node.launch_tops("9", "n2", str(tmp_path)) == [40]
    assert sorted(children(10, str(tmp_path))) == [11, 12]
    assert node.environ(99, str(tmp_path)) == {}
