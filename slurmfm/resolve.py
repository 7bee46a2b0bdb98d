"""Resolve a recipe once: (recipe, target Slurm version, placement) -> one frozen value.

Why (issue 43, "resolve once"): the renderer used to go back to the catalog for every part
of a script: the instance type was looked up again in the directives, the sweep table and
each helper of the script, the launcher's spec in each of them, and
``slurm_features.supports(version)`` was asked seven times along one render. Each lookup is
a climb from the formatting code back up to the facts, and each is a place where two parts
of one script could be rendered from different answers. :func:`resolve` asks each question
once; the renderer (:mod:`slurmfm.render`) formats what it holds.

Pure, like the renderer: no files, no processes. It sits below :mod:`slurmfm.render` (which
imports it) and above the catalog, the launchers, the plan's types and the recipe (which it
reads, on first use: at import time it needs only :mod:`slurmfm.target`), so no import runs
back up and it joins no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmfm.target import Target

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.launchers import LauncherSpec
    from slurmfm.plan.types import Placement
    from slurmfm.recipe.schema import Recipe


@dataclass(frozen=True, repr=False)
class ResolvedJob:
    """A recipe with its facts looked up: what every part of its script is rendered from.

    ``inst`` is the job's instance type (a heterogeneous job's component 0); ``serve_inst``
    the serving component's of a heterogeneous job (its own ``serve.instance_type``, else the
    job's), None for any other job; ``launcher`` the launcher kind's spec and
    ``tasks_per_node`` its answer for this recipe; ``supported`` the names of the Slurm
    features (:data:`slurmfm.catalog.slurm_features.FEATURES`) the target version has.
    """

    recipe: Recipe
    target: Target
    placement: Placement
    inst: InstanceType
    serve_inst: InstanceType | None
    launcher: LauncherSpec
    tasks_per_node: int
    supported: frozenset[str]

    @property
    def version(self) -> SlurmVersion:
        """The Slurm version the script is rendered for."""
        return self.target.slurm_version

    def supports(self, feature: str) -> bool:
        """Whether the target Slurm has ``feature`` (answered by :func:`resolve`); an unknown
        feature name raises ``KeyError``, as :func:`slurmfm.catalog.slurm_features.supports`."""
        from slurmfm.catalog.slurm_features import FEATURES

        if feature not in FEATURES:
            raise KeyError(feature)
        return feature in self.supported

    def __repr__(self) -> str:
        """Short: the recipe's name and what was resolved, not the whole recipe."""
        return (
            f"ResolvedJob({self.recipe.name!r}, {self.inst.name}, launcher={self.launcher.kind}, "
            f"slurm={self.version}{' (assumed)' if self.target.assumed else ''}, "
            f"placement={self.placement.mode})"
        )


def resolve(
    recipe: Recipe, target: Target | None = None, placement: Placement | None = None
) -> ResolvedJob:
    """Look up, once, the facts a recipe's script is rendered from (pure).

    ``target`` defaults to :meth:`slurmfm.target.Target.for_recipe` (the recipe's pinned
    version, else the flavor's assumption), ``placement`` to no plan."""
    from slurmfm.catalog.instances import get_instance
    from slurmfm.catalog.slurm_features import FEATURES, supports
    from slurmfm.launchers import spec
    from slurmfm.plan.types import Placement

    target = target or Target.for_recipe(recipe)
    inst = get_instance(recipe.cluster.instance_type)
    s = recipe.serve
    serve_inst = None
    if s is not None and s.placement == "hetjob":
        serve_inst = get_instance(s.instance_type) if s.instance_type else inst
    launcher = spec(recipe.launcher.kind)
    return ResolvedJob(
        recipe=recipe,
        target=target,
        placement=placement or Placement(),
        inst=inst,
        serve_inst=serve_inst,
        launcher=launcher,
        tasks_per_node=launcher.tasks_per_node(recipe),
        supported=frozenset(f for f in FEATURES if supports(f, target.slurm_version)),
    )
