"""The per-node entry: rank insertion, USR2 ignored for the launcher, TERM to its children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurmfm.job.node import children, node_addrs

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
