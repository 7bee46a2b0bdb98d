"""One training step's inter-node traffic, as NCCL would move it, turned into coflows.

Groups follow Megatron-LM's default rank order ``tp-cp-ep-dp-pp`` (NVIDIA/Megatron-LM
``megatron/core/parallel_state.py``, ``RankGenerator``), rebuilt here from the job shape, not
taken from the planner's cost model:

* **DP gradients, all-reduce**: ring (reduce-scatter then all-gather, ``2(p-1)/p * n`` bytes
  per edge, NVIDIA/nccl ``src/device/all_reduce.h``) or NCCL's double binary tree
  (NVIDIA/nccl ``src/graph/trees.cc``, ``ncclGetBtree``/``ncclGetDtree``), whichever NCCL's
  tuner would pick: it takes the smaller ``latency + bytes / bandwidth`` per algorithm
  (NVIDIA/nccl ``src/graph/tuning.cc``, ``ncclTopoTuneModel``: ring latency grows with the
  ranks, tree latency with ``log2`` of the nodes; all-reduce algorithm bandwidth is
  ``busBw * n/(2(n-1))`` for ring and ``busBw / 2`` with a 0.92 derating for tree, times
  ``treeCorrectionFactor`` for mid-size messages). The message is one gradient bucket
  (``bucket_bytes``), repeated ``n / bucket`` times.
* **PP**: each pipeline sends its activations to the next stage and gradients back
  (point-to-point, ``pp_bytes`` each way per neighbouring pair).
* **EP**: an expert all-to-all among an EP group's nodes (``ep_bytes`` per rank, ``(e-1)/e``
  of it leaving each rank), when the group spans nodes (inside a GB200 UltraServer over
  NVLink, or across EFA for a layout that lets it).
* TP and CP stay inside a node or NVLink domain and cost the same wherever the job sits, so
  they are left out of the comparison.

Groups with the same node sequence (the 8 local-rank DP rings of a TP=8 job) are one coflow
with their bytes added.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from bench.referee.fabric import PhysicalFabric
from bench.referee.flows import Coflow

__all__ = ["StepTraffic", "btree_parent", "dtree", "step_coflows"]

# NVIDIA/nccl src/graph/tuning.cc, treeCorrectionFactor[NCCL_PROTO_SIMPLE]: powers of two
# from 64 B; sizes beyond the table use 1.0.
_TREE_CORRECTION_SIMPLE = (
    0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5,
    0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9,
)  # fmt: skip


@dataclass(frozen=True)
class StepTraffic:
    """Per-rank bytes of one step. Defaults: a dense ~1B-parameter shard in bf16.

    ``dp_bytes``: gradients each DP rank all-reduces; ``bucket_bytes``: Megatron/DDP bucket
    (DDP's default ``bucket_cap_mb=25``; Megatron's distributed optimizer uses 40M-element
    buckets: NVIDIA/Megatron-LM ``megatron/core/distributed/distributed_data_parallel_config.py``).
    ``compute_s``: the step's compute; ``overlap``: fraction of it that can hide DP traffic.
    """

    dp_bytes: float = 2e9
    bucket_bytes: float = 80e6
    pp_bytes: float = 64e6
    ep_bytes: float = 256e6
    compute_s: float = 0.4
    overlap: float = 0.5
    algorithm: str = "auto"  # auto (NCCL's choice), ring or tree


def _tree_factor(nbytes: float) -> float:
    k = int(math.log2(max(nbytes, 64) / 64))
    return _TREE_CORRECTION_SIMPLE[k] if k < len(_TREE_CORRECTION_SIMPLE) else 1.0


def btree_parent(n: int, rank: int) -> int:
    """Parent of ``rank`` in NCCL's binary tree over ``n`` ranks (-1 at the root, rank 0).

    ``ncclGetBtree``: the parent clears the lowest set bit and sets the next one, or only
    clears it when that would leave the tree.
    """
    if rank == 0:
        return -1
    bit = 1
    while not bit & rank:
        bit <<= 1
    up = (rank ^ bit) | (bit << 1)
    return rank ^ bit if up >= n else up


def dtree(n: int) -> list[list[tuple[int, int]]]:
    """NCCL's double binary tree: both trees as (child, parent) edges over ranks 0..n-1.

    The second tree mirrors the first for an even count and shifts it by one for an odd count
    (``ncclGetDtree``), so a leaf of one tree is an inner node of the other.
    """
    t1 = [(r, btree_parent(n, r)) for r in range(1, n)]
    if n % 2:
        t2 = [((c + 1) % n, (p + 1) % n) for c, p in t1]
    else:
        t2 = [(n - 1 - c, n - 1 - p) for c, p in t1]
    return [t1, t2]


def _choose(p: int, n: float, bus_bw: float, lat: float, algorithm: str) -> str:
    """NCCL's pick between ring and tree for one all-reduce of ``n`` bytes over ``p`` nodes."""
    if algorithm in ("ring", "tree"):
        return algorithm
    if p <= 2:
        return "ring"
    ring = 2 * (p - 1) * lat * 1.4 + n / (bus_bw * p / (2 * (p - 1)))
    tree = 2 * math.log2(p) * lat + n / (bus_bw * 0.92 * _tree_factor(n) / 2)
    return "tree" if tree < ring else "ring"


