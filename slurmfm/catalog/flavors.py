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

SageMaker HyperPod: whether its nodes carry such features is not documented. HyperPod
writes the cluster's Slurm configuration itself; what an instance group may say about its
Slurm nodes is a node type and a partition name, nothing about features
(https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ClusterSlurmConfig.html), and
the AWS samples select an instance type by partition, never by ``--constraint``
(aws-samples/awsome-distributed-training:1.architectures/5.sagemaker-hyperpod). Unknown is
treated as absent: the features are dropped there too, with a warning that says the fact is
unverified (a feature an administrator did add is still kept when it is not one of
ParallelCluster's names).

The instance type named in a constraint must be the recipe's own
(:func:`foreign_instance_types`): a recipe moved to another instance type with ``--set`` would
otherwise keep asking for the old one, and the job would land on nodes of another shape than
the one every count in the script was computed for.
"""

from __future__ import annotations

import re

__all__ = [
    "PARALLELCLUSTER_FEATURES",
    "SRC_HYPERPOD_SLURM_CONFIG",
    "SRC_PCLUSTER_FEATURES",
    "constraint_for_flavor",
    "foreign_instance_types",
]

SRC_PCLUSTER_FEATURES = (
    "aws/aws-parallelcluster-cookbook:cookbooks/aws-parallelcluster-slurm/files/default/"
    "head_node_slurm/slurm/pcluster_slurm_config_generator.py (ComputeResourceRenderer._features)"
)
SRC_HYPERPOD_SLURM_CONFIG = (
    "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ClusterSlurmConfig.html"
)
PARALLELCLUSTER_FEATURES = frozenset({"static", "dynamic", "efa", "gpu"})
"""The fixed feature names ParallelCluster sets (the instance type is the other one)."""

# An EC2 instance type name: family[generation][attributes].size (p5.48xlarge, p6e-gb200.36xlarge)
_INSTANCE_TYPE = re.compile(
    r"^[a-z][a-z0-9-]*\.(?:\d*x?large|metal(?:-\d+xl)?|medium|small|micro|nano)$"
)

# Flavors whose nodes carry none of ParallelCluster's own features: known (PCS) or not
# documented anywhere (HyperPod), with what the warning says of each.
_NO_PCLUSTER_FEATURES = {
    "pcs": "pcs nodes carry none of them",
    "hyperpod": (
        "HyperPod documents no node features (its Slurm settings are a node type and a "
        f"partition: {SRC_HYPERPOD_SLURM_CONFIG}), so they are taken as absent (unverified); "
        "select nodes by cluster.partition there"
    ),
}


def _is_pcluster_feature(word: str) -> bool:
    return word in PARALLELCLUSTER_FEATURES or bool(_INSTANCE_TYPE.match(word))


def _words(expr: str) -> list[str]:
    """Feature names of a constraint expression, operators and ``*count`` removed."""
    every = (re.sub(r"\*\d+$", "", w) for w in re.split(r"[&|!()\[\],:]+", expr))
    return [w for w in every if w]


def foreign_instance_types(expr: str | None, instance_type: str) -> list[str]:
    """Instance type names in ``expr`` other than ``instance_type`` (canonical spelling).

    A name the catalog knows is compared by its canonical form (``ml.`` prefix and case do not
    matter); any other instance-type-shaped name is foreign by definition.
    """
    from slurmfm.catalog.instances import UnknownInstanceType, get_instance

    out: list[str] = []
    for w in _words(expr or ""):
        if not _INSTANCE_TYPE.match(w):
            continue
        try:
            name = get_instance(w).name
        except UnknownInstanceType:
            name = w
        if name != instance_type and w not in out:
            out.append(w)
    return out


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
    own = [w for w in _words(expr) if _is_pcluster_feature(w)]
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
        f"nodes; {_NO_PCLUSTER_FEATURES[flavor]} (slurmfm/catalog/flavors.py): "
        + (f"--constraint={kept} is kept" if kept else "--constraint is left out")
    )
    return kept or None, why
