"""The ``#SBATCH`` lines of a recipe's script: resources, time, signal, placement
(``--switches``, ``--segment``, ``--nodelist``), features by flavor and Slurm version, and a
heterogeneous job's second component; pure (part of :mod:`slurmfm.render.script`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmfm.errors import RenderError, UnsupportedError
from slurmfm.quote import sbatch_value

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.recipe.schema import Recipe
    from slurmfm.render.array import SweepTable
    from slurmfm.resolve import ResolvedJob


SRC_HYPERPOD_AUTO_RESUME = (
    "https://docs.aws.amazon.com/sagemaker/latest/dg/"
    "sagemaker-hyperpod-resiliency-slurm-auto-resume.html"
)


@dataclass(frozen=True)
class Directive:
    """One ``#SBATCH`` line."""

    option: str
    value: str | None = None
    why: str | None = None
    raw: bool = False  # a bare keyword such as `hetjob`, not an option

    @property
    def text(self) -> str:
        if self.raw:
            return self.option
        return f"--{self.option}" if self.value is None else f"--{self.option}={self.value}"


def _directives(job: ResolvedJob) -> tuple[list[Directive], list[str]]:
    """Every ``#SBATCH`` line of the job, in the script's order, and the warnings on them:
    who and how long, where, what each node gives, requeue and save, placement, and the
    dependencies and pins that come last."""
    recipe, placement = job.recipe, job.placement
    warnings: list[str] = []
    d = _job_shape(recipe, job.tasks_per_node, job.launcher.why_tasks)
    d += _where(recipe, warnings)
    d += _node_resources(job, warnings)
    d += _requeue_and_save(job, warnings)
    d += _placement_lines(job, warnings)
    _check_spares_fit_the_segment(recipe, d)
    if recipe.resources.singleton:
        d.append(
            Directive(
                "dependency",
                "singleton",
                "at most one running job of this name and user (sbatch(1) --dependency): "
                "a chained segment never overlaps the previous one",
            )
        )
    if placement.mode == "pin" and placement.nodes:
        from slurmfm.topology.hostlist import nodelist

        d.append(
            Directive(
                "nodelist",
                sbatch_value(nodelist(placement.nodes), what="nodelist"),
                "pinned by the planner",
            )
        )
    if recipe.serve is not None and recipe.serve.placement == "hetjob":
        d.extend(_hetjob_component(job))
    return d, warnings


def _job_shape(recipe: Recipe, tasks_per_node: int, why_tasks: str) -> list[Directive]:
    """Name, nodes (with what the spares and a split server take), tasks per node, time."""
    r = recipe.resources
    return [
        Directive("job-name", sbatch_value(recipe.name, what="name")),
        Directive(
            "nodes",
            str(r.nodes + r.spare_nodes),
            f"{recipe.serve.nodes} of them serve (the last in the host order), the rest train"
            if recipe.serve is not None and recipe.serve.placement == "split"
            else f"{r.nodes} train, {r.spare_nodes} stand by (the last in the host order)"
            if r.spare_nodes
            else None,
        ),
        Directive("ntasks-per-node", str(tasks_per_node), why_tasks),
        Directive("time", sbatch_value(r.time_limit, what="resources.time_limit")),
    ]


def _where(recipe: Recipe, warnings: list[str]) -> list[Directive]:
    """Partition, account, QoS, reservation, the flavor's constraint and excluded nodes."""
    from slurmfm.catalog.flavors import constraint_for_flavor

    c, r = recipe.cluster, recipe.resources
    constraint, why_constraint = constraint_for_flavor(c.constraints, c.flavor)
    if why_constraint:
        warnings.append(why_constraint)
    d = [
        Directive(opt, sbatch_value(val, what=what))
        for opt, val, what in (
            ("partition", c.partition, "cluster.partition"),
            ("account", c.account, "cluster.account"),
            ("qos", c.qos, "cluster.qos"),
            ("reservation", c.reservation, "cluster.reservation"),
            ("constraint", constraint, "cluster.constraints"),
            ("exclude", r.exclude, "resources.exclude"),
        )
        if val
    ]
    if c.flavor == "hyperpod" and not c.partition:
        warnings.append(
            "cluster.partition: HyperPod's default partition 'dev' also holds login nodes; "
            "name a partition (docs/login-nodes.md)"
        )
    return d


