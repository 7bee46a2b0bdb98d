"""Predicted communication time of one placement: an alpha-beta model per parallel group.

Why a model at all: Slurm's ``topology/tree`` minimises leaf switches only as a side effect and
orders ranks by node name (https://slurm.schedmd.com/topology.html), so "how good is
this placement" needs a number that sees rank order. The model:

* Ranks follow Megatron's default order ``tp-cp-ep-dp-pp``
(NVIDIA/Megatron-LM:megatron/core/parallel_state.py): TP groups are
  consecutive ranks, CP strides by TP, DP by TP*CP inside one pipeline stage, PP by world/PP.
  Expert groups come from the expert generator ``tp-ep-dp-pp`` with expert-TP = TP (the second
  ``RankGenerator`` of NVIDIA/Megatron-LM:megatron/core/parallel_state.py).
* Node ``i`` of ``order`` holds global ranks ``i*G .. i*G+G-1`` (plan/types.py ``Placement``).
* Each group is charged at the slowest tier it crosses: ``nvlink`` when all its
  members share one NVLink domain (the node, or a GB200 UltraServer), otherwise ``leaf``,
  ``spine`` or ``core`` by the level of the members' lowest common switch (0, 1, >= 2).
* Formulas (after Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 19(1), 2005): ring all-reduce for TP, CP and DP
  ``2(p-1)a + 2(p-1)/p * n*b``; all-to-all for EP ``(p-1)a + (p-1)/p * n*b``; point-to-point for
  PP ``a + n*b`` per neighbouring stage pair along a pipeline.
* Congestion: every DP ring edge between two
  nodes crosses the uplinks of the switches below their common ancestor. All DP groups run at
  once, so per uplink and direction the edges are counted; the uplink carries ``nodes * G / o``
  flows at full rate (``o`` = the oversubscription of that switch's tier, and ``nodes`` = this
  job's nodes under the switch: a fair share of a fabric that other jobs also use). A DP group's
  ``b`` is scaled by ``max(1, load/capacity)`` on the worst uplink it crosses. This reproduces the
  flow-level simulation's qualitative facts (:mod:`slurmfm.plan.simulate`): a topology-ordered ring
  is nearly free at any ``o``, a scrambled
  one slows down by up to about ``o(1-1/L)``.
* ``ideal`` charges every group at the best tier its node span allows (a group over ``k`` nodes
  fits one domain, one leaf or one spine only if the fabric has one that large) with no
  congestion: a lower bound, so ``slowdown = predicted/ideal >= 1`` (docs/placement-plans.md).

Counts are of distinct node-level rings/pairs (groups that map to the same node sequence, such
as the G/TP DP groups of one node set, are one ring for the counts but all load the uplinks).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmfm.errors import SlurmfmError

if TYPE_CHECKING:
    from slurmfm.topology.model import Topology

TIERS = ("nvlink", "leaf", "spine", "core")
DIMS = ("tp", "cp", "ep", "dp", "pp")


class CostParamsError(SlurmfmError):
    """A calibration file that cannot be read or names unknown tiers/fields."""


@dataclass(frozen=True)
class Tier:
    """Latency and inverse bandwidth of one fabric tier, per GPU (rank) stream.

    ``oversubscription`` is the downlink:uplink ratio of the switches *at* this tier: a leaf
    switch's uplinks carry ``1/o`` of what its nodes can send (a fat tree's taper).
    """

    name: str
    alpha_s: float
    beta_s_per_byte: float
    oversubscription: float = 1.0


# Nominal per-GPU figures: NVLink4 900 GB/s bidirectional per H100/H200 GPU
# (https://www.nvidia.com/en-us/data-center/nvlink/) -> 450 GB/s one way; EFA on p5-class
# 3,200 Gb/s per instance (aws/karpenter-provider-aws:pkg/providers/instancetype/
# zz_generated.bandwidth.go) = 50 GB/s per GPU. Every EFA tier has the same per-GPU bandwidth:
# ByteDance's Arnold (arXiv 2509.15940) measured up to 17 % slower collectives across pods
# under production load, which is congestion, and congestion is what ``oversubscription``
# models; charging it as a slower core on top made the model disagree with the flow-level
# simulation (slurmfm.plan.simulate) on uncongested placements. Latencies are not published
# for EFA: 3 us NVLink, 10 us EFA in a leaf and 2 us per extra tier crossed are placeholders
# to calibrate with nccl-tests. Oversubscription defaults to 1 (not published either); pass
# the fabric's with ``--params`` (the benchmark reports 1, 2 and 4).
_DEFAULT_TIERS = {
    "nvlink": Tier("nvlink", 3e-6, 1 / 450e9),
    "leaf": Tier("leaf", 10e-6, 1 / 50e9),
    "spine": Tier("spine", 12e-6, 1 / 50e9),
    "core": Tier("core", 14e-6, 1 / 50e9),
}

# Bytes each group moves per training step. Illustrative (no source gives per-step volumes;
# they depend on the model): DP = bf16 gradients of a ~500M-parameter shard, TP/CP = activations,
# EP = token dispatch, PP = one stage boundary's activations. Only their ratios matter for
# ``slowdown``; calibrate with your model (e.g. dp = 2 bytes * params / (tp*pp)).
_DEFAULT_BYTES = {
    "tp": 256e6,
    "cp": 128e6,
    "ep": 512e6,
    "dp": 1e9,
    "pp": 64e6,
}


@dataclass(frozen=True)
class CostParams:
    """The tier table and per-step message sizes; calibrate from nccl-tests.

    File format (:meth:`from_file`, YAML or JSON; every key optional, missing ones keep the
    defaults)::

        tiers:
          nvlink: {alpha_s: 3.0e-6, bandwidth_GBps: 450}
          leaf:   {alpha_s: 1.0e-5, beta_s_per_byte: 2.0e-11, oversubscription: 1}
          spine:  {alpha_s: 1.2e-5, bandwidth_GBps: 50, oversubscription: 2}
          core:   {alpha_s: 1.4e-5, bandwidth_GBps: 42.7, oversubscription: 4}
        message_bytes: {tp: 2.56e8, cp: 1.28e8, ep: 5.12e8, dp: 1.0e9, pp: 6.4e7}
        dp_bucket_bytes: 8.0e7   # one DP all-reduce call (NCCL's tuner picks per call)
        dp_algorithm: auto       # or ring / tree (NCCL_ALGO)

    ``bandwidth_GBps`` is per-GPU one-way bandwidth (nccl-tests busbw per rank) and is an
    alternative to ``beta_s_per_byte`` (= 1 / (GBps * 1e9)).
    """

    tiers: Mapping[str, Tier]
    message_bytes: Mapping[str, float]
    # One DP all-reduce call (a gradient bucket): what NCCL's tuner sees when it picks ring or
    # tree. Megatron's distributed optimizer buckets max(40M, 1M * dp) parameters
    # (NVIDIA/Megatron-LM:megatron/core/distributed/distributed_data_parallel_config.py,
    # ``bucket_size``), 80 MB of bf16 gradients for dp <= 40.
    dp_bucket_bytes: float = 80e6
    # "auto": the algorithm NCCL's tuner would pick (:func:`nccl_allreduce_algorithm`); "ring"
    # or "tree": forced, as with NCCL_ALGO.
    dp_algorithm: str = "auto"
    # Whose share of a switch's uplinks the job gets: "job" (the default), the job's own nodes
    # under the switch times the NIC over the oversubscription, a fair share of a fabric other
    # jobs also use; "switch": all the nodes under it, as on an otherwise idle fabric. The
    # planner cannot see other jobs' traffic, so it checks a placement under both.
    # "busy": the physical uplinks (every node under the switch times the NIC over the
    # oversubscription) shared max-min with the other jobs' nodes under it (``busy_under``),
    # each of which is taken to send at its NIC rate: the job gets
    # ``all * job / (job + busy)`` nodes' worth, between "job" (every other node busy) and
    # "switch" (none). The guard sets it from the nodes that are not free (issue 42 item 4:
    # Slurm's choice compared under other jobs' traffic on physical uplinks).
    uplink_share: str = "job"
    busy_under: Mapping[str, int] | None = None

    @classmethod
    def default(cls) -> CostParams:
        return cls(dict(_DEFAULT_TIERS), dict(_DEFAULT_BYTES))

    def with_message_bytes(self, sizes: Mapping[str, float]) -> CostParams:
        """The same tiers with some per-step message sizes replaced."""
        return dataclasses.replace(self, message_bytes={**self.message_bytes, **sizes})

    def with_oversubscription(self, oversubscription: float) -> CostParams:
        """The same parameters with every EFA tier (leaf, spine, core) at ``oversubscription``."""
        tiers = dict(self.tiers)
        for name in ("leaf", "spine", "core"):
            t = tiers[name]
            tiers[name] = Tier(t.name, t.alpha_s, t.beta_s_per_byte, float(oversubscription))
        return dataclasses.replace(self, tiers=tiers)

    @classmethod
    def from_file(cls, path: str | Path) -> CostParams:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise CostParamsError(f"{p}: cannot read cost parameters: {exc.strerror}") from exc
        data: Any
        try:
            if p.suffix.lower() == ".json":
                data = json.loads(text)
            else:
                from ruamel.yaml import YAML

                data = YAML(typ="safe").load(text)
        except Exception as exc:
            raise CostParamsError(f"{p}: not valid YAML/JSON: {exc}") from exc
        return cls.from_mapping(data or {}, source=str(p))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "<params>") -> CostParams:
        """Defaults overlaid with ``data`` (the :meth:`from_file` structure)."""
        if not isinstance(data, Mapping):
            raise CostParamsError(f"{source}: expected a mapping with 'tiers'/'message_bytes'")
        unknown = set(data) - {"tiers", "message_bytes", "dp_bucket_bytes", "dp_algorithm"}
        if unknown:
            raise CostParamsError(f"{source}: unknown keys {sorted(unknown)}")
        tiers = dict(_DEFAULT_TIERS)
        for name, spec in (data.get("tiers") or {}).items():
            if name not in TIERS:
                raise CostParamsError(f"{source}: tiers.{name}: unknown tier (use {TIERS})")
            if not isinstance(spec, Mapping):
                raise CostParamsError(f"{source}: tiers.{name}: expected a mapping")
            extra = set(spec) - {"alpha_s", "beta_s_per_byte", "bandwidth_GBps", "oversubscription"}
            if extra:
                raise CostParamsError(f"{source}: tiers.{name}: unknown fields {sorted(extra)}")
            base = tiers[name]
            try:
                beta = float(spec.get("beta_s_per_byte", base.beta_s_per_byte))
                if "bandwidth_GBps" in spec:
                    beta = 1.0 / (float(spec["bandwidth_GBps"]) * 1e9)
                tier = Tier(
                    name,
                    float(spec.get("alpha_s", base.alpha_s)),
                    beta,
                    float(spec.get("oversubscription", base.oversubscription)),
                )
            except (TypeError, ValueError, ZeroDivisionError) as exc:
                raise CostParamsError(f"{source}: tiers.{name}: {exc}") from exc
            if tier.alpha_s < 0 or tier.beta_s_per_byte <= 0 or tier.oversubscription < 1:
                raise CostParamsError(
                    f"{source}: tiers.{name}: need alpha_s >= 0, bandwidth > 0, "
                    "oversubscription >= 1"
                )
            tiers[name] = tier
        sizes = dict(_DEFAULT_BYTES)
        for dim, value in (data.get("message_bytes") or {}).items():
            if dim not in DIMS:
                raise CostParamsError(f"{source}: message_bytes.{dim}: unknown (use {DIMS})")
            try:
                sizes[dim] = float(value)
            except (TypeError, ValueError) as exc:
                raise CostParamsError(f"{source}: message_bytes.{dim}: {exc}") from exc
            if sizes[dim] < 0:
                raise CostParamsError(f"{source}: message_bytes.{dim}: must be >= 0")
        algo = str(data.get("dp_algorithm", "auto"))
        if algo not in ("auto", "ring", "tree"):
            raise CostParamsError(f"{source}: dp_algorithm: use auto, ring or tree, not {algo!r}")
        try:
            bucket = float(data.get("dp_bucket_bytes", 80e6))
        except (TypeError, ValueError) as exc:
            raise CostParamsError(f"{source}: dp_bucket_bytes: {exc}") from exc
        if bucket <= 0:
            raise CostParamsError(f"{source}: dp_bucket_bytes: must be > 0")
        return cls(tiers, sizes, dp_bucket_bytes=bucket, dp_algorithm=algo)


def message_bytes_for_megatron(
    model_args: Mapping[str, Any], *, tp: int, pp: int, dp: int
) -> dict[str, float] | None:
    """Per-step message sizes from a Megatron recipe's model arguments (None if too few).

    Needs ``num-layers``, ``hidden-size``, ``seq-length`` and ``global-batch-size``; the rest
    has Megatron's defaults (NVIDIA/Megatron-LM ``megatron/training/arguments.py``:
    ``ffn-hidden-size`` 4h, ``micro-batch-size`` 1, fp32 gradient reduction unless
    ``grad-reduce-in-bf16``). Parameters per layer: attention ``h^2 (2 + 2 g/a)`` (query and
    output, key and value shrunk by grouped-query attention), MLP ``3 h f`` with SwiGLU else
    ``2 h f``; embeddings are left out (a few percent). Then per rank and step:

    * ``dp``: the gradient bytes of its shard, ``params / (tp * pp)`` at 4 (or 2) bytes;
    * ``pp``: one stage boundary's activations for every micro-batch, ``m * s * b * h * 2``
      (bf16), where ``m = global batch / (b * dp)``;
    * ``tp``: four all-reduces of ``s * b * h`` bf16 values per layer and micro-batch
      (two forward, two backward; Megatron-LM paper, arXiv 1909.08053 section 3).
    """

    def num(key: str, default: float | None = None) -> float | None:
        v = model_args.get(key, default)
        if isinstance(v, bool) or v is None:
            return default
        try:
            return float(v)
        except (TypeError, ValueError):
            return default

    layers, h, s = num("num-layers"), num("hidden-size"), num("seq-length")
    gbs = num("global-batch-size")
    if layers is None or h is None or s is None or gbs is None:
        return None
    f = num("ffn-hidden-size", 4 * h) or 4 * h
    b = num("micro-batch-size", 1.0) or 1.0
    heads = num("num-attention-heads")
    groups = num("num-query-groups") if model_args.get("group-query-attention") else None
    kv = 2 * (groups / heads) if groups and heads else 2.0
    mlp = 3 * h * f if model_args.get("swiglu") else 2 * h * f
    params = layers * (h * h * (2 + kv) + mlp)
    grad_bytes = 2 if model_args.get("grad-reduce-in-bf16") else 4
    micro = max(1.0, gbs / (b * max(1, dp)))
    act = s * b * h * 2
    return {
        "dp": grad_bytes * params / (tp * pp),
        "pp": micro * act,
        "tp": 4 * (layers / pp) * micro * act,
    }


@dataclass(frozen=True)
class JobShape:
    """Whole-node job: ``nodes`` x ``gpus_per_node`` ranks and the Megatron parallel sizes."""

    nodes: int
    gpus_per_node: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    # GPUs more that must share one NVLink domain: a model server's replica (its
    # model-parallel span, slurmfm.launchers.serving.ServerSpec.nvlink_span), 1: none
    span: int = 1

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.cp * self.pp)

    def problems(self) -> list[str]:
        """Why this shape is not a valid Megatron layout (empty when it is)."""
        out: list[str] = []
        for name in ("nodes", "gpus_per_node", "tp", "pp", "cp", "ep", "span"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1")
        if out:
            return out
        mp = self.tp * self.cp * self.pp
        if self.world % mp:
            out.append(
                f"tp*cp*pp = {mp} does not divide the world size {self.nodes}*"
                f"{self.gpus_per_node} = {self.world}"
            )
        elif (self.dp * self.cp) % self.ep:
            out.append(f"ep={self.ep} must divide dp*cp = {self.dp}*{self.cp} (Megatron-LM's rule)")
        if self.world % self.span:
            out.append(f"a server replica of {self.span} GPUs does not divide {self.world} GPUs")
        return out

    def nvlink_unit(self) -> int:
        """Consecutive nodes that must share one NVLink domain.

        TP*CP groups are blocks of ``tp*cp`` consecutive ranks and EP groups blocks of
        ``tp*ep`` (NVIDIA/Megatron-LM:megatron/core/parallel_state.py); both fit whole into aligned
        blocks of ``lcm`` ranks, and such a
        block covers ``lcm(block, G)/G`` whole nodes. A server's replica (``span`` GPUs, whole
        replicas laid out in rank order) is one more such block.
        """
        block = math.lcm(self.tp * self.cp, self.tp * self.ep, self.span)
        return math.lcm(block, self.gpus_per_node) // self.gpus_per_node


@dataclass(frozen=True)
class CostReport:
    """Predicted and ideal per-step communication time plus interpretable counts
    (docs/placement-plans.md)."""

    predicted_s: float
    ideal_s: float
    slowdown: float
    leaves_used: int
    dp_ring_edges: int
    dp_edges_cross_leaf: int
    dp_edges_cross_spine: int
    pp_pairs: int
    pp_pairs_cross_leaf: int
    nvlink_violations: int
    per_group: Mapping[str, float]
    # Per dimension: the tier that bounds its slowest group ("nvlink", "leaf", "spine",
    # "core"), with " x<f>" when uplink congestion slows it by the factor f (DP only).
    bound_by: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {
            "predicted_s": self.predicted_s,
            "ideal_s": self.ideal_s,
            "slowdown": self.slowdown,
            "leaves_used": self.leaves_used,
            "dp_ring_edges": self.dp_ring_edges,
            "dp_edges_cross_leaf": self.dp_edges_cross_leaf,
            "dp_edges_cross_spine": self.dp_edges_cross_spine,
            "pp_pairs": self.pp_pairs,
            "pp_pairs_cross_leaf": self.pp_pairs_cross_leaf,
            "nvlink_violations": self.nvlink_violations,
        }
        for dim, t in self.per_group.items():
            out[f"{dim}_s"] = t
        return out


# ---------------------------------------------------------------------------- helpers


def nvlink_domain(topology: Topology, node: str) -> str:
    """NVLink domain: the node's UltraServer, else for a block topology its block, else itself.

    Block topologies for GB200 put one ``BlockName`` per NVLink domain (topology.conf(5),
    BlockName), so a block without explicit domain ids is
    taken as the UltraServer. Tree topologies carry UltraServers as ``Node.nvlink_domain``.
    """
    dom = topology.nodes[node].nvlink_domain
    if dom:
        return dom
    if topology.kind == "block":
        return "block:" + topology.leaf(node)
    return node


def _tier_of_level(level: int) -> str:
    return "leaf" if level <= 0 else "spine" if level == 1 else "core"


class _Fabric:
    """Per-evaluation view: paths, domains and levels of the job's nodes, by node index."""

    def __init__(self, topology: Topology, order: Sequence[str]) -> None:
        self.topo = topology
        self.paths = [topology.path(h) for h in order]
        self.domains = [nvlink_domain(topology, h) for h in order]
        self._level = topology.level

    def lca_level(self, nodes: Sequence[int]) -> int:
        """Level of the lowest switch above all ``nodes`` (-1: one NVLink domain)."""
        first = nodes[0]
        doms = self.domains
        dom = doms[first]
        if all(doms[i] == dom for i in nodes):
            return -1
        p0 = self.paths[first]
        common = len(p0)
        for i in nodes:
            p = self.paths[i]
            if p is p0:
                continue
            c = 0
            lim = min(common, len(p))
            while c < lim and p[c] == p0[c]:
                c += 1
            common = c
            if common == 0:
                break
        if common == 0:  # pragma: no cover - Topology guarantees one root
            return 1 << 20
        return self._level(p0[common - 1])

    def pair_level(self, a: int, b: int) -> int:
        if self.domains[a] == self.domains[b]:
            return -1
        pa, pb = self.paths[a], self.paths[b]
        if pa is pb:  # same leaf (paths are shared per leaf)
            return self._level(pa[-1])
        c = _common(pa, pb)
        return self._level(pa[c - 1]) if c else 1 << 20


