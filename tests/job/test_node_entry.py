"""The per-node entry: rank insertion, USR2 ignored for the launcher, TERM to its children."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

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


# The node task after its launcher has ended, as it exits: a save signal Slurm resends to the
# step then (the batch step repeats it every resignal_s) must not kill it. The finalizer runs
# during interpreter shutdown, where CPython restores SIG_DFL for Python-handled signals.
AFTER_LAUNCH = r"""
import builtins, os, signal, sys, time
from slurmfm.job import node
rc = node.run_launcher([sys.executable, "-c", "pass"], "none", dict(os.environ))
class Late:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.1)
        os.write(1, b"survived\n")
builtins._late = Late()
sys.exit(rc)
"""


def test_a_node_task_outlives_a_save_signal_while_it_exits() -> None:
    """Seen on the lab under load: a node whose ranks had all finished was still exiting
    when the save signal came; the task died of USR2 (exit 140) and srun's
    --kill-on-bad-exit cut rank 0's save short."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", AFTER_LAUNCH],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "survived\n"), done.stderr


# A TERM that reaches the node entry while it starts the launcher: Slurm's proctrack/linuxproc
# signals the processes it finds under the task once, so a launcher forked after that look
# gets its TERM only from the entry. "before": while Popen runs (the entry has no child yet);
# "after": once the launcher has exec'd, before run_launcher gets Popen's result back.
TERM_AT_START = r"""
import os, signal, subprocess, sys
from slurmfm.job import node
mode, pidfile = sys.argv[1], sys.argv[2]
real = subprocess.Popen
def popen(*args, **kw):
    if mode == "before":
        os.kill(os.getpid(), signal.SIGTERM)
    child = real(*args, **kw)
    with open(pidfile, "w") as fh:
        fh.write(str(child.pid))
    if mode == "after":
        os.kill(os.getpid(), signal.SIGTERM)
    return child
subprocess.Popen = popen
print(node.run_launcher(["sleep", "60"], "none", dict(os.environ)), flush=True)
"""


