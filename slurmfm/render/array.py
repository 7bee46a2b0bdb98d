"""Render a sweep as one job-array script: rendered once, with a table of per-task values.

Why a table and not N scripts: sbatch applies one script and one set of ``#SBATCH`` options to
every array task ("multiple jobs to be executed with identical parameters", sbatch(1)
``--array``), so what a task may change is data, not text. The script is rendered once, from
task 0's recipe; everything a sweep may vary (:data:`slurmfm.recipe.sweep.ALLOWED`) becomes a
row of a JSON table carried in the script's next-to-last line (``# slurmfm-sweep {...}``). At
run time the job runtime's ``task`` step selects the row of ``SLURM_ARRAY_TASK_ID`` and prints
it as ``export`` lines and the array ``slurmfm_task_argv`` (:mod:`slurmfm.job.sweep`).

A row holds the task's run id, checkpoint directory and overrides; the environment variables
and data paths whose value is not the same in every task; the launch words after the
launcher's fixed head (torchrun: the script and its arguments; Megatron-LM: the entry point and
its arguments) from the first line that is not the same in every task; and for NeMo the
driver text. Values enter the table already shell-quoted by
:func:`slurmfm.quote.sh_quote`, the same path a single job's values take, so the runtime
only selects and never quotes.

Overrides that would change an ``#SBATCH`` line or the launcher kind are refused when the
recipe is validated (:mod:`slurmfm.recipe.sweep`); the checks here catch any difference the
table cannot carry (a :class:`~slurmfm.errors.RenderError`), so a future change cannot silently
give every task task 0's value.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmfm.errors import RenderError
from slurmfm.quote import env_name, sbatch_value, sh_quote

if TYPE_CHECKING:
    from slurmfm.plan.types import Placement
    from slurmfm.recipe.schema import Recipe
    from slurmfm.recipe.sweep import SweepTask
    from slurmfm.render.script import RenderedScript, Target

# The marker the runtime looks for (slurmfm/job/sweep.py: TABLE_MARK).
TABLE_MARK = "# slurmfm-sweep "


@dataclass(frozen=True)
class SweepTable:
    """What the renderer needs to render a sweep once.

    ``array`` is the ``--array`` value (the request's ArraySpec); ``env_names`` and
    ``data_names`` the exports left out of the shared part because the table sets them per
    task; ``argv_from`` the index of the first launch line taken from the table (``None``: the
    launch is the same for every task; NeMo's driver, which differs, is in the table);
    ``line`` the table itself, one line of JSON after :data:`TABLE_MARK`.
    """

    array: str
    tasks: int
    env_names: frozenset[str]
    data_names: frozenset[str]
    argv_from: int | None
    line: str
    warnings: tuple[str, ...] = ()


def _fixed_parts(recipe: Recipe, target: Target, placement: Placement | None) -> object:
    """Everything of a task's script that the table cannot carry: the ``#SBATCH`` options and
    the runtime's prepare and batch options. Equal for every task, or the sweep is refused."""
    from slurmfm.render import script as sc
    from slurmfm.render.directives import _directives
    from slurmfm.render.runtime_opts import _batch_opts, _prepare_opts
    from slurmfm.resolve import resolve

    job = resolve(recipe, target, placement)
    inst = job.inst
    serve = sc._serve(job)
    directives, _ = _directives(job)
    batch = _batch_opts(
        recipe,
        inst,
        sc._health(recipe, inst),
        sc._nccl_check(recipe, inst),
        sc._observe(job),
        serve,
        launcher=job.launcher,
    )
    prepare, _ = _prepare_opts(recipe, job.placement, serve, job.launcher)
    return (tuple(directives), tuple(batch), tuple(prepare), serve, recipe.launcher.kind)


def sweep_table(
    recipe: Recipe, tasks: list[SweepTask], target: Target, placement: Placement | None
) -> SweepTable:
    """The per-task values of ``tasks`` as a :class:`SweepTable` (pure)."""
    from slurmfm.recipe.sweep import array_spec
    from slurmfm.render import script as sc
    from slurmfm.resolve import resolve

    if recipe.sweep is None:
        raise RenderError("sweep: the recipe has no sweep section")
    job = resolve(recipe, target, placement)  # the sweep's instance type and launcher, once
    inst = job.inst
    fixed = _fixed_parts(tasks[0].recipe, target, placement)
    envs: list[dict[str, str]] = []
    datas: list[dict[str, str]] = []
    launches: list[list[str]] = []
    warnings: list[str] = []
    launcher = job.launcher
    nemo = launcher.task_per_gpu
    head = 0 if nemo else 2  # torchrun's python -m torch.distributed.run and its options
    # task 0's launch: what every task's fixed part must equal
    first, first_prefix, _ = launcher.launch(tasks[0].recipe, "$SLURMFM_CHECKPOINT_DIR")
    for t in tasks:
        if _fixed_parts(t.recipe, target, placement) != fixed:
            raise RenderError(
                f"sweep: array task {t.index} needs other #SBATCH or runtime options than task "
                "0 (sbatch applies one set to every array task); vary only "
                "what the sweep's allowed keys change"
            )
        lines, env_warnings = sc._env_lines(t.recipe, inst)
        warnings.extend(w for w in env_warnings if w not in warnings)
        envs.append({e.name: e.shell_value for e in lines})
        datas.append(
            {
                env_name(f"SLURMFM_DATA_{k.upper()}"): sh_quote(v, what=f"storage.data.{k}")
                for k, v in t.recipe.storage.data.items()
            }
        )
        argv, prefix, _ = launcher.launch(t.recipe, "$SLURMFM_CHECKPOINT_DIR")
        if argv[:head] != first[:head] or prefix != first_prefix:
            raise RenderError(
                f"sweep: array task {t.index} changes the launcher's fixed part "
                f"({' '.join(argv[:head])!r}); only the script, its arguments and the "
                "model-parallel options may differ"
            )
        launches.append(argv)

    def varying(maps: list[dict[str, str]]) -> list[str]:
        names = list(dict.fromkeys(n for m in maps for n in m))
        return [n for n in names if any(m.get(n) != maps[0].get(n) for m in maps)]

    # Launch lines the same in every task stay in the script, readable; the table holds
    # each task's lines from the first that differs (each line is one group of words).
    same = head
    while all(len(a) > same and a[same] == launches[0][same] for a in launches):
        same += 1
    per_task_argv = not nemo and any(len(a) > same for a in launches)
    env_names = varying(envs)
    data_names = varying(datas)
    rows = []
    for t, env, data, argv in zip(tasks, envs, datas, launches, strict=True):
        exports = [
            ["SLURMFM_RUN_ID", sh_quote(t.run_id, what="storage.run_id")],
            ["SLURMFM_CHECKPOINT_DIR", sh_quote(t.checkpoint_dir, what="storage.checkpoint_root")],
            ["SLURMFM_SWEEP_OVERRIDES", sh_quote(t.overrides_json, what="sweep")],
            *([n, env[n]] for n in env_names if n in env),
            *([n, data[n]] for n in data_names if n in data),
        ]
        row: dict[str, object] = {"task": t.index, "exports": exports}
        if nemo:
            driver = launcher.driver(t.recipe, "$SLURMFM_CHECKPOINT_DIR") or ""
            exports.append(["SLURMFM_NEMO_DRIVER", sh_quote(driver, what="launcher.overrides")])
        elif per_task_argv:
            row["argv"] = " ".join(argv[same:])
        rows.append(row)
    table = json.dumps({"tasks": rows}, separators=(",", ":"), ensure_ascii=True)
    return SweepTable(
        array=array_spec(recipe.sweep),
        tasks=len(tasks),
        env_names=frozenset(env_names),
        data_names=frozenset(data_names),
        argv_from=same if per_task_argv else None,
        line=TABLE_MARK + table,
        warnings=tuple(warnings),
    )


def array_output(log_dir: str) -> str:
    """Each task's own log: ``%A`` the array's id, ``%a`` the task index (sbatch(1))."""
    return f"{sbatch_value(log_dir, what='storage.log_dir').rstrip('/')}/%x_%A_%a.out"


def render_array(
    recipe: Recipe, target: Target | None = None, placement: Placement | None = None
) -> RenderedScript:
    """Render a recipe with ``sweep`` as one job-array script (pure, deterministic)."""
    from slurmfm.recipe.sweep import expand
    from slurmfm.render.script import render_script
    from slurmfm.target import Target as _Target

    if recipe.sweep is None:
        raise RenderError("sweep: the recipe has no sweep section")
    target = target or _Target.for_recipe(recipe)
    tasks = expand(recipe)
    table = sweep_table(recipe, tasks, target, placement)
    first = render_script(tasks[0].recipe, target, placement, sweep=table)
    warnings = list(first.warnings)
    if placement is not None and placement.mode == "pin" and placement.nodes:
        warnings.insert(
            0,
            "sweep: every array task requests the same pinned nodes (--nodelist), so the tasks "
            "run one after another; use --mode constrain to let them run side by side",
        )
    warnings.extend(w for w in table.warnings if w not in warnings)
    notes = (
        *first.notes,
        f"job array of {len(tasks)} tasks (--array={table.array})",
        *(f"task {t.index}: {t.checkpoint_dir} {t.overrides_json}" for t in tasks),
    )
    return dataclasses.replace(
        first,
        warnings=tuple(warnings),
        checkpoint_dir=f"{recipe.checkpoint_dir}-t<index>",
        notes=notes,
    )
