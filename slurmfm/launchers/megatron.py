"""Megatron-LM: its pretrain entry point under torchrun.

It saves and exits on TERM (``--exit-signal-handler``, which slurmfm always passes), and its
completion is read from its own checkpoint tracker (``megatron:ITERS``), since Megatron
writes no slurmfm marker; where the recipe does not fix the iteration count, from Megatron's
own end-of-training line in the job log (``megatron-log``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from slurmfm.launchers.base import LauncherSpec, LaunchLine, section, torchrun_words
from slurmfm.strict import _Strict

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Recipe


class MegatronLauncher(_Strict):
    """Megatron-LM's pretrain entry point launched under torchrun."""

    kind: Literal["megatron"]
    megatron_path: str = "/workspace/Megatron-LM"
    entrypoint: str = "pretrain_gpt.py"
    model_args: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)
    python: str = "python3"
    rdzv_port: int | None = Field(default=None, ge=1024, le=65535)

    @field_validator("model_args")
    @classmethod
    def _names(
        cls, v: dict[str, str | int | float | bool | None]
    ) -> dict[str, str | int | float | bool | None]:
        reserved = {
            "tensor-model-parallel-size",
            "pipeline-model-parallel-size",
            "context-parallel-size",
            "expert-model-parallel-size",
            "save",
            "load",
            "exit-signal-handler",
        }
        for k in v:
            if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", k):
                raise ValueError(f"{k!r}: Megatron argument names look like 'num-layers'")
            if k in reserved:
                raise ValueError(
                    f"{k!r} is set by slurmfm from parallelism/storage; set it there instead"
                )
        return v


class MegatronSpec(LauncherSpec):
    torchrun = True
    kind = "megatron"
    save_interval_arg = "--save-interval"
    save_signal = "TERM"
    save_how = "TERM (--exit-signal-handler)"
    needs_gpus = True

    def save_interval(self, recipe: Recipe) -> int | None:
        """Megatron-LM's ``--save-interval`` (iterations) as the recipe passes it: a
        ``model_args`` entry or ``extra_args`` words (the last one wins, as argparse's)."""
        launcher = recipe.launcher
        value: object = (getattr(launcher, "model_args", None) or {}).get("save-interval")
        words = list(getattr(launcher, "extra_args", None) or [])
        for i, w in enumerate(words):
            if w == "--save-interval" and i + 1 < len(words):
                value = words[i + 1]
            elif w.startswith("--save-interval="):
                value = w.split("=", 1)[1]
        try:
            n = int(str(value))
        except ValueError:
            return None
        return n if n > 0 else None

    def launch(self, recipe: Recipe, checkpoint_dir_expr: str) -> LaunchLine:
        from slurmfm.quote import sh_quote

        L = section(recipe, MegatronLauncher)
        p = recipe.parallelism
        torchrun, common = torchrun_words(recipe, L.python)
        entry = L.megatron_path.rstrip("/") + "/" + L.entrypoint
        args = [
            # SIGTERM -> save a checkpoint and exit; slurmfm's save signal arrives as TERM.
            "--exit-signal-handler",
            f"--tensor-model-parallel-size={p.tp}",
            f"--pipeline-model-parallel-size={p.pp}",
            f"--context-parallel-size={p.cp}",
            f"--expert-model-parallel-size={p.ep}",
            f'--save="{checkpoint_dir_expr}"',
            f'--load="{checkpoint_dir_expr}"',
        ]
        for k, val in L.model_args.items():
            if val is None or val is True:
                args.append(f"--{k}")
            elif val is False:
                continue
            else:
                args.append(f"--{k} {sh_quote(str(val), what=f'launcher.model_args.{k}')}")
        args.extend(sh_quote(a, what="launcher.extra_args") for a in L.extra_args)
        return LaunchLine(
            [
                " ".join(torchrun),
                " ".join(common),
                sh_quote(entry, what="launcher.entrypoint"),
                *args,
            ],
            len(torchrun),
            "Megatron-LM under torchrun; --save/--load share the checkpoint directory",
        )

    def done_check(self, recipe: Recipe) -> str:
        """``megatron:ITERS`` where the recipe fixes Megatron's iteration count, else
        ``megatron-log``: Megatron's own end-of-training line (:data:`END_LINE`) in the
        launch's log, never a guessed count (a count too high requeues a finished run until
        the restart cap, then fails it)."""
        L = section(recipe, MegatronLauncher)
        if L.model_args.get("train-iters") not in (None, False):
            return f"megatron:{int(str(L.model_args['train-iters']))}"
        if L.model_args.get("train-samples") not in (None, False):
            # Run by samples (AWS's own Megatron sample does): Megatron turns them into
            # iterations itself and its tracker counts iterations, so the check does the
            # same arithmetic where it can.
            iters = train_iters(L.model_args, recipe.dp)
            if iters is not None:
                return f"megatron:{iters}"
        return "megatron-log"

    def forward(self, recipe: Recipe) -> str:
        return "TERM"  # --exit-signal-handler

    def checkpoint_format(self, recipe: Recipe) -> str | None:
        L = section(recipe, MegatronLauncher)
        value = L.model_args.get("ckpt-format")
        return str(value) if value is not None else None


