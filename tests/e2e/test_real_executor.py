"""fm.Executor on real Slurm: a research script outside the checkout submits its own
functions; torchrun runs them on 2 nodes; result() returns rank 0's value or raises JobFailed
with the function's exception."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from lab import REPO_ROOT, SlurmLab

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

SCRIPT = """\
import os
import slurmfm.api as fm


def work(x, scale=1):
    return {"value": x * scale, "rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"])}


def boom():
    raise ValueError("bad input 42")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    ex = fm.Executor({
        "name": "fn",
        "cluster": {"partition": "batch", "instance_type": "lab-cpu"},
        "resources": {"nodes": 2, "procs_per_node": 1, "time_limit": "5", "exclusive": False},
        "env": {"OMP_NUM_THREADS": 1},
        "resilience": {"requeue": False},
        "storage": {"checkpoint_root": f"{here}/ckpt", "log_dir": f"{here}/logs"},
    }, experiment="fns")
    good, bad = ex.submit(work, 21, scale=2), ex.submit(boom)
    print("result", good.result(timeout=300))
    try:
        bad.result(timeout=300)
    except fm.JobFailed as e:
        print("failed:", e.reason)
    print("runs", len(fm.history("fns")))
"""


def test_a_scripts_own_functions_run_as_jobs(host_b_lab: SlurmLab, tmp_path: Path) -> None:
    (tmp_path / "exp.py").write_text(SCRIPT)
    assert not tmp_path.is_relative_to(REPO_ROOT)
    env = {
        **host_b_lab.env,
        "PATH": f"{Path(sys.executable).parent}:{host_b_lab.env['PATH']}",
        "SLURMFM_HISTORY": str(tmp_path / "h" / "history.jsonl"),
    }
    proc = subprocess.run(
        [sys.executable, "exp.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "result {'value': 42, 'rank': 0, 'world': 2}",
        "failed: ValueError: bad input 42",
        "runs 2",
    ]