def _node_resources(job: ResolvedJob, warnings: list[str]) -> list[Directive]:
    """What each node gives the job (whole nodes, GPUs, CPUs, memory), the boot wait and the
    output file."""
    recipe, inst, tasks_per_node = job.recipe, job.inst, job.tasks_per_node
    r, c = recipe.resources, recipe.cluster
    d: list[Directive] = []
    if r.exclusive:
        d.append(Directive("exclusive", None, "whole nodes: NCCL/EFA tuning assumes it"))
    if inst.gpus:
        if c.flavor == "hyperpod":
            warnings.append(
                "GPUs not requested through GRES on HyperPod: older HyperPod AMIs have no GPU "
                "GRES and auto-resume needs --nodes with --exclusive ("
                f"{SRC_HYPERPOD_AUTO_RESUME})"
            )
        elif job.supports("gpus_per_node"):
            d.append(Directive("gpus-per-node", str(inst.gpus)))
        else:
            d.append(Directive("gres", f"gpu:{inst.gpus}"))
    if not r.exclusive and inst.gpus:
        # A shared node gives a job one CPU per task unless it asks (sbatch(1),
        # --cpus-per-task): ask for the GPUs' share of the node for each process the launch
        # starts, never more than the node has.
        per_task = recipe.procs_per_node * (inst.vcpus // inst.gpus) // tasks_per_node
        cpus = max(1, min(per_task, inst.vcpus // tasks_per_node))
        d.append(Directive("cpus-per-task", str(cpus), "each GPU's share of the node's vCPUs"))
    if r.mem:
        d.append(Directive("mem", r.mem))
    elif r.exclusive and inst.gpus:
        d.append(Directive("mem", "0", "all of each node's memory"))
    d.append(Directive("wait-all-nodes", "1", "start only when every node has booted"))
    out = f"{sbatch_value(recipe.storage.log_dir, what='storage.log_dir').rstrip('/')}/%x_%j.out"
    d.append(Directive("output", out))
    return d


def _requeue_and_save(job: ResolvedJob, warnings: list[str]) -> list[Directive]:
    """Requeue (expedited where asked and possible), appending output, and the pre-timeout
    save signal."""
    recipe, v = job.recipe, job.version
    res, r, c = recipe.resilience, recipe.resources, recipe.cluster
    d: list[Directive] = []
    if res.requeue and res.expedited_requeue:
        if not job.supports("requeue_expedite"):
            raise UnsupportedError(
                f"resilience.expedited_requeue: sbatch --requeue=expedite needs Slurm >= 25.11; "
                f"target is {v}"
            )
        d.append(
            Directive(
                "requeue",
                "expedite",
                "restart after node failure or a pre-timeout save, at once: no wait for the "
                "credential lifetime (cluster needs SlurmctldParameters=enable_expedited_requeue;"
                " https://slurm.schedmd.com/news.html, 25.11)",
            )
        )
    elif res.requeue:
        d.append(Directive("requeue", None, "restart after node failure or a pre-timeout save"))
    else:
        d.append(Directive("no-requeue"))
    if res.requeue or c.flavor == "hyperpod":
        d.append(
            Directive(
                "open-mode", "append", "a requeue would otherwise truncate the earlier output"
            )
        )
    window = recipe.save_window_warning()
    if window:
        warnings.append(window)
    if res.save_before_timeout_s:
        if res.save_before_timeout_s >= r.time_minutes * 60 > 0:
            warnings.append(
                f"resilience.save_before_timeout_s: {res.save_before_timeout_s} s is not shorter "
                f"than the time limit {r.time_limit}; the save signal comes at the start"
            )
        d.append(
            Directive(
                "signal",
                f"B:USR2@{res.save_before_timeout_s}",
                "USR2 to the batch shell before the time limit: save and requeue "
                "(USR2, not USR1, which NCCL uses: "
                "https://github.com/facebookincubator/submitit/pull/1697)",
            )
        )
    return d


def _placement_lines(job: ResolvedJob, warnings: list[str]) -> list[Directive]:
    """``--switches`` and ``--segment``: the plan's, or without a plan a segment that keeps
    NVLink units in one UltraServer."""
    recipe, inst, v, placement = job.recipe, job.inst, job.version, job.placement
    r = recipe.resources
    d: list[Directive] = []
    if placement.switches:
        d.append(Directive("switches", sbatch_value(placement.switches, what="switches")))
    if placement.segment is not None:
        if not job.supports("segment"):
            raise UnsupportedError(
                f"--segment needs Slurm >= 24.05 (topology/block segments); target is {v}"
            )
        pinned = placement.mode == "pin"
        d.append(
            Directive(
                "segment",
                str(placement.segment),
                "topology/block takes the pinned --nodelist cut into segments of this size"
                if pinned
                else None,
            )
        )
        split = segment_split_warning(inst, r.nodes, placement.segment)
        if split:
            warnings.append(split)
        if not pinned:  # the nodes are fixed: a consolidate/spread rule could only refuse them
            d.extend(_segment_options(job, placement.segment))
    elif placement.mode == "none":
        # the spares too: they are best in the same NVLink domain as the nodes they replace
        alloc = r.nodes + r.spare_nodes
        seg, seg_warning = default_segment(
            inst, alloc, v, _nvlink_unit_nodes(job), has_segment=job.supports("segment")
        )
        if seg is not None:
            d.append(
                Directive(
                    "segment",
                    str(seg),
                    f"{_why_segment(inst, seg, alloc)}; topology/block, Slurm >= 24.05",
                )
            )
            split = segment_split_warning(inst, alloc, seg)
            if split:
                warnings.append(split)
            d.extend(_segment_options(job, seg))
        if seg_warning:
            warnings.append(seg_warning)
    return d


def _why_segment(inst: InstanceType, seg: int, alloc: int) -> str:
    """Why a job without a plan gets ``--segment=seg``: the whole job in one UltraServer, or
    groups of ``seg`` nodes each in one."""
    sizes = "/".join(str(n) for n in inst.nvlink.instances)
    small = min(inst.nvlink.instances)
    if seg != alloc:
        return (
            f"no topology plan: groups of {seg} nodes, each in one UltraServer ({sizes} instances)"
        )
    fit = min(n for n in inst.nvlink.instances if n >= seg)
    why = (
        f"no topology plan: the whole job in one NVLink domain, one UltraServer of {fit} instances"
    )
    if seg > small:
        why += f"; a {small}-instance one cannot hold it (lower --segment there)"
    return why


def _check_spares_fit_the_segment(recipe: Recipe, d: list[Directive]) -> None:
    """ "The requested node count must always be evenly divisible by the requested segment
    size" (https://slurm.schedmd.com/sbatch.html#OPT_segment): spares count."""
    r = recipe.resources
    seg_d = next((x for x in d if x.option == "segment" and x.value), None)
    if r.spare_nodes and seg_d is not None and (r.nodes + r.spare_nodes) % int(str(seg_d.value)):
        raise RenderError(
            f"resources.spare_nodes: --segment={seg_d.value} must divide the "
            f"{r.nodes + r.spare_nodes} nodes allocated (nodes + spare_nodes); use a multiple "
            f"of {seg_d.value} spares, or plan the job with a segment that divides it"
        )


def _nvlink_unit_nodes(job: ResolvedJob) -> int:
    """Nodes a TP*CP or EP group covers: a segment must hold whole groups (planner's rule).

    A serving launcher's group is its model-parallel span as the server defines it
    (:meth:`slurmfm.launchers.serving.ServerSpec.nvlink_span`: SGLang ``tp``, whose
    ``--ep-size`` divides it; vLLM ``tp x pp``; with prefill/decode the lcm of both servers'),
    not Megatron's ``tp x ep`` blocks.
    """
    from slurmfm.launchers import ServerSpec

    g = max(1, job.inst.gpus)
    p = job.recipe.parallelism
    if isinstance(job.launcher, ServerSpec):
        spans = job.launcher.replica_spans(job.recipe.launcher, p)  # type: ignore[arg-type]
        block = math.lcm(*spans.values())
    else:
        block = math.lcm(p.tp * p.cp, p.tp * p.ep)
    return max(1, math.lcm(block, g) // g)


def default_segment(
    inst: InstanceType,
    nodes: int,
    v: SlurmVersion,
    unit: int = 1,
    *,
    has_segment: bool | None = None,
) -> tuple[int | None, str | None]:
    """``--segment`` for a multi-node NVLink job that has no topology plan, or a warning.

    Why: without a segment, an 18-node GB200 job may be placed across two UltraServers and its
    NVLink domain is cut in two. Slurm's topology/block places each segment inside one block
    (sbatch(1) ``--segment``, Slurm >= 24.05). The recipe's intent decides the size: a job
    that fits one UltraServer (the largest size, 18 instances of GB200) is one segment, the
    whole job in one NVLink domain -- not the gcd of the 9- and 18-instance sizes, which lets
    Slurm place it 9 + 9 on two UltraServers and moves its data-parallel traffic to EFA. A
    larger job gets the largest segment that divides its node count, fits one UltraServer and
    holds whole ``unit``-node TP*CP/EP groups. Returns (segment, None), or (None, a warning)
    when no such segment exists or Slurm lacks it, and (None, None) for single-node jobs and
    types without multi-node NVLink. ``has_segment``: whether ``v`` has ``--segment``, when
    the caller has resolved it already (:class:`slurmfm.resolve.ResolvedJob`).
    """
    if not inst.needs_imex or nodes <= 1:
        return None, None
    largest = max(inst.nvlink.instances)
    sizes = "/".join(str(n) for n in inst.nvlink.instances)
    where = f"{nodes} {inst.name} nodes may be placed across UltraServers of {sizes} instances"
    fits = [s for s in range(unit, min(nodes, largest) + 1, unit) if nodes % s == 0]
    if not fits or fits[-1] <= 1:
        return None, (
            f"resources.nodes: {where}; no --segment of whole {unit}-node NVLink groups divides "
            f"{nodes} and fits an UltraServer: use a node count that does, or plan with a "
            "topology file (slurmfm plan --topology)"
        )
    seg = fits[-1]
    if has_segment is None:
        from slurmfm.catalog.slurm_features import supports

        has_segment = supports("segment", v)
    if not has_segment:
        return None, (
            f"resources.nodes: {where}; --segment={seg} would keep each group in one "
            f"UltraServer but needs Slurm >= 24.05 (target is {v})"
        )
    return seg, None


def segment_split_warning(inst: InstanceType, nodes: int, seg: int) -> str | None:
    """A warning when segments of ``seg`` nodes cut the job's NVLink domain smaller than it
    could be: the job fits one UltraServer, or a segment is smaller than the largest one."""
    if not inst.needs_imex or seg >= nodes:
        return None
    largest = max(inst.nvlink.instances)
    could = min(nodes, largest)
    if seg >= could:
        return None
    g = inst.gpus
    return (
        f"resources.nodes: --segment={seg} lets Slurm place the {nodes} nodes on "
        f"{nodes // seg} UltraServers: NVLink domains of {seg} nodes ({seg * g} GPUs) instead "
        f"of {could} ({could * g} GPUs), and traffic between them goes over EFA"
    )


def _segment_options(job: ResolvedJob, seg: int) -> list[Directive]:
    """``--consolidate-segments``/``--spread-segments`` and the IMEX channel per segment.

    Slurm 25.11's topology/block options (SchedMD/slurm:RELEASE_NOTES.md, 25.11; sbatch(1)):
    ``--consolidate-segments`` packs a job's segments into one higher-level aggregated block
    (as few UltraServers as possible), ``--spread-segments`` puts each on a base block of its
    own, ``--network=unique-channel-per-segment`` gives each segment its own IMEX channel
    (switch/nvidia_imex). Each is gated by version (slurmfm/catalog/slurm_features.py).
    """
    recipe, v = job.recipe, job.version
    out: list[Directive] = []
    mode = recipe.resources.segments
    if recipe.resources.nodes > seg:
        if mode == "spread":
            if not job.supports("spread_segments"):
                raise UnsupportedError(
                    f"resources.segments: spread: --spread-segments needs Slurm >= 25.11; "
                    f"target is {v}"
                )
            out.append(Directive("spread-segments", None, "each segment on a block of its own"))
        elif job.supports("consolidate_segments"):
            out.append(
                Directive(
                    "consolidate-segments",
                    None,
                    "the segments in as few UltraServers as possible (one aggregated block)",
                )
            )
        elif mode == "consolidate":
            raise UnsupportedError(
                f"resources.segments: consolidate: --consolidate-segments needs Slurm >= 25.11; "
                f"target is {v}"
            )
    if recipe.network.imex_channel == "segment":
        if not job.supports("network_unique_channel_per_segment"):
            raise UnsupportedError(
                "network.imex_channel: segment: --network=unique-channel-per-segment needs "
                f"Slurm >= 25.11; target is {v}"
            )
        out.append(
            Directive(
                "network",
                "unique-channel-per-segment",
                "an IMEX channel per segment (switch/nvidia_imex)",
            )
        )
    return out


def _hetjob_component(job: ResolvedJob) -> list[Directive]:
    """Directives of heterogeneous component 1: the server's own node shape."""
    recipe, sinst = job.recipe, job.serve_inst
    s = recipe.serve
    if s is None or sinst is None:  # pragma: no cover - called only for hetjob serve sections
        raise RenderError("serve: no hetjob component to render")
    if not job.supports("hetjob"):
        raise UnsupportedError(f"#SBATCH hetjob needs Slurm >= 20.02; target is {job.version}")
    c = recipe.cluster
    d = [
        Directive(
            "hetjob",
            why=f"component 1: the {s.launcher.kind} server on {sinst.name} "
            "(srun --het-group=1 runs it; the trainer is component 0)",
            raw=True,
        ),
        Directive("nodes", str(s.nodes)),
        Directive("ntasks-per-node", "1"),
    ]
    part = s.partition or c.partition
    if part:
        d.append(Directive("partition", sbatch_value(part, what="serve.partition")))
    for opt, val, what in (
        ("account", c.account, "cluster.account"),
        ("qos", c.qos, "cluster.qos"),
        ("reservation", c.reservation, "cluster.reservation"),
    ):
        if val:
            d.append(Directive(opt, sbatch_value(val, what=what)))
    if recipe.resources.exclusive:
        d.append(Directive("exclusive"))
    if sinst.gpus:
        if job.supports("gpus_per_node"):
            d.append(Directive("gpus-per-node", str(sinst.gpus)))
        else:
            d.append(Directive("gres", f"gpu:{sinst.gpus}"))
        if recipe.resources.exclusive:
            d.append(Directive("mem", "0"))
    return d


def _array_directives(
    directives: list[Directive], sweep: SweepTable, log_dir: str
) -> list[Directive]:
    """A sweep's ``--output`` per task and its ``--array`` (the request's ArraySpec, also in
    the script so that a plain ``sbatch`` of it runs the array)."""
    from slurmfm.render.array import array_output

    out: list[Directive] = []
    for d in directives:
        if d.option != "output":
            out.append(d)
            continue
        out.append(Directive("output", array_output(log_dir)))
        out.append(
            Directive(
                "array",
                sbatch_value(sweep.array, what="sweep"),
                "one array task per sweep point (sbatch(1) --array; %K caps how many run at once)",
            )
        )
    return out