def _common(pa: tuple[str, ...], pb: tuple[str, ...]) -> int:
    """Length of the shared top-down prefix of two switch paths."""
    c = 0
    lim = min(len(pa), len(pb))
    while c < lim and pa[c] == pb[c]:
        c += 1
    return c


def _tier_name(level: int) -> str:
    return "nvlink" if level < 0 else _tier_of_level(level)


def _tier_at(tiers: Mapping[str, Tier], level: int) -> Tier:
    """The tier a group whose lowest common switch is at ``level`` pays (-1: NVLink).

    Levels above 2 (4-level fabrics: p6-b200/b300 report 4 network layers) cost the core's
    bandwidth and one more hop each way per level: the core's alpha plus the spine-to-core
    alpha step per extra level, so a ring that crosses the top of a 4-level fabric is not
    charged like one that stays under a level-2 switch (the flow-level simulation adds a hop
    latency per uplink crossed).
    """
    if level <= 2:
        return tiers[_tier_name(level)]
    core, spine = tiers["core"], tiers["spine"]
    step = max(0.0, core.alpha_s - spine.alpha_s)
    return Tier(
        core.name, core.alpha_s + (level - 2) * step, core.beta_s_per_byte, core.oversubscription
    )


def _ring(p: int, n: float, t: Tier, congestion: float = 1.0) -> float:
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * t.alpha_s + 2 * (p - 1) / p * n * t.beta_s_per_byte * congestion


