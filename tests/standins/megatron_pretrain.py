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
iteration is a multiple of N (the early exit 0 the completion check must not take for done).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


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
    it = start
    while it < total and not stop:
        time.sleep(0.1)
        it += 1
        if exit_interval and it % exit_interval == 0 and it < total:
            stop.append(0)
    if rank == 0 and save:
        os.makedirs(save, exist_ok=True)
        with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as fh:
            fh.write(str(it))
    say(("saved-on-term" if stop[0] else "exit-interval") if stop else "done", iteration=it)
    return 0


if __name__ == "__main__":
    sys.exit(main())
