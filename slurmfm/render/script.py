"""Build the sbatch script for a recipe: a pure function from typed values to text.

The script is assembled as typed parts (directives, environment lines, launch command) and laid
out by a jinja2 template with ``StrictUndefined``, so a missing value is a bug caught in tests,
never an empty string in a job. User values enter bash only through
:func:`slurmfm.render.quote.sh_quote` and enter ``#SBATCH`` lines only through
:func:`slurmfm.render.quote.sbatch_value`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from slurmfm import __version__
from slurmfm.errors import RenderError, UnsupportedError
from slurmfm.plan.types import Placement
from slurmfm.render.payload import RuntimeFile, payload_line, runtime_file
from slurmfm.render.quote import env_name, sbatch_value, sh_join, sh_quote

if TYPE_CHECKING:
    import jinja2

    from slurmfm.catalog.instances import InstanceType
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.recipe.schema import Recipe
    from slurmfm.render.serve import ServeLaunch

# Default Slurm version per flavor when the recipe says "auto" and no cluster was asked.
# Conservative on purpose: an assumed version only ever removes options.
# Sources: ParallelCluster 3.14 ships 24.11.6, 3.15 ships 25.11.4 (aws-parallelcluster-cookbook
# CHANGELOG); PCS offers 23.11-25.11 (PCS doc-history); HyperPod partition topology needs 25.11;
# Debian 12 ships 22.05. See ../shared/reference/aws-launch-facts.md section 4.
ASSUMED_VERSION = {
    "parallelcluster": "24.11",
    "pcs": "24.11",
    "hyperpod": "24.11",
    "generic": "22.05",
}


@dataclass(frozen=True)
class Target:
    """What the script is rendered for: the Slurm version and whether it was probed."""

    slurm_version: SlurmVersion
    assumed: bool = False

    @classmethod
    def for_recipe(cls, recipe: Recipe, probed: str | None = None) -> Target:
        from slurmfm.catalog.slurm_features import SlurmVersion

        if recipe.cluster.slurm_version != "auto":
            return cls(SlurmVersion.parse(recipe.cluster.slurm_version))
        if probed:
            return cls(SlurmVersion.parse(probed))
        return cls(SlurmVersion.parse(ASSUMED_VERSION[recipe.cluster.flavor]), assumed=True)


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
    # What the job needs beside its text: the runtime zipapp (also embedded in the text's last
    # line, so a plain `sbatch` of the text works on its own).
    files: tuple[RuntimeFile, ...] = ()


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept on disk, as Python keeps ``__pycache__``.

    Why: compiling the templates to Python and then to bytecode is ~50 ms of every cold
    ``slurmfm render`` (measured with cProfile on the largest recipe); loading the marshalled
    code takes ~1 ms. Jinja keys each entry on the template's name and a checksum of its source,
    and stamps it with jinja's and Python's bytecode versions, so an edited template or a new
    interpreter simply compiles again. Lives under the render cache's directory
    (``slurmfm.render_cache.cache_dir()/templates``, mode 0700); ``SLURMFM_NO_CACHE=1`` turns it
    off, and a directory that cannot be written only costs the compile time.
    """
    import jinja2

    from slurmfm import render_cache

    if not render_cache.enabled():
        return None
    directory = render_cache.cache_dir() / "templates"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None

    class _Quiet(jinja2.FileSystemBytecodeCache):
        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    return _Quiet(str(directory))


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("slurmfm", "render/templates"),
        bytecode_cache=_bytecode_cache(),
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
            str(r.nodes),
            f"{recipe.serve.nodes} of them serve (the last in the host order), the rest train"
            if recipe.serve is not None and recipe.serve.placement == "split"
            else None,
        ),
        Directive("ntasks-per-node", str(tasks_per_node), why_tasks),
        Directive("time", sbatch_value(r.time_limit, what="resources.time_limit")),
    ]
    for opt, val, what in (
        ("partition", c.partition, "cluster.partition"),
        ("account", c.account, "cluster.account"),
        ("qos", c.qos, "cluster.qos"),
        ("reservation", c.reservation, "cluster.reservation"),
        ("constraint", c.constraints, "cluster.constraints"),
        ("exclude", r.exclude, "resources.exclude"),
    ):
        if val:
            d.append(Directive(opt, sbatch_value(val, what=what)))
    if c.flavor == "hyperpod" and not c.partition:
        warnings.append(
            "cluster.partition: HyperPod's default partition 'dev' also holds login nodes; "
            "name a partition"
        )
    if r.exclusive:
        d.append(Directive("exclusive", None, "whole nodes: NCCL/EFA tuning assumes it"))
    if inst.gpus:
        if c.flavor == "hyperpod":
            warnings.append(
                "GPUs not requested through GRES on HyperPod: older HyperPod AMIs have no GPU "
                "GRES and auto-resume needs --nodes with --exclusive (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-resiliency-slurm-auto-resume.html)"
            )
        elif supports("gpus_per_node", v):
            d.append(Directive("gpus-per-node", str(inst.gpus)))
        else:
            d.append(Directive("gres", f"gpu:{inst.gpus}"))
    if r.mem:
        d.append(Directive("mem", r.mem))
    elif r.exclusive and inst.gpus:
        d.append(Directive("mem", "0", "all of each node's memory"))
    d.append(Directive("wait-all-nodes", "1", "start only when every node has booted"))
    out = f"{sbatch_value(recipe.storage.log_dir, what='storage.log_dir').rstrip('/')}/%x_%j.out"
    d.append(Directive("output", out))
    res = recipe.resilience
    if res.requeue:
        d.append(Directive("requeue", None, "restart after node failure or a pre-timeout save"))
    else:
        d.append(Directive("no-requeue"))
    if res.requeue or c.flavor == "hyperpod":
        d.append(
            Directive(
                "open-mode", "append", "a requeue would otherwise truncate the earlier output"
            )
        )
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
                "(USR2: what slurmfm/checkpoint.py SaveRequest listens for)",
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
        import hostlist

        d.append(
            Directive(
                "nodelist",
                sbatch_value(hostlist.collect_hostlist(list(placement.nodes)), what="nodelist"),
                "pinned by the planner",
            )
        )
    if recipe.serve is not None and recipe.serve.placement == "hetjob":
        d.extend(_hetjob_component(recipe, inst, v))
    return d, warnings


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