def _tree(k: int, n: float, buckets: int, t: Tier, congestion: float = 1.0) -> float:
    """NCCL's double binary tree all-reduce of ``n`` bytes over ``k`` nodes in ``buckets`` calls.

    Each call climbs and descends ``ceil(log2 k)`` levels (latency); each tree carries half the
    data up (reduce) and down (broadcast), so an inner node's NIC moves about ``2n`` (three tree
    edges in one tree, one in the other, ``n/2`` each way): the bandwidth term of a ring,
    without the ring's ``(p-1)/p`` (NVIDIA/nccl:src/graph/trees.cc, ``ncclGetDtree``).
    """
    if k <= 1:
        return 0.0
    steps = 2 * math.ceil(math.log2(k))
    return buckets * steps * t.alpha_s + 2 * n * t.beta_s_per_byte * congestion


# NVIDIA/nccl:src/graph/tuning.cc, treeCorrectionFactor[NCCL_PROTO_SIMPLE]: powers of two from
# 64 B; larger sizes use 1.0.
_TREE_CORRECTION_SIMPLE = (
    0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5,
    0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9,
)  # fmt: skip


def nccl_allreduce_algorithm(nodes: int, call_bytes: float, tier: Tier) -> str:
    """ "ring" or "tree": what NCCL's tuner would pick for one all-reduce call over ``nodes``.

    NVIDIA/nccl:src/graph/tuning.cc (``ncclTopoTuneModel``, then ``ncclTopoGetAlgoTime``) takes
    the smaller ``latency + bytes / algorithm bandwidth``: the ring's latency grows with its
    ``2(n-1)`` steps (each also paying the intra-node hops, charged here as 1.4x a network
    step), the tree's with ``2 log2 n``; the ring's algorithm bandwidth is
    ``busBw * n / (2(n-1))``, the tree's ``busBw / 2`` derated by 0.92 and by
    ``treeCorrectionFactor`` for mid-size calls. It depends on the node count and the call's
    size, not on where the nodes sit (the tuner sees the nominal network), so two placements of
    one job use the same algorithm. The crossover is an estimate: NCCL's constants change
    between releases, which is why the planner asks a placement to win under both algorithms
    before it leaves Slurm's own choice (:mod:`slurmfm.plan.planner`).
    """
    if nodes <= 2:
        return "ring"
    bw = 1.0 / tier.beta_s_per_byte
    lat = tier.alpha_s
    k = int(math.log2(max(call_bytes, 64) / 64))
    factor = _TREE_CORRECTION_SIMPLE[k] if k < len(_TREE_CORRECTION_SIMPLE) else 1.0
    ring = 2 * (nodes - 1) * lat * 1.4 + call_bytes / (bw * nodes / (2 * (nodes - 1)))
    tree = 2 * math.log2(nodes) * lat + call_bytes / (bw * 0.92 * factor / 2)
    return "tree" if tree < ring else "ring"


