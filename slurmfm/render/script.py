"""Build the sbatch script for a recipe: a pure function from typed values to text.

The script is assembled as typed parts (directives, environment lines, launch command) and laid
out by a jinja2 template with ``StrictUndefined``, so a missing value is a bug caught in tests,
never an empty string in a job. User values enter bash only through
:func:`slurmfm.render.quote.sh_quote` and enter ``#SBATCH`` lines only through
:func:`slurmfm.render.quote.sbatch_value`.
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
from slurmfm.launchers import LauncherSpec, spec
from slurmfm.plan.types import Placement
from slurmfm.render.container import _container_entry, _container_forward, _container_opts
from slurmfm.render.directives import Directive, _array_directives, _directives
from slurmfm.render.parts import Component, EnvLine, HealthGate, Observe, _wrap
from slurmfm.render.payload import RuntimeFile, payload_line, runtime_file
from slurmfm.render.quote import env_name, sh_join, sh_quote
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


def _health(recipe: Recipe, inst: InstanceType) -> HealthGate:
    mode = recipe.resilience.health_gate
    enabled = mode == "on" or (mode == "auto" and inst.gpus > 0 and not inst.virtual)
    return HealthGate(enabled, inst.gpus, inst.efa_interfaces)


def _serve(recipe: Recipe) -> ServeLaunch | None:
    """The server group of a serving recipe (whole job) or of a train-and-serve recipe."""
    from slurmfm.launchers import SglangLauncher, VllmLauncher
    from slurmfm.render.serve import serve_launch

    L = recipe.launcher
    if isinstance(L, VllmLauncher | SglangLauncher):  # a server's recipe: the whole job serves
        return serve_launch(L, recipe.parallelism, recipe.resources.nodes, "all")
    if recipe.serve is None:
        return None
    s = recipe.serve
    return serve_launch(s.launcher, s.parallelism, s.nodes, s.placement)


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
        "tasks_per_node": spec(recipe.launcher.kind).tasks_per_node(recipe),
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


def _launch_srun(
    recipe: Recipe,
    launcher: LauncherSpec,
    serve: ServeLaunch | None,
    in_container: bool,
    observe: Observe,
    container_opts: list[str],
) -> list[str]:
    """The launch ``srun``'s options: where its tasks go (the allocation, the trainer's hosts
    of a split or spared job, one task per GPU in host order for NeMo, one per node in host
    order in a container), labels, HyperPod's auto-resume, per-restart logs, Pyxis."""
    split = serve is not None and serve.group == "split"
    # A split trainer runs on the first hosts of the order only; elsewhere the step spans the
    # (first component of the) allocation.
    spare = recipe.resources.spare_nodes > 0  # the trainer runs on the order, spares aside
    nodes_expr = '"$SLURMFM_NNODES"' if split or spare else '"$SLURM_JOB_NUM_NODES"'
    nemo = launcher.task_per_gpu
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
    recipe: Recipe,
    inst: InstanceType,
    srun: list[str],
    serve: ServeLaunch | None,
    components: tuple[Component, ...],
    container_env: list[str],
    serve_entry: bool,
) -> list[str]:
    """The server step's ``srun`` options: the launch's own for a whole-allocation server,
    else the serving nodes (split) or heterogeneous component 1, with its own log."""
    if serve is None:
        return []
    if serve.group == "all":
        return srun
    het = [comp for comp in components if comp.group == 1]
    serve_inst = inst
    if het:
        from slurmfm.catalog.instances import get_instance

        serve_inst = get_instance(het[0].instance)
    opts, _ = _container_opts(
        recipe, serve_inst, container_env, mount_runtime=serve_entry, role="serve"
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
    launcher = spec(recipe.launcher.kind)
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
        argv, prefix, how = launcher.launch(recipe, "$SLURMFM_CHECKPOINT_DIR")
    if sweep is not None and sweep.argv_from is not None:
        # this array task's own launch words, set from the sweep table
        argv = [*argv[: sweep.argv_from], '"${slurmfm_task_argv[@]}"']
    observe = _observe(recipe, inst)
    srun = _launch_srun(recipe, launcher, serve, in_container, observe, container_opts)
    serve_srun = _serve_srun(recipe, inst, srun, serve, components, container_env, serve_entry)
    setup = _setup_lines(recipe)
    data = [
        (env_name(f"SLURMFM_DATA_{k.upper()}"), sh_quote(v, what=f"storage.data.{k}"))
        for k, v in s.data.items()
    ]
    shown_env = env
    if sweep is not None:
        data = [(n, v) for n, v in data if n not in sweep.data_names]
        shown_env = [e for e in env if e.name not in sweep.env_names]
    # a sweep's driver is per task, in the table
    nemo_driver = None if sweep is not None else launcher.driver(recipe, "$SLURMFM_CHECKPOINT_DIR")
    heredoc_tag = "SLURMFM_NEMO_DRIVER_EOF"
    if nemo_driver and heredoc_tag in nemo_driver:
        raise RenderError("launcher: the NeMo driver text contains its own heredoc delimiter")
    health = _health(recipe, inst)
    nccl_check = _nccl_check(recipe, inst)
    # Only launchers that run NCCL under the per-node entry get an NCCL log to check: vLLM and
    # SGLang set up NCCL themselves and never log there (no false "no NCCL line" warning).
    if not launcher.nccl_log:
        nccl_check = "off"
    rf = runtime_file()
    prepare, order_how = _prepare_opts(recipe, placement, serve)
    # What the training processes get on the save signal besides Slurm's own USR2, which
    # already reaches every process of the step (a second, late USR2 could hit a worker that
    # is already exiting): Megatron-LM saves on SIGTERM (--exit-signal-handler), NeMo 2.0 too
    # (its PreemptionCallback, which its driver adds), where the task itself gets it.
    forward = launcher.forward(recipe)
    batch = _batch_opts(
        recipe,
        inst,
        health,
        nccl_check,
        observe,
        serve,
        components,
        _container_forward(launcher, forward, in_container),
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
                prefix=prefix,
                forward=forward,
                forward_tasks=launcher.forward_tasks and forward != "none",
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
        "forward_tasks": launcher.forward_tasks and forward != "none",
        # $0 of that program: what the runtime looks for to print node 0's command
        "container_entry_name": CONTAINER_ENTRY,
        "container_entry": (
            _container_entry(launcher.tasks_per_node(recipe), prefix > 0, nccl_check != "off")
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
        # how each step of the script runs it: the interpreter the runtime's own steps use
        "runtime": " ".join(install.INTERPRETER) + ' -c "$slurmfm_checked"',
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