END_LINE = "[after training is done]"
"""What Megatron-LM prints (rank 0) when training reached its iterations, and only then:
``print_datetime('after training is done')`` in ``pretrain`` after ``train`` returns; an early
exit (the save signal, ``--exit-interval``, ``--exit-duration-in-mins``) leaves through
``sys.exit`` inside ``train`` first (NVIDIA/Megatron-LM megatron/training/training.py)."""

_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def _schedule_number(text: str) -> int:
    """A threshold or batch size of ``--step-batch-size-schedule``, with Megatron's own
    suffixes (``StepBatchsizeNumMicroBatchesCalculator._parse_numeric_value``)."""
    t = text.strip().upper()
    mult = _SUFFIX.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def step_schedule(text: str, seq_length: int) -> list[tuple[int, int]] | None:
    """``--step-batch-size-schedule "THRESHOLD:BS ..."`` as (threshold in samples, batch size),
    or None when Megatron would refuse it.

    NVIDIA/Megatron-LM megatron/core/num_microbatches_calculator.py: entries split on spaces
    (commas too), thresholds with K/M/B/T suffixes, sorted; pretrain always passes
    ``seq_length`` (megatron/training/global_vars.py), so thresholds are tokens and become
    samples by ``// seq_length``; the first must be 0, thresholds strictly increasing, batch
    sizes positive.
    """
    out: list[tuple[int, int]] = []
    for entry in text.replace(",", " ").split():
        if ":" not in entry:
            return None
        t, _, b = entry.partition(":")
        out.append((_schedule_number(t) // seq_length, _schedule_number(b)))
    out.sort(key=lambda x: x[0])
    if not out or out[0][0] != 0 or any(b <= 0 for _, b in out):
        return None
    if any(out[i][0] <= out[i - 1][0] for i in range(1, len(out))):
        return None
    return out


def schedule_iters(schedule: Sequence[tuple[int, int]], samples: int) -> int:
    """Iterations Megatron trains ``samples`` for on a step schedule.

    ``update_train_iters`` (megatron/training/training.py): while consumed < train_samples,
    one iteration at the batch size of the last threshold <= consumed. Here a run of
    iterations at one batch size is counted at once, so a schedule of trillions of samples
    costs one step per threshold, not one per iteration.
    """
    iters = consumed = 0
    while consumed < samples:
        i = max(k for k, (t, _) in enumerate(schedule) if t <= consumed)
        bs = schedule[i][1]
        end = samples if i + 1 == len(schedule) else min(samples, schedule[i + 1][0])
        k = -(-(end - consumed) // bs)
        consumed += k * bs
        iters += k
    return iters


def train_iters(args: Mapping[str, object], dp: int) -> int | None:
    """The iterations Megatron-LM trains for ``--train-samples`` (None: not computable).

    Current NVIDIA/Megatron-LM (megatron/training/training.py ``update_train_iters``):
    with ``--step-batch-size-schedule`` the iterations the schedule takes to consume the
    samples (:func:`schedule_iters`; it needs ``seq-length``, which turns its token thresholds
    into samples); otherwise ``train_samples // global_batch_size``, ``global-batch-size``
    defaulting to micro-batch-size x dp (megatron/training/arguments.py).

    ``--rampup-batch-size`` is not computable: current Megatron ignores it ("Deprecated. This
    argument is ignored", megatron/core/num_microbatches_calculator.py, since #4411) and trains
    at the constant batch, while an older Megatron ramps and trains more iterations; which one
    the image holds decides, so the completion check reads Megatron's end line instead.
    """
    try:
        samples = int(str(args["train-samples"]))
        if samples < 0 or args.get("rampup-batch-size") not in (None, False):
            return None
        sched = args.get("step-batch-size-schedule")
        if sched not in (None, False):
            seq = args.get("seq-length")
            if seq in (None, False) or int(str(seq)) <= 0:
                return None
            steps = step_schedule(str(sched), int(str(seq)))
            return None if steps is None else schedule_iters(steps, samples)
        gbs_arg = args.get("global-batch-size")
        if gbs_arg in (None, False):
            gbs = int(str(args.get("micro-batch-size", 1))) * dp
        else:
            gbs = int(str(gbs_arg))
    except (KeyError, ValueError, TypeError, OverflowError):
        return None
    return samples // gbs if gbs > 0 else None


MEGATRON = MegatronSpec()
