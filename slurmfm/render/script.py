"""Build the sbatch script for a recipe: a pure function from typed values to text.

The script is assembled as typed parts (directives, environment lines, launch command) and laid
out by a jinja2 template with ``StrictUndefined``, so a missing value is a bug caught in tests,
never an empty string in a job. User values enter bash only through
:func:`slurmfm.render.quote.sh_quote` and enter ``#SBATCH`` lines only through
:func:`slurmfm.render.quote.sbatch_value`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from slurmfm import __version__
from slurmfm.errors import RenderError, UnsupportedError
from slurmfm.job import hetjob, install
from slurmfm.job.batch import CONTAINER_ENTRY
from slurmfm.job.options import BatchOptions, NodeOptions, PrepareOptions, flag
from slurmfm.job.state import state_name
from slurmfm.plan.types import Placement
from slurmfm.render.payload import RuntimeFile, payload_line, runtime_file
from slurmfm.render.quote import env_name, sbatch_value, sh_join, sh_quote
from slurmfm.target import Target as Target  # noqa: PLC0414 - re-exported for callers

if TYPE_CHECKING:
    import jinja2

    from slurmfm.catalog.instances import InstanceType
    from slurmfm.catalog.nccl import EnvSetting, JobTraits
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.catalog.storage import CheckpointLayout
    from slurmfm.recipe.schema import Recipe
    from slurmfm.render.array import SweepTable
    from slurmfm.render.serve import ServeLaunch

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


@dataclass(frozen=True)
class EnvLine:
    """One ``export NAME=VALUE`` line with the reason it is there."""

    name: str
    shell_value: str
    why: str
    origin: str  # "profile", "user", "slurmfm"
    expands: bool = False  # value holds a command substitution: assign, then export (SC2155)


@dataclass(frozen=True)
class RenderedScript:
    """The result of rendering: the text plus its parts, for inspection and dry-runs."""

    text: str
    directives: tuple[Directive, ...]
    env: tuple[EnvLine, ...]
    launch: str
    warnings: tuple[str, ...]
    target: Target
    secrets: tuple[str, ...] = ()
    log_dir: str = ""
    checkpoint_dir: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    components: tuple[Component, ...] = ()
    container_env: tuple[str, ...] = ()
    # What the job needs beside its text: the runtime zipapp (also embedded in the text's last
    # line, so a plain `sbatch` of the text works on its own).
    files: tuple[RuntimeFile, ...] = ()
    # The runtime's options the script passes (the words of its ``prepare`` and ``batch``
    # lines, tests/job/test_options.py), as the typed values of slurmfm.job.options.
    prepare_options: PrepareOptions | None = None
    batch_options: BatchOptions | None = None


# Compiled templates kept on disk, as Python keeps ``__pycache__``, when a caller provides a
# cache (the CLI does: ``slurmfm.cli.cache.template_bytecode_cache``). Why injected: the renderer
# is a pure function of its inputs and writes no files; where a cache may live, and whether one
# may be written at all, is the business of the process that runs it.
_BYTECODE_CACHE: dict[str, jinja2.BytecodeCache | None] = {"cache": None}


def use_bytecode_cache(cache: jinja2.BytecodeCache | None) -> None:
    """Compile templates through ``cache`` from now on (call before the first render)."""
    _BYTECODE_CACHE["cache"] = cache
    _env.cache_clear()


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("slurmfm", "render/templates"),
        bytecode_cache=_BYTECODE_CACHE["cache"],
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # noqa: S701 - shell text, not HTML; values are shell-quoted
        keep_trailing_newline=True,
        # bash uses "{#" in "${#array[@]}": move jinja comments out of its way.
        comment_start_string="{##",
        comment_end_string="##}",
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _directives(
    recipe: Recipe, inst: InstanceType, target: Target, placement: Placement
) -> tuple[list[Directive], list[str]]:
    from slurmfm.catalog.slurm_features import supports

    warnings: list[str] = []
    v = target.slurm_version
    r = recipe.resources
    c = recipe.cluster
    tasks_per_node = recipe.procs_per_node if recipe.launcher.kind == "nemo" else 1
    why_tasks = {
        "nemo": "one task per GPU (NeMo/Lightning reads Slurm ranks)",
        "vllm": "one task per node: a Ray head or worker; vLLM starts the per-GPU workers",
        "sglang": "one launch_server per node; SGLang starts the per-GPU schedulers",
    }.get(recipe.launcher.kind, "one launcher per node; torchrun starts the per-GPU processes")
    d: list[Directive] = [
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
    from slurmfm.catalog.flavors import constraint_for_flavor

    constraint, why_constraint = constraint_for_flavor(c.constraints, c.flavor)
    if why_constraint:
        warnings.append(why_constraint)
    for opt, val, what in (
        ("partition", c.partition, "cluster.partition"),
        ("account", c.account, "cluster.account"),
        ("qos", c.qos, "cluster.qos"),
        ("reservation", c.reservation, "cluster.reservation"),
        ("constraint", constraint, "cluster.constraints"),
        ("exclude", r.exclude, "resources.exclude"),
    ):
        if val:
            d.append(Directive(opt, sbatch_value(val, what=what)))
    if c.flavor == "hyperpod" and not c.partition:
        warnings.append(
            "cluster.partition: HyperPod's default partition 'dev' also holds login nodes; "
            "name a partition (docs/login-nodes.md)"
        )
    if r.exclusive:
        d.append(Directive("exclusive", None, "whole nodes: NCCL/EFA tuning assumes it"))
    if inst.gpus:
        if c.flavor == "hyperpod":
            warnings.append(
                "GPUs not requested through GRES on HyperPod: older HyperPod AMIs have no GPU "
                "GRES and auto-resume needs --nodes with --exclusive ("
                f"{SRC_HYPERPOD_AUTO_RESUME})"
            )
        elif supports("gpus_per_node", v):
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
    res = recipe.resilience
    if res.requeue and res.expedited_requeue:
        if not supports("requeue_expedite", v):
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
    if placement.switches:
        d.append(Directive("switches", sbatch_value(placement.switches, what="switches")))
    if placement.segment is not None:
        if not supports("segment", v):
            raise UnsupportedError(
                f"--segment needs Slurm >= 24.05 (topology/block segments); target is {v}"
            )
        d.append(Directive("segment", str(placement.segment)))
        split = segment_split_warning(inst, r.nodes, placement.segment)
        if split:
            warnings.append(split)
        d.extend(_segment_options(recipe, placement.segment, v))
    elif placement.mode == "none":
        # the spares too: they are best in the same NVLink domain as the nodes they replace
        alloc = r.nodes + r.spare_nodes
        seg, seg_warning = default_segment(inst, alloc, v, _nvlink_unit_nodes(recipe, inst))
        if seg is not None:
            sizes = "/".join(str(n) for n in inst.nvlink.instances)
            small = min(inst.nvlink.instances)
            if seg == alloc:
                fit = min(n for n in inst.nvlink.instances if n >= seg)
                why = (
                    "no topology plan: the whole job in one NVLink domain, one UltraServer of "
                    f"{fit} instances"
                )
                if seg > small:
                    why += f"; a {small}-instance one cannot hold it (lower --segment there)"
            else:
                why = (
                    f"no topology plan: groups of {seg} nodes, each in one UltraServer "
                    f"({sizes} instances)"
                )
            d.append(Directive("segment", str(seg), f"{why}; topology/block, Slurm >= 24.05"))
            split = segment_split_warning(inst, alloc, seg)
            if split:
                warnings.append(split)
            d.extend(_segment_options(recipe, seg, v))
        if seg_warning:
            warnings.append(seg_warning)
    seg_d = next((x for x in d if x.option == "segment" and x.value), None)
    if r.spare_nodes and seg_d is not None and (r.nodes + r.spare_nodes) % int(str(seg_d.value)):
        # "The requested node count must always be evenly divisible by the requested segment
        # size" (https://slurm.schedmd.com/sbatch.html#OPT_segment)
        raise RenderError(
            f"resources.spare_nodes: --segment={seg_d.value} must divide the "
            f"{r.nodes + r.spare_nodes} nodes allocated (nodes + spare_nodes); use a multiple "
            f"of {seg_d.value} spares, or plan the job with a segment that divides it"
        )
    if r.singleton:
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
        d.extend(_hetjob_component(recipe, inst, v))
    return d, warnings


def _nvlink_unit_nodes(recipe: Recipe, inst: InstanceType) -> int:
    """Nodes a TP*CP or EP group covers: a segment must hold whole groups (planner's rule)."""
    g = max(1, inst.gpus)
    p = recipe.parallelism
    block = math.lcm(p.tp * p.cp, p.tp * p.ep)
    return max(1, math.lcm(block, g) // g)


def default_segment(
    inst: InstanceType, nodes: int, v: SlurmVersion, unit: int = 1
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
    types without multi-node NVLink.
    """
    from slurmfm.catalog.slurm_features import supports

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
    if not supports("segment", v):
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


def _segment_options(recipe: Recipe, seg: int, v: SlurmVersion) -> list[Directive]:
    """``--consolidate-segments``/``--spread-segments`` and the IMEX channel per segment.

    Slurm 25.11's topology/block options (SchedMD/slurm:RELEASE_NOTES.md, 25.11; sbatch(1)):
    ``--consolidate-segments`` packs a job's segments into one higher-level aggregated block
    (as few UltraServers as possible), ``--spread-segments`` puts each on a base block of its
    own, ``--network=unique-channel-per-segment`` gives each segment its own IMEX channel
    (switch/nvidia_imex). Each is gated by version (slurmfm/catalog/slurm_features.py).
    """
    from slurmfm.catalog.slurm_features import supports

    out: list[Directive] = []
    mode = recipe.resources.segments
    if recipe.resources.nodes > seg:
        if mode == "spread":
            if not supports("spread_segments", v):
                raise UnsupportedError(
                    f"resources.segments: spread: --spread-segments needs Slurm >= 25.11; "
                    f"target is {v}"
                )
            out.append(Directive("spread-segments", None, "each segment on a block of its own"))
        elif supports("consolidate_segments", v):
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
        if not supports("network_unique_channel_per_segment", v):
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


def _hetjob_component(recipe: Recipe, inst: InstanceType, v: SlurmVersion) -> list[Directive]:
    """Directives of heterogeneous component 1: the server's own node shape."""
    from slurmfm.catalog.instances import get_instance
    from slurmfm.catalog.slurm_features import supports

    s = recipe.serve
    if s is None:  # pragma: no cover - called only for hetjob serve sections
        raise RenderError("serve: no hetjob component to render")
    if not supports("hetjob", v):
        raise UnsupportedError(f"#SBATCH hetjob needs Slurm >= 20.02; target is {v}")
    sinst = get_instance(s.instance_type) if s.instance_type else inst
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
        if supports("gpus_per_node", v):
            d.append(Directive("gpus-per-node", str(sinst.gpus)))
        else:
            d.append(Directive("gres", f"gpu:{sinst.gpus}"))
        if recipe.resources.exclusive:
            d.append(Directive("mem", "0"))
    return d


def job_traits(recipe: Recipe, nodes: int | None = None) -> JobTraits:
    """What the recipe's job does that NCCL bug triggers depend on (catalog.nccl.JobTraits)."""
    from slurmfm.catalog.nccl import JobTraits

    return JobTraits(
        cuda_visible_devices=recipe.env.get("CUDA_VISIBLE_DEVICES"),
        pipeline_parallel=recipe.parallelism.pp,
        nodes=recipe.train_nodes if nodes is None else nodes,
    )


def _profile(
    recipe: Recipe, inst: InstanceType, traits: JobTraits
) -> tuple[tuple[EnvSetting, ...], list[str]]:
    """The NCCL/EFA profile for one node type of the job, and its version warnings."""
    from slurmfm.catalog.nccl import Runtime, StackVersions, check_minimums, nccl_env

    n = recipe.network
    stack = StackVersions.parse(n.efa_installer, n.libfabric, n.aws_ofi_nccl, n.nccl)
    runtime: Runtime = "container" if recipe.container is not None else "host"
    return nccl_env(inst, stack, runtime, traits), [
        f"network: {w}" for w in check_minimums(inst, stack)
    ]


def _profile_line(s: EnvSetting) -> EnvLine:
    value = f'"{s.value}"' if s.raw_shell else sh_quote(s.value, what=f"env {s.name}")
    return EnvLine(env_name(s.name), value, f"{s.reason} [{s.source}]", "profile", s.raw_shell)


def _env_lines(recipe: Recipe, inst: InstanceType) -> tuple[list[EnvLine], list[str]]:
    from slurmfm.catalog.nccl import (
        FORBIDDEN,
        Runtime,
        StackVersions,
        merge_env,
        user_env_warnings,
    )

    traits = job_traits(recipe)
    profile, warnings = _profile(recipe, inst, traits)
    user_env = dict(recipe.env)
    if recipe.network.nccl_debug and "NCCL_DEBUG" not in user_env:
        user_env["NCCL_DEBUG"] = recipe.network.nccl_debug
    kept, user = merge_env(profile, user_env)
    lines = [_profile_line(s) for s in kept]
    overridden = {s.name for s in profile} & set(user)
    for name, value in user.items():
        why = "set by the recipe"
        if name in overridden:
            why += " (overrides the slurmfm profile value)"
        if name in FORBIDDEN:
            warnings.append(f"env.{name}: {FORBIDDEN[name]}")
        lines.append(
            EnvLine(
                env_name(name, what=f"env.{name}"), sh_quote(value, what=f"env.{name}"), why, "user"
            )
        )
    n = recipe.network
    stack = StackVersions.parse(n.efa_installer, n.libfabric, n.aws_ofi_nccl, n.nccl)
    runtime: Runtime = "container" if recipe.container is not None else "host"
    warnings.extend(
        f"env.{w}"
        for w in user_env_warnings(inst, stack, runtime, recipe.env, traits)
        if w.split(":", 1)[0] not in FORBIDDEN
    )
    return lines, warnings


@dataclass(frozen=True)
class Component:
    """One heterogeneous component of the job, for what the job runtime does per component.

    Why: a hetjob's server may run on another instance type than the trainer, so its NCCL/EFA
    profile and its health expectations (GPUs, EFA devices) are its own. ``env`` holds the
    profile lines of this component that differ from the batch script's exports (component 0's
    profile) and ``unset`` the exported profile names its own profile lacks: the runtime applies
    both on that component's step only. ``health`` is what the health gate must find on each of
    its nodes.
    """

    group: int
    instance: str
    env: tuple[EnvLine, ...]
    unset: tuple[str, ...]
    health: HealthGate
    nodes: int = 0
    imex: bool = False


def _components(recipe: Recipe, inst: InstanceType) -> tuple[Component, ...]:
    """Per-component profile and health for heterogeneous jobs (empty for one component)."""
    from slurmfm.catalog.instances import get_instance

    s = recipe.serve
    if s is None or s.placement != "hetjob":
        return ()
    sinst = get_instance(s.instance_type) if s.instance_type else inst
    base, _ = _profile(recipe, inst, job_traits(recipe))
    own, _ = _profile(recipe, sinst, job_traits(recipe, s.nodes))
    user = set(recipe.env)
    exported = {e.name: e for e in base if e.name not in user}
    differ = [e for e in own if e.name not in user and exported.get(e.name) != e]
    # A profile variable of component 0 that component 1's profile lacks is unset there.
    own_names = {e.name for e in own}
    drop = tuple(name for name in exported if name not in own_names)
    return (
        Component(0, inst.name, (), (), _health(recipe, inst), recipe.train_nodes, inst.needs_imex),
        Component(
            1,
            sinst.name,
            tuple(_profile_line(e) for e in differ),
            drop,
            _health(recipe, sinst),
            s.nodes,
            sinst.needs_imex,
        ),
    )


def _launch(recipe: Recipe, checkpoint_dir_expr: str) -> tuple[list[str], int, str]:
    """Return (per-node command as lines of shell words, prefix length, description).

    Words are already shell-quoted (user values) or fixed tokens/variable expansions that
    slurmfm controls; each line is a readable group. ``prefix`` counts the words (of the first
    line) after which the per-node entry inserts ``--node-rank``; 0 inserts nothing.
    """
    from slurmfm.recipe.schema import MegatronLauncher, NemoLauncher, TorchrunLauncher

    L = recipe.launcher
    p = recipe.parallelism
    g = recipe.procs_per_node
    if isinstance(L, NemoLauncher):
        return (
            [f'{sh_quote(L.python, what="launcher.python")} -c "$SLURMFM_NEMO_DRIVER"'],
            0,
            "NeMo 2.0 recipe, one Slurm task per GPU",
        )
    torchrun = [
        sh_quote(L.python, what="launcher.python"),
        "-m",
        "torch.distributed.run",
    ]
    common = [
        f"--nnodes={recipe.train_nodes}",
        f"--nproc-per-node={g}",
        '--master-addr="$SLURMFM_RDZV_HOST"',
        '--master-port="$SLURMFM_RDZV_PORT"',
    ]
    if isinstance(L, TorchrunLauncher):
        target = (
            ["-m", sh_quote(L.script, what="launcher.script")]
            if L.module
            else [sh_quote(L.script, what="launcher.script")]
        )
        user_args = " ".join(sh_quote(a, what="launcher.args") for a in L.args)
        return (
            [
                " ".join(torchrun),
                " ".join(common),
                " ".join(target),
                *([user_args] if user_args else []),
            ],
            len(torchrun),
            "torchrun, static rendezvous, node rank from the job's host order",
        )
    if not isinstance(L, MegatronLauncher):  # pragma: no cover - the union is exhaustive
        raise RenderError(f"launcher: unknown kind {L.kind!r}")
    entry = L.megatron_path.rstrip("/") + "/" + L.entrypoint
    args = [
        # SIGTERM -> save a checkpoint and exit; slurmfm's save signal arrives as TERM.
        "--exit-signal-handler",
        f"--tensor-model-parallel-size={p.tp}",
        f"--pipeline-model-parallel-size={p.pp}",
        f"--context-parallel-size={p.cp}",
        f"--expert-model-parallel-size={p.ep}",
        f'--save="{checkpoint_dir_expr}"',
        f'--load="{checkpoint_dir_expr}"',
    ]
    for k, val in L.model_args.items():
        if val is None or val is True:
            args.append(f"--{k}")
        elif val is False:
            continue
        else:
            args.append(f"--{k} {sh_quote(str(val), what=f'launcher.model_args.{k}')}")
    args.extend(sh_quote(a, what="launcher.extra_args") for a in L.extra_args)
    return (
        [" ".join(torchrun), " ".join(common), sh_quote(entry, what="launcher.entrypoint"), *args],
        len(torchrun),
        "Megatron-LM under torchrun; --save/--load share the checkpoint directory",
    )


def _nemo_driver(recipe: Recipe, checkpoint_dir_expr: str) -> str | None:
    """Python source run in every task for NeMo 2.0; user values enter as JSON literals."""
    import json

    from slurmfm.recipe.schema import NemoLauncher

    L = recipe.launcher
    if not isinstance(L, NemoLauncher):
        return None
    p = recipe.parallelism
    settings = {
        "trainer.strategy.tensor_model_parallel_size": p.tp,
        "trainer.strategy.pipeline_model_parallel_size": p.pp,
        "trainer.strategy.context_parallel_size": p.cp,
        "trainer.strategy.expert_model_parallel_size": p.ep,
        **L.overrides,
    }
    # json.dumps gives valid Python literals for str/int/float; true/false/null are mapped.
    lit = json.dumps(settings, sort_keys=True)
    return (
        "import json, os\n"
        "from nemo.collections import llm\n"
        "import nemo_run as run\n"
        f"factory = getattr(llm, {json.dumps(L.recipe)})\n"
        f"recipe = getattr(factory, {json.dumps(L.task + '_recipe')})(\n"
        f"    name={json.dumps(recipe.name)}, dir=os.environ['SLURMFM_CHECKPOINT_DIR'],\n"
        f"    num_nodes={recipe.resources.nodes}, num_gpus_per_node={recipe.procs_per_node})\n"
        f"for dotted, value in json.loads({json.dumps(lit)}).items():\n"
        "    obj = recipe\n"
        "    *parents, leaf = dotted.split('.')\n"
        "    for part in parents:\n"
        "        obj = getattr(obj, part)\n"
        "    setattr(obj, leaf, value)\n"
        + (
            "# pre-timeout save: on TERM PreemptionCallback stops, ModelCheckpoint saves last\n"
            "from nemo.lightning.pytorch.callbacks import PreemptionCallback\n"
            "cbs = list(recipe.trainer.callbacks or [])\n"
            "if not any(getattr(c, '__fn_or_cls__', None) is PreemptionCallback for c in cbs):\n"
            "    recipe.trainer.callbacks = cbs + [run.Config(PreemptionCallback)]\n"
            if recipe.save_on_signal
            else ""
        )
        + "# resume from the newest checkpoint in the run directory when one exists\n"
        "recipe.resume = run.Config(llm.AutoResume, resume_if_exists=True,\n"
        "                           resume_ignore_no_checkpoint=True)\n"
        "run.run(recipe, direct=True)\n"
    )


def _container_entry(tasks_per_node: int, torchrun: bool, nccl_log: bool) -> str:
    """The first program of a training launch in a Pyxis container: fixed POSIX ``sh`` text
    (no user value), then ``exec`` of the launch command; slurmfm's runtime stays on the host.

    What the per-node entry (``runtime node``) does on the host is done here by the shell
    every image has, so the image needs no Python of a given version and never runs slurmfm:

    * the save signal comes from a host step (``runtime forward``; docs/features.md) to
      the training processes only (_container_forward); should a USR2 reach the whole step
      (``scancel --signal=USR2`` of the step), the launcher ignores it (an ignored signal
      stays ignored across ``exec``, POSIX execve(2)) and the training processes install
      their own handler;
    * the node rank: the launch lays its tasks out in the job's host order
      (``--distribution=arbitrary``), so the task id says the node's rank; torchrun reads it
      from ``PET_NODE_RANK`` (pytorch/pytorch:torch/distributed/argparse_util.py: an option
      with ``action=env`` defaults to ``PET_<DEST>``; ``--node-rank`` is one);
    * NCCL's network choice logged on node 0 for the runtime's transport check.
    """
    # NeMo: one task per GPU, so the node's rank is the task id over the tasks per node.
    per = "" if tasks_per_node == 1 else f" / {tasks_per_node}"
    rank = f'"$((SLURM_PROCID{per}))"' if per else '"$SLURM_PROCID"'
    lines = ['trap "" USR2', f"export SLURMFM_NODE_RANK={rank}"]
    if torchrun:
        lines[-1] += f" PET_NODE_RANK={rank}"
    if nccl_log:
        lines.append(
            'if [ "$SLURMFM_NODE_RANK" = 0 ]; then export NCCL_DEBUG=INFO'
            ' NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$SLURMFM_NCCL_LOG"; fi'
        )
    lines.append('exec "$@"')
    return sh_quote("\n".join(lines))


def container_name(role: str) -> str:
    """The Pyxis container name of a job's attempt (shell text, expanded by the batch script)."""
    return "slurmfm-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}-" + role


def _container_forward(kind: str, forward: str, in_container: bool) -> dict[str, object]:
    """The batch options (:class:`BatchOptions` fields) that deliver the save signal to a
    training launch in a container.

    Only a host step on every node delivers it (``runtime forward``), to the training
    processes it finds there, and the launch ``srun`` gets no signal: Slurm passes a signal
    sent to ``srun`` to every process of the step, and under Pyxis' ``use_squashfuse=1`` those
    include Enroot's ``squashfuse``, which holds the container's root file system and dies of
    USR2 (its default action; github.com/NVIDIA/enroot src/runtime.sh starts it in the step;
    tests/e2e/test_real_container_launch.py shows it on real Pyxis). Megatron-LM saves on
    TERM; the others on USR2 (slurmfm.checkpoint). NeMo's tasks are its training processes
    (no launcher), so they get it themselves.
    """
    if not in_container or kind not in ("torchrun", "megatron", "nemo"):
        return {}
    return {
        "container_forward": forward if forward != "none" else "USR2",
        "container_forward_tasks": kind == "nemo",
    }


def _container_opts(
    recipe: Recipe,
    inst: InstanceType,
    env_names: list[str],
    mount_runtime: bool = True,
    role: str = "launch",
) -> tuple[list[str], list[str]]:
    """Pyxis options for a container step on ``inst``, and warnings.

    ``--container-env`` names every variable slurmfm or the recipe sets (``env_names``): Pyxis
    exports the host environment into the container after the entrypoint, but a variable the
    image already defines keeps the image's value unless it is named there (NVIDIA/pyxis
    README, tests/env.bats). NGC images define ``LD_LIBRARY_PATH`` and some ``NCCL_*``, so
    without it the profile and ``env:`` would silently not apply. On multi-node NVLink types
    the IMEX channel directory is bind-mounted where Enroot does not provide it.
    """
    from slurmfm.catalog.containers import CONTAINER_FEATURES, IMEX_CHANNELS_DIR, has
    from slurmfm.catalog.containers import parse_version as container_version

    c = recipe.container
    if c is None:
        return [], []
    warnings: list[str] = []
    opts = [f"--container-image={sh_quote(c.image, what='container.image')}"]
    mounts = list(c.mounts)
    enroot = container_version("container.enroot", c.enroot)
    if (
        inst.needs_imex
        and not has("imex_channels", enroot)
        and not any(m.split(":", 1)[0].rstrip("/") == IMEX_CHANNELS_DIR for m in mounts)
    ):
        mounts.append(IMEX_CHANNELS_DIR)
    # A server step that needs the per-node entry inside the image (vLLM's Ray sequence,
    # SGLang's node rank) sees the runtime file read-only at the same path; a training launch
    # runs no runtime in the container (_container_entry) and gets no such mount.
    mount_list = [sh_quote(",".join(mounts), what="container.mounts")] if mounts else []
    if mount_runtime:
        mount_list.append('"$SLURMFM_RUNTIME:$SLURMFM_RUNTIME:ro"')
    if mount_list:
        opts.append("--container-mounts=" + ",".join(mount_list))
    if c.workdir:
        opts.append(f"--container-workdir={sh_quote(c.workdir, what='container.workdir')}")
    if not c.mount_home:
        opts.append("--no-container-mount-home")
    names = sorted(set(env_names))
    if names:
        pyxis = container_version("container.pyxis", c.pyxis)
        if has("container_env", pyxis):
            listed = ",".join(env_name(n) for n in names)
            opts.append(f"--container-env={sh_quote(listed, what='container-env')}")
        else:
            f = CONTAINER_FEATURES["container_env"]
            warnings.append(
                f"container.pyxis: {c.pyxis} has no --container-env (from {f.introduced}): a "
                f"variable the image defines keeps the image's value, which can override "
                f"{', '.join(names)} [{f.source}]"
            )
    # A named container is kept on the node after its step (NVIDIA/pyxis README,
    # --container-name): every step of this attempt in this role (the in-container IMEX
    # check, the launch, a relaunch) reuses its file system instead of unpacking the image
    # again on every node (scripts/bench_container_name.py measures it). One per attempt, so
    # that a requeued run starts from the image; the runtime removes it when the attempt ends
    # (`container-remove`). Pyxis' use_squashfuse=1 mounts only unnamed containers' images:
    # there a name would unpack the image instead (container.named: false).
    if c.named:
        opts.append(f'--container-name="{container_name(role)}"')
    return opts, warnings


@dataclass(frozen=True)
class HealthGate:
    """What the per-node health gate expects, from the instance catalog."""

    enabled: bool
    gpus: int
    efa: int


def _health(recipe: Recipe, inst: InstanceType) -> HealthGate:
    mode = recipe.resilience.health_gate
    enabled = mode == "on" or (mode == "auto" and inst.gpus > 0 and not inst.virtual)
    return HealthGate(enabled, inst.gpus, inst.efa_interfaces)


def _serve(recipe: Recipe) -> ServeLaunch | None:
    """The server group of a serving recipe (whole job) or of a train-and-serve recipe."""
    from slurmfm.recipe.schema import SglangLauncher, VllmLauncher
    from slurmfm.render.serve import serve_launch

    L = recipe.launcher
    if isinstance(L, VllmLauncher | SglangLauncher):
        return serve_launch(L, recipe.parallelism, recipe.resources.nodes, "all")
    if recipe.serve is None:
        return None
    s = recipe.serve
    return serve_launch(s.launcher, s.parallelism, s.nodes, s.placement)


@dataclass(frozen=True)
class Observe:
    """What the observability include needs (slurmfm/render/templates/observe.sh.j2)."""

    enabled: bool
    textfile_dir: str = "''"
    dcgm_dir: str = "''"
    efa: int = 0
    interval: int = 15
    gpus: int = 0
    recipe: str = "''"
    job_json: str = "{}"  # the job's description for the agent (literal JSON)


def _observe(recipe: Recipe, inst: InstanceType) -> Observe:
    import json

    o = recipe.observability
    enabled = o.enabled == "on" or (o.enabled == "auto" and inst.gpus > 0 and not inst.virtual)
    if not enabled:
        return Observe(False)
    # what `slurmfm logs --rank` needs; nothing that differs between the tasks of a sweep
    job = {
        "recipe": recipe.name,
        "launcher": recipe.launcher.kind,
        "procs_per_node": recipe.procs_per_node,
        "tasks_per_node": recipe.procs_per_node if recipe.launcher.kind == "nemo" else 1,
        "instance_type": inst.name,
    }
    return Observe(
        enabled=True,
        textfile_dir=sh_quote(o.textfile_dir or "", what="observability.textfile_dir"),
        dcgm_dir=sh_quote(
            (o.dcgm_job_mapping_dir or "") if inst.gpus else "",
            what="observability.dcgm_job_mapping_dir",
        ),
        efa=int(o.efa_counters),
        interval=o.interval_s,
        gpus=inst.gpus,
        recipe=sh_quote(recipe.name, what="name"),
        job_json=json.dumps(job, sort_keys=True),
    )


def _nccl_check(recipe: Recipe, inst: InstanceType) -> str:
    mode = recipe.resilience.nccl_transport_check
    if mode == "auto":
        return "fail" if inst.efa_interfaces > 0 and not inst.virtual else "off"
    return mode


def _prepare_opts(
    recipe: Recipe, placement: Placement, serve: ServeLaunch | None
) -> tuple[PrepareOptions, str]:
    """Options of ``runtime prepare``: where the host order comes from, ports, storage."""
    o: dict[str, object] = {}
    if placement.nodes:
        o["planned"] = " ".join(placement.nodes)
        how = "planned by `slurmfm plan`, pin mode"
    elif placement.rank_key:
        o["rank_map"] = " ".join(f"{h}={k}" for h, k in sorted(placement.rank_key.items()))
        how = "the planner's rank map sorts the allocation"
    elif placement.mode == "constrain":
        o["topo_addr"] = True
        how = "sorted by each node's SLURM_TOPOLOGY_ADDR"
    else:
        how = "the allocation's own order"
    port = getattr(recipe.launcher, "rdzv_port", None)
    if port:
        o["rdzv_port"] = port
    if recipe.launcher.kind == "nemo":  # one task per GPU, laid out in host order
        o["tasks_per_node"] = recipe.procs_per_node
    if recipe.resources.spare_nodes:
        o["spare_nodes"] = recipe.resources.spare_nodes
    if serve is not None:
        o.update(serve=serve.group, serve_nodes=serve.nodes, serve_port=serve.port)
        if serve.dist_port is not None:
            o["dist_port"] = serve.dist_port
            o["serve_dp"] = serve.dp
    s = recipe.storage
    if s.stripe == "auto":
        layout = _checkpoint_layout(recipe)
        if layout.args:
            o["stripe_layout"] = " ".join(layout.args)
    if s.min_free_gb:
        gb = str(int(s.min_free_gb)) if s.min_free_gb == int(s.min_free_gb) else str(s.min_free_gb)
        o.update(min_free_kb=int(s.min_free_gb * 1024 * 1024), min_free_gb=gb)
    return PrepareOptions(**o), how  # type: ignore[arg-type]


def _shell_words(words: list[str]) -> str:
    """Runtime option words as shell text: ``--flag=VALUE`` keeps its flag bare."""
    out = []
    for w in words:
        name, eq, value = w.partition("=")
        bare_flag = eq and name.startswith("--") and name[2:].replace("-", "").isalnum()
        out.append(name + "=" + sh_quote(value) if bare_flag else sh_quote(w))
    return " ".join(out)


# ``runtime batch``'s options, one readable line per group: a line marked True always shows
# (for the reader), the others when one of their values is not the runtime's default.
_BATCH_LINES: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("max_restarts", "restart_in_job", "requeue", "drain", "hyperpod"), True),
    (("retry_exit", "hang_timeout_s"), True),
    (("expedite",), False),
    (("health", "gpus", "efa", "dcgm", "imex", "efa_tries", "efa_delay_s"), False),
    (("nccl_check", "nccl_timeout_s"), False),
    (("save_protocol", "resignal_s", "probe_timeout_s", "done_check"), True),
    (("observe", "observe_job_json"), False),
    (
        (
            "serve_words",
            "serve_kind",
            "serve_model",
            "health_path",
            "ready_timeout_s",
            "ready_poll_s",
        ),
        False,
    ),
    (("component",), False),  # one line per component, with its own env lines (_batch_lines)
    (("secret",), False),
    (("container_forward",), False),
    (("container_forward_tasks",), False),
)


def _serve_node_words(serve: ServeLaunch) -> str:
    """The server's per-node entry options: its prefix always and, with Ray, every setting."""
    ray = ("ray", "ray_python", "ray_port", "ray_nodes", "ray_timeout_s") if serve.node.ray else ()
    return _shell_words(serve.node.to_argv(always=("prefix", *ray)))


def _batch_lines(o: BatchOptions, components: tuple[Component, ...]) -> list[str]:
    """``o`` as the script's lines of shell words (:data:`_BATCH_LINES`).

    Two values only the job's bash knows are shell text here, not fields of ``o``: the
    number of words of the server's command (``${#slurmfm_serve[@]}``) and each component's
    environment values (the profile's shell words, as in the ``export`` lines).
    """
    changed = set(o.changed())
    lines: list[str] = []
    placed: set[str] = set()
    for names, always in _BATCH_LINES:
        placed.update(names)
        if names == ("component",):
            # Heterogeneous component N: its own health gate and observability agent on its
            # own nodes, and the profile lines of its instance type that differ from the
            # exports above, applied to its steps (`srun --het-group=N`).
            for comp, spec in zip(components[1:], o.component, strict=False):
                lines.append(_shell_words([flag("component"), spec]))
                env = flag("component_env")
                own = [
                    f"{env} " + hetjob.env_spec(comp.group, e.name, e.shell_value) for e in comp.env
                ]
                own += [
                    _shell_words([flag("component_unset"), hetjob.unset_spec(comp.group, n)])
                    for n in comp.unset
                ]
                lines.extend(_wrap(own))
            placed.update(("component_env", "component_unset"))
            continue
        if not always and not changed & set(names):
            continue
        words = []
        for name in names:
            if name == "serve_words":
                words.append(flag(name) + ' "${#slurmfm_serve[@]}"')
            else:
                words.append(_shell_words(o.words(name)))
        lines.append(" ".join(w for w in words if w))
    if changed - placed:  # pragma: no cover - a field added to BatchOptions but not here
        raise RenderError(f"internal: batch options {sorted(changed - placed)} have no line")
    return lines


def _checkpoint_layout(recipe: Recipe) -> CheckpointLayout:
    """The Lustre layout for this recipe's checkpoint format (slurmfm/catalog/storage.py)."""
    from slurmfm.catalog.storage import checkpoint_layout

    fmt = None
    if recipe.launcher.kind == "megatron":
        value = recipe.launcher.model_args.get("ckpt-format")
        fmt = str(value) if value is not None else None
    return checkpoint_layout(recipe.launcher.kind, fmt)


def _batch_opts(
    recipe: Recipe,
    inst: InstanceType,
    health: HealthGate,
    nccl_check: str,
    observe: Observe,
    serve: ServeLaunch | None,
    components: tuple[Component, ...] = (),
    container: Mapping[str, object] = {},
) -> BatchOptions:
    """Options of ``runtime batch`` (the words: :func:`_batch_lines`)."""
    res = recipe.resilience
    kind = recipe.launcher.kind
    o: dict[str, object] = {
        "max_restarts": res.max_restarts,
        "restart_in_job": res.restart_in_job,
        "requeue": res.requeue,
        "drain": res.drain_unhealthy,
        "hyperpod": recipe.cluster.flavor == "hyperpod",
        # Exits > 128 (killed by a signal) retry in the runtime whatever this list says.
        "retry_exit": ",".join(str(c) for c in sorted(set(res.retry_exit_codes))) or "none",
        "hang_timeout_s": res.hang_timeout_s,
        # an end it chooses must not be requeued held
        "expedite": res.requeue and res.expedited_requeue,
    }
    if health.enabled:
        # A multi-node NVLink domain (GB200) needs the IMEX channel: NCCL's MNNVL fails
        # without /dev/nvidia-caps-imex-channels (NVIDIA/nccl src/mnnvl.cc).
        o.update(
            health=True,
            gpus=health.gpus,
            efa=health.efa,
            dcgm=res.dcgm_level,
            imex=max(inst.nvlink.instances) > 1,
        )
    if nccl_check != "off":
        o.update(nccl_check=nccl_check, nccl_timeout_s=res.nccl_check_timeout_s)
    # resilience.save_on_signal (default by launcher: servers have no state to save, scripts
    # without a USR2 handler have no save protocol): false requeues at once at the
    # signal, resuming from the last periodic checkpoint; true lets the training save first.
    o["save_protocol"] = bool(recipe.save_on_signal)
    done = "marker"
    from slurmfm.recipe.schema import MegatronLauncher

    L = recipe.launcher
    if isinstance(L, MegatronLauncher) and L.model_args.get("train-iters") not in (None, False):
        done = f"megatron:{int(str(L.model_args['train-iters']))}"
    elif isinstance(L, MegatronLauncher) and L.model_args.get("train-samples") not in (None, False):
        # Run by samples (AWS's own Megatron sample does): Megatron turns them into iterations
        # itself and its tracker counts iterations, so the check does the same arithmetic.
        iters = megatron_train_iters(L.model_args, recipe.dp)
        if iters is not None:
            done = f"megatron:{iters}"
    elif kind in ("vllm", "sglang"):
        done = "none"
    o["done_check"] = done
    if observe.enabled:
        o.update(observe=True, observe_job_json=observe.job_json)
    if serve is not None:
        o.update(
            serve_kind=serve.kind,
            serve_model=serve.model_json,
            health_path=serve.health_path,
            ready_timeout_s=serve.ready_timeout_s,
            ready_poll_s=serve.ready_poll_s,
        )
    o["component_unset"] = tuple(
        hetjob.unset_spec(c.group, n) for c in components[1:] for n in c.unset
    )
    o["component"] = tuple(
        hetjob.component_spec(
            hetjob.Component(
                c.group, c.nodes, c.health.enabled, c.health.gpus, c.health.efa, c.imex
            )
        )
        for c in components[1:]
    )
    # masked in the launch command the job log prints
    o["secret"] = tuple(recipe.secrets)
    o.update(container)
    return BatchOptions(**o)  # type: ignore[arg-type]


def megatron_train_iters(args: Mapping[str, object], dp: int) -> int | None:
    """The iterations Megatron-LM trains for ``--train-samples`` (None: not computable).

    NVIDIA/Megatron-LM megatron/training/training.py ``update_train_iters``: with a constant
    batch ``train_samples // global_batch_size``; with ``--rampup-batch-size START INCR
    SAMPLES`` one iteration per ramp batch while ``consumed <= SAMPLES``, then the rest at
    the full batch, the partial last batch dropped. The ramp's batch size follows
    megatron/core/num_microbatches_calculator.py (``RampupBatchsizeNumMicroBatchesCalculator``:
    ``START + int(consumed / (SAMPLES / increments)) * INCR``, the full batch past the ramp).
    ``global-batch-size`` defaults to micro-batch-size x dp, as in Megatron's arguments.
    """
    try:
        samples = int(str(args["train-samples"]))
        gbs_arg = args.get("global-batch-size")
        if gbs_arg in (None, False):
            gbs = int(str(args.get("micro-batch-size", 1))) * dp
        else:
            gbs = int(str(gbs_arg))
        ramp = args.get("rampup-batch-size")
        if gbs <= 0 or samples < 0:
            return None
        if ramp in (None, False):
            return samples // gbs
        words = ramp if isinstance(ramp, list) else str(ramp).split()
        start, incr, ramp_samples = (int(str(w)) for w in words)
    except (KeyError, ValueError, TypeError):
        return None
    if incr <= 0 or start <= 0 or gbs <= start or (gbs - start) // incr == 0:
        return samples // gbs
    per_increment = ramp_samples / ((gbs - start) // incr)
    iters = consumed = 0
    while consumed <= ramp_samples:
        consumed += min(gbs, start + int(consumed / per_increment) * incr)
        iters += 1
    return iters + max(0, samples - consumed) // gbs


def _wrap(words: list[str], width: int = 88) -> list[str]:
    """Shell words grouped into lines of at most ``width`` characters (one word may exceed)."""
    lines: list[str] = []
    for w in words:
        if lines and len(lines[-1]) + 1 + len(w) <= width:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return lines


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


def render_script(
    recipe: Recipe,
    target: Target | None = None,
    placement: Placement | None = None,
    *,
    sweep: SweepTable | None = None,
) -> RenderedScript:
    """Render ``recipe`` into an sbatch script for ``target``; pure, deterministic.

    With ``sweep`` (:func:`slurmfm.render.array.render_array`), ``recipe`` is task 0's and the
    values the table sets per task are left out of the shared exports and the launch."""
    from slurmfm.catalog.instances import get_instance

    target = target or Target.for_recipe(recipe)
    placement = placement or Placement()
    inst = get_instance(recipe.cluster.instance_type)
    directives, warnings = _directives(recipe, inst, target, placement)
    if sweep is not None:
        directives = _array_directives(directives, sweep, recipe.storage.log_dir)
    env, env_warnings = _env_lines(recipe, inst)
    warnings.extend(env_warnings)
    components = _components(recipe, inst)
    # Every variable the profile or the recipe sets (names only; values stay in the exports).
    container_env = sorted(
        {e.name for e in env}
        | set(recipe.secrets)
        | {e.name for comp in components for e in comp.env}
        | (sweep.env_names if sweep is not None else frozenset())
    )
    serve = _serve(recipe)
    # A training launch in a container runs the launcher itself, not the runtime's per-node
    # entry (_container_entry); a server sharing the whole allocation keeps the entry.
    in_container = recipe.container is not None and (serve is None or serve.group != "all")
    # A server keeps the per-node entry in its container only where it has work there:
    # across nodes (vLLM's Ray sequence, SGLang's node rank); one server node runs directly.
    serve_entry = serve is not None and (recipe.container is None or serve.nodes > 1)
    # The launch step's Pyxis options (the launch srun is a whole-allocation server's own step
    # when the job has no trainer).
    container_opts, container_warnings = _container_opts(
        recipe, inst, container_env, mount_runtime=serve_entry and not in_container
    )
    warnings.extend(container_warnings)
    for name in recipe.secrets:
        env_name(name, what="secrets")
    s = recipe.storage
    run_id = recipe.run_id
    checkpoint_dir = recipe.checkpoint_dir
    if serve is not None and serve.group == "all":
        argv, prefix, how = list(serve.argv), serve.prefix, serve.description
    else:
        argv, prefix, how = _launch(recipe, "$SLURMFM_CHECKPOINT_DIR")
    if sweep is not None and sweep.argv_from is not None:
        # this array task's own launch words, set from the sweep table
        argv = [*argv[: sweep.argv_from], '"${slurmfm_task_argv[@]}"']
    split = serve is not None and serve.group == "split"
    # A split trainer runs on the first hosts of the order only; elsewhere the step spans the
    # (first component of the) allocation.
    spare = recipe.resources.spare_nodes > 0  # the trainer runs on the order, spares aside
    nodes_expr = '"$SLURMFM_NNODES"' if split or spare else '"$SLURM_JOB_NUM_NODES"'
    nemo = recipe.launcher.kind == "nemo"
    # --nodes is left out with --distribution=arbitrary: Slurm >= 24.11 refuses the two together.
    srun = [] if nemo or in_container else [f"--nodes={nodes_expr}"]
    if serve is not None and serve.group == "hetjob":
        srun.insert(0, "--het-group=0")
    if nemo:
        # Lightning's SLURMEnvironment takes the global rank from SLURM_PROCID, so tasks are
        # laid out in the job's host order: with --distribution=arbitrary srun places tasks
        # in the order of the node list, each host named once per task (srun(1)
        # --distribution=arbitrary and --nodelist; checked on Slurm 22.05, 24.11, 26.05).
        g = recipe.procs_per_node
        srun.extend(
            [
                f"--ntasks-per-node={g}",
                # the runtime's prepare step lists each host of the order once per task
                '--ntasks="$SLURMFM_NTASKS"',
                "--distribution=arbitrary",
                '--nodelist="$SLURMFM_TASK_NODELIST"',
            ]
        )
    elif in_container:
        # One task per node in the host order: the task id is the node rank.
        srun.extend(
            [
                f"--ntasks={nodes_expr}",
                "--ntasks-per-node=1",
                "--distribution=arbitrary",
                '--nodelist="$SLURMFM_NODELIST"',
            ]
        )
    else:
        srun.extend([f"--ntasks={nodes_expr}", "--ntasks-per-node=1"])
    if (split or spare) and not nemo and not in_container:  # those name the trainer's hosts
        srun.append('--nodelist="$SLURMFM_NODELIST"')
    srun.append("--kill-on-bad-exit=1")
    observe = _observe(recipe, inst)
    if observe.enabled:
        # "T: " before each output line, T the task: `slurmfm logs --rank` selects on it.
        srun.append("--label")
    hyperpod = recipe.cluster.flavor == "hyperpod"
    if hyperpod:
        # HyperPod's auto-resume is an srun option; sbatch rejects it (AWS docs
        # "sagemaker-hyperpod-resiliency-slurm-auto-resume"). Other flavors: the runtime adds
        # it when it finds /opt/sagemaker_cluster on the node.
        srun.insert(0, "--auto-resume=1")
    if recipe.resilience.log_mode == "per_restart":
        srun.append(
            '--output="$SLURMFM_LOG_DIR/${SLURM_JOB_NAME}_${SLURM_JOB_ID}_r${SLURMFM_RESTART}.out"'
        )
    srun.extend(container_opts)
    serve_srun: list[str] = []
    het = [comp for comp in components if comp.group == 1]
    serve_inst = inst
    if het:
        from slurmfm.catalog.instances import get_instance

        serve_inst = get_instance(het[0].instance)
    serve_container_opts, _ = _container_opts(
        recipe,
        serve_inst,
        container_env,
        mount_runtime=serve_entry,
        role="launch" if serve is not None and serve.group == "all" else "serve",
    )
    if serve is not None:
        if serve.group == "all":
            serve_srun = srun
        else:
            k = serve.nodes
            serve_srun = [f"--nodes={k}", f"--ntasks={k}", "--ntasks-per-node=1"]
            if serve.group == "hetjob":
                serve_srun.insert(0, "--het-group=1")
            else:
                serve_srun.append('--nodelist="$SLURMFM_SERVE_NODELIST"')
            serve_srun += [
                "--kill-on-bad-exit=1",
                '--output="$SLURMFM_LOG_DIR/${SLURM_JOB_NAME}_${SLURM_JOB_ID}_serve.out"',
                "--open-mode=append",
                *serve_container_opts,
            ]
    pe = recipe.python_env
    setup: list[str] = []
    if pe is not None:
        for mod in pe.modules:
            setup.append(f"module load {sh_quote(mod, what='python_env.modules')}")
        if pe.activate:
            setup.append("# shellcheck source=/dev/null")
            setup.append(f"source {sh_quote(pe.activate, what='python_env.activate')}")
        if pe.conda_env:
            setup.append('eval "$(conda shell.bash hook)"')
            setup.append(f"conda activate {sh_quote(pe.conda_env, what='python_env.conda_env')}")
    data = [
        (env_name(f"SLURMFM_DATA_{k.upper()}"), sh_quote(v, what=f"storage.data.{k}"))
        for k, v in s.data.items()
    ]
    shown_env = env
    if sweep is not None:
        data = [(n, v) for n, v in data if n not in sweep.data_names]
        shown_env = [e for e in env if e.name not in sweep.env_names]
    # a sweep's driver is per task, in the table
    nemo_driver = None if sweep is not None else _nemo_driver(recipe, "$SLURMFM_CHECKPOINT_DIR")
    heredoc_tag = "SLURMFM_NEMO_DRIVER_EOF"
    if nemo_driver and heredoc_tag in nemo_driver:
        raise RenderError("launcher: the NeMo driver text contains its own heredoc delimiter")
    health = _health(recipe, inst)
    nccl_check = _nccl_check(recipe, inst)
    # Only launchers that run NCCL under the per-node entry get an NCCL log to check: vLLM and
    # SGLang set up NCCL themselves and never log there (no false "no NCCL line" warning).
    if recipe.launcher.kind in ("vllm", "sglang"):
        nccl_check = "off"
    rf = runtime_file()
    prepare, order_how = _prepare_opts(recipe, placement, serve)
    # What the training processes get on the save signal besides Slurm's own USR2, which
    # already reaches every process of the step (a second, late USR2 could hit a worker that
    # is already exiting): Megatron-LM saves on SIGTERM (--exit-signal-handler), NeMo 2.0 too
    # (its PreemptionCallback, which _nemo_driver adds), where the task itself gets it.
    forward = {"megatron": "TERM"}.get(recipe.launcher.kind, "none")
    if nemo and recipe.save_on_signal:
        forward = "TERM"
    batch = _batch_opts(
        recipe,
        inst,
        health,
        nccl_check,
        observe,
        serve,
        components,
        _container_forward(recipe.launcher.kind, forward, in_container),
    )
    ctx = {
        "version": __version__,
        "recipe": recipe,
        "inst": inst,
        "target": target,
        "directives": directives,
        "env": shown_env,
        "sweep": sweep,
        "secrets": list(recipe.secrets),
        "setup": setup,
        "data": data,
        "log_dir": sh_quote(s.log_dir, what="storage.log_dir"),
        "checkpoint_dir": sh_quote(checkpoint_dir, what="storage.checkpoint_root"),
        "run_id": sh_quote(run_id, what="storage.run_id"),
        # the job runtime's name of it (slurmfm/job/state.py), with the job's own variables
        "state_file_name": state_name("${SLURM_JOB_NAME}", "${SLURM_JOB_ID}"),
        "prepare_opts": _shell_words(prepare.to_argv()),
        "serve_node_opts": _serve_node_words(serve) if serve is not None else "",
        "node_opts": _shell_words(
            NodeOptions(
                prefix=prefix, forward=forward, forward_tasks=nemo and forward != "none"
            ).to_argv(always=("prefix", "forward"))
        ),
        "order_how": order_how,
        "batch_opts": _batch_lines(batch, components),
        "srun_opts": _wrap(srun),
        "argv": argv,
        "prefix": prefix,
        "how": how,
        "nemo_driver": nemo_driver,
        "heredoc_tag": heredoc_tag,
        "procs_per_node": recipe.procs_per_node,
        "world": recipe.world_size,
        "nccl_log": nccl_check != "off",
        "observe": observe,
        "forward": forward,
        "forward_tasks": nemo and forward != "none",
        # $0 of that program: what the runtime looks for to print node 0's command
        "container_entry_name": CONTAINER_ENTRY,
        "container_entry": (
            _container_entry(recipe.procs_per_node if nemo else 1, prefix > 0, nccl_check != "off")
            if in_container
            else None
        ),
        # Heterogeneous components: each one's own profile differences and health
        # expectations, for the runtime to apply per component (empty for one component).
        "components": components,
        "container_env": container_env,
        "serve": serve,
        "serve_srun": _wrap(serve_srun),
        "serve_entry": serve_entry,
        "runtime_sha": rf.sha256,
        "checked": sh_quote(install.CHECKED, what="runtime check"),
        "payload": payload_line(rf),
    }
    text = _env().get_template("sbatch.sh.j2").render(**ctx)
    return RenderedScript(
        text=text,
        directives=tuple(directives),
        env=tuple(env),
        launch=sh_join([]) + " ".join(argv),
        warnings=tuple(warnings),
        target=target,
        secrets=tuple(recipe.secrets),
        log_dir=s.log_dir,
        checkpoint_dir=checkpoint_dir,
        notes=(how,),
        components=components,
        container_env=tuple(container_env),
        files=(rf,),
        prepare_options=prepare,
        batch_options=batch,
    )