def _alive(pid: int) -> bool:
    state = node.stat_fields(pid)[:1]
    return bool(state) and state != ["Z"]


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_term_while_the_launcher_starts_reaches_it(tmp_path: Path, mode: str) -> None:
    """Seen on the lab: an scancel 0.2 s into the launch killed the entry alone, and its
    torchrun, a child of init from then on, was still running 11 minutes later with the
    step's output open (slurmstepd abandoned the step's IO after 60 s)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    pidfile, out = tmp_path / "launcher.pid", tmp_path / "out"
    try:
        with out.open("w") as fh:  # a file, not a pipe: a launcher left behind would hold it
            done = subprocess.run(
                [sys.executable, "-c", TERM_AT_START, mode, str(pidfile)],
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=60,
                check=False,
            )
        pid = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the launcher outlived the entry"
        # the entry waited for the launcher and reports its death by TERM
        assert (done.returncode, out.read_text()) == (0, "143\n")
    finally:
        if pidfile.exists() and _alive(int(pidfile.read_text())):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


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
        self.stopped: list[str] = []

    def stop(self, owner: str) -> None:
        self.stopped.append(owner)

    def call(self, argv: Sequence[str], env: dict[str, str]) -> int:
        self.calls.append((list(argv), dict(env)))
        return self.call_rcs.pop(0) if self.call_rcs else 0

    def run(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        return 0, self.alive.pop(0)

    def launch(self, argv: Sequence[str], forward: str, env: dict[str, str]) -> int:
        self.launched.append((list(argv), dict(env)))
        return 0


def ray_node(
    rank: int,
    rec: RayCalls,
    temp: str = "/nonexistent/ray-temp",
    make_temp: Callable[[str], str] | None = None,
) -> int:
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
        {"PATH": "/bin", "SLURM_JOB_ID": "5", "SLURM_STEP_ID": "1"},
        run=rec.run,
        call=rec.call,
        clock=lambda: 0.0,
        sleep=lambda s: None,
        launch=rec.launch,
        stop=rec.stop,
        make_temp=make_temp or (lambda prefix: temp),
    )


def test_ray_worker_pins_its_own_address_on_every_attempt() -> None:
    """vLLM's run_cluster.sh: each worker gives Ray its own address and VLLM_HOST_IP. Before,
    only the head had --node-ip-address; a worker on a multi-NIC host picked one itself."""
    rec = RayCalls(call_rcs=[1, 0], alive=[])  # the head is not up at the first try
    assert ray_node(1, rec) == 0
    start = ["ray", "start", "--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2"]
    assert [argv for argv, _ in rec.calls] == [
        [*start, "--temp-dir=/nonexistent/ray-temp/r", "--block"]
    ] * 2
    assert all(env["VLLM_HOST_IP"] == "10.0.0.2" for _, env in rec.calls)
    assert all(env["SLURMFM_RAY_OWNER"] == "5.1.10.0.0.2" for _, env in rec.calls)
    assert rec.launched == []  # only node 0 serves
    assert rec.stopped == ["5.1.10.0.0.2"]  # its own Ray, when its ray start returned


def test_ray_head_pins_its_address_and_serves_with_vllm_host_ip() -> None:
    rec = RayCalls(call_rcs=[0], alive=["1", "2"])  # the worker joins at the second poll
    assert ray_node(0, rec) == 0
    [head_start] = rec.calls  # no `ray stop`: it stops every Ray on the host
    assert head_start[0] == [
        "ray",
        "start",
        "--head",
        "--port=6379",
        "--node-ip-address=10.0.0.1",
        "--temp-dir=/nonexistent/ray-temp/r",
    ]
    assert head_start[1]["VLLM_HOST_IP"] == "10.0.0.1"
    assert rec.stopped == ["5.1.10.0.0.1"]
    [(argv, env)] = rec.launched
    assert argv == ["vllm", "serve", "m"]
    assert env["VLLM_HOST_IP"] == "10.0.0.1"
    assert env["RAY_ADDRESS"] == "10.0.0.1:6379"  # its own cluster, not /tmp/ray's last head
    assert env["PATH"] == "/bin"


def test_each_nodes_ray_lives_in_a_private_directory_removed_at_the_end(tmp_path: Path) -> None:
    """Not /tmp/ray, which every Ray on the host shares: a mkdtemp directory per node, passed
    as --temp-dir, gone when the node's part ends, however it ends."""
    made: list[str] = []

    def make(prefix: str) -> str:
        d = tempfile.mkdtemp(prefix=prefix, dir=tmp_path)
        made.append(d)
        return d

    rec = RayCalls(call_rcs=[0], alive=["2"])
    assert ray_node(0, rec, make_temp=make) == 0
    [d] = made
    assert os.path.basename(d).startswith("slurmfm-ray-5-")
    # Ray opens its temp dir to everyone (0777): it is one level inside the private one
    assert f"--temp-dir={d}/r" in rec.calls[0][0]
    assert not os.path.exists(d)
    rec = RayCalls(call_rcs=[1], alive=[])  # ray start --head fails
    assert ray_node(0, rec, make_temp=make) == 1
    assert not any(os.path.exists(d) for d in made)