def _env_lines(recipe: Recipe, inst: InstanceType) -> tuple[list[EnvLine], list[str]]:
    from slurmfm.catalog.nccl import (
        FORBIDDEN,
        Runtime,
        StackVersions,
        check_minimums,
        merge_env,
        nccl_env,
    )

    n = recipe.network
    stack = StackVersions.parse(n.efa_installer, n.libfabric, n.aws_ofi_nccl, n.nccl)
    runtime: Runtime = "container" if recipe.container is not None else "host"
    profile = nccl_env(inst, stack, runtime)
    user_env = dict(recipe.env)
    if n.nccl_debug and "NCCL_DEBUG" not in user_env:
        user_env["NCCL_DEBUG"] = n.nccl_debug
    kept, user = merge_env(profile, user_env)
    warnings = [f"network: {w}" for w in check_minimums(inst, stack)]
    lines: list[EnvLine] = []
    for s in kept:
        value = f'"{s.value}"' if s.raw_shell else sh_quote(s.value, what=f"env {s.name}")
        lines.append(
            EnvLine(env_name(s.name), value, f"{s.reason} [{s.source}]", "profile", s.raw_shell)
        )
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
    return lines, warnings


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
        "# resume from the newest checkpoint in the run directory when one exists\n"
        "recipe.resume = run.Config(llm.AutoResume, resume_if_exists=True,\n"
        "                           resume_ignore_no_checkpoint=True)\n"
        "run.run(recipe, direct=True)\n"
    )


def _container_opts(recipe: Recipe) -> list[str]:
    c = recipe.container
    if c is None:
        return []
    opts = [f"--container-image={sh_quote(c.image, what='container.image')}"]
    # The per-node entry wraps the launcher, so it runs where the launcher runs: inside the
    # container, which therefore sees the runtime file (read-only, at the same path).
    runtime = '"$SLURMFM_RUNTIME:$SLURMFM_RUNTIME:ro"'
    if c.mounts:
        mounts = sh_quote(",".join(c.mounts), what="container.mounts")
        opts.append(f"--container-mounts={mounts},{runtime}")
    else:
        opts.append(f"--container-mounts={runtime}")
    if c.workdir:
        opts.append(f"--container-workdir={sh_quote(c.workdir, what='container.workdir')}")
    if not c.mount_home:
        opts.append("--no-container-mount-home")
    return opts


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
    job_json: str = "''"


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
        job_json=sh_quote(json.dumps(job, sort_keys=True)),
    )


