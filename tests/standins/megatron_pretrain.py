"""Stands in for Megatron-LM's ``pretrain_gpt.py`` where Megatron is not the subject: what
slurmfm's save signal does to a Megatron job (a launch in a container, the TERM from the host).

It follows Megatron-LM's documented contract (NVIDIA/Megatron-LM
``megatron/training/training.py``, ``--exit-signal-handler``: on SIGTERM the training saves a
checkpoint at the current iteration and exits 0; ``megatron/training/checkpointing.py``: the
iteration of the last save is written to ``latest_checkpointed_iteration.txt`` in ``--save``).
It "trains" one iteration per 0.1 s, prints one JSON line per event, and ends at
``--train-iters``. Standard library only, so it starts at once.

Also as Megatron does (same file): it resumes from the tracker in ``--load``; ``--train-samples``
without ``--train-iters`` trains ``train_samples // global_batch_size`` iterations
(``update_train_iters``, constant batch); ``--exit-interval N`` saves and exits 0 when the
iteration is a multiple of N (the early exit 0 the completion check must not take for done);
rank 0 prints Megatron's end line ``[after training is done] datetime: ...`` only when every
iteration ran (``pretrain``: ``print_datetime('after training is done')``).
The last rank prints Megatron's iteration line every ``--log-interval`` iterations (default
100), as ``training_log`` does through ``print_rank_last``:
`` [YYYY-MM-DD HH:MM:SS] iteration        N/       M | consumed samples: ... |``.

What a test makes go wrong, through the environment (imports nothing of slurmfm):

* ``STANDIN_FAIL=RANK:ITER``: that rank dies after ITER iterations, once per checkpoint
  directory (a marker there), with the error an NCCL watchdog timeout raises
  (``torch.distributed.DistBackendError``) and exit 1;
* ``STANDIN_IMPORT_FAIL=NODE``: on that node every worker imports ``flash_attn`` first, which
  the image lacks (``ModuleNotFoundError``);
* ``STANDIN_STARTUP_S=S``: S seconds before the first iteration (a data index build, a large
  checkpoint load).

No rank iterates before every rank of the launch has started (a directory in ``--save``
stands in for torch.distributed's rendezvous).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import datetime


def arg(name: str, default: str = "") -> str:
    for i, word in enumerate(sys.argv):
        if word == name and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return default


def main() -> int:
    rank = int(os.environ.get("RANK", "0"))
    save = arg("--save")
    total = int(arg("--train-iters", "0"))
    if not total and arg("--train-samples"):
        total = int(arg("--train-samples")) // int(arg("--global-batch-size", "1"))
    total = total or 1000000
    exit_interval = int(arg("--exit-interval", "0"))
    start = 0
    tracker = os.path.join(arg("--load"), "latest_checkpointed_iteration.txt")
    if arg("--load") and os.path.exists(tracker):
        with open(tracker) as fh:
            start = int(fh.read().strip() or 0)
    stop = []
    if "--exit-signal-handler" in sys.argv:
        signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))

    def say(event: str, **kw: object) -> None:
        rec = {"event": event, "rank": rank, "node": os.environ.get("SLURMD_NODENAME", "?")}
        print(json.dumps({**rec, **kw}), flush=True)

    say("start", usr2_ignored=signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN, iteration=start)
    if os.environ.get("STANDIN_IMPORT_FAIL") == os.environ.get("SLURMD_NODENAME"):
        import flash_attn  # type: ignore[import-not-found]  # noqa: F401  # not in the image
    time.sleep(float(os.environ.get("STANDIN_STARTUP_S", "0") or 0))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if save and world > 1:
        # torch.distributed's init: no rank trains before every rank has joined (a rank that
        # failed its import never does); each launch step meets in a directory of its own
        step = os.environ.get("SLURM_JOB_ID", "0") + "." + os.environ.get("SLURM_STEP_ID", "0")
        rdzv = os.path.join(save, ".standin-rdzv", step)
        os.makedirs(rdzv, exist_ok=True)
        open(os.path.join(rdzv, str(rank)), "w").close()
        while len(os.listdir(rdzv)) < world and not stop:
            time.sleep(0.05)
    fail_rank, _, fail_at = os.environ.get("STANDIN_FAIL", "").partition(":")
    marker = os.path.join(save or ".", "standin-failed-once")
    last = rank == world - 1
    log_interval = int(arg("--log-interval", "100"))
    it = start
    while it < total and not stop:
        time.sleep(0.1)
        it += 1
        if last and it % log_interval == 0:
            now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            print(
                f" [{now}] iteration {it:8d}/{total:8d} | consumed samples: {it:12d} |", flush=True
            )
        if fail_at and str(rank) == fail_rank and it >= int(fail_at) and not os.path.exists(marker):
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "w").close()
            err = "torch.distributed.DistBackendError"
            print(
                f"{err}: [Rank {rank}] NCCL watchdog thread terminated with exception: "
                f"[Rank {rank}] Watchdog caught collective operation timeout",
                file=sys.stderr,
                flush=True,
            )
            return 1
        if exit_interval and it % exit_interval == 0 and it < total:
            stop.append(0)
    if rank == 0 and save:
        os.makedirs(save, exist_ok=True)
        with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as fh:
            fh.write(str(it))
    say(("saved-on-term" if stop[0] else "exit-interval") if stop else "done", iteration=it)
    if not stop and rank == 0:
        # pretrain's print_datetime('after training is done'), only after the last iteration
        print(f"[after training is done] datetime: {time.strftime('%Y-%m-%d %H:%M:%S')} ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