def test_only_this_nodes_own_ray_is_stopped(tmp_path: Path) -> None:
    """Another job's Ray on the same host (or this job's on another lab node) stays: only the
    processes whose environment carries this node's owner mark are signalled, TERM first,
    KILL for what outlives it."""
    p = FakeProc(tmp_path)
    p.add(10, 1, {"SLURMFM_RAY_OWNER": "5.1.10.0.0.1"})  # gcs_server
    p.add(11, 1, {"SLURMFM_RAY_OWNER": "5.1.10.0.0.1"})  # raylet
    p.add(20, 1, {"SLURMFM_RAY_OWNER": "6.0.10.0.0.1"})  # another job's Ray
    p.add(30, 1, {})  # a Ray of nobody's
    sent: list[tuple[int, int]] = []

    def kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        if pid == 10:  # gcs_server ends at TERM; the raylet does not
            shutil.rmtree(tmp_path / "10")

    assert node.stop_own_ray("5.1.10.0.0.1", str(tmp_path), kill, lambda s: None, 1.0) == [10, 11]
    assert sent == [(10, signal.SIGTERM), (11, signal.SIGTERM), (11, signal.SIGKILL)]


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
    words = out.read_text().split()
    assert words[:3] == ["start", "--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2"]
    assert words[3].startswith("--temp-dir=/tmp/slurmfm-ray-")
    assert words[3].endswith("/r")
    assert words[4:] == ["--block", "VLLM_HOST_IP=10.0.0.2"]
    assert not os.path.exists(os.path.dirname(words[3].split("=", 1)[1]))  # removed at the end


