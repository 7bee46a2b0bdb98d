"""Planning train-and-serve and serving recipes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmfm.plan.planner import PlanError, plan_for_recipe
from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script
from slurmfm.topology.model import Topology


def tree(leaves: int, per_leaf: int) -> Topology:
    """Two spines; node names interleaved across leaves (launch order, not fabric order)."""
    paths = {}
    for i in range(leaves * per_leaf):
        leaf = i % leaves
        paths[f"p5-{i:03d}"] = ("core", f"spine{leaf % 2}", f"leaf{leaf}")
    return Topology.from_paths(paths)


def grpo(nodes: int, serve: int, **extra: Any) -> Any:
    return validate(
        {
            "name": "grpo",
            "cluster": {"instance_type": "p5.48xlarge", "slurm_version": "24.11"},
            "resources": {"nodes": nodes},
            "launcher": {"kind": "torchrun", "script": "t.py"},
            "serve": {
                "nodes": serve,
                "launcher": {"kind": "vllm", "model": "m"},
                "parallelism": {"tp": 8, "pp": serve},
                **extra,
            },
        }
    )


def test_split_plans_the_trainer_then_the_nearest_servers() -> None:
    topo = tree(leaves=4, per_leaf=4)
    p = plan_for_recipe(grpo(4, 1), topo)
    trainer, server = p.nodes[:3], p.nodes[3:]
    leaf = {n: topo.leaf_of[n] for n in p.nodes}
    # the trainer's 3 nodes sit under one leaf, and the server takes that leaf's 4th node
    assert len({leaf[n] for n in trainer}) == 1
    assert leaf[server[0]] == leaf[trainer[0]]
    assert any("serving group:" in line for line in p.explanation)
    text = render_script(grpo(4, 1), Target.for_recipe(grpo(4, 1)), p.placement()).text
    assert "#SBATCH --nodelist=" in text
    assert f"--planned '{' '.join(p.nodes)}'" in text  # the runtime's prepare step


def test_split_without_room_for_the_server() -> None:
    topo = tree(leaves=1, per_leaf=4)
    with pytest.raises(PlanError, match="serving group: 2 node"):
        plan_for_recipe(grpo(5, 2), topo)


@settings(max_examples=60, deadline=None)
@given(
    leaves=st.integers(2, 6),
    per_leaf=st.integers(2, 6),
    serve=st.integers(1, 3),
    data=st.data(),
)
def test_split_is_disjoint_free_and_trainer_first(
    leaves: int, per_leaf: int, serve: int, data: st.DataObject
) -> None:
    topo = tree(leaves, per_leaf)
    total = leaves * per_leaf
    nodes = data.draw(st.integers(serve + 1, total))
    busy = data.draw(st.sets(st.sampled_from(sorted(topo.nodes)), max_size=total // 3))
    try:
        p = plan_for_recipe(grpo(nodes, serve), topo, unavailable=busy)
    except PlanError:
        assert total - len(busy) < nodes
        return
    assert len(p.nodes) == len(set(p.nodes)) == nodes
    assert not set(p.nodes) & busy
    # The trainer part is exactly what the planner picks for the trainer alone.
    alone = plan_for_recipe(
        validate(
            {
                "name": "t",
                "cluster": {"instance_type": "p5.48xlarge", "slurm_version": "24.11"},
                "resources": {"nodes": nodes - serve},
                "launcher": {"kind": "torchrun", "script": "t.py"},
            }
        ),
        topo,
        unavailable=busy,
    )
    assert p.nodes[: nodes - serve] == alone.nodes


def test_sglang_tp_across_nodes_is_planned_not_refused() -> None:
    r = validate(
        {
            "name": "ds",
            "cluster": {"instance_type": "p5.48xlarge", "slurm_version": "24.11"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 16, "ep": 16},
            "launcher": {"kind": "sglang", "model": "deepseek-ai/DeepSeek-V3"},
        }
    )
    p = plan_for_recipe(r, tree(leaves=2, per_leaf=4))
    assert len({tree(2, 4).leaf_of[n] for n in p.nodes}) == 1
