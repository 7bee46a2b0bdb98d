"""Node features each cluster flavor sets by itself, so that ``--constraint`` fits the flavor.

Why: a recipe written for ParallelCluster often says ``constraints: "p5.48xlarge&efa"``. Those
are features ParallelCluster writes on every node it defines: ``static`` or ``dynamic``, the
instance type (when the compute resource has one), the compute resource's name, ``efa`` when
EFA is enabled and ``gpu`` when the instance has GPUs (``ComputeResourceRenderer._features`` in
aws/aws-parallelcluster-cookbook:cookbooks/aws-parallelcluster-slurm/files/default/head_node_slurm/slurm/pcluster_slurm_config_generator.py).
AWS PCS writes no node features of its own: a compute node group's Slurm settings are the ones
its administrator sets (https://docs.aws.amazon.com/pcs/latest/userguide/slurm-custom-settings.html),
so after ``--set cluster.flavor=pcs`` such a constraint matches no node and the job pends for
ever ("Invalid feature specification" at submit). The renderer drops ParallelCluster's own
features from the expression for PCS, with a warning naming them.
"""

from __future__ import annotations

import re

__all__ = ["PARALLELCLUSTER_FEATURES", "SRC_PCLUSTER_FEATURES", "constraint_for_flavor"]

SRC_PCLUSTER_FEATURES = (
    "aws/aws-parallelcluster-cookbook:cookbooks/aws-parallelcluster-slurm/files/default/"
    "head_node_slurm/slurm/pcluster_slurm_config_generator.py (ComputeResourceRenderer._features)"
)
PARALLELCLUSTER_FEATURES = frozenset({"static", "dynamic", "efa", "gpu"})
"""The fixed feature names ParallelCluster sets (the instance type is the other one)."""

# An EC2 instance type name: family[generation][attributes].size (p5.48xlarge, p6e-gb200.36xlarge)
_INSTANCE_TYPE = re.compile(
    r"^[a-z][a-z0-9-]*\.(?:\d*x?large|metal(?:-\d+xl)?|medium|small|micro|nano)$"
)

# Flavors whose nodes carry none of ParallelCluster's own features.
_NO_PCLUSTER_FEATURES = frozenset({"pcs"})


def _is_pcluster_feature(word: str) -> bool:
    return word in PARALLELCLUSTER_FEATURES or bool(_INSTANCE_TYPE.match(word))


def constraint_for_flavor(expr: str | None, flavor: str) -> tuple[str | None, str | None]:
    """(the ``--constraint`` to emit, a warning or None) for ``expr`` on ``flavor``.

    Only an AND-list (``a&b&c``, optionally with ``*count``) is rewritten; an expression with
    ``|``, ``!``, brackets or parentheses that names ParallelCluster features is dropped whole,
    since removing a term from it could widen or invert what it asks.
    """
    if not expr or flavor not in _NO_PCLUSTER_FEATURES:
        return expr, None
    terms = expr.split("&")
    words = [re.sub(r"\*\d+$", "", t) for t in terms]
    every = (re.sub(r"\*\d+$", "", w) for w in re.split(r"[&|!()\[\],:]+", expr))
    own = [w for w in every if w and _is_pcluster_feature(w)]
    if not own:
        return expr, None
    simple = all(re.fullmatch(r"[A-Za-z0-9_.\-]+(\*\d+)?", t) for t in terms)
    kept = (
        "&".join(t for t, w in zip(terms, words, strict=True) if not _is_pcluster_feature(w))
        if simple
        else ""
    )
    why = (
        f"cluster.constraints: {', '.join(sorted(set(own)))} "
        f"{'is a feature' if len(set(own)) == 1 else 'are features'} ParallelCluster sets on its "
        f"nodes; {flavor} nodes carry none of them (slurmfm/catalog/flavors.py): "
        + (f"--constraint={kept} is kept" if kept else "--constraint is left out")
    )
    return kept or None, why
