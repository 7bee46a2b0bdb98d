"""torchrun: any torch.distributed script, one torchrun per node with a static rendezvous.

Its training saves on USR2 through :class:`slurmfm.checkpoint.SaveRequest` and marks its end
with :func:`slurmfm.checkpoint.mark_done` (the ``marker`` completion check).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from slurmfm.launchers.base import (
    LauncherSpec,
    LaunchLine,
    python_module,
    section,
    torchrun_words,
)
from slurmfm.strict import _Strict

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Recipe


class TorchrunLauncher(_Strict):
    """Any torch.distributed script, one torchrun per node with a static rendezvous."""

    kind: Literal["torchrun"]
    script: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    python: str = Field(default="python3", min_length=1)
    module: bool = Field(default=False, description="run `script` as a module (python -m)")
    rdzv_port: int | None = Field(
        default=None, ge=1024, le=65535, description="fixed port; default derives from job id"
    )


class TorchrunSpec(LauncherSpec):
    torchrun = True
    kind = "torchrun"

    def launch(self, recipe: Recipe, checkpoint_dir_expr: str) -> LaunchLine:
        from slurmfm.quote import sh_quote

        L = section(recipe, TorchrunLauncher)
        torchrun, common = torchrun_words(recipe, L.python)
        script = sh_quote(L.script, what="launcher.script")
        # torchrun's own -m runs each worker as `python -u -m MODULE`, which puts the working
        # directory first on sys.path: the worker runs the module off it instead (torchrun's
        # --no-python runs `training_script training_script_args` as given; pytorch/pytorch:
        # torch/distributed/run.py, config_from_args).
        if L.module:
            py, c, code, mod = python_module(L.python, L.script)
            target = ["--no-python", py, "-u", c, code, mod]
        else:
            target = [script]
        user_args = " ".join(sh_quote(a, what="launcher.args") for a in L.args)
        return LaunchLine(
            [
                " ".join(torchrun),
                " ".join(common),
                " ".join(target),
                *([user_args] if user_args else []),
            ],
            len(torchrun),
            "torchrun, static rendezvous, node rank from the job's host order",
        )

    def host_script(self, recipe: Recipe) -> str | None:
        L = section(recipe, TorchrunLauncher)
        return None if L.module or recipe.container is not None else L.script


TORCHRUN = TorchrunSpec()
