"""Tests for slurmfm.plan.slurm_sim.select_block: Slurm's topology/block selection, reproduced.

Each case is worked by hand from ``eval_nodes_block`` (SchedMD/slurm
``src/plugins/topology/block/eval_nodes_block.c``): the block level from the job (or segment)
size, the block with the fewest sufficient free nodes (later on ties), base blocks by
``_choose_best_bblock``, and the cap on lower-level blocks. Four GB200-style base blocks of
18 nodes, ``gb-001``..``gb-072``.
"""

from __future__ import annotations

import pytest

from slurmfm.plan.slurm_sim import (
    BLOCK_RULE_SETS,
    BlockRules,
    block_choices,
    level_blocks,
    nodelist_accepted,
    segment_for,
    select_block,
)
from slurmfm.topology.model import Node, Topology

BLOCKS = [[f"gb-{b * 18 + k:03d}" for k in range(1, 19)] for b in range(4)]


@pytest.fixture(params=BLOCK_RULE_SETS)
def rules(request: pytest.FixtureRequest) -> BlockRules:
    """Both rule sets: they agree on these cases (several nodes, segments within a base block)."""
    value: BlockRules = request.param
    return value


def free_of(counts: list[int]) -> set[str]:
    """The first ``counts[b]`` nodes of each base block are free."""
    return {n for b, c in enumerate(counts) for n in BLOCKS[b][:c]}


def test_a_job_that_fits_one_base_block_takes_the_tightest_later_on_ties(rules: BlockRules) -> None:
    free = free_of([10, 18, 5, 18])
    got = select_block(BLOCKS, free, 16, block_sizes=[18, 36, 72], rules=rules)
    assert got == BLOCKS[3][:16]  # blocks 1 and 3 both hold 18: `<=` keeps the later one


def test_an_aggregated_block_is_the_aligned_pair_with_fewest_free_nodes(rules: BlockRules) -> None:
    free = free_of([10, 18, 5, 18])
    got = select_block(BLOCKS, free, 20, block_sizes=[18, 36, 72], rules=rules)
    # Pairs {0,1} hold 28 and {2,3} 23: the emptier pair. Inside it no base block holds 20,
    # so the fullest (block 3, 18 nodes) first, then the rest from block 2.
    assert got == BLOCKS[2][:2] + BLOCKS[3][:18]


def test_segments_are_placed_one_at_a_time_over_the_nodes_still_free(rules: BlockRules) -> None:
    free = free_of([10, 18, 17, 18])
    got = select_block(BLOCKS, free, 32, block_sizes=[18, 36, 72], rules=rules, segment=16)
    # First segment: block 2 (17 free, the tightest); second: blocks 1 and 3 tie, later wins.
    assert got == BLOCKS[2][:16] + BLOCKS[3][:16]


def test_llblock_cap_leaves_a_fragmented_job_pending(rules: BlockRules) -> None:
    # BlockSizes=18 only: a 32-node job may touch ceil(32/18) = 2 base blocks, and no two
    # of them hold 32 free nodes, although 40 are free in all.
    assert (
        select_block(BLOCKS, free_of([10, 10, 10, 10]), 32, block_sizes=[18], rules=rules) is None
    )
    assert select_block(BLOCKS, free_of([10, 10, 10, 10]), 20, block_sizes=[18], rules=rules) == (
        BLOCKS[2][:10] + BLOCKS[3][:10]
    )


def test_base_blocks_of_the_whole_system_fullest_first_then_one_that_holds_the_rest(
    rules: BlockRules,
) -> None:
    got = select_block(BLOCKS, free_of([18, 10, 18, 5]), 30, block_sizes=[18], rules=rules)
    # No level holds 2 base blocks: the whole system is one block. Blocks 0 and 2 tie at 18
    # (the later first), then the rest (12) from the emptiest that holds it: block 0.
    assert got == BLOCKS[0][:12] + BLOCKS[2][:18]


def test_segment_that_does_not_divide_the_job_or_does_not_fit(rules: BlockRules) -> None:
    assert (
        select_block(BLOCKS, free_of([18] * 4), 30, block_sizes=[18], rules=rules, segment=16)
        is None
    )
    # Three segments of 16 need three base blocks with 16 free each.
    assert (
        select_block(
            BLOCKS, free_of([18, 18, 15, 15]), 48, block_sizes=[18], rules=rules, segment=16
        )
        is None
    )


def test_bad_block_sizes_are_refused(rules: BlockRules) -> None:
    with pytest.raises(ValueError, match="2\\^k"):
        select_block(BLOCKS, free_of([18] * 4), 8, block_sizes=[18, 54], rules=rules)


def test_segment_for_divides_the_job_and_fits_one_block() -> None:
    assert segment_for(32, 18) == 16
    assert segment_for(36, 18) == 18
    assert segment_for(8, 18) == 8
    assert segment_for(34, 18) == 17


