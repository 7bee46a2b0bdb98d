"""A ``--constraint`` of ParallelCluster's own node features does not follow the recipe to PCS."""

from __future__ import annotations

from pathlib import Path

from render_helpers import rendered

from slurmfm.catalog.flavors import constraint_for_flavor
from slurmfm.recipe.loader import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_a_parallelcluster_constraint_is_left_out_after_a_change_to_pcs() -> None:
    pc = load_recipe(RECIPES / "llama3-8b-p5-fsdp.yaml")
    assert pc.cluster.constraints == "p5.48xlarge&efa"
    assert "#SBATCH --constraint=p5.48xlarge&efa" in rendered(pc).text
    pcs = load_recipe(RECIPES / "llama3-8b-p5-fsdp.yaml", {"cluster.flavor": "pcs"})
    out = rendered(pcs)
    assert "--constraint" not in out.text
    assert any(
        "efa, p5.48xlarge are features ParallelCluster sets" in w and "left out" in w
        for w in out.warnings
    )


def test_only_parallelclusters_own_features_are_dropped() -> None:
    assert constraint_for_flavor("bigmem&efa&gpu*2", "pcs")[0] == "bigmem"
    assert constraint_for_flavor("bigmem", "pcs") == ("bigmem", None)
    # an expression with OR/NOT is not edited term by term: removing one could widen it
    assert constraint_for_flavor("efa|bigmem", "pcs")[0] is None
    assert constraint_for_flavor("p6e-gb200.36xlarge", "pcs")[0] is None
    for flavor in ("parallelcluster", "generic", "hyperpod"):
        assert constraint_for_flavor("p5.48xlarge&efa", flavor) == ("p5.48xlarge&efa", None)
