"""Cost model: hand-checkable counts on a 4-leaf x 4-node, 2-spine tree (8 GPUs per node)."""

from __future__ import annotations

import pytest
from fabrics import NAMES, SCRAMBLED, tree

from slurmfm.plan.cost import CostParams, CostParamsError, JobShape, evaluate
from slurmfm.topology.model import Node, Topology


def test_tp8_pp2_on_16_nodes_in_topology_order() -> None:
    # Stage 0 = nodes 0-7 (leaves 0,1 under spine0), stage 1 = nodes 8-15 (spine1).
    # 16 DP groups (8 TP ranks x 2 stages) map to 2 distinct node rings of 8 nodes each:
    # 16 edges; each ring leaves a leaf twice (3->4, 7->0) and never leaves its spine.
    # PP: 8 distinct node pairs (i, i+8), all crossing leaves (and spines).
    r = evaluate(tree(), NAMES, JobShape(16, 8, tp=8, pp=2))
    assert r.leaves_used == 4
    assert r.dp_ring_edges == 16
    assert r.dp_edges_cross_leaf == 4
    assert r.dp_edges_cross_spine == 0
    assert r.pp_pairs == 8
    assert r.pp_pairs_cross_leaf == 8
    assert r.nvlink_violations == 0
    assert r.slowdown >= 1.0
    assert set(r.per_group) == {"tp", "cp", "ep", "dp", "pp"}


def test_scrambled_order_crosses_more_and_costs_more() -> None:
    # Interleave spines: every DP ring edge leaves its leaf and spine.
    good = evaluate(tree(), NAMES, JobShape(16, 8, tp=8, pp=2))
    bad = evaluate(tree(), SCRAMBLED, JobShape(16, 8, tp=8, pp=2))
    assert bad.dp_edges_cross_leaf == 16
    assert bad.dp_edges_cross_spine == 16
    assert bad.predicted_s > good.predicted_s
    assert bad.ideal_s == pytest.approx(good.ideal_s)


def test_oversubscription_penalises_scrambled_rings_only() -> None:
    params = CostParams.from_mapping({"tiers": {"leaf": {"oversubscription": 4}}})
    job = JobShape(8, 8, tp=8)
    order = NAMES[:8]
    scrambled = ["n00", "n04", "n01", "n05", "n02", "n06", "n03", "n07"]
    base = evaluate(tree(), order, job)
    over = evaluate(tree(), order, job, params)
    bad = evaluate(tree(), scrambled, job, params)
    # Contiguous ring: 1 flow per direction per leaf uplink per DP group (8 groups) against
    # 4 nodes * 8 GPUs / 4 = 8 flows of capacity: no congestion.
    assert over.per_group["dp"] == pytest.approx(base.per_group["dp"])
    assert bad.per_group["dp"] > over.per_group["dp"]


def test_tp_crossing_nodes_is_an_nvlink_violation() -> None:
    r = evaluate(tree(), NAMES[:4], JobShape(4, 4, tp=8))
    assert r.nvlink_violations == 2  # 16 ranks / tp 8 = 2 TP groups, each over 2 nodes
    gb = Topology.from_paths(
        dict.fromkeys(NAMES[:4], ("core", "leaf0")),
        [Node(n, nvlink_domain="us0") for n in NAMES[:4]],
    )
    assert evaluate(gb, NAMES[:4], JobShape(4, 4, tp=8)).nvlink_violations == 0


def test_params_from_file(tmp_path: pytest.TempPathFactory) -> None:
    f = tmp_path / "p.yaml"  # type: ignore[operator]
    f.write_text(
        "tiers:\n  spine: {bandwidth_GBps: 25, oversubscription: 2}\nmessage_bytes: {dp: 1e6}\n"
    )
    p = CostParams.from_file(f)
    assert p.tiers["spine"].beta_s_per_byte == pytest.approx(1 / 25e9)
    assert p.tiers["spine"].oversubscription == 2
    assert p.message_bytes["dp"] == 1e6
    assert p.tiers["leaf"] == CostParams.default().tiers["leaf"]
    bad = tmp_path / "bad.json"  # type: ignore[operator]
    bad.write_text('{"tiers": {"pod": {}}}')
    with pytest.raises(CostParamsError, match="unknown tier"):
        CostParams.from_file(bad)


def test_evaluate_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        evaluate(tree(), NAMES[:3], JobShape(3, 8, tp=16))
    with pytest.raises(ValueError, match="order has"):
        evaluate(tree(), NAMES[:3], JobShape(4, 8))


def test_bound_by_names_the_tier_and_the_congestion() -> None:
    job = JobShape(16, 8, tp=8, pp=2)
    r = evaluate(tree(), NAMES, job)
    # Each stage's ring stays under one spine; PP pairs (i, i+8) cross the core.
    assert r.bound_by == {"tp": "nvlink", "dp": "spine", "pp": "core"}
    params = CostParams.from_mapping({"tiers": {"leaf": {"oversubscription": 4}}})
    r4 = evaluate(tree(), SCRAMBLED, JobShape(16, 8, tp=8), params)
    assert r4.bound_by["dp"].startswith("core x")
    assert CostParams.default().with_oversubscription(2).tiers["spine"].oversubscription == 2


def test_explain_shows_time_per_group_and_its_tier() -> None:
    from slurmfm.plan.planner import plan

    p = plan(tree(), JobShape(16, 8, tp=8, pp=2))
    (line,) = [w for w in p.explanation if w.startswith("per group")]
    assert "dp " in line
    assert "(spine)" in line
    assert "pp " in line
    assert "(nvlink)" in line


