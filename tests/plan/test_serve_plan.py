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


def gb200(free: tuple[int, ...], size: int = 18) -> tuple[Topology, list[str]]:
    """UltraServers of ``size`` GB200 nodes (topology/block), ``free[i]`` nodes free in the
    i-th; node names interleaved across them (launch order, not fabric order)."""
    from slurmfm.topology.model import Node

    names = [f"gb-{i:03d}" for i in range(len(free) * size)]
    block = {n: f"block{i % len(free) + 1}" for i, n in enumerate(names)}
    topo = Topology.from_parents([Node(n) for n in names], block, {}, kind="block")
    busy: list[str] = []
    for b, k in enumerate(free):
        mine = [n for n in names if block[n] == f"block{b + 1}"]
        busy += mine[k:]
    return topo, busy


def gb_serving(nodes: int, tp: int, pp: int = 1, **launcher: Any) -> Any:
    return validate(
        {
            "name": "serve",
            "cluster": {"instance_type": "p6e-gb200.36xlarge", "slurm_version": "24.11"},
            "resources": {"nodes": nodes},
            "parallelism": {"tp": tp, "pp": pp},
            "launcher": {"model": "deepseek-ai/DeepSeek-V3", **launcher},
        }
    )


def domains(topo: Topology, nodes: Any) -> set[str]:
    return {topo.leaf_of[n] for n in nodes}


def test_gb200_prefill_and_decode_servers_never_straddle_two_ultraservers() -> None:
    # 8 nodes: a prefill and a decode server of --tp 16 (4 nodes of 4 GPUs) each; 6 nodes
    # free in each UltraServer. Without the rule 6 + 2 nodes would do, and the decode server
    # (the order's nodes 4-7) would straddle the two.
    topo, busy = gb200((6, 6))
    pd = {"prefill_nodes": 4, "decode_nodes": 4}
    r = gb_serving(8, 16, kind="sglang", disaggregation=pd)
    # A pin plan across two UltraServers is taken by Slurm's topology/block only with a
    # --segment (26.05; tests/plan/test_real_slurm_plan.py): there the segment holds whole
    # servers. Slurm 24.11 takes no --nodelist outside one block, so the pin plan is refused.
    for mode, version in (("pin", "26.05"), ("constrain", None)):
        p = plan_for_recipe(r, topo, unavailable=busy, mode=mode, slurm_version=version)  # type: ignore[arg-type]
        assert not set(p.nodes) & set(busy)
        order = list(p.nodes) if mode == "pin" else sorted(p.nodes, key=p.rank_key.__getitem__)
        for server in (order[:4], order[4:]):
            assert len(domains(topo, server)) == 1, (mode, p.explanation)
        assert any("server replicas span 4" in line for line in p.explanation)
    assert plan_for_recipe(r, topo, unavailable=busy, slurm_version="26.05").segment == 4
    with pytest.raises(PlanError, match="only inside one block"):
        plan_for_recipe(r, topo, unavailable=busy, slurm_version="24.11")


def test_gb200_vllm_replica_over_nodes_stays_in_one_ultraserver() -> None:
    # one vLLM replica of tp 4 x pp 3 = 12 GPUs (3 nodes): 2 + 2 free nodes cannot hold it,
    # 2 + 3 can (the 3)
    r = gb_serving(3, 4, 3, kind="vllm")
    topo, busy = gb200((2, 3))
    p = plan_for_recipe(r, topo, unavailable=busy)
    assert len(domains(topo, p.nodes)) == 1
    topo, busy = gb200((2, 2))
    with pytest.raises(PlanError, match="whole 3-node NVLink units"):
        plan_for_recipe(r, topo, unavailable=busy)