def double_binary_tree(n: int) -> list[list[tuple[int, int]]]:
    """NCCL's two binary trees over positions ``0..n-1`` of the ring order, as (child, parent).

    NVIDIA/nccl:src/graph/trees.cc: in ``ncclGetBtree`` a rank's parent clears its lowest set
    bit and sets the next one (or only clears it near the end); ``ncclGetDtree`` mirrors the
    tree for an even count and shifts it by one for an odd count, so a leaf of one tree is an
    inner node of the other.
    """

    def parent(r: int) -> int:
        bit = 1
        while not bit & r:
            bit <<= 1
        up = (r ^ bit) | (bit << 1)
        return r ^ bit if up >= n else up

    t1 = [(r, parent(r)) for r in range(1, n)]
    if n % 2:
        t2 = [((c + 1) % n, (q + 1) % n) for c, q in t1]
    else:
        t2 = [(n - 1 - c, n - 1 - q) for c, q in t1]
    return [t1, t2]


def _distinct_ring(nodes: tuple[int, ...]) -> tuple[int, ...]:
    """A group's node sequence with consecutive repeats (ranks of one node) folded."""
    seq: list[int] = []
    for x in nodes:
        if not seq or seq[-1] != x:
            seq.append(x)
    if len(seq) > 1 and seq[-1] == seq[0]:
        seq.pop()
    return tuple(seq)


