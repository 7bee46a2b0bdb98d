"""NeMo 2.0: a ``nemo.collections.llm`` recipe run directly in each Slurm task.

One task per GPU, laid out in the job's host order, since Lightning takes the ranks from
Slurm (``SLURM_PROCID``); the program is a small driver the script holds in a heredoc. On the
save signal the tasks themselves get TERM, on which NeMo's ``PreemptionCallback`` (added by
the driver) stops the trainer and ``ModelCheckpoint`` saves the last checkpoint.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from slurmfm.launchers.base import LauncherSpec, LaunchLine, section
from slurmfm.strict import _Strict

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Recipe


class NemoLauncher(_Strict):
    """NeMo 2.0 ``nemo.collections.llm`` recipe run directly in each Slurm task."""

    kind: Literal["nemo"]
    recipe: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="e.g. llama3_8b")
    task: Literal["pretrain", "finetune"] = "pretrain"
    overrides: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict,
        description="dotted recipe attributes, e.g. {'trainer.max_steps': 1000}",
    )
    python: str = "python3"

    @field_validator("overrides")
    @classmethod
    def _dotted(
        cls, v: dict[str, str | int | float | bool | None]
    ) -> dict[str, str | int | float | bool | None]:
        reserved = {
            "trainer.num_nodes",
            "trainer.devices",
            "trainer.strategy.tensor_model_parallel_size",
            "trainer.strategy.pipeline_model_parallel_size",
            "trainer.strategy.context_parallel_size",
            "trainer.strategy.expert_model_parallel_size",
        }
        for k in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", k):
                raise ValueError(f"{k!r}: override keys are dotted attribute paths")
            if k in reserved:
                raise ValueError(
                    f"{k!r} is set by slurmfm from resources/parallelism (where it is "
                    "validated); set it there instead"
                )
        return v


class NemoSpec(LauncherSpec):
    kind = "nemo"
    save_signal = "TERM"
    save_how = "TERM (NeMo's PreemptionCallback)"
    needs_gpus = True
    task_per_gpu = True
    why_tasks = "one task per GPU (NeMo/Lightning reads Slurm ranks)"
    forward_tasks = True

    def launch(self, recipe: Recipe, checkpoint_dir_expr: str) -> LaunchLine:
        from slurmfm.quote import sh_quote

        L = section(recipe, NemoLauncher)
        return LaunchLine(
            [f'{sh_quote(L.python, what="launcher.python")} -c "$SLURMFM_NEMO_DRIVER"'],
            0,
            "NeMo 2.0 recipe, one Slurm task per GPU",
        )

    def forward(self, recipe: Recipe) -> str:
        return "TERM" if recipe.save_on_signal else "none"  # PreemptionCallback

    def driver(self, recipe: Recipe, checkpoint_dir_expr: str) -> str | None:
        """Python source run in every task; user values enter as JSON literals."""
        import json

        L = section(recipe, NemoLauncher)
        p = recipe.parallelism
        settings = {
            "trainer.strategy.tensor_model_parallel_size": p.tp,
            "trainer.strategy.pipeline_model_parallel_size": p.pp,
            "trainer.strategy.context_parallel_size": p.cp,
            "trainer.strategy.expert_model_parallel_size": p.ep,
            **L.overrides,
        }
        # json.dumps gives valid Python literals for str/int/float; true/false/null are mapped.
        lit = json.dumps(settings, sort_keys=True)
        from slurmfm.job.safepath import SAFE_PATH

        # `python -c` puts the working directory first on sys.path (slurmfm/job/safepath.py)
        return (
            SAFE_PATH + "\n"
            "import json, os\n"
            "from nemo.collections import llm\n"
            "import nemo_run as run\n"
            f"factory = getattr(llm, {json.dumps(L.recipe)})\n"
            f"recipe = getattr(factory, {json.dumps(L.task + '_recipe')})(\n"
            f"    name={json.dumps(recipe.name)}, dir=os.environ['SLURMFM_CHECKPOINT_DIR'],\n"
            f"    num_nodes={recipe.resources.nodes}, num_gpus_per_node={recipe.procs_per_node})\n"
            f"for dotted, value in json.loads({json.dumps(lit)}).items():\n"
            "    obj = recipe\n"
            "    *parents, leaf = dotted.split('.')\n"
            "    for part in parents:\n"
            "        obj = getattr(obj, part)\n"
            "    setattr(obj, leaf, value)\n"
            + (
                "# pre-timeout save: on TERM PreemptionCallback stops, ModelCheckpoint saves last\n"
                "from nemo.lightning.pytorch.callbacks import PreemptionCallback\n"
                "cbs = list(recipe.trainer.callbacks or [])\n"
                "if not any(getattr(c, '__fn_or_cls__', None) is PreemptionCallback"
                " for c in cbs):\n"
                "    recipe.trainer.callbacks = cbs + [run.Config(PreemptionCallback)]\n"
                if recipe.save_on_signal
                else ""
            )
            + "# resume from the newest checkpoint in the run directory when one exists\n"
            "recipe.resume = run.Config(llm.AutoResume, resume_if_exists=True,\n"
            "                           resume_ignore_no_checkpoint=True)\n"
            "run.run(recipe, direct=True)\n"
        )


NEMO = NemoSpec()