def test_block_choices_use_the_nvlink_domains_as_base_blocks() -> None:
    paths = {n: ("root", f"spine{b // 2}", f"us{b}") for b, ns in enumerate(BLOCKS) for n in ns}
    nodes = [Node(n, nvlink_domain=f"us{b}") for b, ns in enumerate(BLOCKS) for n in ns]
    topo = Topology.from_paths(paths, nodes)
    got = dict(block_choices(topo, free_of([10, 18, 17, 18]), 32, rules="24.11"))
    # -N 32: only the pair {us2,us3} holds 32 (35 free); the fuller us3 first (18), then the
    # remaining 14 from us2. --segment=16: one segment per UltraServer, as above.
    assert got["block"] == BLOCKS[2][:14] + BLOCKS[3][:18]
    assert got["block --segment=16"] == BLOCKS[2][:16] + BLOCKS[3][:16]
    flat = Topology.from_paths(dict.fromkeys(BLOCKS[0], ("root", "leaf0")))
    assert block_choices(flat, set(BLOCKS[0]), 4, rules="24.11") == []


def test_one_node_job_tightest_base_block_on_24_11_first_free_node_on_26_05() -> None:
    """The rule sets differ on one-node jobs only: 24.11 runs eval_nodes_block for them (the
    base block with the fewest free nodes, later on ties), 26.05 gives the first free node of
    the node table (what sbatch --test-only said on the real labs, test_slurm_sim.py)."""
    free = free_of([10, 18, 5, 5])
    assert select_block(BLOCKS, free, 1, block_sizes=[18, 36], rules="24.11") == BLOCKS[3][:1]
    assert select_block(BLOCKS, free, 1, block_sizes=[18, 36], rules="26.05") == BLOCKS[0][:1]
    assert select_block(BLOCKS, set(), 1, block_sizes=[18], rules="26.05") is None


def test_segment_larger_than_a_base_block_refused_on_24_11_placed_on_26_05() -> None:
    """24.11's eval_nodes_block refuses a segment larger than the base block ("segment (%u) >
    bblock_node_cnt (%u) is not supported"); 26.05 places it like any other segment."""
    free = free_of([18, 18, 18, 18])
    sizes = [18, 36, 72]
    assert select_block(BLOCKS, free, 40, block_sizes=sizes, rules="24.11", segment=20) is None
    got = select_block(BLOCKS, free, 40, block_sizes=sizes, rules="26.05", segment=20)
    assert got is not None
    assert len(got) == 40


# What real Slurm 24.11.5 and 26.05.5 did with an exclusive -N len -w NODES job on 4 base
# blocks of 9 (BlockSizes=9,18,36), nodes 1-36 (tests/plan/test_real_slurm_plan.py,
# test_gb200_nodelist_across_ultraservers): (blocks and counts, segment, 24.11, 26.05).
NINE = [[f"node{b * 9 + k:03d}" for k in range(1, 10)] for b in range(4)]
MEASURED = [
    ({0: 8}, None, True, True),
    ({0: 4, 1: 4}, None, False, False),
    ({0: 4, 1: 4}, 4, False, True),
    ({0: 5, 1: 3}, 1, False, True),
    ({1: 4, 2: 4}, None, False, False),
    ({0: 8, 1: 8}, None, True, True),
    ({1: 8, 2: 8}, None, False, False),
    ({1: 8, 2: 8}, 8, False, True),
    ({0: 6, 1: 6, 2: 4}, 2, False, True),
    ({0: 8, 1: 8, 2: 8, 3: 8}, None, True, True),
]


@pytest.mark.parametrize(("counts", "segment", "on_24_11", "on_26_05"), MEASURED)
def test_nodelist_accepted_as_real_slurm_took_it(
    counts: dict[int, int], segment: int | None, on_24_11: bool, on_26_05: bool
) -> None:
    """--nodelist alone: only inside one block of the job's level (an aligned run of base
    blocks), on both; with --segment: 26.05 cuts the list into segments, 24.11 refuses."""
    nodes = [n for b, c in counts.items() for n in NINE[b][:c]]
    sizes = [9, 18, 36]
    checks: list[tuple[BlockRules, bool]] = [("24.11", on_24_11), ("26.05", on_26_05)]
    for rules, want in checks:
        got = nodelist_accepted(NINE, nodes, block_sizes=sizes, rules=rules, segment=segment)
        assert got == want, (rules, counts, segment)


def test_nodelist_outside_the_blocks_or_under_the_llblock_cap_is_refused() -> None:
    assert not nodelist_accepted(
        NINE, [*NINE[0][:3], "other"], block_sizes=[9, 18, 36], rules="26.05"
    )
    # BlockSizes=9,36: a 16-node job's block is all four, but it may touch ceil(16/9) = 2
    # base blocks (eval_nodes_block's llblock limit for required nodes)
    three = NINE[0][:6] + NINE[1][:5] + NINE[2][:5]
    assert not nodelist_accepted(NINE, three, block_sizes=[9, 36], rules="24.11")
    assert nodelist_accepted(NINE, NINE[0][:8] + NINE[3][:8], block_sizes=[9, 36], rules="24.11")
    with pytest.raises(ValueError, match="distinct"):
        nodelist_accepted(NINE, [], block_sizes=[9], rules="24.11")


def test_level_blocks_are_the_aligned_runs_of_the_job_level() -> None:
    sizes = [9, 18, 36]
    assert level_blocks(NINE, 8, block_sizes=sizes) == NINE
    assert level_blocks(NINE, 16, block_sizes=sizes) == [NINE[0] + NINE[1], NINE[2] + NINE[3]]
    assert level_blocks(NINE, 30, block_sizes=sizes) == [[n for b in NINE for n in b]]
    assert level_blocks(NINE, 16, block_sizes=[9]) == [[n for b in NINE for n in b]]