def _alltoall(p: int, n: float, t: Tier) -> float:
    if p <= 1:
        return 0.0
    return (p - 1) * t.alpha_s + (p - 1) / p * n * t.beta_s_per_byte


def _p2p(n: float, t: Tier) -> float:
    return t.alpha_s + n * t.beta_s_per_byte


@dataclass(frozen=True)
class _Spans:
    """Largest node count one NVLink domain / leaf / level-1 switch of the fabric holds."""

    domain: int
    leaf: int
    spine: int

    def ideal_level(self, k: int) -> int:
        if k <= max(1, self.domain):
            return -1
        if k <= self.leaf:
            return 0
        if k <= self.spine:
            return 1
        return 2


_SPANS_CACHE: dict[int, tuple[Any, _Spans]] = {}
_UNDER_CACHE: dict[int, tuple[Any, Counter[str]]] = {}


def _all_under(topology: Topology) -> Counter[str]:
    """Nodes under each switch of the fabric (cached per topology)."""
    import weakref

    hit = _UNDER_CACHE.get(id(topology))
    if hit is not None and hit[0]() is topology:
        return hit[1]
    under: Counter[str] = Counter()
    for n in topology.nodes:
        for sw in topology.path(n):
            under[sw] += 1
    if len(_UNDER_CACHE) > 64:
        _UNDER_CACHE.clear()
    _UNDER_CACHE[id(topology)] = (weakref.ref(topology), under)
    return under


def _spans(topology: Topology) -> _Spans:
    import weakref

    hit = _SPANS_CACHE.get(id(topology))
    if hit is not None and hit[0]() is topology:
        return hit[1]
    nodes = topology.nodes
    if topology.kind == "tree" and not any(n.nvlink_domain for n in nodes.values()):
        dom_sizes: Counter[str] = Counter({"": 1})  # every node is its own domain
    else:
        dom_sizes = Counter(nvlink_domain(topology, n) for n in nodes)
    leaf_sizes = Counter(topology.leaf_of.values())
    spine_sizes: Counter[str] = Counter()
    for leaf, cnt in leaf_sizes.items():
        par = topology.parent_of.get(leaf)
        if par is not None and topology.level(par) == 1:
            spine_sizes[par] += cnt
    spans = _Spans(
        max(dom_sizes.values(), default=1),
        max(leaf_sizes.values(), default=1),
        max(spine_sizes.values(), default=max(leaf_sizes.values(), default=1)),
    )
    _SPANS_CACHE[id(topology)] = (weakref.ref(topology), spans)
    return spans


