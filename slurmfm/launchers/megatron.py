"""Megatron-LM: its pretrain entry point under torchrun.

It saves and exits on TERM (``--exit-signal-handler``, which slurmfm always passes), and its
completion is read from its own checkpoint tracker (``megatron:ITERS``), since Megatron
writes no slurmfm marker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from slurmfm.launchers.base import LauncherSpec, LaunchLine, section, torchrun_words
from slurmfm.recipe.strict import _Strict

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
    kind = "megatron"
    save_signal = "TERM"
    save_how = "TERM (--exit-signal-handler)"
    needs_gpus = True

    def launch(self, recipe: Recipe, checkpoint_dir_expr: str) -> LaunchLine:
        from slurmfm.render.quote import sh_quote

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
        L = section(recipe, MegatronLauncher)
        if L.model_args.get("train-iters") not in (None, False):
            return f"megatron:{int(str(L.model_args['train-iters']))}"
        if L.model_args.get("train-samples") not in (None, False):
            # Run by samples (AWS's own Megatron sample does): Megatron turns them into
            # iterations itself and its tracker counts iterations, so the check does the
            # same arithmetic.
            iters = train_iters(L.model_args, recipe.dp)
            if iters is not None:
                return f"megatron:{iters}"
        return "marker"

    def forward(self, recipe: Recipe) -> str:
        return "TERM"  # --exit-signal-handler

    def checkpoint_format(self, recipe: Recipe) -> str | None:
        L = section(recipe, MegatronLauncher)
        value = L.model_args.get("ckpt-format")
        return str(value) if value is not None else None


def train_iters(args: Mapping[str, object], dp: int) -> int | None:
    """The iterations Megatron-LM trains for ``--train-samples`` (None: not computable).

    NVIDIA/Megatron-LM megatron/training/training.py ``update_train_iters``: with a constant
    batch ``train_samples // global_batch_size``; with ``--rampup-batch-size START INCR
    SAMPLES`` one iteration per ramp batch while ``consumed <= SAMPLES``, then the rest at
    the full batch, the partial last batch dropped. The ramp's batch size follows
    megatron/core/num_microbatches_calculator.py (``RampupBatchsizeNumMicroBatchesCalculator``:
    ``START + int(consumed / (SAMPLES / increments)) * INCR``, the full batch past the ramp).
    ``global-batch-size`` defaults to micro-batch-size x dp, as in Megatron's arguments.
    """
    try:
        samples = int(str(args["train-samples"]))
        gbs_arg = args.get("global-batch-size")
        if gbs_arg in (None, False):
            gbs = int(str(args.get("micro-batch-size", 1))) * dp
        else:
            gbs = int(str(gbs_arg))
        ramp = args.get("rampup-batch-size")
        if gbs <= 0 or samples < 0:
            return None
        if ramp in (None, False):
            return samples // gbs
        words = ramp if isinstance(ramp, list) else str(ramp).split()
        start, incr, ramp_samples = (int(str(w)) for w in words)
    except (KeyError, ValueError, TypeError):
        return None
    if incr <= 0 or start <= 0 or gbs <= start or (gbs - start) // incr == 0:
        return samples // gbs
    per_increment = ramp_samples / ((gbs - start) // incr)
    iters = consumed = 0
    while consumed <= ramp_samples:
        consumed += min(gbs, start + int(consumed / per_increment) * incr)
        iters += 1
    return iters + max(0, samples - consumed) // gbs


MEGATRON = MegatronSpec()
