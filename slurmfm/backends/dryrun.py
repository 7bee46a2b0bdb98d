"""Dry-run: everything a submission would do, as an inspectable value, with nothing submitted.

Like TorchX's ``dryrun`` info, the object carries the exact script and the exact ``sbatch``
command line, so a research script can inspect or tweak before calling ``submit``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Recipe
    from slurmfm.recipe.sweep import SweepTask
    from slurmfm.render.script import RenderedScript


@dataclass(frozen=True)
class DryRunInfo:
    """What ``submit`` would run: the argv, the script on its stdin, and what it needs."""

    recipe: Recipe
    script: RenderedScript
    sbatch_argv: tuple[str, ...] = ("sbatch", "--parsable")
    needs_env: tuple[str, ...] = field(default_factory=tuple)
    creates_dirs: tuple[str, ...] = field(default_factory=tuple)
    # A sweep's array tasks (index, overrides, own recipe, run id); empty for a single job.
    tasks: tuple[SweepTask, ...] = field(default_factory=tuple)

    @property
    def text(self) -> str:
        return self.script.text

    def __str__(self) -> str:
        return self.script.text