def container_task(tmp: Path, job: str, entry: list[str], path: str) -> subprocess.Popen[str]:
    """The rendered container program started as slurmstepd starts a task (SLURM_TASK_PID is
    the task's own pid) with ``entry`` as its arguments and ``path`` as PATH."""
    from slurmfm.job.options import CONTAINER_ENTRY
    from slurmfm.render.container import _container_entry

    (tmp / "launcher.py").write_text(LAUNCHER)
    program = shlex.split(_container_entry(torchrun=True, nccl_log=False))[0]
    env = {
        **os.environ,
        "PATH": path,
        "OUT": str(tmp),
        "SLURM_JOB_ID": job,
        "SLURM_PROCID": "0",
        "SLURMD_NODENAME": "n3",
        "SLURMFM_HOST_ORDER": "n1 n2 n3",
        "SLURMFM_STEP": "launch",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    argv = ["sh", "-c", program, CONTAINER_ENTRY, *entry]
    task = ["/bin/sh", "-c", 'SLURM_TASK_PID=$$ exec "$@"', "task", *argv]
    return subprocess.Popen(task, env=env, text=True, stderr=subprocess.PIPE)


def test_container_program_runs_the_entry_then_host_forward(tmp_path: Path) -> None:
    """Issue 37, a launch in a container: the rendered ``sh`` program runs the runtime's node
    entry with the image's python3 (the launcher's parent is the entry, the rank from the host
    order, USR2 ignored); the host step ``runtime forward`` finds the launch task (the entry)
    by its environment, TERMs the launcher's children only (through the entry), and ends with
    the launch."""
    job = f"t{os.getpid()}"  # no other process on this machine has this job id
    py = str(tmp_path / "bin")
    os.mkdir(py)
    os.symlink(sys.executable, os.path.join(py, "python3"))
    words = ["python3", "-m", "slurmfm.job", "node", "--prefix", "2", "--forward", "none"]
    entry = [*words, "--", "python3", str(tmp_path / "launcher.py"), "--x"]
    proc = container_task(tmp_path, job, entry, f"{py}:/usr/bin:/bin")
    try:
        wait_for(tmp_path / "ready", proc)
        lines = (tmp_path / "launcher").read_text().splitlines()
        assert lines == ["--node-rank=2 --x", "usr2=True", "rank=2"]  # the entry's own insert
        assert node.launch_tops(job) == [proc.pid]  # sh exec'd the entry: same process
        assert node.entry_launcher(proc.pid) in node.children(proc.pid)
        fwd = subprocess.run(
            [sys.executable, "-m", "slurmfm.job", "forward", "--signal", "TERM", "--poll-s", "0.1"],
            env={
                **os.environ,
                "SLURM_JOB_ID": job,
                "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "SIGTERM to 1 training process(es); the launch ended" in fwd.stdout
        assert proc.wait(timeout=60) == 0  # the launcher ended with its worker, not by TERM
        assert (tmp_path / "worker").read_text() == "SIGTERM"
        assert "no python3" not in (proc.stderr.read() if proc.stderr else "")
    finally:
        proc.kill()
        proc.wait()


def test_container_program_without_python3_runs_the_launch_with_one_line(tmp_path: Path) -> None:
    """An image without ``python3``: task 0 says so in one line, the entry's words are
    dropped, the launcher runs as the task with its rank from the host order."""
    job = f"u{os.getpid()}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python-only")  # no python3 on PATH
    os.symlink(shutil.which("sh") or "/bin/sh", bin_dir / "sh")
    entry = ["python3", "-I", "-S", "-c", "CHECKED", "node", "--prefix", "1", "--"]
    entry += ["python-only", str(tmp_path / "launcher.py"), "--x"]
    proc = container_task(tmp_path, job, entry, str(bin_dir))
    try:
        wait_for(tmp_path / "ready", proc)
        lines = (tmp_path / "launcher").read_text().splitlines()
        assert lines == ["--x", "usr2=True", "rank=2"]
        assert node.launch_tops(job) == [proc.pid]
        assert node.entry_launcher(proc.pid) == 0  # the task is the launcher itself
        fwd = node.forward_to_workers(job, signal.SIGTERM)
        assert len(fwd) == 1
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read() if proc.stderr else ""
        assert err.count("no python3 in the container image") == 1, err
        assert err.startswith("slurmfm: n3: no python3 in the container image: the launch runs"), (
            err
        )
    finally:
        proc.kill()
        proc.wait()


# what a training process catches: TERM (Megatron's --exit-signal-handler), USR2 (slurmfm's)
CAUGHT = 1 << (signal.SIGTERM - 1) | 1 << (signal.SIGUSR2 - 1)


class FakeProc:
    """A fake ``/proc``: each process a ``stat`` (its parent, its start time) and an
    ``environ``, as the kernel writes them (proc(5))."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(
        self, pid: int, ppid: int, env: dict[str, str], started: int = 100, caught: int = CAUGHT
    ) -> None:
        d = self.root / str(pid)
        d.mkdir()
        fields = ["S", str(ppid)] + ["0"] * 17 + [str(started), "0"]  # field 22: start time
        (d / "stat").write_text(f"{pid} (python3 (x)) " + " ".join(fields))
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))
        self.handlers(pid, caught)

    def handlers(self, pid: int, caught: int) -> None:
        """The signals ``pid`` has a handler for (``SigCgt``, a mask: bit N-1 for signal N)."""
        (self.root / str(pid) / "status").write_text(
            f"Name:\tpython3\nSigIgn:\t0000000000000800\nSigCgt:\t{caught:016x}\n"
        )

    def restart(self, pid: int, started: int) -> None:  # the kernel reused the pid
        stat = self.root / str(pid) / "stat"
        words = stat.read_text().split()
        words[22] = str(started)  # "(python3 (x))" is two words: field N at N
        stat.write_text(" ".join(words))


def task_env(job: str, pid: int, **more: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": job, "SLURMFM_STEP": "launch", "SLURM_TASK_PID": str(pid), **more}


def test_launch_tops_are_the_launch_steps_own_tasks(tmp_path: Path) -> None:
    """Only the tasks Slurm started for this job's launch step count: a process whose
    SLURM_TASK_PID is its own pid, of this job, step and node."""
    p = FakeProc(tmp_path)
    p.add(10, 1, task_env("9", 10))  # torchrun, exec'd by the container's sh program
    p.add(11, 10, task_env("9", 10))  # its workers
    p.add(12, 10, task_env("9", 10))
    p.add(20, 1, {"SLURM_JOB_ID": "9", "SLURM_TASK_PID": "20"})  # the agent step of the job
    p.add(30, 1, task_env("8", 30))  # another job
    p.add(40, 1, task_env("9", 40, SLURMD_NODENAME="n2"))  # the job's launcher on another node
    assert node.launch_tops("9", proc=str(tmp_path)) == [10, 40]
    assert node.launch_tops("9", "n2", str(tmp_path)) == [40]
    assert sorted(children(10, str(tmp_path))) == [11, 12]
    assert node.environ(99, str(tmp_path)) == {}


def squashfuse_node(tmp_path: Path) -> FakeProc:
    """A node of a Pyxis launch with use_squashfuse=1, as seen on the lab: the launch task
    (torchrun) has Enroot's holder as a child (``sh -c "kill -STOP $$ ; exit 0"``, Enroot's own
    small environment: github.com/NVIDIA/pyxis pyxis_slurmstepd.c), which holds ``fuse-shim``
    and its ``squashfuse``, the container's root file system; those two carry the launch step's
    environment but no task's pid (github.com/NVIDIA/enroot src/runtime.sh)."""
    p = FakeProc(tmp_path)
    step = {"SLURM_JOB_ID": "9", "SLURMFM_STEP": "launch", "SLURMD_NODENAME": "n1"}
    p.add(5, 1, {})  # slurmstepd: no job environment of its own
    p.add(10, 5, task_env("9", 10, SLURMD_NODENAME="n1"))  # the launch task (torchrun)
    p.add(20, 10, {"PATH": "/usr/bin", "ENROOT_ROOTFS": "/x"})  # Enroot's holder
    p.add(21, 20, step)  # fuse-shim
    p.add(22, 21, step)  # squashfuse
    p.add(11, 10, task_env("9", 10, SLURMD_NODENAME="n1"))  # the workers
    p.add(12, 10, task_env("9", 10, SLURMD_NODENAME="n1"))
    p.add(50, 1, step)  # a fuse-shim left over, reparented
    p.add(51, 50, step)
    return p


def test_forward_signals_only_the_training_never_the_containers_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With use_squashfuse=1 a TERM to Enroot's holder, fuse-shim or squashfuse removes the
    container's root file system under the training it should save (Stale file handle, Bus
    error): the forward signals only the children the launcher started."""
    squashfuse_node(tmp_path)
    killed: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
    assert node.launch_tops("9", "n1", str(tmp_path)) == [10]
    sent = node.forward_to_workers("9", signal.SIGTERM, "n1", str(tmp_path))
    assert sorted(sent) == [11, 12]
    assert sorted(killed) == [(11, signal.SIGTERM), (12, signal.SIGTERM)]


def test_forward_once_then_only_to_new_workers_until_the_launch_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One forward step for the whole save window: each worker gets the TERM once, a worker
    that appears later gets it then, a reused pid is a new process; the step ends when the
    launch task is gone."""
    p = squashfuse_node(tmp_path)
    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    lines: list[str] = []
    rounds = [0]

    p.add(14, 10, task_env("9", 10, SLURMD_NODENAME="n1"), caught=0)  # still starting up

    def sleep(s: float) -> None:
        rounds[0] += 1
        if rounds[0] == 1:
            p.handlers(14, CAUGHT)  # it installed its handler
        if rounds[0] == 2:
            p.add(13, 10, task_env("9", 10, SLURMD_NODENAME="n1"))  # a late worker
        if rounds[0] == 3:
            p.restart(12, 500)  # worker 12 ended; a new process got its pid
        if rounds[0] == 4:
            for d in ("10", "11", "12", "13", "14", "20", "21", "22"):
                shutil.rmtree(tmp_path / d)  # the launch ended on this node

    n = node.forward_until_done(
        "9", signal.SIGTERM, "n1", str(tmp_path), poll_s=0, say=lines.append, sleep=sleep
    )
    assert killed[:2] == [11, 12]  # 14 had no handler yet: not in the first round
    assert sorted(killed) == [11, 12, 12, 13, 14]
    assert n == 5
    assert rounds[0] == 4
    assert lines == [
        "slurmfm: n1: SIGTERM to 2 training process(es)",
        "slurmfm: n1: SIGTERM to 1 training process(es) more",
        "slurmfm: n1: SIGTERM to 1 training process(es) more",
        "slurmfm: n1: SIGTERM to 1 training process(es) more",
    ]


