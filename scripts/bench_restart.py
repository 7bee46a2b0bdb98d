#!/usr/bin/env python3
"""Time from a failure to training resumed: restart inside the allocation vs requeue.

On a running lab (``scripts/slurm-lab up``; pass its directory), the quickstart's real torch
training (gloo, real torchrun) raises a RuntimeError once at step 12, after its step-10
checkpoint (tests/resilience/train_faults.py). Measured from the job log, polled every 0.1 s:
from the moment the fault's line appears to the first training step after the resume. The two
modes alternate in one run (``resilience.restart_in_job`` true, then false), so both see the
same machine; medians and their ratio are printed. Nothing is forced: the requeued job waits
for whatever Slurm makes it wait (the credential lifetime, then the scheduler).

    SLURMFM_LAB_ROOT=... scripts/slurm-lab up
    .venv/bin/python scripts/bench_restart.py --lab "$SLURMFM_LAB_ROOT/host" --runs 3
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.lab import lab_env  # noqa: E402

FAULTS = REPO / "tests" / "resilience" / "train_faults.py"
EVENT = re.compile(r'\{"event"[^{}]*\}')


def events(path: Path) -> list[dict[str, object]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for m in EVENT.finditer(text):
        try:
            out.append(json.loads(m.group(0)))
        except ValueError:
            continue
    return out


def one(env: dict[str, str], tmp: Path, in_job: bool, timeout: float) -> float:
    """Seconds from the fault to the first step after the resume."""
    sets = [
        f"storage.checkpoint_root={tmp}/ckpt",
        f"storage.log_dir={tmp}/logs",
        f"launcher.script={FAULTS}",
        f"env.TEST_FAULT=raise:12:{tmp / 'once'}",
        "launcher.args=[--steps, '40', --checkpoint-every, '5']",
        "resilience.max_restarts=2",
        f"resilience.restart_in_job={'true' if in_job else 'false'}",
    ]
    cmd = [str(Path(sys.executable).parent / "slurmfm"), "submit", "recipes/quickstart.yaml"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    job = proc.stdout.strip().splitlines()[-1]
    log = tmp / "logs" / f"quickstart_{job}.out"
    deadline = time.monotonic() + timeout
    t_fault = None
    try:
        while time.monotonic() < deadline:
            ev = events(log)
            if t_fault is None and any(e.get("event") == "fault" for e in ev):
                t_fault = time.monotonic()
            if t_fault is not None:
                resumed = [i for i, e in enumerate(ev) if e.get("event") == "resume"]
                if resumed and any(e.get("event") == "step" for e in ev[resumed[0] :]):
                    return time.monotonic() - t_fault
            time.sleep(0.1)
    finally:
        subprocess.run(["scancel", job], env=env, check=False)
    raise SystemExit(f"job {job}: no resume within {timeout:g} s (see {log})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab", required=True, help="a running lab's directory")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    env = lab_env(a.lab)
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-restart-", dir=a.lab) as d:
        for i in range(a.runs):
            for in_job in (True, False):
                tmp = Path(d) / f"{'injob' if in_job else 'requeue'}-{i}"
                tmp.mkdir()
                t = one(env, tmp, in_job, a.timeout)
                times[in_job].append(t)
                print(f"run {i + 1} {'in-job ' if in_job else 'requeue'}: {t:6.1f} s", flush=True)
    inj, req = statistics.median(times[True]), statistics.median(times[False])
    print(f"median failure -> training resumed: in-job {inj:.1f} s, requeue {req:.1f} s")
    print(f"requeue / in-job: {req / inj:.1f}x ({a.runs} runs each, alternating)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
