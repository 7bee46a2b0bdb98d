"""What the job does when its step ends: finish, requeue, or fail (pure; no I/O).

The rules, in order:

1. The pre-timeout signal came: the job requeues (the training saved, or saves periodically),
   unless the work is finished. The save is claimed only on proof: a new complete checkpoint
   (``latest``) or a moved Megatron tracker since the step started. A step that ended
   without one after the signal is a failed save, recorded as such; the job still requeues
   from the last checkpoint on disk.
2. The step failed: what :func:`slurmfm.job.classify.classify` makes of the evidence (the
   nodes' reports, srun's lines, progress during the attempt, the last attempt's signature);
   without evidence, the exit-code rule: requeue when a node is gone, when a process was
   killed by a signal (exit > 128: srun reports a task killed by SIGKILL as 137, by TERM as
   143; a cgroup OOM, though, ends srun with exit 1: SchedMD/slurm src/srun/srun.c maps
   ``SIG_OOM`` to 1) or when the exit code is one the recipe marks retryable; otherwise fail
   at once.
3. The step exited 0: finished when the completion check agrees (Megatron-LM also exits 0 after
   ``--exit-duration-in-mins``), else requeue to continue.

A requeue past the restart cap, or with requeue off, is a give-up: the job must end FAILED
(never COMPLETED 0:0, which would start ``afterok`` stages on unfinished work).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

# The completion marker's rules live with the run directory's others (.checkpoint); the
# batch step asks them here.
from .checkpoint import marker_stamp as marker_stamp  # noqa: PLC0414 - re-exported
from .checkpoint import marker_verdict as marker_verdict  # noqa: PLC0414 - re-exported

if TYPE_CHECKING:
    from .classify import Verdict

GIVE_UP_EXIT = 3


class Decision(NamedTuple):
    action: str  # "finished" | "requeue" | "fail"
    reason: str
    exit_code: int


def decide(
    rc: int,
    signalled: bool,
    finished: bool | None,
    unresponsive: Sequence[str] = (),
    retryable: Sequence[int] | None = None,
    hyperpod: bool = False,
    verdict: Verdict | None = None,
    saved: str | None = None,
) -> Decision:
    """The decision before the restart cap is applied (see :func:`apply_cap`).

    ``finished`` is the completion check's answer (None: the launcher has no check, so exit 0
    counts as finished); ``retryable`` None means every non-zero exit is retried, otherwise
    exits above 128 (killed by a signal) and the listed ones are. ``verdict``: the evidence's
    judgement of a failed step (it replaces the exit-code rule). ``saved``: after the
    pre-timeout signal, the new checkpoint that proves the save ("" none appeared, None
    nothing to tell by).
    """
    if signalled:
        if rc == 0 and finished is not False and finished is not None:
            return Decision("finished", "exit 0 (all work done before the time limit)", 0)
        if saved:
            return Decision(
                "requeue", "saved before the time limit (training exit %d): %s" % (rc, saved), rc
            )
        if saved is None:
            return Decision(
                "requeue",
                "time limit near; requeued (training exit %d; no checkpoint to confirm a save)"
                % rc,
                rc,
            )
        return Decision(
            "requeue",
            "pre-timeout save failed (training exit %d, no new complete checkpoint); resuming "
            "from the last one" % rc,
            rc,
        )
    if rc != 0 and verdict is not None and not hyperpod:
        return Decision("requeue" if verdict.retry else "fail", verdict.reason, rc)
    if rc != 0:
        dead = " ".join(unresponsive)
        if dead:
            return Decision(
                "requeue", "step failed with exit %d; unresponsive: %s" % (rc, dead), rc
            )
        if hyperpod:
            # HyperPod's auto-resume replaces a faulty node and retries the step itself.
            return Decision("fail", "exit %d" % rc, rc)
        if retryable is None or rc in retryable:
            return Decision("requeue", "step failed with exit %d" % rc, rc)
        if rc > 128:  # a cgroup OOM is not among them: srun ends with exit 1 for it
            return Decision(
                "requeue", "step failed with exit %d (killed by signal %d)" % (rc, rc - 128), rc
            )
        return Decision(
            "fail",
            "exit %d (not a retryable exit code: a deterministic error such as a bad argument, "
            "an ImportError or an unknown srun option; see the job log; "
            "resilience.retry_exit_codes lists retryable ones)" % rc,
            rc,
        )
    if finished is False:
        return Decision("requeue", "exit 0 before the work was done (completion check)", 0)
    return Decision("finished", "exit 0", 0)


def apply_cap(d: Decision, restart: int, max_restarts: int, requeue_enabled: bool) -> Decision:
    """Turn a requeue past the cap (or with requeue off) into a failure with its reason."""
    if d.action != "requeue":
        return d
    if not requeue_enabled:
        return Decision("fail", f"requeue disabled: {d.reason}", d.exit_code or GIVE_UP_EXIT)
    if restart >= max_restarts:
        return Decision(
            "fail",
            "restart cap %d reached: %s" % (max_restarts, d.reason),
            d.exit_code or GIVE_UP_EXIT,
        )
    return d


def megatron_finished(checkpoint_dir: str, train_iters: int) -> bool | None:
    """Megatron-LM: finished when ``latest_checkpointed_iteration.txt`` reaches train_iters.

    Megatron writes the iteration of its last save there (megatron/training/checkpointing.py,
    ``get_checkpoint_tracker_filename``); ``release`` marks a released model.
    """
    import os

    path = os.path.join(checkpoint_dir, "latest_checkpointed_iteration.txt")
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            text = fh.read().strip()
    except OSError:
        return False
    if text == "release":
        return True
    try:
        return int(text) >= train_iters
    except ValueError:
        return False


MEGATRON_END = "[after training is done]"
"""Megatron-LM's end-of-training line (slurmfm/launchers/megatron.py ``END_LINE``)."""


def megatron_log_finished(lines: Sequence[str]) -> bool:
    """Megatron-LM: finished when its launch printed the end-of-training line.

    ``print_datetime('after training is done')`` runs only after ``train`` returned with
    every iteration done; the save signal, ``--exit-interval`` and ``--exit-duration-in-mins``
    leave through ``sys.exit`` before it (NVIDIA/Megatron-LM megatron/training/training.py).
    Used where the recipe does not fix the iteration count the tracker could be held to.
    """
    return any(MEGATRON_END in line for line in lines)