def test_forward_to_the_tasks_themselves_when_they_are_the_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NeMo in a container: one task per GPU and no launcher; the tasks get the signal."""
    p = FakeProc(tmp_path)
    p.add(10, 1, task_env("9", 10))
    p.add(11, 1, task_env("9", 11))
    p.add(12, 10, task_env("9", 10))  # a data loader worker of task 10
    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    assert node.forward_to_workers("9", signal.SIGUSR2, proc=str(tmp_path), tasks=True) == [
        10,
        11,
    ]
    assert killed == [10, 11]


def test_handler_read_from_proc_status(tmp_path: Path) -> None:
    p = FakeProc(tmp_path)
    p.add(10, 1, {}, caught=1 << (signal.SIGUSR2 - 1))
    assert node.catches(10, signal.SIGUSR2, str(tmp_path))
    assert not node.catches(10, signal.SIGTERM, str(tmp_path))
    assert node.catches(99, signal.SIGTERM, str(tmp_path))  # unreadable: sent, not lost
    # and the kernel's own: a process that caught TERM, not USR2
    code = "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None); print(1); time.sleep(60)"
    kid = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert kid.stdout is not None
        assert kid.stdout.readline() == "1\n"
        assert node.catches(kid.pid, signal.SIGTERM)
        assert not node.catches(kid.pid, signal.SIGUSR2)
    finally:
        kid.kill()
        kid.wait()


def test_container_remove_takes_only_this_attempts_container() -> None:
    """Pyxis names a kept container pyxis_NAME, or pyxis_JOBID_NAME with container_scope=job;
    the job's other attempts' and other jobs' containers stay."""
    calls: list[list[str]] = []
    listed = "pyxis_slurmfm-7-1-launch\npyxis_slurmfm-7-0-launch\npyxis_7_slurmfm-7-1-launch\n"
    listed += "pyxis_slurmfm-7-1-launchx\npyxis_17.0\n"

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        calls.append(list(argv))
        return (0, listed) if list(argv) == ["enroot", "list"] else (0, "")

    gone = node.container_remove("slurmfm-7-1-launch", run)
    assert gone == ["pyxis_slurmfm-7-1-launch", "pyxis_7_slurmfm-7-1-launch"]
    assert calls[1:] == [["enroot", "remove", "--force", c] for c in gone]
    assert node.container_remove("x", lambda a, t: (127, "enroot: command not found")) is None