def _nccl_check(recipe: Recipe, inst: InstanceType) -> str:
    mode = recipe.resilience.nccl_transport_check
    if mode == "auto":
        return "fail" if inst.efa_interfaces > 0 and not inst.virtual else "off"
    return mode


def _prepare_opts(
    recipe: Recipe, placement: Placement, serve: ServeLaunch | None
) -> tuple[list[str], str]:
    """Options of ``runtime prepare``: where the host order comes from, ports, storage."""
    opts: list[str] = []
    if placement.nodes:
        opts.append("--planned " + sh_quote(" ".join(placement.nodes)))
        how = "planned by `slurmfm plan`, pin mode"
    elif placement.rank_key:
        rank_map = " ".join(f"{h}={k}" for h, k in sorted(placement.rank_key.items()))
        opts.append("--rank-map " + sh_quote(rank_map))
        how = "the planner's rank map sorts the allocation"
    elif placement.mode == "constrain":
        opts.append("--topo-addr 1")
        how = "sorted by each node's SLURM_TOPOLOGY_ADDR"
    else:
        how = "the allocation's own order"
    port = getattr(recipe.launcher, "rdzv_port", None)
    if port:
        opts.append(f"--rdzv-port {port}")
    if serve is not None:
        opts.append(f"--serve {serve.group} --serve-nodes {serve.nodes} --serve-port {serve.port}")
        if serve.dist_port is not None:
            opts.append(f"--dist-port {serve.dist_port}")
    s = recipe.storage
    if s.stripe == "auto":
        opts.append("--stripe 1")
    if s.min_free_gb:
        gb = str(int(s.min_free_gb)) if s.min_free_gb == int(s.min_free_gb) else str(s.min_free_gb)
        opts.append(f"--min-free-kb {int(s.min_free_gb * 1024 * 1024)} --min-free-gb {gb}")
    return opts, how


def _batch_opts(
    recipe: Recipe,
    inst: InstanceType,
    health: HealthGate,
    nccl_check: str,
    observe: Observe,
    serve: ServeLaunch | None,
) -> list[str]:
    """Options of ``runtime batch``, one readable group per line."""
    res = recipe.resilience
    kind = recipe.launcher.kind
    opts = [
        f"--max-restarts {res.max_restarts} --requeue {int(res.requeue)}"
        f" --drain {int(res.drain_unhealthy)} --hyperpod {int(recipe.cluster.flavor == 'hyperpod')}"
    ]
    if health.enabled:
        # A multi-node NVLink domain (GB200) needs the IMEX channel: NCCL's MNNVL fails
        # without /dev/nvidia-caps-imex-channels (NVIDIA/nccl src/mnnvl.cc).
        imex = int(max(inst.nvlink.instances) > 1)
        opts.append(
            f"--health 1 --gpus {health.gpus} --efa {health.efa} --dcgm {res.dcgm_level}"
            f" --imex {imex} --efa-tries 3 --efa-delay-s 5"
        )
    if nccl_check != "off":
        opts.append(f"--nccl-check {nccl_check} --nccl-timeout-s {res.nccl_check_timeout_s}")
    # Servers have no state to save and NeMo has no save-on-signal protocol: at the signal the
    # job requeues at once (resuming from the last periodic checkpoint). Others save first.
    save = kind not in ("nemo", "vllm", "sglang")
    done = "marker"
    from slurmfm.recipe.schema import MegatronLauncher

    L = recipe.launcher
    if isinstance(L, MegatronLauncher) and L.model_args.get("train-iters") not in (None, False):
        done = f"megatron:{int(str(L.model_args['train-iters']))}"
    elif kind in ("vllm", "sglang"):
        done = "none"
    opts.append(
        f"--save-protocol {int(save)} --resignal-s 10 --probe-timeout-s 60 --done-check {done}"
    )
    if observe.enabled:
        opts.append(f"--observe 1 --observe-job-json {observe.job_json}")
    if serve is not None:
        words = '"${#slurmfm_serve[@]}"'
        opts.append(
            f"--serve-words {words} --serve-kind {serve.kind} --serve-model {serve.model_json}"
            f" --health-path {sh_quote(serve.health_path)}"
            f" --ready-timeout-s {serve.ready_timeout_s} --ready-poll-s {serve.ready_poll_s}"
        )
    if recipe.secrets:
        # masked in the launch command the job log prints
        opts.append(" ".join(f"--secret {name}" for name in recipe.secrets))
    return opts