def _groups(nodes: int, g: int, tp: int, cp: int, pp: int, ep: int) -> dict[str, list[list[int]]]:
    world = nodes * g
    stage = world // pp
    dp = world // (tp * cp * pp)
    out: dict[str, list[list[int]]] = {"dp": [], "pp": [], "ep": []}
    if dp > 1:
        step = tp * cp
        out["dp"] = [
            list(range(s * stage + t, (s + 1) * stage, step))
            for s in range(pp)
            for t in range(step)
        ]
    if pp > 1:
        out["pp"] = [list(range(x, world, stage)) for x in range(stage)]
    if ep > 1:
        edp = world // (tp * ep * pp)
        out["ep"] = [
            list(range(s * stage + k * tp * ep + t, s * stage + (k + 1) * tp * ep, tp))
            for s in range(pp)
            for k in range(edp)
            for t in range(tp)
        ]
    return out


def _node_seq(ranks: Sequence[int], g: int) -> tuple[int, ...]:
    seq: list[int] = []
    for r in ranks:
        x = r // g
        if not seq or seq[-1] != x:
            seq.append(x)
    if len(seq) > 1 and seq[-1] == seq[0]:
        seq.pop()
    return tuple(seq)


def _add(uses: Counter[str], links: Sequence[str]) -> None:
    for lk in links:
        uses[lk] += 1


def _ring_uses(
    fabric: PhysicalFabric, order: Sequence[str], seq: tuple[int, ...]
) -> tuple[Counter[str], float]:
    """Links a ring over node sequence ``seq`` crosses (one use per edge) and its slowest
    edge's latency."""
    uses: Counter[str] = Counter()
    lat = 0.0
    for a, b in zip(seq, seq[1:] + seq[:1], strict=True):
        links, lt = fabric.route(order[a], order[b])
        _add(uses, links)
        lat = max(lat, lt)
    return uses, lat


def _tree_uses(
    fabric: PhysicalFabric, order: Sequence[str], seq: tuple[int, ...]
) -> tuple[Counter[str], float]:
    """Links NCCL's double binary tree over ``seq`` crosses (each edge up and down) and its
    slowest edge's latency."""
    uses: Counter[str] = Counter()
    lat = 0.0
    for tree in dtree(len(seq)):
        for c, par in tree:
            for a, b in ((c, par), (par, c)):
                links, lt = fabric.route(order[seq[a]], order[seq[b]])
                _add(uses, links)
                lat = max(lat, lt)
    return uses, lat