# A NeMo 2.0 task stand-in: the launched process is the training process itself (one task per
# GPU, no launcher); like NeMo's PreemptionCallback it saves and stops on TERM.
NEMO_TASK = r"""
import os, signal, sys, time
out = os.environ["OUT"]
def got(s, f):
    open(out + "/saved", "w").write(signal.Signals(s).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, got)
with open(out + "/usr2", "w") as fh:
    fh.write("usr2=%s" % (signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN))
open(out + "/ready", "w").close()
while True:
    time.sleep(0.05)
"""


def test_nemo_task_itself_gets_the_term_at_the_save_signal(tmp_path: Path) -> None:
    (tmp_path / "task.py").write_text(NEMO_TASK)
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "SLURMD_NODENAME": "n1",
        "SLURMFM_HOST_ORDER": "n1",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    argv = [sys.executable, "-m", "slurmfm.job", "node", "--prefix", "0", "--forward", "TERM"]
    proc = subprocess.Popen(
        [*argv, "--forward-tasks", "1", "--", sys.executable, str(tmp_path / "task.py")],
        env=env,
        text=True,
    )
    wait_for(tmp_path / "ready", proc)
    # the task does not die of the USR2 Slurm gives every process of the step
    assert (tmp_path / "usr2").read_text() == "usr2=True"
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=60) == 0
    assert (tmp_path / "saved").read_text() == "SIGTERM"