def _wrap(words: list[str], width: int = 88) -> list[str]:
    """Shell words grouped into lines of at most ``width`` characters (one word may exceed)."""
    lines: list[str] = []
    for w in words:
        if lines and len(lines[-1]) + 1 + len(w) <= width:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return lines


def render_script(
    recipe: Recipe, target: Target | None = None, placement: Placement | None = None
) -> RenderedScript:
    """Render ``recipe`` into an sbatch script for ``target``; pure, deterministic."""
    from slurmfm.catalog.instances import get_instance

    target = target or Target.for_recipe(recipe)
    placement = placement or Placement()
    inst = get_instance(recipe.cluster.instance_type)
    directives, warnings = _directives(recipe, inst, target, placement)
    env, env_warnings = _env_lines(recipe, inst)
    warnings.extend(env_warnings)
    for name in recipe.secrets:
        env_name(name, what="secrets")
    s = recipe.storage
    run_id = s.run_id or recipe.name
    ckpt = s.checkpoint_root.rstrip("/") or "/"
    checkpoint_dir = f"{ckpt}/{recipe.name}/{run_id}" if ckpt != "/" else f"/{recipe.name}/{run_id}"
    serve = _serve(recipe)
    if serve is not None and serve.group == "all":
        argv, prefix, how = list(serve.argv), serve.prefix, serve.description
    else:
        argv, prefix, how = _launch(recipe, "$SLURMFM_CHECKPOINT_DIR")
    split = serve is not None and serve.group == "split"
    # A split trainer runs on the first hosts of the order only; elsewhere the step spans the
    # (first component of the) allocation.
    nodes_expr = '"$SLURMFM_NNODES"' if split else '"$SLURM_JOB_NUM_NODES"'
    srun = [f"--nodes={nodes_expr}"]
    if serve is not None and serve.group == "hetjob":
        srun.insert(0, "--het-group=0")
    if recipe.launcher.kind == "nemo":
        srun.append(f"--ntasks-per-node={recipe.procs_per_node}")
    else:
        srun.extend([f"--ntasks={nodes_expr}", "--ntasks-per-node=1"])
    if split:
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
    srun.extend(_container_opts(recipe))
    serve_srun: list[str] = []
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
                *_container_opts(recipe),
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
    nemo_driver = _nemo_driver(recipe, "$SLURMFM_CHECKPOINT_DIR")
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
    ctx = {
        "version": __version__,
        "recipe": recipe,
        "inst": inst,
        "target": target,
        "directives": directives,
        "env": env,
        "secrets": list(recipe.secrets),
        "setup": setup,
        "data": data,
        "log_dir": sh_quote(s.log_dir, what="storage.log_dir"),
        "checkpoint_dir": sh_quote(checkpoint_dir, what="storage.checkpoint_root"),
        "run_id": sh_quote(run_id, what="storage.run_id"),
        "prepare_opts": prepare,
        "order_how": order_how,
        "batch_opts": _batch_opts(recipe, inst, health, nccl_check, observe, serve),
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
        # What the per-node entry sends to the launcher's children on the save signal. Slurm
        # already delivers the USR2 sent to srun to every process of the step, so torchrun
        # scripts need nothing more (a second, late USR2 could hit a worker that is already
        # exiting); Megatron-LM saves on SIGTERM (--exit-signal-handler).
        "forward": {"megatron": "TERM"}.get(recipe.launcher.kind, "none"),
        "serve": serve,
        "serve_srun": _wrap(serve_srun),
        "runtime_sha": rf.sha256,
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
        files=(rf,),
    )