def _dp_coflows(
    fabric: PhysicalFabric,
    order: Sequence[str],
    dp: list[list[int]],
    g: int,
    tr: StepTraffic,
    prefix: str,
) -> list[Coflow]:
    """One coflow per distinct DP node ring: a ring or tree all-reduce (NCCL's pick per
    bucket), its bytes per edge scaled by how many DP groups share the node sequence."""
    out: list[Coflow] = []
    lat_hop = fabric.params.nic_latency_s * 2 + 2 * fabric.params.hop_latency_s
    dp_seqs = Counter(_node_seq(r, g) for r in dp)
    for i, (seq, mult) in enumerate(sorted(dp_seqs.items())):
        p = len(seq)
        if p < 2:
            continue
        members = len(dp[0])
        n = tr.dp_bytes
        buckets = max(1, math.ceil(n / tr.bucket_bytes))
        bucket = n / buckets
        algo = _choose(p, bucket, fabric.params.nic_bytes_per_s / g, lat_hop, tr.algorithm)
        if algo == "ring":
            uses, lat = _ring_uses(fabric, order, seq)
            per_edge = mult * 2 * (members - 1) / members * n
            latency = buckets * 2 * (p - 1) * lat
        else:
            uses, lat = _tree_uses(fabric, order, seq)
            per_edge = mult * n / 2  # each tree carries half, up then down
            latency = buckets * 2 * math.ceil(math.log2(p)) * lat
        out.append(
            Coflow(
                f"{prefix}:dp{i}",
                dict(uses),
                per_edge,
                latency_s=latency,
                tags={"dim": "dp", "algo": algo},
            )
        )
    return out


def _pp_coflow(
    fabric: PhysicalFabric,
    order: Sequence[str],
    pp: list[list[int]],
    g: int,
    tr: StepTraffic,
    prefix: str,
) -> list[Coflow]:
    """One coflow for the step's boundary traffic: every pair of neighbouring stages on two
    nodes, forward and back (none when every pipeline stays on one node)."""
    pp_pairs: Counter[tuple[int, int]] = Counter()
    for ranks in pp:
        nodes = [r // g for r in ranks]
        for a, b in itertools.pairwise(nodes):
            if a != b:
                pp_pairs[(a, b)] += 1
    if not pp_pairs:
        return []
    uses: Counter[str] = Counter()
    lat = 0.0
    for (a, b), k in pp_pairs.items():
        for x, y in ((a, b), (b, a)):
            links, lt = fabric.route(order[x], order[y])
            for lk in links:
                uses[lk] += k
            lat = max(lat, lt)
    return [Coflow(f"{prefix}:pp", dict(uses), tr.pp_bytes, latency_s=2 * lat, tags={"dim": "pp"})]


def _ep_coflows(
    fabric: PhysicalFabric,
    order: Sequence[str],
    ep: list[list[int]],
    g: int,
    tr: StepTraffic,
    prefix: str,
) -> list[Coflow]:
    """One coflow per distinct EP node set: the all-to-all token dispatch between its nodes."""
    out: list[Coflow] = []
    ep_seqs = Counter(tuple(dict.fromkeys(r // g for r in ranks)) for ranks in ep)
    for i, (ep_nodes, mult) in enumerate(sorted(ep_seqs.items())):
        e = len(ep_nodes)
        if e < 2:
            continue
        per_rank = len(ep[0])
        uses: Counter[str] = Counter()
        lat = 0.0
        for a in ep_nodes:
            for b in ep_nodes:
                if a != b:
                    links, lt = fabric.route(order[a], order[b])
                    _add(uses, links)
                    lat = max(lat, lt)
        # Each rank sends (e_ranks-1)/e_ranks of its tokens, spread over the other nodes;
        # the ranks of one node (g / tp of this group's members) share its ports.
        ranks_per_node = per_rank / e
        per_pair = mult * tr.ep_bytes * ranks_per_node * (per_rank - 1) / per_rank / (e - 1)
        out.append(
            Coflow(
                f"{prefix}:ep{i}", dict(uses), per_pair, latency_s=(e - 1) * lat, tags={"dim": "ep"}
            )
        )
    return out


def step_coflows(
    fabric: PhysicalFabric,
    order: Sequence[str],
    *,
    gpus_per_node: int,
    tp: int = 1,
    cp: int = 1,
    pp: int = 1,
    ep: int = 1,
    traffic: StepTraffic | None = None,
    prefix: str = "job",
) -> list[Coflow]:
    """The coflows of one step of a job whose ranks follow ``order`` (node rank order):
    DP's all-reduces, then PP's boundary sends, then EP's all-to-alls."""
    tr = traffic or StepTraffic()
    g = gpus_per_node
    groups = _groups(len(order), g, tp, cp, pp, ep)
    return [
        *_dp_coflows(fabric, order, groups["dp"], g, tr, prefix),
        *_pp_coflow(fabric, order, groups["pp"], g, tr, prefix),
        *_ep_coflows(fabric, order, groups["ep"], g, tr, prefix),
    ]
