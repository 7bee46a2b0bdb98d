"""Slurm's node selection for ``topology/block``: ``eval_nodes_block``, reproduced.

Why a module apart from :mod:`slurmfm.plan.slurm_sim` (which re-exports everything here):
the block plugin's arithmetic (base blocks, aggregated block levels, llblocks, segments)
shares nothing with the tree plugin's greedy leaf choice but the node-table order, and each
is a transcription to check line by line against its own Slurm source file
(SchedMD/slurm ``src/plugins/topology/block/eval_nodes_block.c`` here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from slurmfm.topology.model import natural_key

BlockRules = Literal["24.11", "26.05"]

__all__ = ["BLOCK_RULE_SETS", "BlockRules", "level_blocks", "nodelist_accepted", "select_block"]


def _block_level(rem: int, levels: Sequence[bool], base: int) -> tuple[int, int]:
    """(block level or -1 for "the whole system", llblock level): ``_get_block_level``."""
    per = -(-rem // base)
    want = math.ceil(math.log2(per)) if per > 0 else -1
    ll = 0
    if want > 0:
        below = [k for k in range(min(want - 1, len(levels) - 1), -1, -1) if levels[k]]
        ll = below[0] if below else -1
    if want < 0:
        return -1, ll
    above = [k for k in range(want, len(levels)) if levels[k]]
    return (above[0] if above else -1), ll


# Both block rule sets, oldest first: what a caller simulates when the Slurm version is unknown.
BLOCK_RULE_SETS: tuple[BlockRules, ...] = ("24.11", "26.05")


@dataclass(frozen=True)
class _BlockGeometry:
    """The block plugin's arithmetic for one job size: how base blocks group into the
    blocks of the job's level and into llblocks (the lower-level blocks it counts)."""

    count: int  # base blocks
    per_block: int  # base blocks per block of the job's level (all of them: the whole system)
    block_cnt: int  # blocks of that level
    ll_level: int
    per_ll: int  # base blocks per llblock
    ll_size: int  # nodes per llblock

    @classmethod
    def for_job(cls, rem_job: int, levels: Sequence[bool], base: int, count: int) -> _BlockGeometry:
        block_level, ll_level = _block_level(rem_job, levels, base)
        if block_level < 0:
            per_block, block_cnt = count, 1
        else:
            per_block = 1 << block_level
            block_cnt = -(-count // per_block)
        per_ll = 1 << ll_level
        return cls(count, per_block, block_cnt, ll_level, per_ll, per_ll * base)


def _block_levels(block_sizes: Sequence[int]) -> tuple[int, list[bool]]:
    """The base block size and which levels ``BlockSizes`` enforces (B0*2^k: level k);
    refuses a size that is not such a multiple, as slurmctld does."""
    base = block_sizes[0]
    levels = [False] * 32
    for s in block_sizes:
        k = int(math.log2(s // base))
        if s % base or (1 << k) * base != s:
            raise ValueError(f"BlockSizes: {s} is not {base}*2^k")
        levels[k] = True
    return base, levels


def _job_segments(
    nodes: int, segment: int | None, base: int, rules: BlockRules
) -> tuple[int, int] | None:
    """(segments, nodes per segment) of the job, or None when Slurm refuses its
    ``--segment`` (ESLURM_REQUESTED_TOPO_CONFIG_UNAVAILABLE)."""
    if rules == "24.11" and segment and segment > base:
        # 24.11's eval_nodes_block: "segment (%u) > bblock_node_cnt (%u) is not supported"
        return None
    # 26.05: "Ignoring segment_size (%u): larger than job size (%u)"; 24.11 has no such
    # exception, and the divisibility check below refuses the job
    seg = segment if segment and (segment <= nodes or rules == "24.11") else None
    if seg is not None and nodes % seg:
        return None
    return (nodes // seg if seg else 1), (seg or nodes)


def _free_per_block(
    bnodes: Sequence[Sequence[str]], avail: set[str], geo: _BlockGeometry
) -> tuple[list[int], list[int], list[int]]:
    """Free nodes per base block, per block of the job's level and per llblock."""
    on_bb = [sum(1 for n in b if n in avail) for b in bnodes]
    on_block = [0] * geo.block_cnt
    on_ll = [0] * (-(-geo.count // geo.per_ll))
    for i, c in enumerate(on_bb):
        on_block[i // geo.per_block] += c
        on_ll[i // geo.per_ll] += c
    return on_bb, on_block, on_ll


def _pick_block(
    geo: _BlockGeometry,
    on_block: list[int],
    on_ll: list[int],
    rem: int,
    max_ll: int,
    use_ll: bool,
    count_segments: bool,
) -> tuple[int, int]:
    """The block the job (segment) goes to (-1: none fits), and how many segments the
    fitting blocks hold (counted only when ``count_segments``).

    Of the blocks that can hold it (counting only the ``max_ll`` fullest llblocks when the
    level is not an exact multiple of them), the lowest weight (uniform here), then the
    fewest sufficient free nodes wins, later blocks on ties (``bnc <= block_node_cnt``).
    """
    pick = -1
    segments = 0
    per = geo.per_block // geo.per_ll
    for b in range(geo.block_cnt):
        if use_ll:
            lls = sorted(on_ll[b * per : (b + 1) * per], reverse=True)
            room = sum(lls[:max_ll])
        else:
            room = on_block[b]
        if room < rem:
            continue
        if count_segments:
            segments += on_block[b] // rem
        if on_block[b] and (pick == -1 or on_block[b] <= on_block[pick]):
            pick = b
    return pick, segments


def _best_bblock(
    geo: _BlockGeometry,
    members: list[int],
    required: set[int],
    on_bb: list[int],
    on_ll: list[int],
    rem: int,
    use_ll: bool,
) -> tuple[int, bool]:
    """``_choose_best_bblock``: the next base block to take (-1: none) and whether it is in
    an llblock already used.

    First one in an llblock already used, then one in an llblock that can hold the rest (the
    emptiest such), else in the fullest llblock; then a base block that holds the rest (the
    emptiest), else the fullest; later base blocks on ties.
    """
    ll_level = geo.ll_level
    best, best_fit, best_same = -1, False, True
    for i in members:
        if i in required:
            continue
        fit = on_bb[i] >= rem
        if use_ll and (best == -1 or (best >> ll_level) != (i >> ll_level)):
            lo = i & (-1 << ll_level)
            same = any(j in required for j in range(lo, min(geo.count, lo + geo.per_ll)))
            if best == -1 or (same and not best_same):
                best, best_fit, best_same = i, fit, same
                continue
            if not same and best_same:
                continue
            c_i, c_b = on_ll[i >> ll_level], on_ll[best >> ll_level]
            f_i, f_b = c_i >= rem, c_b >= rem
            if f_i != f_b:
                if f_i:
                    best, best_fit, best_same = i, fit, same
                continue
            if c_i != c_b:
                if (c_i < c_b) == f_i:  # both fit: emptier; neither: fuller
                    best, best_fit, best_same = i, fit, same
                continue
        if (
            best == -1
            or (fit and not best_fit)
            or (not fit and not best_fit and on_bb[i] >= on_bb[best])
            or (fit and on_bb[i] <= on_bb[best])
        ):
            best, best_fit = i, fit
    return best, best_same


def _take_bblocks(
    geo: _BlockGeometry,
    pick: int,
    bnodes: Sequence[Sequence[str]],
    counts: tuple[list[int], list[int]],
    avail: set[str],
    chosen: list[str],
    rem: int,
    max_ll: int,
    use_ll: bool,
) -> int:
    """Take base blocks of block ``pick`` one at a time (:func:`_best_bblock`), each one's
    free nodes in node-table order, until ``rem`` nodes are taken; at most ``max_ll``
    llblocks. Moves the nodes from ``avail`` to ``chosen``; returns how many are missing."""
    on_bb, on_ll = counts
    members = [i for i in range(geo.count) if i // geo.per_block == pick]
    required: set[int] = set()
    prev = rem + 1
    while rem > 0 and prev != rem:
        prev = rem
        best, best_same = _best_bblock(geo, members, required, on_bb, on_ll, rem, use_ll)
        if best == -1:
            break
        if max_ll <= 0 and not best_same:
            break  # "can't add more bblocks due to llblock limit"
        required.add(best)
        for n in bnodes[best]:
            if rem == 0:
                break
            if n in avail:
                avail.discard(n)
                chosen.append(n)
                rem -= 1
        if not best_same:
            max_ll -= 1
    return rem


def select_block(
    blocks: Sequence[Sequence[str]],
    free: set[str] | frozenset[str],
    nodes: int,
    *,
    block_sizes: Sequence[int],
    rules: BlockRules,
    segment: int | None = None,
    node_order: Sequence[str] | None = None,
) -> list[str] | None:
    """The nodes Slurm's ``topology/block`` would give an exclusive ``-N nodes`` job now.

    A transcription of ``eval_nodes_block`` (SchedMD/slurm
    ``src/plugins/topology/block/eval_nodes_block.c``; the algorithm
    https://slurm.schedmd.com/topology.html describes) for whole-node exclusive jobs with
    uniform node weights, no ``-w`` required nodes, no ``--consolidate-segments`` or
    ``--spread-segments`` and no hierarchical resources. Checked against ``sbatch --test-only``
    on real Slurm 24.11.5 and 26.05.5 (``tests/plan/test_slurm_sim.py``, random base blocks,
    BlockSizes, busy nodes, job sizes and segments), where it agreed on every multi-node job.

    * ``rules``: ``"24.11"`` (as Slurm 24.11.5 does) or ``"26.05"`` (as 26.05.5 does). They
      differ in two places. A ``--segment`` larger than the base block size: 24.11 refuses
      the job ("segment (%u) > bblock_node_cnt (%u) is not supported" in its
      ``eval_nodes_block``), 26.05 places it (and ignores a segment larger than the job). A
      one-node job: 24.11 places it with ``eval_nodes_block`` like any other (the tightest
      base block, later on ties), 26.05 does not run ``eval_nodes_block`` for it at all
      (slurmctld logs no ``SelectType`` "Best nodes" line) and gives it the first free node of
      the node table; the code path that skips the block plugin there was not located in the
      source, the rule is what the lab showed on every busy pattern tried.

    * ``blocks``: the base blocks in ``BlockName`` line order (the block index), each its
      nodes; ``block_sizes``: ``BlockSizes`` (B0, then B0*2^k: level k enforced). An
      aggregated block of level k is the aligned run of 2^k consecutive base blocks.
    * The job (or each ``--segment``, in turn, over the nodes still free) needs the smallest
      enforced level whose blocks hold ``ceil(ceil(n / B0))`` base blocks, log2; with no such
      level the whole system is one block. The block is chosen by :func:`_pick_block`, its
      base blocks taken by :func:`_take_bblocks` (at most ``ceil(n / llblock size)``
      llblocks). Nodes of a base block in node-table order.

    Returns the nodes in node-table order, or None when Slurm would not start the job now
    (``ESLURM_TOPO_*``: no block fits, a segment does not fit, or the llblock cap).
    """
    if nodes <= 0:
        raise ValueError("nodes must be positive")
    if not block_sizes or not blocks:
        raise ValueError("select_block needs base blocks and BlockSizes")
    base, levels = _block_levels(block_sizes)
    table = (
        sorted((n for b in blocks for n in b), key=natural_key)
        if node_order is None
        else node_order
    )
    pos = {n: k for k, n in enumerate(table)}
    if nodes == 1 and rules == "26.05":
        # 26.05 does not run eval_nodes_block for a one-node job (see the docstring)
        in_blocks = {n for b in blocks for n in b}
        first = [n for n in table if n in free and n in in_blocks][:1]
        return first or None
    bnodes = [sorted(b, key=pos.__getitem__) for b in blocks]
    split = _job_segments(nodes, segment, base, rules)
    if split is None:
        return None  # ESLURM_REQUESTED_TOPO_CONFIG_UNAVAILABLE
    seg_cnt, rem_job = split
    geo = _BlockGeometry.for_job(rem_job, levels, base, len(bnodes))
    avail = set(free)
    chosen: list[str] = []
    for s in range(seg_cnt):
        max_ll = -(-rem_job // geo.ll_size)
        use_ll = geo.per_block != geo.per_ll * max_ll
        on_bb, on_block, on_ll = _free_per_block(bnodes, avail, geo)
        first_of_many = s == 0 and seg_cnt > 1
        pick, segments = _pick_block(geo, on_block, on_ll, rem_job, max_ll, use_ll, first_of_many)
        if pick == -1:
            return None  # ESLURM_TOPO_NO_FIT / ESLURM_TOPO_SEGMENT_NO_FIT
        if first_of_many and segments < seg_cnt:
            return None  # "blocks fit %d of %d requested segments"
        counts = (on_bb, on_ll)
        rem = _take_bblocks(geo, pick, bnodes, counts, avail, chosen, rem_job, max_ll, use_ll)
        if rem > 0:
            return None  # ESLURM_TOPO_INSUFFICIENT_RESOURCES
    return sorted(chosen, key=pos.__getitem__)


def nodelist_accepted(
    blocks: Sequence[Sequence[str]],
    nodes: Sequence[str],
    *,
    block_sizes: Sequence[int],
    rules: BlockRules,
    segment: int | None = None,
) -> bool:
    """Whether Slurm's ``topology/block`` takes an exclusive job of exactly ``nodes``
    (``-N len(nodes) --nodelist=nodes``, with ``--segment`` when given), all of them free.

    Why: a plan in pin mode is such a job, and Slurm refuses one at submission ("Requested
    node configuration is not available") unless its nodes fit the block rules; measured on
    real Slurm 24.11.5 and 26.05.5 (``tests/plan/test_real_slurm_plan.py``,
    ``test_gb200_nodelist_across_ultraservers``):

    * Without ``--segment`` (or with one segment), both versions: every node in one block of
      the job's level (the aligned run of 2^k base blocks, :func:`select_block`), as
      ``eval_nodes_block`` checks ("requires nodes that do not have shared block",
      SchedMD/slurm ``src/plugins/topology/block/eval_nodes_block.c``); with BlockSizes that
      skip a level, also its llblock limit ("requires nodes exceed maximum llblock limit due
      to required nodes", read in that source, not measured).
    * With ``--segment`` of two or more segments: 24.11.5 refuses every such job, even one
      whose segments each fill a base block inside one block of the job's level; 26.05.5 lays
      the segments out inside the listed nodes by its usual rules (``eval_nodes_block``
      limits the nodes it may use to the list), so the job is taken when :func:`select_block`
      finds the segments in the listed nodes.
    """
    n = len(nodes)
    if n == 0 or len(set(nodes)) != n:
        raise ValueError("nodes must be distinct and not empty")
    base, levels = _block_levels(block_sizes)
    index = {m: i for i, b in enumerate(blocks) for m in b}
    if any(m not in index for m in nodes):
        return False  # "requires nodes which are not in blocks"
    split = _job_segments(n, segment, base, rules)
    if split is None:
        return False
    seg_cnt, _ = split
    if seg_cnt > 1:
        if rules == "24.11":
            return False
        got = select_block(
            blocks, frozenset(nodes), n, block_sizes=block_sizes, rules=rules, segment=segment
        )
        return got is not None
    geo = _BlockGeometry.for_job(n, levels, base, len(blocks))
    used = sorted({index[m] for m in nodes})
    if len({i // geo.per_block for i in used}) > 1:
        return False
    max_ll = -(-n // geo.ll_size)
    if geo.per_block != geo.per_ll * max_ll:
        return len({i >> geo.ll_level for i in used}) <= max_ll
    return True


def level_blocks(
    blocks: Sequence[Sequence[str]], nodes: int, *, block_sizes: Sequence[int]
) -> list[list[str]]:
    """The blocks of the level Slurm places an ``nodes``-node job in without ``--segment``
    (the aligned runs of 2^k base blocks, or the whole system when no level is large enough),
    each its nodes: a ``--nodelist`` job is taken only inside one of them
    (:func:`nodelist_accepted`)."""
    base, levels = _block_levels(block_sizes)
    geo = _BlockGeometry.for_job(nodes, levels, base, len(blocks))
    step = geo.per_block
    return [[n for b in blocks[i : i + step] for n in b] for i in range(0, len(blocks), step)]
