"""Job dependencies: ``#SBATCH --dependency`` added to a rendered script once job ids are known.

Why in the script and not on sbatch's command line: every backend (the Slurm CLI and pyslurm's
``load_sbatch_options``) reads ``#SBATCH`` lines, and a script saved with ``-o`` then shows the
exact dependency it was submitted with. Why a separate step: ids exist only after the earlier
jobs were submitted, while rendering stays a pure function of the recipe.

Semantics (sbatch(1), ``--dependency``): ``afterok:ID`` starts after ID "successfully executed
(ran to completion with an exit code of zero)"; ``afternotok:ID`` after it "terminated in some
failed state"; ``afterany:ID`` after it terminated in any state; ``singleton`` once no other
job of the same name and user runs. Terms joined with ``,`` must all hold (only one separator
kind may be used, so slurmfm only uses ``,``). On an array job, ``afterok`` waits for every task.

"Once a job dependency fails due to the termination state of a preceding job, the dependent job
will never be run" (sbatch(1)): by default it then pends forever with reason
``DependencyNeverSatisfied``. ``--kill-on-invalid-dep=yes`` ends it instead (state CANCELLED),
so a failed pipeline leaves nothing behind in the queue.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from slurmfm.errors import RenderError
from slurmfm.render.quote import sbatch_value
from slurmfm.render.script import Directive

if TYPE_CHECKING:
    from slurmfm.render.script import RenderedScript

Condition = Literal["afterok", "afterany", "afternotok"]
CONDITIONS: tuple[str, ...] = get_args(Condition)

_ID = re.compile(r"^\d+$")


@dataclass(frozen=True)
class Dependency:
    """``terms``: (condition, job ids) pairs; all must hold (Slurm's ``,`` separator)."""

    terms: tuple[tuple[Condition, tuple[str, ...]], ...] = ()

    @classmethod
    def of(cls, pairs: list[tuple[Condition, str]]) -> Dependency:
        """Group ``[(condition, id), ...]`` by condition, in first-seen order."""
        grouped: dict[Condition, list[str]] = {}
        for cond, job_id in pairs:
            if cond not in CONDITIONS:
                raise RenderError(f"dependency: unknown condition {cond!r}")
            ids = grouped.setdefault(cond, [])
            if job_id not in ids:
                ids.append(job_id)
        return cls(tuple((c, tuple(ids)) for c, ids in grouped.items()))

    def expression(self, *, singleton: bool = False) -> str:
        parts = [f"{cond}:{':'.join(ids)}" for cond, ids in self.terms if ids]
        if singleton:
            parts.append("singleton")
        return ",".join(parts)

    def __bool__(self) -> bool:
        return any(ids for _, ids in self.terms)


def with_dependency(script: RenderedScript, dep: Dependency) -> RenderedScript:
    """The script with ``--dependency`` (merged with a recipe's ``singleton``) and, where the
    target Slurm has it, ``--kill-on-invalid-dep=yes``."""
    from slurmfm.catalog.slurm_features import supports

    if not dep:
        return script
    for _, ids in dep.terms:
        for job_id in ids:
            if not _ID.fullmatch(job_id):
                raise RenderError(f"dependency: {job_id!r} is not a Slurm job id")
    singleton = any(d.option == "dependency" and d.value == "singleton" for d in script.directives)
    expr = sbatch_value(dep.expression(singleton=singleton), what="dependency")
    new = [
        Directive(
            "dependency",
            expr,
            "start only when the jobs this one depends on ended as required (sbatch(1))",
        )
    ]
    if supports("kill_on_invalid_dep", script.target.slurm_version):
        new.append(
            Directive(
                "kill-on-invalid-dep",
                "yes",
                "a dependency that can never be met cancels this job instead of leaving it "
                "pending (DependencyNeverSatisfied)",
            )
        )
    lines = script.text.split("\n")
    sbatch_at = [i for i, line in enumerate(lines) if line.startswith("#SBATCH ")]
    if not sbatch_at:
        raise RenderError("dependency: the script has no #SBATCH lines to extend")
    # The singleton line (if any) is replaced by the merged expression; Slurm keeps only the
    # last --dependency it reads, so there must be exactly one.
    if "#SBATCH --dependency=singleton" in lines:
        i = lines.index("#SBATCH --dependency=singleton")
        start = i - 1 if i > 0 and lines[i - 1].startswith("# at most one running job") else i
        del lines[start : i + 1]
    sbatch_at = [i for i, line in enumerate(lines) if line.startswith("#SBATCH ")]
    at = sbatch_at[-1] + 1
    block: list[str] = []
    for d in new:
        if d.why:
            block.append(f"# {d.why}")
        block.append(f"#SBATCH {d.text}")
    lines[at:at] = block
    directives = tuple(d for d in script.directives if d.option != "dependency") + tuple(new)
    return dataclasses.replace(script, text="\n".join(lines), directives=directives)
