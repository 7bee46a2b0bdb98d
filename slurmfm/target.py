"""Version policy: which Slurm a script is rendered for, and what is assumed when nobody asked.

Why its own module: the planner (``--segment`` needs 24.05+), the renderer and the CLI all need
the same answer, and the planner must not import the renderer to get it (jinja2 and the
templates are no business of ``slurmfm plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.recipe.schema import Recipe

# Default Slurm version per flavor when the recipe says "auto" and no cluster was asked.
# Conservative on purpose: an assumed version only ever removes options.
# Sources: ParallelCluster 3.14 ships 24.11.6, 3.15 ships 25.11.4
# (aws/aws-parallelcluster-cookbook:CHANGELOG.md); PCS offers 23.11-25.11
# (https://docs.aws.amazon.com/pcs/latest/userguide/doc-history.html); HyperPod partition
# topology needs 25.11; Debian 12 ships 22.05 (https://packages.debian.org/bookworm/slurm-wlm).
ASSUMED_VERSION = {
    "parallelcluster": "24.11",
    "pcs": "24.11",
    "hyperpod": "24.11",
    "generic": "22.05",
}


@dataclass(frozen=True)
class Target:
    """What the script is rendered for: the Slurm version and whether it was probed."""

    slurm_version: SlurmVersion
    assumed: bool = False

    @classmethod
    def for_recipe(cls, recipe: Recipe, probed: str | None = None) -> Target:
        """The recipe's pinned version, else the probed one, else the flavor's assumption."""
        from slurmfm.catalog.slurm_features import SlurmVersion

        if recipe.cluster.slurm_version != "auto":
            return cls(SlurmVersion.parse(recipe.cluster.slurm_version))
        if probed:
            return cls(SlurmVersion.parse(probed))
        return cls(SlurmVersion.parse(ASSUMED_VERSION[recipe.cluster.flavor]), assumed=True)