@settings(max_examples=40, deadline=None)
@given(
    free=st.tuples(st.integers(0, 18), st.integers(0, 18), st.integers(0, 18)),
    tp_nodes=st.sampled_from([1, 2, 3, 4, 6]),
    servers=st.integers(1, 4),
)
def test_gb200_sglang_servers_are_whole_in_an_ultraserver_or_refused(
    free: tuple[int, int, int], tp_nodes: int, servers: int
) -> None:
    topo, busy = gb200(free)
    n = tp_nodes * servers * 2
    pd = {"prefill_nodes": n // 2, "decode_nodes": n // 2}
    r = gb_serving(n, 4 * tp_nodes, kind="sglang", disaggregation=pd)
    try:  # 26.05: a pin plan may cross UltraServers with a --segment (see above)
        p = plan_for_recipe(r, topo, unavailable=busy, slurm_version="26.05")
    except PlanError:
        assert sum(f // tp_nodes for f in free) < 2 * servers
        return
    for i in range(0, n, tp_nodes):
        assert len(domains(topo, p.nodes[i : i + tp_nodes])) == 1


def test_a_replica_wider_than_an_ultraserver_is_refused_at_its_line(tmp_path: Any) -> None:
    from slurmfm.errors import RecipeError
    from slurmfm.recipe.loader import load_recipe

    text = """\
name: big
cluster: {instance_type: p6e-gb200.36xlarge}
resources: {nodes: 24}
parallelism:
  tp: 96
launcher: {kind: sglang, model: m}
"""
    (tmp_path / "big.yaml").write_text(text)
    with pytest.raises(RecipeError) as exc:
        load_recipe(tmp_path / "big.yaml")
    msg = str(exc.value)
    assert "big.yaml:5: parallelism.tp: a model replica's span (--tp 96) is 96 GPUs (24 " in msg
    assert "one NVLink domain of p6e-gb200.36xlarge holds 72 GPUs" in msg
    assert "must not straddle two UltraServers" in msg


def gb_split(nodes: int, serve: int, version: str = "26.05") -> Any:
    """A trainer with a vLLM server of one replica over ``serve`` GB200 nodes (4 GPUs each)
    split from its allocation: the replica's span is ``serve`` nodes."""
    return validate(
        {
            "name": "grpo",
            "cluster": {"instance_type": "p6e-gb200.36xlarge", "slurm_version": version},
            "resources": {"nodes": nodes},
            "launcher": {"kind": "torchrun", "script": "t.py"},
            "serve": {
                "nodes": serve,
                "launcher": {"kind": "vllm", "model": "m"},
                "parallelism": {"tp": 4 * serve},
            },
        }
    )


def test_gb200_split_server_stays_in_one_ultraserver_and_slurm_takes_the_list() -> None:
    # The trainer's 4 nodes fit the UltraServer with 5 free nodes; its one free node left
    # cannot hold the 2-node replica, which the nearest-node rule alone would put across two
    # UltraServers.
    from slurmfm.plan.slurm_block import nodelist_accepted
    from slurmfm.plan.slurm_sim import block_geometry

    topo, busy = gb200((5, 6))
    geometry = block_geometry(topo)
    assert geometry is not None
    blocks, sizes = geometry
    for version, rules in (("26.05", "26.05"), ("24.11", "24.11")):
        p = plan_for_recipe(gb_split(6, 2, version), topo, unavailable=busy)
        trainer, server = p.nodes[:4], p.nodes[4:]
        assert not set(p.nodes) & set(busy)
        assert len(set(p.nodes)) == 6
        assert len(domains(topo, server)) == 1, (version, p.explanation)
        assert len(domains(topo, trainer)) == 1
        # Slurm's topology/block takes the joint list (with its --segment) as submitted
        assert nodelist_accepted(blocks, p.nodes, block_sizes=sizes, rules=rules, segment=p.segment)
        assert p.sbatch_options[0].startswith("--nodelist=")
        assert set(p.placement().nodes) == set(p.nodes)
        if version == "26.05":  # the trainer stays where it was planned; --segment=2 joins them
            assert p.segment == 2
            assert "--segment=2" in p.sbatch_options
            assert domains(topo, trainer) != domains(topo, server)
        else:  # 24.11 takes no list across blocks: both planned again inside one
            assert p.segment is None
            assert domains(topo, trainer) == domains(topo, server)
            assert any("planned again inside one block" in line for line in p.explanation)
    topo, busy = gb200((5, 1))
    with pytest.raises(PlanError, match=r"serving group: .* whole 2-node NVLink units"):
        plan_for_recipe(gb_split(6, 2), topo, unavailable=busy)


@settings(max_examples=40, deadline=None)
@given(
    free=st.tuples(st.integers(0, 18), st.integers(0, 18), st.integers(0, 18)),
    unit=st.sampled_from([1, 2, 3, 4]),
    trainer=st.integers(1, 12),
    version=st.sampled_from(["24.11", "26.05"]),
)
def test_gb200_split_servers_are_whole_and_accepted_or_refused(
    free: tuple[int, int, int], unit: int, trainer: int, version: str
) -> None:
    from slurmfm.plan.slurm_block import nodelist_accepted
    from slurmfm.plan.slurm_sim import block_geometry

    topo, busy = gb200(free)
    geometry = block_geometry(topo)
    assert geometry is not None
    blocks, sizes = geometry
    try:
        p = plan_for_recipe(gb_split(trainer + unit, unit, version), topo, unavailable=busy)
    except PlanError:
        # refused only where no one block of the job's level holds trainer and server (or,
        # on 26.05, no segments would): here, at least, no UltraServer holds both
        assert all(f < trainer + unit for f in free)
        return
    assert not set(p.nodes) & set(busy)
    assert len(set(p.nodes)) == trainer + unit
    assert len(domains(topo, p.nodes[trainer:])) == 1
    rules = "26.05" if version == "26.05" else "24.11"
    assert nodelist_accepted(blocks, p.nodes, block_sizes=sizes, rules=rules, segment=p.segment)


def test_gb200_split_in_constrain_mode_keeps_whole_server_units() -> None:
    # Slurm picks the nodes and the job sorts them domain by domain: units of the server's
    # replica over the whole job keep the tail (the server) whole.
    topo, busy = gb200((8, 8))
    p = plan_for_recipe(gb_split(6, 2), topo, unavailable=busy, mode="constrain")
    assert any("server replicas span 2" in line for line in p.explanation)
    assert p.segment is not None
    assert p.segment % 2 == 0
    with pytest.raises(PlanError, match=r"2-node|8 GPUs does not divide"):
        plan_for_recipe(gb_split(5, 2), topo, unavailable=busy, mode="constrain")


def with_spares(nodes: int, spares: int, instance: str, version: str = "24.11") -> Any:
    return validate(
        {
            "name": "spares",
            "cluster": {"instance_type": instance, "slurm_version": version},
            "resources": {"nodes": nodes, "spare_nodes": spares},
            "launcher": {"kind": "torchrun", "script": "t.py"},
        }
    )


def test_spares_are_planned_into_the_nodelist_nearest_the_trainer() -> None:
    # Before, the plan listed the trainer's nodes only and Slurm added the spares anywhere;
    # under topology/block real Slurm takes a --nodelist only inside one block (its rule for
    # the listed nodes, slurmfm.plan.slurm_block.nodelist_accepted), so spares are listed too
    topo = tree(leaves=4, per_leaf=4)
    p = plan_for_recipe(with_spares(3, 1, "p5.48xlarge"), topo)
    assert len(p.nodes) == 4
    assert len({topo.leaf_of[n] for n in p.nodes}) == 1  # the spare on the trainer's leaf
    assert any(line.startswith("spare nodes: ") for line in p.explanation)
    r = with_spares(3, 1, "p5.48xlarge")
    text = render_script(r, Target.for_recipe(r), p.placement()).text
    assert "#SBATCH --nodes=4" in text
    assert f"--planned '{' '.join(p.nodes)}'" in text  # the runtime takes the last as spare


def test_gb200_spares_are_listed_where_slurm_takes_them_or_refused() -> None:
    from slurmfm.plan.slurm_block import nodelist_accepted
    from slurmfm.plan.slurm_sim import block_geometry

    topo, busy = gb200((4, 8))  # the trainer's 4 nodes fit the first UltraServer exactly
    geometry = block_geometry(topo)
    assert geometry is not None
    blocks, sizes = geometry
    p = plan_for_recipe(with_spares(4, 2, "p6e-gb200.36xlarge"), topo, unavailable=busy)
    assert len(p.nodes) == 6
    assert nodelist_accepted(blocks, p.nodes, block_sizes=sizes, rules="24.11")
    assert len(domains(topo, p.nodes)) == 1  # planned again inside the second one
    topo, busy = gb200((4, 4))
    with pytest.raises(PlanError, match=r"spare nodes: .*use fewer resources\.spare_nodes"):
        plan_for_recipe(with_spares(4, 2, "p6e-gb200.36xlarge"), topo, unavailable=busy)