def test_node_0s_nccl_log_reaches_a_servers_ray_head_and_its_vllm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The transport check of a multi-node server: node 0's entry sets NCCL_DEBUG_FILE before
    it starts Ray, so `ray start --head` (whose raylet starts vLLM's workers on node 0) and
    `vllm serve` both carry it; the other nodes log nothing."""
    from slurmfm.job import node

    seen: list[tuple[int, dict[str, str]]] = []

    def fake_ray_node(argv: Sequence[str], rank: int, *a: object, **kw: object) -> int:
        env = a[-1]
        assert isinstance(env, dict)
        seen.append((rank, dict(env)))
        return 0

    monkeypatch.setattr(node, "run_ray_node", fake_ray_node)
    ray = {"ray": "ray", "python": "python3", "port": "6379", "nodes": "2", "timeout": "60"}
    for me in ("n1", "n2"):
        env = {
            "SLURMD_NODENAME": me,
            "SLURMFM_HOST_ORDER": "n1 n2",
            "SLURMFM_NCCL_LOG": "/x/nccl-5/%h-%p.log",
        }
        assert node.main(["vllm", "serve", "m"], 0, "none", ray, env) == 0
    (r0, env0), (r1, env1) = seen
    assert (r0, r1) == (0, 1)
    assert env0["NCCL_DEBUG_FILE"] == "/x/nccl-5/%h-%p.log"
    assert env0["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert "NCCL_DEBUG_FILE" not in env1
    rec = RayCalls(call_rcs=[0], alive=["2"])
    run_ray_node(
        ["vllm", "serve", "m"],
        0,
        "10.0.0.1",
        "10.0.0.1",
        "ray",
        "python3",
        6379,
        1,
        60.0,
        env0,
        run=rec.run,
        call=rec.call,
        clock=lambda: 0.0,
        sleep=lambda s: None,
        launch=rec.launch,
        stop=rec.stop,
        make_temp=lambda prefix: "/nonexistent/ray-temp",
    )
    assert rec.calls[0][1]["NCCL_DEBUG_FILE"] == "/x/nccl-5/%h-%p.log"
    assert rec.launched[0][1]["NCCL_DEBUG_FILE"] == "/x/nccl-5/%h-%p.log"


def test_container_remove_earlier_takes_the_jobs_earlier_attempts_only() -> None:
    """Issue 37: a restart removes what its job's earlier attempts left in the same role (a
    scancel past KillWait, a node reboot), whatever the scope Pyxis named them with; not its
    own, not another role's, not another job's."""
    listed = [
        "pyxis_slurmfm-7-0-launch",
        "pyxis_7_slurmfm-7-1-launch",
        "pyxis_slurmfm-7-2-launch",  # this attempt's
        "pyxis_slurmfm-7-0-serve",
        "pyxis_slurmfm-17-0-launch",
        "pyxis_slurmfm-7-10-launch",
    ]
    removed: list[str] = []

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        if list(argv) == ["enroot", "list"]:
            return 0, "\n".join(listed) + "\n"
        removed.append(argv[-1])
        return 0, ""

    gone = node.container_remove("slurmfm-7-2-launch", run, earlier=True)
    assert gone == removed == ["pyxis_slurmfm-7-0-launch", "pyxis_7_slurmfm-7-1-launch"]
    assert node.container_remove("not-ours", run, earlier=True) == []


def test_a_ray_heads_own_ray_goes_at_the_term_before_its_launcher_ends(tmp_path: Path) -> None:
    """Slurm SIGKILLs a cancelled step's processes KillWait after the TERM (the lab's 5 s): a
    head that stopped its Ray only once its launcher had ended left the daemons running (seen
    in a CI simulation). ``first_on_term`` runs at the TERM, before the launcher is told."""
    import threading

    told = tmp_path / "launcher-told"
    ready = tmp_path / "launcher-ready"
    child = (
        "import pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: pathlib.Path({str(told)!r}).touch()"
        " or sys.exit(3))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    seen: list[bool] = []

    def term_once_ready() -> None:
        while not ready.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=term_once_ready, daemon=True).start()
    rc = node.run_launcher(
        [sys.executable, "-c", child],
        "none",
        dict(os.environ),
        first_on_term=lambda: seen.append(told.exists()),
    )
    assert rc == 3
    assert told.exists()
    assert seen == [False]  # it ran once, before the launcher had the TERM
