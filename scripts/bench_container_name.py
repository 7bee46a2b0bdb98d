#!/usr/bin/env python3
"""What a named Pyxis container saves: steps of one job on real Pyxis and Enroot, with and
without ``--container-name``, medians and ratios from the same run.

A job's attempt runs several steps in the same image on every node (the in-container IMEX
check and the launch on GB200; a relaunch after an in-job restart; the save-signal forward
runs on the host). Unnamed, Pyxis creates the container again for each step: in its default
mode Enroot unpacks the image on every node (``enroot create``), with ``use_squashfuse=1`` it
mounts it. Named, the second step finds the container kept by the first and skips that
(NVIDIA/pyxis README, ``--container-name``). This times two steps in a row (``srun -N2
--container-image=IMG true``) in one allocation, both ways, alternating which goes first in
each round, in both Pyxis modes.

Needs root, the Pyxis lab of the real tier (``scripts/pyxis-lab build``, then
``SLURMFM_LAB_PYXIS=default scripts/slurm-lab --lab DIR up``; this script brings it up when it
is missing). The image is the test image (about 27 MB); a real NGC image (10-20 GB) takes
proportionally longer to unpack, so the saving measured here is a floor.

Usage: scripts/bench_container_name.py [--rounds 7] [--lab DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOT = Path(os.environ.get("SLURMFM_LAB_ROOT") or "/var/tmp/slurmfm-lab")
# the real tier's own Pyxis lab (tests/e2e/test_real_container_launch.py, PYXIS)
CTLD, SLURMD, NODES = 19107, 18701, 3


def lab_env(lab: Path) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-c", f". {lab}/env.sh && env -0"], capture_output=True, check=True
    ).stdout
    env = dict(kv.split("=", 1) for kv in out.decode().split("\0") if "=" in kv)
    env["PATH"] = f"{ROOT / 'pyxis' / 'prefix' / 'bin'}:{env['PATH']}"
    return env


def ensure_lab(lab: Path) -> None:
    off = int(os.environ.get("SLURMFM_LAB_PORT_OFFSET", "0") or 0)
    env = dict(
        os.environ,
        SLURMFM_LAB_PYXIS="default",
        SLURMFM_LAB_CTLD_PORT=str(CTLD + off),
        SLURMFM_LAB_SLURMD_PORT=str(SLURMD + off),
    )
    lab_cmd = [str(REPO / "scripts" / "slurm-lab"), "--lab", str(lab)]
    status = subprocess.run([*lab_cmd, "status"], env=env, capture_output=True, check=False)
    if status.returncode != 0:
        subprocess.run([*lab_cmd, "--nodes", str(NODES), "up"], env=env, check=True)


def timed(argv: list[str], env: dict[str, str]) -> float:
    t = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    took = time.monotonic() - t
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--lab", type=Path, default=ROOT / "pyxis-host")
    a = ap.parse_args()
    ensure_lab(a.lab)
    env = lab_env(a.lab)
    image = (ROOT / "pyxis" / "image.sqsh").as_posix()
    got = subprocess.run(
        ["salloc", "-N2", "--no-shell", "-p", "batch", "-t", "30"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    m = re.search(r"Granted job allocation (\d+)", got.stderr)
    if m is None:
        sys.exit("salloc: " + got.stderr)
    job = m.group(1)
    step = ["srun", f"--jobid={job}", "--overlap", "-N2", "--ntasks-per-node=1"]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for mode in ("default", "squashfuse"):
            subprocess.run(
                [str(REPO / "scripts" / "pyxis-lab"), "mode", str(a.lab), mode],
                env=dict(os.environ, SLURMFM_LAB_ROOT=str(ROOT)),
                check=True,
                capture_output=True,
            )
            for r in range(a.rounds):
                order = ("unnamed", "named") if r % 2 == 0 else ("named", "unnamed")
                for kind in order:
                    name = f"bench-{job}-{mode}-{r}"
                    opts = [f"--container-image={image}"]
                    if kind == "named":
                        opts.append(f"--container-name={name}")
                    first = timed([*step, *opts, "true"], env)
                    second = timed([*step, *opts, "true"], env)
                    results.setdefault((mode, kind), []).append((first, second))
                    if kind == "named":  # Pyxis keeps it: remove it as the runtime does
                        timed([*step, "enroot", "remove", "--force", "pyxis_" + name], env)
    finally:
        subprocess.run(["scancel", job], env=env, check=False)
    print(f"median of {a.rounds} rounds, seconds per srun step on 2 nodes (image {image}):")
    print(f"{'mode':<11} {'container':<9} {'1st step':>9} {'2nd step':>9} {'both':>7}")
    for (mode, kind), runs in results.items():
        f = statistics.median(x for x, _ in runs)
        s = statistics.median(y for _, y in runs)
        b = statistics.median(x + y for x, y in runs)
        print(f"{mode:<11} {kind:<9} {f:9.2f} {s:9.2f} {b:7.2f}")
    for mode in ("default", "squashfuse"):
        un = statistics.median(y for _, y in results[(mode, "unnamed")])
        na = statistics.median(y for _, y in results[(mode, "named")])
        print(f"{mode}: 2nd step named / unnamed = {na / un:.2f} (saves {un - na:.2f} s a step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
