"""The validation warning for a launch of the user's own that would discard the job's order.

Why (issue 42 item 1): torchrun's ``--rdzv-backend=c10d`` (the AWS samples' choice) ranks the
nodes by its rendezvous, which sorts them by host name as text
(pytorch/pytorch:torch/distributed/elastic/rendezvous/dynamic_rendezvous.py; pytorch#150660),
not by the job's host order: the topology order the planner chose, or Slurm's, is lost and no
error says so. slurmfm's own torchrun launch uses a static rendezvous with ``--node-rank`` from
the host order; these words in a launcher's own fields (a wrapper ``script``, ``args``,
``extra_args``) would bring the c10d rendezvous back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurmfm.job.rankorder import c10d

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Recipe

FIX = (
    "remove it and use launcher.kind torchrun (or megatron): its static rendezvous gives each "
    "node --node-rank from the job's host order (topology order with a plan or "
    "--topology-order)"
)


def c10d_warnings(recipe: Recipe) -> list[str]:
    """One warning per launcher field whose words ask for torchrun's c10d rendezvous."""
    out: list[str] = []
    sections = [("launcher", recipe.launcher)]
    if recipe.serve is not None:
        sections.append(("serve.launcher", recipe.serve.launcher))
    for where, section in sections:
        for name, value in section.model_dump().items():
            words = [value] if isinstance(value, str) else value if isinstance(value, list) else []
            found = c10d([w for w in words if isinstance(w, str)])
            if found:
                out.append(
                    f"{where}.{name}: {found} makes torchrun rank the nodes by its rendezvous, "
                    "which sorts them by host name (pytorch/pytorch:torch/distributed/elastic/"
                    f"rendezvous/dynamic_rendezvous.py), not by the job's order: {FIX}"
                )
    return out