def _groups(job: JobShape) -> dict[str, list[range]]:
    """Every communication group as a range of global ranks (ring/chain order), per dim."""
    tp, cp, pp, ep, world = job.tp, job.cp, job.pp, job.ep, job.world
    dp = job.dp
    stage = world // pp
    out: dict[str, list[range]] = {d: [] for d in DIMS}
    if tp > 1:
        out["tp"] = [range(s * tp, s * tp + tp) for s in range(world // tp)]
    if cp > 1:
        out["cp"] = [
            range(b * tp * cp + t, (b + 1) * tp * cp, tp)
            for b in range(world // (tp * cp))
            for t in range(tp)
        ]
    if dp > 1:
        step = tp * cp
        out["dp"] = [
            range(p * stage + t, (p + 1) * stage, step) for p in range(pp) for t in range(step)
        ]
    if ep > 1:
        edp = world // (tp * ep * pp)
        out["ep"] = [
            range(p * stage + k * tp * ep + t, p * stage + (k + 1) * tp * ep, tp)
            for p in range(pp)
            for k in range(edp)
            for t in range(tp)
        ]
    if pp > 1:
        out["pp"] = [range(x, world, stage) for x in range(stage)]
    return out


def _node_groups(ranges: list[range], g: int) -> Counter[tuple[int, ...]]:
    """Distinct node sequences of groups (rank // G), with how many groups map to each."""
    div = g.__rfloordiv__  # r // g, without a Python frame per rank (64k-node plans)
    return Counter(tuple(map(div, rg)) for rg in ranges)


def _one_per_shape(ranges: list[range], g: int) -> list[range]:
    """``ranges`` cut to one per length when every group stays inside one node, else as is.

    Why: such a group (TP=8 on 8-GPU nodes) costs the same wherever it is: NVLink inside
    its node, never a violation. :func:`_nvlink_dim` (TP/CP/EP) keeps the worst and
    the first bound, so one representative per length gives the same report without
    16k identical groups on a 64k-node plan.
    """
    if not all(r.start // g == (r.stop - 1) // g for r in ranges):
        return ranges
    return list({len(r): r for r in reversed(ranges)}.values())


def _ring_edges(nodes: tuple[int, ...]) -> list[tuple[int, int]]:
    """Inter-node edges of a ring that visits ``nodes`` in order and closes."""
    seq = [nodes[0]]
    for x in nodes[1:]:
        if x != seq[-1]:
            seq.append(x)
    if len(seq) > 1 and seq[-1] == seq[0]:
        seq.pop()
    if len(seq) < 2:
        return []
    return [(seq[i], seq[(i + 1) % len(seq)]) for i in range(len(seq))]


@dataclass(frozen=True)
class _DimTime:
    """One dimension's slowest group: its predicted and its ideal time, and the tier that
    bounds it (None when the dimension has no group, so :class:`CostReport` leaves it out)."""

    worst: float = 0.0
    best: float = 0.0
    bound: str | None = None


@dataclass
class _DpRings:
    """The DP groups as directed node edges, and the load all of them put on each uplink.

    Why one value: the congestion pass needs every group's load before it can charge any
    group, so the edges are walked once here and kept (with each edge's shared path prefix)
    for :func:`_dp_time` instead of being recomputed per group.
    """

    # (switch, upwards?) -> ring-edge loads; per ring: (a, b, level or -1, shared prefix)
    load: dict[tuple[str, bool], float] = field(default_factory=dict)
    edges: dict[tuple[int, ...], list[tuple[int, int, int, int]]] = field(default_factory=dict)
    algo: dict[tuple[int, ...], str] = field(default_factory=dict)
    ring_edges: int = 0
    cross_leaf: int = 0
    cross_spine: int = 0


def _check_order(order: Sequence[str], job: JobShape) -> None:
    """Refuse a shape or an order the model cannot charge: a wrong node count or a repeated
    host would put ranks on nodes the job does not have, and the report would look valid."""
    bad = job.problems()
    if bad:
        raise ValueError("; ".join(bad))
    if len(order) != job.nodes:
        raise ValueError(f"order has {len(order)} hosts, the job needs {job.nodes}")
    if len(set(order)) != len(order):
        raise ValueError("order names a host twice")


def _nvlink_dim(
    fab: _Fabric,
    spans: _Spans,
    ranges: list[range],
    g: int,
    dim: str,
    params: CostParams,
) -> tuple[_DimTime, int]:
    """TP, CP or EP: collectives that must stay inside an NVLink domain; the time and how
    many groups leave their domain (the NVLink violations).

    A group's time depends only on (size, level), so it is computed once per pair: a
    64k-node plan has 16k TP groups.
    """
    tiers, nbytes = params.tiers, params.message_bytes[dim]
    fn = _alltoall if dim == "ep" else _ring
    worst = best = 0.0
    bound: str | None = None
    violations = 0
    memo: dict[tuple[int, int], float] = {}
    for nodes, count in _node_groups(_one_per_shape(ranges, g), g).items():
        p = len(nodes)
        level = fab.lca_level(nodes)
        if level >= 0:
            violations += count
        ilevel = spans.ideal_level(len(set(nodes)))
        t = memo.get((p, level))
        if t is None:
            t = memo[(p, level)] = fn(p, nbytes, _tier_at(tiers, level))
        if t > worst or bound is None:
            worst, bound = max(worst, t), _tier_name(level)
        ti = memo.get((p, ilevel))
        if ti is None:
            ti = memo[(p, ilevel)] = fn(p, nbytes, _tier_at(tiers, ilevel))
        best = max(best, ti)
    return _DimTime(worst, best, bound), violations


def _dp_directed(
    nodes: tuple[int, ...], seq: tuple[int, ...], algo: str
) -> list[tuple[int, int, float, bool]]:
    """(a, b, weight, counted) per directed edge of one DP all-reduce: how many ring-edge
    loads it carries and whether it counts in the edge counts.

    A tree edge moves n/2 each way (each of the two trees carries half), a ring edge about
    2n, so a tree edge loads an uplink a quarter as much; it counts once, not per way.
    """
    if algo == "tree":
        return [
            (seq[x], seq[y], 0.25, x == c)
            for tree in double_binary_tree(len(seq))
            for c, par in tree
            for x, y in ((c, par), (par, c))
        ]
    return [(a, b, 1.0, True) for a, b in _ring_edges(nodes)]


def _dp_rings(fab: _Fabric, dp_nodes: Counter[tuple[int, ...]], params: CostParams) -> _DpRings:
    """Every DP group's edges (ring or NCCL's double binary tree, as NCCL's tuner would
    pick) and the uplink load of all DP groups at once, for the congestion pass."""
    rings = _DpRings()
    load = rings.load
    ring_edges = cross_leaf = cross_spine = 0
    paths, doms, level_of = fab.paths, fab.domains, fab._level
    for nodes, count in dp_nodes.items():
        seq = _distinct_ring(nodes)
        algo = params.dp_algorithm
        if algo == "auto":
            algo = nccl_allreduce_algorithm(len(seq), params.dp_bucket_bytes, params.tiers["leaf"])
        rings.algo[nodes] = algo
        info = []
        for a, b, w, counted in _dp_directed(nodes, seq, algo):
            # fab.pair_level(a, b) inlined, keeping the shared prefix length for the uplinks
            # below and the congestion pass (16k ring edges on a 64k-node plan).
            if doms[a] == doms[b]:
                info.append((a, b, -1, 0))
                ring_edges += counted
                continue
            pa, pb = paths[a], paths[b]
            c = len(pa) if pa is pb else _common(pa, pb)
            lvl = level_of(pa[c - 1]) if c else 1 << 20
            info.append((a, b, lvl, c))
            if counted:
                ring_edges += 1
                cross_leaf += lvl >= 1
                cross_spine += lvl >= 2
            for sw in pa[c:]:
                load[(sw, True)] = load.get((sw, True), 0.0) + count * w
            for sw in pb[c:]:
                load[(sw, False)] = load.get((sw, False), 0.0) + count * w
        rings.edges[nodes] = info
    rings.ring_edges, rings.cross_leaf, rings.cross_spine = ring_edges, cross_leaf, cross_spine
    return rings


def _job_under(topology: Topology, fab: _Fabric, params: CostParams) -> Mapping[str, float]:
    """Nodes whose share of each switch's uplinks the job gets (``CostParams.uplink_share``):
    its own nodes under the switch, all of them on an otherwise idle fabric, or its max-min
    share of the physical uplinks with the busy nodes under the switch sending too."""
    if params.uplink_share == "switch":
        return _all_under(topology)
    job_under: Counter[str] = Counter()
    for path in fab.paths:
        for sw in path:
            job_under[sw] += 1
    if params.uplink_share == "busy":
        busy = params.busy_under or {}
        under = _all_under(topology)
        return {sw: under[sw] * c / (c + busy.get(sw, 0)) for sw, c in job_under.items()}
    return job_under


def _uplink_ratio(
    topology: Topology,
    tiers: Mapping[str, Tier],
    load: Mapping[tuple[str, bool], float],
    job_under: Mapping[str, float],
    g: int,
    nic_load: float = 1.0,
) -> dict[str, float]:
    """Per switch, the worst direction's load over what its uplinks carry at full rate
    (``job_under * G / o``), beyond the ``nic_load`` each node's NIC carries anyway: the
    factor by which a send across that uplink slows down (> 1: congested)."""
    ratio: dict[str, float] = {}
    for (sw, _up), flows in load.items():
        o = tiers[_tier_of_level(topology.level(sw))].oversubscription
        share = flows / (job_under[sw] * g / o) / nic_load
        ratio[sw] = max(ratio.get(sw, 0.0), share)
    return ratio


def _ring_congestion(
    info: list[tuple[int, int, int, int]], paths: list[tuple[str, ...]], ratio: dict[str, float]
) -> float:
    """The worst uplink ratio on any inter-node edge of one DP ring (1.0: uncongested)."""
    congestion = 1.0
    for a, b, lvl, c in info:
        if lvl < 0:
            continue
        pa, pb = paths[a], paths[b]
        for sw in (*pa[c:], *pb[c:]):
            congestion = max(congestion, ratio.get(sw, 0.0))
    return congestion


def _dp_time(
    fab: _Fabric, spans: _Spans, rings: _DpRings, ratio: dict[str, float], params: CostParams
) -> _DimTime:
    """DP's all-reduce: each ring (or tree) at its tier, slowed by its worst uplink."""
    tiers, nbytes = params.tiers, params.message_bytes["dp"]
    buckets = max(1, math.ceil(nbytes / params.dp_bucket_bytes))
    worst = best = 0.0
    bound: str | None = None
    for nodes, info in rings.edges.items():
        p = len(nodes)
        level = fab.lca_level(nodes)
        congestion = _ring_congestion(info, fab.paths, ratio)
        ilevel = spans.ideal_level(len(set(nodes)))
        tree = rings.algo[nodes] == "tree"
        if tree:
            k = len(_distinct_ring(nodes))
            t = _tree(k, nbytes, buckets, _tier_at(tiers, level), congestion)
            ti = _tree(k, nbytes, buckets, _tier_at(tiers, ilevel))
        else:
            t = _ring(p, nbytes, _tier_at(tiers, level), congestion)
            ti = _ring(p, nbytes, _tier_at(tiers, ilevel))
        if t > worst or bound is None:
            worst = max(worst, t)
            bound = (
                _tier_name(level)
                + (" tree" if tree else "")
                + (f" x{congestion:.2f}" if congestion > 1 + 1e-9 else "")
            )
        best = max(best, ti)
    return _DimTime(worst, best, bound)


def _pp_pairs(
    fab: _Fabric, pp_groups: Counter[tuple[int, ...]]
) -> tuple[dict[tuple[int, int], int], Counter[tuple[str, bool]]]:
    """Each distinct pair of neighbouring stages with its level, and the sends on each uplink.

    Every pipeline sends at once (activations forward, gradients back), so the pairs that
    cross an uplink share it like DP edges do.
    """
    pairs: dict[tuple[int, int], int] = {}  # distinct PP pair -> its level
    pp_load: Counter[tuple[str, bool]] = Counter()
    paths = fab.paths
    for nodes, count in pp_groups.items():
        for a, b in itertools.pairwise(nodes):
            lvl = pairs[(a, b)] = fab.pair_level(a, b)
            if lvl < 0:
                continue
            pa, pb = paths[a], paths[b]
            c = len(pa) if pa is pb else _common(pa, pb)
            for sw in pa[c:]:  # forward on a's uplinks, back on them downwards
                pp_load[(sw, True)] += count
                pp_load[(sw, False)] += count
            for sw in pb[c:]:
                pp_load[(sw, False)] += count
                pp_load[(sw, True)] += count
    return pairs, pp_load


def _pp_sender(
    fab: _Fabric, tiers: Mapping[str, Tier], nbytes: float, pp_ratio: dict[str, float]
) -> Callable[[int, int, int], tuple[float, float]]:
    """``send(a, b, level)``: one PP send's time and its slowdown, the worst uplink on its
    path. With no uplink beyond its share a send costs its tier alone, once per level."""
    paths = fab.paths
    congested = any(r > 1 + 1e-12 for r in pp_ratio.values())
    send_memo: dict[int, float] = {}  # level -> an uncongested send's time

    def send(a: int, b: int, level: int) -> tuple[float, float]:
        if not congested:
            t = send_memo.get(level)
            if t is None:
                t = send_memo[level] = _p2p(nbytes, _tier_at(tiers, level))
            return t, 1.0
        tier = _tier_at(tiers, level)
        slow = 1.0
        if level >= 0:
            pa, pb = paths[a], paths[b]
            c = len(pa) if pa is pb else _common(pa, pb)
            for sw in (*pa[c:], *pb[c:]):
                slow = max(slow, pp_ratio.get(sw, 0.0))
        return tier.alpha_s + nbytes * tier.beta_s_per_byte * slow, slow

    return send


def _pp_time(
    fab: _Fabric,
    spans: _Spans,
    pp_groups: Counter[tuple[int, ...]],
    pairs: dict[tuple[int, int], int],
    pp_ratio: dict[str, float],
    params: CostParams,
) -> _DimTime:
    """PP: point-to-point between neighbouring stages along each pipeline, summed per
    pipeline; a pair's send is slowed by the worst uplink on its path."""
    tiers, nbytes = params.tiers, params.message_bytes["pp"]
    send = _pp_sender(fab, tiers, nbytes, pp_ratio)
    ideal_pair, ideal_self = spans.ideal_level(2), spans.ideal_level(1)
    ideal_send = {lvl: _p2p(nbytes, _tier_at(tiers, lvl)) for lvl in {ideal_pair, ideal_self}}
    worst = best = 0.0
    bound: str | None = None
    top_congestion = 1.0
    for nodes in pp_groups:
        t = tb = 0.0
        top = -1
        slowest = 1.0
        for a, b in itertools.pairwise(nodes):
            lvl = pairs[(a, b)]
            top = max(top, lvl)
            dt, slow = send(a, b, lvl)
            t += dt
            slowest = max(slowest, slow)
            tb += ideal_send[ideal_pair if a != b else ideal_self]
        if t > worst or bound is None:
            bound = _tier_name(top)
            top_congestion = slowest
        worst, best = max(worst, t), max(best, tb)
    if top_congestion > 1 + 1e-9 and bound is not None:
        bound += f" x{top_congestion:.2f}"
    return _DimTime(worst, best, bound)


def evaluate(
    topology: Topology,
    order: Sequence[str],
    job: JobShape,
    params: CostParams | None = None,
) -> CostReport:
    """Cost of running ``job`` with node ``i`` of ``order`` holding ranks ``i*G..i*G+G-1``.

    One step per kind of traffic (module docstring): the groups that must stay inside an
    NVLink domain (TP, CP, EP), DP's all-reduce with the uplink congestion of all DP groups
    at once, then PP's sends, congested the same way.
    """
    params = params or CostParams.default()
    _check_order(order, job)
    fab = _Fabric(topology, order)
    spans = _spans(topology)
    g = job.gpus_per_node
    groups = _groups(job)
    times: dict[str, _DimTime] = {}
    violations = 0
    for dim in ("tp", "cp", "ep"):
        times[dim], outside = _nvlink_dim(fab, spans, groups[dim], g, dim, params)
        violations += outside
    rings = _dp_rings(fab, _node_groups(groups["dp"], g), params)
    job_under = _job_under(topology, fab, params)
    ratio = _uplink_ratio(topology, params.tiers, rings.load, job_under, g)
    times["dp"] = _dp_time(fab, spans, rings, ratio, params)
    pp_groups = _node_groups(groups["pp"], g)
    pairs, pp_load = _pp_pairs(fab, pp_groups)
    # A middle stage's node sends both ways, so its own NIC already carries two pairs per GPU:
    # an uplink is a bottleneck only beyond what the busiest NIC carries anyway.
    nic_load = 2.0 if job.pp > 2 else 1.0
    pp_ratio = _uplink_ratio(topology, params.tiers, pp_load, job_under, g, nic_load)
    times["pp"] = _pp_time(fab, spans, pp_groups, pairs, pp_ratio, params)

    predicted = sum(times[d].worst for d in DIMS)
    ideal = sum(times[d].best for d in DIMS)
    bound_by = {d: b for d in DIMS if (b := times[d].bound) is not None and times[d].worst > 0}
    return CostReport(
        predicted_s=predicted,
        ideal_s=ideal,
        slowdown=predicted / ideal if ideal > 0 else 1.0,
        leaves_used=len({p[-1] for p in fab.paths}),
        dp_ring_edges=rings.ring_edges,
        dp_edges_cross_leaf=rings.cross_leaf,
        dp_edges_cross_spine=rings.cross_spine,
        pp_pairs=len(pairs),
        pp_pairs_cross_leaf=sum(1 for lvl in pairs.values() if lvl >= 1),
        nvlink_violations=violations,
        # per_group keeps a fixed key order (tp, cp, ep, dp, pp) for stable JSON.
        per_group={d: times[d].worst for d in DIMS},
        bound_by=bound_by,
    )
