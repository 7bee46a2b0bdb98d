"""The quickstart's real torch training (recipes/scripts/train_tiny.py, gloo) with one fault.

The fault comes from ``TEST_FAULT`` (a recipe ``env`` value, so the job carries it):

* ``import:R`` — the workers on node rank R fail at import time (``ModuleNotFoundError``, at
  the script's top level, before any ``@record`` runs: what a missing package does);
* ``raise:STEP:FILE`` — rank 0 raises ``RuntimeError`` at STEP, once (FILE marks it done);
* ``kill:STEP:FILE`` — rank 0's worker is killed with SIGKILL at STEP, once;
* ``hang:N:FILE`` — rank 1 stops at its N-th ``all_reduce`` (once): it sleeps, and every
  other rank waits inside that ``all_reduce`` (gloo's timeout is 30 minutes);
* ``save`` — the pre-timeout save fails (``OSError`` "Read-only file system"), as on a full or
  read-only checkpoint directory; periodic saves work. (A chmod would not show it: the tests
  run as root, whom no mode stops.)

The training itself is train_tiny's, unchanged: its ``main`` runs under torch's ``@record``
(pytorch/pytorch torch/distributed/elastic/multiprocessing/errors/__init__.py), so a worker's
exception reaches ``TORCHELASTIC_ERROR_FILE``; steps are hooked through the
``slurmfm.checkpoint`` calls train_tiny makes (``report_progress`` each step on rank 0,
``save`` per checkpoint).
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
from pathlib import Path

FAULT = os.environ.get("TEST_FAULT", "")
KIND, _, REST = FAULT.partition(":")

if os.environ.get("TEST_TIMELINE"):
    # Each worker's start (time, pid, rank), before torch's import: the benchmark
    # (scripts/bench_goodput.py) times a restart to it and finds the rank it stops there.
    import time

    with open(os.environ["TEST_TIMELINE"] + ".starts", "a") as fh:
        fh.write(f"{time.time():.3f} {os.getpid()} {os.environ.get('RANK', '?')}\n")

if KIND == "import" and os.environ.get("SLURMFM_NODE_RANK") == REST:
    print(json.dumps({"event": "fault", "node": os.environ.get("SLURMD_NODENAME")}), flush=True)
    import slurmfm_test_no_such_module  # type: ignore[import-not-found]  # noqa: F401

import torch  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from slurmfm import checkpoint as ck  # noqa: E402

TRAIN = Path(__file__).resolve().parents[2] / "recipes" / "scripts" / "train_tiny.py"


def once(path: str) -> bool:
    """True the first time only (the file marks that the fault happened)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    os.close(fd)
    return True


TIMELINE = os.environ.get("TEST_TIMELINE", "")
if TIMELINE:
    # The test's own clock of the training: every report (each step, each save's) with its
    # time and pid, unthrottled, in a file of the test's; the goodput ledger is checked on it.
    import time

    timed = ck.report_progress

    def timeline(step: int, **kw: object) -> bool:
        with open(TIMELINE, "a") as fh:
            fh.write(f"{time.time():.3f} {os.getpid()} {step} {kw.get('checkpoint_step')}\n")
        return timed(step, **kw)  # type: ignore[arg-type]

    ck.report_progress = timeline  # type: ignore[assignment]

if KIND in ("raise", "kill"):
    at, _, mark = REST.partition(":")
    report = ck.report_progress

    def hooked(step: int, **kw: object) -> bool:
        done = report(step, **kw)  # type: ignore[arg-type]
        if step == int(at) and once(mark):
            print(json.dumps({"event": "fault", "step": step}), flush=True)
            if KIND == "raise":
                raise RuntimeError(f"injected fault at step {step}")
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    ck.report_progress = hooked  # type: ignore[assignment]

if KIND == "hang":
    import time

    import torch.distributed as dist

    at, _, mark = REST.partition(":")
    reduce = dist.all_reduce
    calls = [0]

    def stuck(*a: object, **kw: object) -> object:
        calls[0] += 1
        if calls[0] == int(at) and dist.get_rank() == 1 and once(mark):
            print(json.dumps({"event": "fault", "hang": calls[0]}), flush=True)
            time.sleep(3600)
        return reduce(*a, **kw)  # type: ignore[arg-type]

    dist.all_reduce = stuck  # type: ignore[assignment]

if KIND == "save":
    import torch.distributed as dist

    save = ck.save
    requests: list[ck.SaveRequest] = []
    request = ck.SaveRequest
    agreed = [False]  # the ranks' all-reduce of the stop flag came back set
    reduce = dist.all_reduce

    def tracked(*a: object, **kw: object) -> ck.SaveRequest:
        r = request(*a, **kw)  # type: ignore[arg-type]
        requests.append(r)
        return r

    def flag_seen(tensor: torch.Tensor, *a: object, **kw: object) -> object:
        out = reduce(tensor, *a, **kw)  # type: ignore[arg-type]
        if tensor.numel() == 1 and float(tensor.item()) > 0:
            agreed[0] = True
        return out

    def failing(*a: object, **kw: object) -> object:
        # Only rank 0 saves, and the USR2 may have reached another rank first: the stop then
        # comes to rank 0 through train_tiny's all-reduce of the flag, not its own SaveRequest
        # (a CI simulation's save went through so, 2026-12-07).
        if agreed[0] or any(r.requested for r in requests):
            print(json.dumps({"event": "fault", "save": "read-only"}), flush=True)
            raise OSError(30, "Read-only file system")
        return save(*a, **kw)  # type: ignore[arg-type]

    ck.SaveRequest = tracked  # type: ignore[assignment,misc]
    ck.save = failing  # type: ignore[assignment]
    dist.all_reduce = flag_seen  # type: ignore[assignment]


@record
def main() -> None:
    runpy.run_path(str(TRAIN), run_name="__main__")


if __name__ == "__main__":
    sys.argv[0] = str(TRAIN)
    main()