def test_levels_above_the_core_add_a_hop_each() -> None:
    # 4 levels: two pods, each with one top, one spine, one leaf of 2 nodes.
    paths = {
        "a0": ("root", "pod0", "top0", "spine0", "leaf0"),
        "a1": ("root", "pod0", "top0", "spine0", "leaf0"),
        "b0": ("root", "pod0", "top1", "spine1", "leaf1"),
        "b1": ("root", "pod0", "top1", "spine1", "leaf1"),
        "c0": ("root", "pod1", "top2", "spine2", "leaf2"),
        "c1": ("root", "pod1", "top2", "spine2", "leaf2"),
    }
    topo = Topology.from_paths(paths)
    job = JobShape(4, 8, tp=8)
    in_pod = evaluate(topo, ["a0", "a1", "b0", "b1"], job)  # common switch pod0 (level 3)
    across = evaluate(topo, ["a0", "a1", "c0", "c1"], job)  # common switch root (level 4)
    assert in_pod.bound_by["dp"] == across.bound_by["dp"] == "core"
    assert across.per_group["dp"] > in_pod.per_group["dp"]


def test_message_bytes_from_a_megatron_recipe() -> None:
    from pathlib import Path

    from slurmfm.plan.cost import message_bytes_for_megatron
    from slurmfm.recipe.loader import load_recipe

    repo = Path(__file__).resolve().parents[2]
    rec = load_recipe(str(repo / "recipes" / "llama3-70b-p5en-megatron.yaml"))
    args = rec.launcher.model_args  # type: ignore[union-attr]
    sizes = message_bytes_for_megatron(args, tp=8, pp=4, dp=4)
    assert sizes is not None
    # Llama-3-70B without embeddings: 68.5e9 parameters; fp32 gradients over tp*pp = 32.
    params = sizes["dp"] * 32 / 4
    assert 68e9 < params < 69e9
    # GBS 512 = dp 4 x mbs 1 x 128 micro-batches of 8192 x 8192 bf16 activations.
    assert sizes["pp"] == 128 * 8192 * 8192 * 2
    assert message_bytes_for_megatron({"num-layers": 2}, tp=1, pp=1, dp=1) is None


def test_nccl_picks_the_tree_for_many_nodes_and_the_ring_for_few() -> None:
    """NCCL's tuner (NVIDIA/nccl:src/graph/tuning.cc): ring latency grows with 2(n-1) steps,
    the tree's with log2 n, so an 80 MB bucket goes by ring on a few nodes, by tree on many."""
    from slurmfm.plan.cost import nccl_allreduce_algorithm

    leaf = CostParams.default().tiers["leaf"]
    assert nccl_allreduce_algorithm(2, 80e6, leaf) == "ring"
    assert nccl_allreduce_algorithm(8, 80e6, leaf) == "ring"
    assert nccl_allreduce_algorithm(256, 80e6, leaf) == "tree"
    # Larger calls favour the ring's bandwidth: the crossover moves to more nodes.
    assert nccl_allreduce_algorithm(64, 80e6, leaf) == "tree"
    assert nccl_allreduce_algorithm(64, 8e9, leaf) == "ring"


def test_double_binary_tree_edges_are_ncclS() -> None:
    """ncclGetBtree/ncclGetDtree over 8 ranks: tree 1 rooted at 0, tree 2 its mirror."""
    from slurmfm.plan.cost import double_binary_tree

    t1, t2 = double_binary_tree(8)
    assert dict(t1) == {1: 2, 2: 4, 3: 2, 4: 0, 5: 6, 6: 4, 7: 6}
    assert dict(t2) == {7 - c: 7 - p for c, p in t1}
    t1, t2 = double_binary_tree(5)  # odd: the second tree is the first shifted by one
    assert dict(t2) == {(c + 1) % 5: (p + 1) % 5 for c, p in t1}


def test_tree_all_reduce_is_charged_on_tree_edges() -> None:
    """A forced tree: its latency is log-depth, and its congestion comes from tree edges.

    In topology order the tree's long edges (rank r to r +- 4, 8) leave leaves, so a scrambled
    order still costs more, and "tree" names the algorithm in ``bound_by``.
    """
    tree_params = CostParams.from_mapping({"dp_algorithm": "tree"})
    ring_params = CostParams.from_mapping({"dp_algorithm": "ring"})
    job = JobShape(16, 8, tp=8)
    t = evaluate(tree(), NAMES, job, tree_params)
    r = evaluate(tree(), NAMES, job, ring_params)
    assert t.bound_by["dp"].endswith("tree")
    assert "tree" not in r.bound_by["dp"]
    assert t.per_group["dp"] != r.per_group["dp"]
    four = tree_params.with_oversubscription(4)
    assert (
        evaluate(tree(), SCRAMBLED, job, four).predicted_s
        > evaluate(tree(), NAMES, job, four).predicted_s
    )
    with pytest.raises(CostParamsError, match="dp_algorithm"):
        CostParams.from_mapping({"dp_algorithm": "butterfly"})


def test_pipeline_sends_share_uplinks_at_oversubscription() -> None:
    """PP pairs that cross an uplink together slow down once it is tapered; at 1 they do not."""
    job = JobShape(16, 8, tp=8, pp=2)
    one = evaluate(tree(), NAMES, job)
    four = evaluate(tree(), NAMES, job, CostParams.default().with_oversubscription(4))
    assert one.bound_by["pp"] == "core"
    assert four.bound_by["pp"].startswith("core x")
    assert four.per_group["pp"] > one.per_group["pp"]
