"""``slurmfm pipeline validate|submit`` and ``slurmfm submit A --then B`` (imports only click).

Exit status: 2 for anything the user can fix (``FILE:LINE: field: message``, preflight, a
refused submission), 1 for ``--wait`` when a stage did not complete, 0 otherwise.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from slurmfm.cli.common import F, backend_option, friendly, install_template_cache, write_requests

if TYPE_CHECKING:
    from slurmfm.pipeline import Pipeline

CONDITION_CHOICE = click.Choice(["afterok", "afterany", "afternotok"])


def _show_dry_run(
    pipeline: Pipeline, slurm_version: str | None, output_dir: str | None, as_json: bool
) -> None:
    import os
    import tempfile

    from slurmfm import api
    from slurmfm.errors import SlurmfmError

    out = output_dir or tempfile.mkdtemp(prefix="slurmfm-pipeline-")
    if os.path.exists(out) and not os.path.isdir(out):
        raise SlurmfmError(f"-o {out}: exists and is not a directory")
    install_template_cache()
    try:
        plan = api.dry_run_pipeline(pipeline, slurm_version=slurm_version, output_dir=out)
    except OSError as exc:
        raise SlurmfmError(f"-o {out}: cannot write: {exc.strerror or exc}") from None
    for s in plan.stages:
        for w in s.info.warnings:
            click.echo(f"warning: {s.name}: {w}", err=True)
    if as_json:
        import json

        click.echo(
            json.dumps(
                {
                    "pipeline": pipeline.name,
                    "stages": [
                        {
                            "stage": s.name,
                            "recipe": pipeline.stage(s.name).recipe.name,
                            "dependency": s.dependency,
                            "script": s.script_path,
                            "argv": list(s.info.argv()),
                            "array_tasks": len(s.info.tasks),
                        }
                        for s in plan.stages
                    ],
                },
                indent=2,
            )
        )
        return
    click.echo(f"# dry run of pipeline {pipeline.name}: nothing submitted; in submission order:")
    for line in plan.lines():
        click.echo(line)
    click.echo(
        "# at submit time <stage> becomes that stage's job id in sbatch --dependency "
        "(with --kill-on-invalid-dep=yes); NN-STAGE.argv.json holds each command line"
    )


def _run(
    pipeline: Pipeline,
    *,
    dry_run: bool,
    output_dir: str | None,
    backend: str,
    host: str | None,
    wait: bool,
    timeout: float,
    slurm_version: str | None,
    no_check: bool,
    keep_submitted: bool,
    as_json: bool,
) -> None:
    from slurmfm import api

    if dry_run:
        from slurmfm.cli.common import cluster_version

        if any(st.recipe.cluster.slurm_version == "auto" for st in pipeline.stages):
            slurm_version = cluster_version(slurm_version, backend, host)
        _show_dry_run(pipeline, slurm_version, output_dir, as_json)
        return
    install_template_cache()
    run = api.submit_pipeline(
        pipeline,
        backend=api.get_backend(backend, host=host),  # type: ignore[arg-type]
        preflight=not no_check,
        keep_submitted=keep_submitted,
    )
    if output_dir:
        from slurmfm.pipeline import stem

        write_requests(
            output_dir, [(stem(i, s.name), s.request) for i, s in enumerate(run.stages, 1)]
        )
    if as_json:
        import json

        click.echo(
            json.dumps(
                [
                    {"stage": s.name, "job_id": s.job_id, "dependency": s.dependency}
                    for s in run.stages
                ]
            )
        )
    else:
        for s in run.stages:
            dep = f" after {s.dependency}" if s.dependency else ""
            click.echo(f"{s.name} {s.job_id}{dep}")
    if run.record_path is not None:
        click.echo(f"# record: {run.record_path} (slurmfm pipeline status)", err=True)
    elif run.record_error:
        click.echo(f"warning: {run.record_error}", err=True)
    if wait:
        from slurmfm.pipeline import status_lines, succeeded

        states = run.wait(timeout=timeout)
        for line in status_lines(states):
            click.echo(line, err=True)
        sys.exit(0 if succeeded(states) else 1)


_RUN_OPTIONS = [
    click.option(
        "--dry-run", is_flag=True, help="Render every stage and show the plan; submit nothing."
    ),
    click.option(
        "-o",
        "--output-dir",
        type=click.Path(file_okay=False),
        help="Write what each stage sends here: NN-STAGE.sh, NN-STAGE.argv.json (dry run: "
        "default a new temp dir).",
    ),
    backend_option,
    click.option(
        "--wait",
        is_flag=True,
        help="Wait for every stage; exit 1 if one failed (a stage whose condition did not "
        "hold is skipped, not failed).",
    ),
    click.option("--timeout", type=float, default=3600.0, show_default=True),
    click.option("--slurm-version", help="With --dry-run: render for this Slurm version."),
    click.option("--no-check", is_flag=True, help="Skip the preflight of every stage."),
    click.option(
        "--keep-submitted",
        is_flag=True,
        help="If a later stage cannot be submitted, keep the stages already queued "
        "(default: cancel them).",
    ),
    click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
]


def run_options(fn: F) -> F:
    """The options shared by ``pipeline submit`` and ``submit --then``."""
    for opt in reversed(_RUN_OPTIONS):
        fn = opt(fn)
    return fn


@click.group("pipeline")
def pipeline() -> None:
    """Pipelines of recipes: stages with afterok/afterany/afternotok dependencies."""


@pipeline.command("validate")
@click.argument("file", type=click.Path(dir_okay=False))
@friendly
def validate_cmd(file: str) -> None:
    """Check FILE: its stages, their recipes and overrides, and the dependency graph."""
    from slurmfm import api

    p = api.load_pipeline(file)
    click.echo(f"{file}: ok: pipeline {p.name}, {len(p.stages)} stages")
    for s in p.stages:
        dep = p.dependency_expression(s)
        click.echo(f"  {s.name}: {s.recipe.name}" + (f" after {dep}" if dep else ""))


@pipeline.command("status")
@click.argument("target", type=click.Path(dir_okay=False))
@backend_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@friendly
def status_cmd(target: str, backend: str, host: str | None, as_json: bool) -> None:
    """Each stage's job, state and verdict (waiting, running, completed, skipped, failed).

    TARGET is a pipeline file (its latest submission, from the record that ``pipeline submit``
    writes under the first stage's ``<log_dir>/pipelines/``) or such a record itself. Exit
    status: 0 when no stage failed, 1 when one did, 2 when there is no record.
    """
    from pathlib import Path

    from slurmfm import api
    from slurmfm.errors import SlurmfmError
    from slurmfm.pipeline import latest_record, read_record, status_lines, verdict

    path = Path(target)
    if path.suffix != ".json":
        pipe = api.load_pipeline(path)
        found = latest_record(pipe)
        if found is None:
            raise SlurmfmError(
                f"{target}: no submission on record (looked in "
                f"{pipe.stages[0].recipe.storage.log_dir}/pipelines)"
            )
        path = found
    ids = read_record(path)
    be = api.get_backend(backend, host=host)  # type: ignore[arg-type]
    states = {name: be.status(job_id) for name, job_id in ids.items()}
    if as_json:
        import json

        click.echo(
            json.dumps(
                {
                    "record": str(path),
                    "stages": [
                        {
                            "stage": n,
                            "job_id": st.job_id,
                            "state": st.state,
                            "reason": st.reason,
                            "exit_code": st.exit_code,
                            "verdict": verdict(st),
                        }
                        for n, st in states.items()
                    ],
                }
            )
        )
    else:
        click.echo(f"# {path}")
        for line in status_lines(states):
            click.echo(line)
    sys.exit(1 if any(verdict(st) == "failed" for st in states.values()) else 0)


@pipeline.command("submit")
@click.argument("file", type=click.Path(dir_okay=False))
@run_options
@friendly
def submit_cmd(file: str, **kw: Any) -> None:
    """Submit every stage of FILE in dependency order. Every stage is preflighted first, and
    nothing is queued when one cannot run. Prints STAGE JOBID per line."""
    from slurmfm import api

    _run(api.load_pipeline(file), **kw)


def submit_chain(
    first: str,
    then: tuple[str, ...],
    sets: tuple[str, ...],
    condition: str,
    **kw: Any,
) -> None:
    """``slurmfm submit A --then B --then C``: a linear pipeline; ``--set`` applies to all."""
    from slurmfm import api
    from slurmfm.recipe.loader import load_recipe, parse_override

    overrides = dict(parse_override(s) for s in sets)
    recipes = [load_recipe(path, overrides) for path in (first, *then)]
    _run(api.chain(recipes, condition), **kw)  # type: ignore[arg-type]  # condition: a Choice
