"""A ``--constraint`` of ParallelCluster's own node features does not follow the recipe to PCS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from render_helpers import rendered

from slurmfm.catalog.flavors import constraint_for_flavor, foreign_instance_types
from slurmfm.errors import RecipeError
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
    for flavor in ("parallelcluster", "generic"):
        assert constraint_for_flavor("p5.48xlarge&efa", flavor) == ("p5.48xlarge&efa", None)


def test_hyperpod_drops_parallelclusters_features_with_a_warning_that_says_unverified() -> None:
    """No AWS document or source shows HyperPod writing node features: unknown is dropped."""
    kept, why = constraint_for_flavor("p5.48xlarge&efa&bigmem", "hyperpod")
    assert kept == "bigmem"
    assert why is not None
    assert "HyperPod documents no node features" in why
    assert "unverified" in why
    assert "API_ClusterSlurmConfig" in why
    hp = load_recipe(RECIPES / "llama3-8b-p5-fsdp.yaml", {"cluster.flavor": "hyperpod"})
    out = rendered(hp)
    assert "--constraint" not in out.text
    assert any("HyperPod documents no node features" in w for w in out.warnings)


def test_a_constraint_naming_another_instance_type_is_refused_naming_both(tmp_path: Path) -> None:
    """`--set cluster.instance_type=p6-b200.48xlarge` on a p5 recipe: the job would land on p5
    nodes with a B200 profile (8 EFA expected, 32 found) and the gate would drain them all."""
    with pytest.raises(RecipeError) as err:
        load_recipe(
            RECIPES / "llama3-8b-p5-fsdp.yaml", {"cluster.instance_type": "p6-b200.48xlarge"}
        )
    (line,) = str(err.value).splitlines()
    assert "llama3-8b-p5-fsdp.yaml:" in line
    assert ": cluster.constraints: " in line
    assert "p5.48xlarge" in line
    assert "p6-b200.48xlarge" in line
    # the line points at the constraint in the file
    src = (RECIPES / "llama3-8b-p5-fsdp.yaml").read_text().splitlines()
    lineno = int(line.split("llama3-8b-p5-fsdp.yaml:")[1].split(":")[0])
    assert "constraints:" in src[lineno - 1]
    # the CLI: one line, exit 2
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmfm.cli",
            "validate",
            str(RECIPES / "llama3-8b-p5-fsdp.yaml"),
            "--set",
            "cluster.instance_type=p6-b200.48xlarge",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "cluster.constraints:" in proc.stderr
    assert "p6-b200.48xlarge" in proc.stderr
    # the recipe's own type, in any spelling the catalog knows, is fine; so is no type at all
    f = tmp_path / "r.yaml"
    for ok in ("ml.p5.48xlarge&efa", "P5.48XLARGE", "efa&gpu"):
        f.write_text(
            "name: r\ncluster:\n  instance_type: p5.48xlarge\n"
            f'  constraints: "{ok}"\nlauncher: {{kind: torchrun, script: /fsx/t.py}}\n'
        )
        assert load_recipe(f).cluster.constraints == ok


def test_foreign_instance_types_finds_every_other_type_in_any_expression() -> None:
    assert foreign_instance_types("p5.48xlarge&efa", "p5.48xlarge") == []
    assert foreign_instance_types("p5.48xlarge|p5e.48xlarge", "p5.48xlarge") == ["p5e.48xlarge"]
    assert foreign_instance_types("[g5.xlarge*2&efa]", "p5.48xlarge") == ["g5.xlarge"]
    assert foreign_instance_types(None, "p5.48xlarge") == []
