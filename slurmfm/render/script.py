"""Build the sbatch script for a recipe: a pure function from typed values to text.

The script is assembled as typed parts (directives, environment lines, launch command) and laid
out by a jinja2 template with ``StrictUndefined``, so a missing value is a bug caught in tests,
never an empty string in a job. User values enter bash only through
:func:`slurmfm.quote.sh_quote` and enter ``#SBATCH`` lines only through
:func:`slurmfm.quote.sbatch_value`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from slurmfm import __version__
from slurmfm.errors import RenderError
from slurmfm.job import install
from slurmfm.job.options import (
    CONTAINER_ENTRY,
    BatchOptions,
    NodeOptions,
    PrepareOptions,
)
from slurmfm.job.state import state_name
from slurmfm.launchers import LauncherSpec
from slurmfm.plan.types import Placement
from slurmfm.quote import env_name, sh_join, sh_quote
from slurmfm.render.container import _container_entry, _container_forward, _container_opts
from slurmfm.render.directives import Directive, _array_directives, _directives
from slurmfm.render.parts import Component, EnvLine, HealthGate, Observe, _wrap
from slurmfm.render.payload import RuntimeFile, payload_line, runtime_file
from slurmfm.render.runtime_opts import (
    _batch_lines,
    _batch_opts,
    _prepare_opts,
    _serve_node_words,
    _shell_words,
)
from slurmfm.target import Target as Target  # noqa: PLC0414 - re-exported for callers

if TYPE_CHECKING:
    import jinja2

    from slurmfm.catalog.instances import InstanceType
    from slurmfm.catalog.nccl import EnvSetting, JobTraits
    from slurmfm.recipe.schema import Recipe
    from slurmfm.render.array import SweepTable
    from slurmfm.render.serve import ServeLaunch
    from slurmfm.resolve import ResolvedJob


@dataclass(frozen=True, repr=False)
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
    # What it was rendered from (slurmfm.resolve): a dry run's or a submission's request
    # carries it (``SubmitRequest.resolved_job``); a sweep's is task 0's.
    resolved: ResolvedJob | None = None

    def __repr__(self) -> str:
        """Short: the launch line and what to look at, not the text (its last line is the
        whole runtime; ``.text`` has it)."""
        lines = self.text.count("\n")
        return (
            f"RenderedScript(<{len(self.text):,} chars, {lines:,} lines>, launch={self.launch!r}, "
            f"target={self.target!r}, directives={len(self.directives)}, "
            f"warnings={self.warnings!r})"
        )


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


_RUN_MODULE_MARK = "# slurmfm: run-module definition"


def _with_run_module(text: str) -> str:
    """The script with ``slurmfm_run_module`` defined where its launches use it, and no line
    where none does. Why a variable: the program that keeps the working directory off
    ``sys.path`` (:mod:`slurmfm.job.safepath`) is a line of Python that would otherwise stand
    in the middle of every launch line; defined once, the launch reads ``python3 -c
    "$slurmfm_run_module" torch.distributed.run``. Whether a launch uses it is known only
    once every launch line is rendered (the training's, a server's, each component's)."""
    from slurmfm.job.safepath import RUN_MODULE, SHELL_VAR
    from slurmfm.quote import sh_quote

    mark = _RUN_MODULE_MARK + "\n"
    if f'"${SHELL_VAR}"' not in text:
        return text.replace(mark, "", 1)
    definition = (
        "# python -m MODULE without the working directory on sys.path: a package another user\n"
        "# planted in a shared submit directory is never imported (docs/security.md).\n"
        f"{SHELL_VAR}={sh_quote(RUN_MODULE)}\n"
    )
    return text.replace(mark, definition, 1)


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
    from slurmfm.job.masking import env_warnings

    traits = job_traits(recipe)
    profile, warnings = _profile(recipe, inst, traits)
    warnings.extend(env_warnings(recipe.env))  # a token under env: instead of secrets:
    from slurmfm.recipe.rdzv import c10d_warnings

    warnings.extend(c10d_warnings(recipe))  # a c10d rendezvous would discard the order
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


def _components(job: ResolvedJob) -> tuple[Component, ...]:
    """Per-component profile and health for heterogeneous jobs (empty for one component)."""
    recipe, inst, sinst = job.recipe, job.inst, job.serve_inst
    s = recipe.serve
    if s is None or sinst is None:  # not a heterogeneous job
        return ()
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


def _health(recipe: Recipe, inst: InstanceType) -> HealthGate:
    mode = recipe.resilience.health_gate
    enabled = mode == "on" or (mode == "auto" and inst.gpus > 0 and not inst.virtual)
    return HealthGate(enabled, inst.gpus, inst.efa_interfaces)


def _serve(job: ResolvedJob) -> ServeLaunch | None:
    """The server group of a serving recipe (whole job) or of a train-and-serve recipe."""
    from typing import cast

    from slurmfm.launchers import ServeLauncher
    from slurmfm.render.serve import serve_launch

    recipe = job.recipe
    L = recipe.launcher
    if job.launcher.server:  # a server's recipe (the registry says): the whole job serves
        server = cast("ServeLauncher", L)  # a server kind's section (slurmfm.launchers)
        return serve_launch(
            server, recipe.parallelism, recipe.resources.nodes, "all", recipe.procs_per_node
        )
    if recipe.serve is None:
        return None
    s = recipe.serve
    return serve_launch(s.launcher, s.parallelism, s.nodes, s.placement)


def _observe(job: ResolvedJob) -> Observe:
    import json

    recipe, inst = job.recipe, job.inst
    o = recipe.observability
    enabled = o.enabled == "on" or (o.enabled == "auto" and inst.gpus > 0 and not inst.virtual)
    if not enabled:
        return Observe(False)
    # what `slurmfm logs --rank` needs; nothing that differs between the tasks of a sweep
    facts = {
        "recipe": recipe.name,
        "launcher": recipe.launcher.kind,
        "procs_per_node": recipe.procs_per_node,
        "tasks_per_node": job.tasks_per_node,
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
        job_json=json.dumps(facts, sort_keys=True),
    )


def _nccl_check(recipe: Recipe, inst: InstanceType) -> str:
    mode = recipe.resilience.nccl_transport_check
    if mode == "auto":
        return "fail" if inst.efa_interfaces > 0 and not inst.virtual else "off"
    return mode


def _launch_srun(
    recipe: Recipe,
    launcher: LauncherSpec,
    serve: ServeLaunch | None,
    observe: Observe,
    container_opts: list[str],
) -> list[str]:
    """The launch ``srun``'s options: where its tasks go (the allocation, the trainer's hosts
    of a split or spared job, one task per GPU in host order for NeMo), labels, HyperPod's
    auto-resume, per-restart logs, Pyxis."""
    split = serve is not None and serve.group == "split"
    # A split trainer runs on the first hosts of the order only; elsewhere the step spans the
    # (first component of the) allocation.
    spare = recipe.resources.spare_nodes > 0  # the trainer runs on the order, spares aside
    nodes_expr = '"$SLURMFM_NNODES"' if split or spare else '"$SLURM_JOB_NUM_NODES"'
    nemo = launcher.task_per_gpu
    # --nodes is left out with --distribution=arbitrary: Slurm >= 24.11 refuses the two together.
    srun = [] if nemo else [f"--nodes={nodes_expr}"]
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
    else:
        # One task per node; each node's entry (in the container too) takes its rank from the
        # host order, so no node list is fixed here that HyperPod's auto-resume would replay.
        srun.extend([f"--ntasks={nodes_expr}", "--ntasks-per-node=1"])
    if (split or spare) and not nemo:  # those name the trainer's hosts
        srun.append('--nodelist="$SLURMFM_NODELIST"')
    srun.append("--kill-on-bad-exit=1")
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
    return srun


def _serve_srun(
    job: ResolvedJob,
    srun: list[str],
    serve: ServeLaunch | None,
    container_env: list[str],
    serve_entry: bool,
) -> list[str]:
    """The server step's ``srun`` options: the launch's own for a whole-allocation server,
    else the serving nodes (split) or heterogeneous component 1 (its own instance type),
    with its own log."""
    if serve is None:
        return []
    if serve.group == "all":
        return srun
    opts, _ = _container_opts(
        job.recipe,
        job.serve_inst or job.inst,
        container_env,
        mount_runtime=serve_entry,
        role="serve",
    )
    k = serve.nodes
    out = [f"--nodes={k}", f"--ntasks={k}", "--ntasks-per-node=1"]
    if serve.group == "hetjob":
        out.insert(0, "--het-group=1")
    else:
        out.append('--nodelist="$SLURMFM_SERVE_NODELIST"')
    return [
        *out,
        "--kill-on-bad-exit=1",
        '--output="$SLURMFM_LOG_DIR/${SLURM_JOB_NAME}_${SLURM_JOB_ID}_serve.out"',
        "--open-mode=append",
        *opts,
    ]


def _setup_lines(recipe: Recipe) -> list[str]:
    """The python environment's set-up lines (modules, an activate script, conda)."""
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
    return setup


def _worker_binding(
    recipe: Recipe,
    inst: InstanceType,
    torchrun: bool,
    task_per_gpu: bool,
    trains: bool,
    srun: list[str],
    warnings: list[str],
) -> tuple[list[str], str]:
    """The launch srun with ``--cpu-bind`` where each task is one GPU's (its NUMA domain,
    slurmfm/catalog/binding.py), and torchrun's ``--numa-binding`` mode for the node entry
    ("" for none). A launch that only serves is not bound (servers bind themselves)."""
    from slurmfm.catalog.binding import worker_binding

    binding = worker_binding(recipe, inst, torchrun and trains, task_per_gpu)
    if binding.warning:
        warnings.append(binding.warning)
    if binding.cpu_bind and trains:
        # one task per GPU: local task i on GPU i's NUMA domain
        srun = [*srun, f"--cpu-bind={binding.cpu_bind}"]
    return srun, binding.numa if trains else ""


def _data_and_env(
    recipe: Recipe, env: list[EnvLine], sweep: SweepTable | None
) -> tuple[list[tuple[str, str]], list[EnvLine]]:
    """``storage.data`` as ``SLURMFM_DATA_<NAME>`` exports, and the environment lines the
    script shows: without what a sweep's table sets per task."""
    data = [
        (env_name(f"SLURMFM_DATA_{k.upper()}"), sh_quote(v, what=f"storage.data.{k}"))
        for k, v in recipe.storage.data.items()
    ]
    if sweep is None:
        return data, env
    return (
        [(n, v) for n, v in data if n not in sweep.data_names],
        [e for e in env if e.name not in sweep.env_names],
    )


def _launch_nccl_check(
    recipe: Recipe, inst: InstanceType, launcher: LauncherSpec, serve: ServeLaunch | None
) -> str:
    """The NCCL transport check of the launch, or "off" where no NCCL log is written.

    Launchers that run NCCL under the per-node entry get an NCCL log to check. A server sets
    up NCCL itself, but its processes honour NCCL_DEBUG_FILE too (the node entry sets it on
    node 0, and vLLM's Ray workers and SGLang's schedulers inherit it): checked where its
    group spans nodes, so that NCCL has a network to choose (vLLM's own guide says to look
    for NET/Socket: vllm-project/vllm docs/serving/parallelism_scaling.md). A one-node server
    crosses no network (no false "no NCCL line" warning)."""
    if not launcher.nccl_log and not (
        launcher.server and serve is not None and serve.group == "all" and serve.span > 1
    ):
        return "off"
    return _nccl_check(recipe, inst)


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
    from slurmfm.resolve import resolve

    return render_resolved(resolve(recipe, target, placement), sweep=sweep)


@dataclass(frozen=True)
class _Parts:
    """What a script is laid out from, each part computed once from the resolved job: the
    ``#SBATCH`` lines, the environment, the launch and its steps, the runtime's options."""

    directives: list[Directive]
    warnings: list[str]
    env: list[EnvLine]
    components: tuple[Component, ...]
    container_env: list[str]
    serve: ServeLaunch | None
    in_container: bool
    serve_entry: bool
    argv: list[str]
    prefix: int
    how: str
    observe: Observe
    srun: list[str]
    serve_srun: list[str]
    trains: bool
    numa: str
    nccl_check: str
    prepare: PrepareOptions
    order_how: str
    forward: str
    batch: BatchOptions


def _environment(
    job: ResolvedJob, sweep: SweepTable | None
) -> tuple[list[Directive], list[str], list[EnvLine], tuple[Component, ...], list[str]]:
    """The ``#SBATCH`` lines, the warnings so far, the exports, the heterogeneous components
    and every variable name a container must be given."""
    recipe = job.recipe
    directives, warnings = _directives(job)
    if sweep is not None:
        directives = _array_directives(directives, sweep, recipe.storage.log_dir)
    env, env_warnings = _env_lines(recipe, job.inst)
    warnings.extend(env_warnings)
    components = _components(job)
    # Every variable the profile or the recipe sets (names only; values stay in the exports).
    container_env = sorted(
        {e.name for e in env}
        | set(recipe.secrets)
        | {e.name for comp in components for e in comp.env}
        | (sweep.env_names if sweep is not None else frozenset())
    )
    return directives, warnings, env, components, container_env


def _parts(job: ResolvedJob, sweep: SweepTable | None) -> _Parts:
    """Every part of the script but its layout (see :class:`_Parts`)."""
    recipe, inst, launcher = job.recipe, job.inst, job.launcher
    directives, warnings, env, components, container_env = _environment(job, sweep)
    serve = _serve(job)
    # A training launch in a container runs the runtime's per-node entry in the image
    # (_container_entry), as a server sharing the whole allocation does.
    in_container = recipe.container is not None and (serve is None or serve.group != "all")
    # A server keeps the per-node entry in its container only where it has work there:
    # across nodes (vLLM's Ray sequence, SGLang's node rank); one server node runs directly.
    serve_entry = serve is not None and (recipe.container is None or serve.nodes > 1)
    # The launch step's Pyxis options (the launch srun is a whole-allocation server's own step
    # when the job has no trainer).
    container_opts, container_warnings = _container_opts(
        recipe, inst, container_env, mount_runtime=serve_entry or in_container
    )
    warnings.extend(container_warnings)
    for name in recipe.secrets:
        env_name(name, what="secrets")
    if serve is not None and serve.group == "all":
        argv, prefix, how = list(serve.argv), serve.prefix, serve.description
    else:
        argv, prefix, how = launcher.launch(recipe, "$SLURMFM_CHECKPOINT_DIR")
    if sweep is not None and sweep.argv_from is not None:
        # this array task's own launch words, set from the sweep table
        argv = [*argv[: sweep.argv_from], '"${slurmfm_task_argv[@]}"']
    observe = _observe(job)
    srun = _launch_srun(recipe, launcher, serve, observe, container_opts)
    serve_srun = _serve_srun(job, srun, serve, container_env, serve_entry)
    trains = serve is None or serve.group != "all"
    srun, numa = _worker_binding(
        recipe, inst, launcher.torchrun, launcher.task_per_gpu, trains, srun, warnings
    )
    nccl_check = _launch_nccl_check(recipe, inst, launcher, serve)
    prepare, order_how = _prepare_opts(recipe, job.placement, serve, launcher)
    # What the training processes get on the save signal besides Slurm's own USR2, which
    # already reaches every process of the step (a second, late USR2 could hit a worker that
    # is already exiting): Megatron-LM saves on SIGTERM (--exit-signal-handler), NeMo 2.0 too
    # (its PreemptionCallback, which its driver adds), where the task itself gets it.
    forward = launcher.forward(recipe)
    batch = _batch_opts(
        recipe,
        inst,
        _health(recipe, inst),
        nccl_check,
        observe,
        serve,
        components,
        _container_forward(launcher, forward, in_container),
        launcher,
    )
    return _Parts(
        directives=directives,
        warnings=warnings,
        env=env,
        components=components,
        container_env=container_env,
        serve=serve,
        in_container=in_container,
        serve_entry=serve_entry,
        argv=argv,
        prefix=prefix,
        how=how,
        observe=observe,
        srun=srun,
        serve_srun=serve_srun,
        trains=trains,
        numa=numa,
        nccl_check=nccl_check,
        prepare=prepare,
        order_how=order_how,
        forward=forward,
        batch=batch,
    )


_HEREDOC_TAG = "SLURMFM_NEMO_DRIVER_EOF"


def _nemo_driver(job: ResolvedJob, sweep: SweepTable | None) -> str | None:
    """NeMo's driver text for the script's heredoc (a sweep's is per task, in the table)."""
    driver = (
        None if sweep is not None else job.launcher.driver(job.recipe, "$SLURMFM_CHECKPOINT_DIR")
    )
    if driver and _HEREDOC_TAG in driver:
        raise RenderError("launcher: the NeMo driver text contains its own heredoc delimiter")
    return driver


def _launch_context(job: ResolvedJob, p: _Parts, sweep: SweepTable | None) -> dict[str, object]:
    """The template's values for the launch: the runtime's options, the srun lines, the
    launch words and what the per-node entry is told."""
    launcher = job.launcher
    forward_tasks = launcher.forward_tasks and p.forward != "none"
    return {
        "prepare_opts": _shell_words(p.prepare.to_argv()),
        "serve_node_opts": _serve_node_words(p.serve) if p.serve is not None else "",
        "node_opts": _shell_words(
            launcher.node_options(
                job.recipe,
                NodeOptions(
                    prefix=p.prefix, forward=p.forward, forward_tasks=forward_tasks, numa=p.numa
                ),
            ).to_argv(always=("prefix", "forward"))
        ),
        "order_how": p.order_how,
        "batch_opts": _batch_lines(p.batch, p.components, trainer=p.trains),
        "srun_opts": _wrap(p.srun),
        "argv": p.argv,
        "prefix": p.prefix,
        "how": p.how,
        "nemo_driver": _nemo_driver(job, sweep),
        "heredoc_tag": _HEREDOC_TAG,
        "procs_per_node": job.recipe.procs_per_node,
        "world": job.recipe.world_size,
        "nccl_log": p.nccl_check != "off",
        "observe": p.observe,
        "forward": p.forward,
        "forward_tasks": forward_tasks,
        # $0 of that program: what the runtime looks for to print node 0's command
        "container_entry_name": CONTAINER_ENTRY,
        "container_entry": (
            _container_entry(p.prefix > 0, p.nccl_check != "off") if p.in_container else None
        ),
        # Heterogeneous components: each one's own profile differences and health
        # expectations, for the runtime to apply per component (empty for one component).
        "components": p.components,
        "container_env": p.container_env,
        "serve": p.serve,
        "serve_srun": _wrap(p.serve_srun),
        "serve_entry": p.serve_entry,
    }


def _context(
    job: ResolvedJob, p: _Parts, sweep: SweepTable | None, rf: RuntimeFile
) -> dict[str, object]:
    """Every value the template formats (``sbatch.sh.j2``)."""
    recipe = job.recipe
    data, shown_env = _data_and_env(recipe, p.env, sweep)
    return {
        "version": __version__,
        "recipe": recipe,
        "inst": job.inst,
        "target": job.target,
        "directives": p.directives,
        "env": shown_env,
        "sweep": sweep,
        "secrets": list(recipe.secrets),
        "setup": _setup_lines(recipe),
        "data": data,
        "log_dir": sh_quote(recipe.storage.log_dir, what="storage.log_dir"),
        "checkpoint_dir": sh_quote(recipe.checkpoint_dir, what="storage.checkpoint_root"),
        "run_id": sh_quote(recipe.run_id, what="storage.run_id"),
        # the job runtime's name of it (slurmfm/job/state.py), with the job's own variables
        "state_file_name": state_name("${SLURM_JOB_NAME}", "${SLURM_JOB_ID}"),
        **_launch_context(job, p, sweep),
        "runtime_sha": rf.sha256,
        "checked": sh_quote(install.CHECKED, what="runtime check"),
        # how each step of the script runs it: the interpreter the runtime's own steps use
        "runtime": " ".join(install.INTERPRETER) + ' -c "$slurmfm_checked"',
        "payload": payload_line(rf),
    }


def render_resolved(job: ResolvedJob, *, sweep: SweepTable | None = None) -> RenderedScript:
    """Render a resolved recipe (:func:`slurmfm.resolve.resolve`): the script formats what
    ``job`` holds and asks the catalog nothing again. Pure, deterministic."""
    recipe = job.recipe
    p = _parts(job, sweep)
    rf = runtime_file()
    ctx = _context(job, p, sweep, rf)
    text = _with_run_module(
        _env().get_template("sbatch.sh.j2").render(run_module_marker=_RUN_MODULE_MARK, **ctx)
    )
    return RenderedScript(
        text=text,
        directives=tuple(p.directives),
        env=tuple(p.env),
        launch=sh_join([]) + " ".join(p.argv),
        warnings=tuple(p.warnings),
        target=job.target,
        secrets=tuple(recipe.secrets),
        log_dir=recipe.storage.log_dir,
        checkpoint_dir=recipe.checkpoint_dir,
        notes=(p.how,),
        components=p.components,
        container_env=tuple(p.container_env),
        files=(rf,),
        prepare_options=p.prepare,
        batch_options=p.batch,
        resolved=job,
    )
