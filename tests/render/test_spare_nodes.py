"""``resources.spare_nodes``: what the recipe accepts (located errors), and the script it gives:
N+K nodes allocated, the launch on the N of the host order, the spares known to the runtime."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from render_helpers import recipe, render, shellcheck
from test_render_rules import launch_line

from slurmfm.errors import RenderError, SlurmfmError
from slurmfm.plan.types import Placement
from slurmfm.recipe.loader import RecipeError, load_recipe

GOOD = """\
name: demo
cluster:
  instance_type: p5.48xlarge
  partition: gpu
resources:
  nodes: 4
  spare_nodes: {k}
parallelism:
  tp: 8
launcher:
  kind: torchrun
  script: /fsx/train.py
"""


def problems(tmp: Path, text: str) -> list[str]:
    f = tmp / "recipe.yaml"
    f.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(f)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    ("k", "expected"),
    [
        ("-1", ":7: resources.spare_nodes: Input should be greater than or equal to 0"),
        ("5", ":7: resources.spare_nodes: 5 spares for 4 training node(s): at most one spare"),
        ("two", ":7: resources.spare_nodes: Input should be a valid integer"),
    ],
)
def test_bad_spare_counts_are_refused_on_their_line(tmp_path: Path, k: str, expected: str) -> None:
    msgs = problems(tmp_path, GOOD.format(k=k))
    assert any(m.startswith(str(tmp_path / "recipe.yaml") + expected) for m in msgs), msgs


def test_spares_are_refused_beside_a_server_and_on_hyperpod() -> None:
    with pytest.raises(SlurmfmError, match=r"resources\.spare_nodes: HyperPod replaces"):
        recipe(resources__spare_nodes=1, cluster__flavor="hyperpod")
    with pytest.raises(SlurmfmError, match=r"resources\.spare_nodes: spares are for training"):
        recipe(
            resources__spare_nodes=1,
            launcher={"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"},
        )


def test_n_plus_k_allocated_the_launch_on_the_n_of_the_order(tmp_path: Path) -> None:
    r = recipe(resources__spare_nodes=1)
    text = render(r)
    shellcheck(text, tmp_path)
    assert "# 2 train, 1 stand by (the last in the host order)\n#SBATCH --nodes=3\n" in text
    # not --no-kill: with it a lost batch host would end the job FAILED, not requeued
    assert "--no-kill" not in text
    assert " --spare-nodes 1" in text  # the prepare step sets the last one aside
    words = shlex.split(launch_line(text).replace('"', ""))
    assert "--nodes=$SLURMFM_NNODES" in words
    assert "--ntasks=$SLURMFM_NNODES" in words
    assert "--nodelist=$SLURMFM_NODELIST" in words
    assert "--nnodes=2" in words  # torchrun's world is the N training nodes


def test_on_gb200_the_spares_share_the_nvlink_domain_and_divide_by_the_segment() -> None:
    gb200 = {"cluster__instance_type": "p6e-gb200.36xlarge", "parallelism": {"tp": 4}}
    # 16 + 2: one UltraServer of 18 holds the trainers and their spares
    text = render(recipe(resources__nodes=16, resources__spare_nodes=2, **gb200))
    assert "#SBATCH --nodes=18\n" in text
    assert "#SBATCH --segment=18\n" in text
    # a planned segment that does not divide N+K: Slurm would refuse it
    with pytest.raises(RenderError, match=r"--segment=18 must divide the 19 nodes allocated"):
        render(
            recipe(resources__nodes=18, resources__spare_nodes=1, **gb200),
            placement=Placement(segment=18),
        )


def test_without_spares_the_script_is_as_before() -> None:
    text = render(recipe())
    assert "#SBATCH --nodes=2\n" in text
    assert "--no-kill" not in text
    assert "--spare-nodes" not in text
    assert "--nodelist" not in launch_line(text)


def test_nemo_and_pinned_plans_take_spares_too() -> None:
    nemo = render(
        recipe(resources__spare_nodes=1, launcher={"kind": "nemo", "recipe": "llama3_8b"})
    )
    assert "#SBATCH --nodes=3" in nemo
    assert '--nodelist="$SLURMFM_TASK_NODELIST"' in launch_line(nemo)
    assert "num_nodes=2," in nemo  # NeMo's trainer is told the N training nodes
    pinned = render(
        recipe(resources__spare_nodes=1),
        placement=Placement(mode="pin", nodes=("p5-1", "p5-2")),
    )
    assert "#SBATCH --nodelist=p5-[1-2]" in pinned
    assert "#SBATCH --nodes=3" in pinned  # Slurm adds the spare to the planned nodes


def test_validate_names_the_spares(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurmfm.cli import main

    f = tmp_path / "recipe.yaml"
    f.write_text(GOOD.format(k=2))
    res = CliRunner().invoke(main, ["validate", str(f)])
    assert res.exit_code == 0, res.output
    assert "ok: demo, 4 x p5.48xlarge + 2 spare(s), world size 32 " in res.stdout
