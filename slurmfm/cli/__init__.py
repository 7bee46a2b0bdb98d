"""``slurmfm`` command line. Only click is imported at start; everything else lazily.

Why lazy: ``slurmfm --help`` and shell completion run often on login nodes; importing pydantic,
jinja2 and rich up front would triple the start time. Every user-fixable error prints one line
per problem (``FILE:LINE: field: message``) on stderr and exits with status 2.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import click

from slurmfm.cli.common import (
    F,
    backend_option,
    cluster_version,
    friendly,
    install_template_cache,
    risk_option,
    write_atomic,
    write_requests,
)

if TYPE_CHECKING:
    from slurmfm.api import Job
    from slurmfm.backends.base import Backend
    from slurmfm.plan.types import Placement
    from slurmfm.recipe.schema import Recipe
    from slurmfm.request import SubmitRequest


def _load(recipe: str, sets: tuple[str, ...]) -> Recipe:
    from slurmfm.recipe.loader import load_recipe, parse_override

    overrides = dict(parse_override(s) for s in sets)
    r = load_recipe(recipe, overrides)
    if r.sweep is not None and overrides:
        from slurmfm.recipe.sweep import shadowed_overrides

        _warn(shadowed_overrides(r.sweep, overrides))
    return r


def _write_atomic(path: str, text: str, mode: int = 0o755) -> None:
    """Write a whole file or nothing (scripts are executable)."""
    write_atomic(path, text, mode=mode)


def _check_output(path: str) -> None:
    """Refuse an -o target that is not a regular file before any work (or a submission)."""
    from slurmfm.fsutil import check_target

    check_target(path)


def _say_run_dir(r: Recipe) -> None:
    """Name the run directory and the one-live-job rule (slurmfm.run_lock)."""
    from slurmfm.run_lock import run_dir

    alone = (
        "jobs of this singleton recipe take turns"
        if r.resources.singleton
        else ("submit refuses a second live job on it (--allow-shared-run-dir to override)")
    )
    click.echo(f"run directory: {run_dir(r)}{'-t<i>' if r.sweep else ''}; {alone}")


def _warn(warnings: tuple[str, ...] | list[str]) -> None:
    for w in warnings:
        click.echo(f"warning: {w}", err=True)


def _placement_options(fn: F) -> F:
    """--topology/--mode/--unavailable/--risk/--topology-order, shared by the commands that
    plan (submit)."""
    fn = risk_option(fn)
    fn = click.option(
        "--topology-order",
        is_flag=True,
        help="Without --topology: order ranks in the job by each node's SLURM_TOPOLOGY_ADDR.",
    )(fn)
    fn = click.option(
        "--unavailable", metavar="HOSTLIST|@FILE", help="Nodes the planner must not use."
    )(fn)
    fn = click.option(
        "--mode",
        type=click.Choice(["pin", "constrain"]),
        default="pin",
        show_default=True,
        help="pin: request the planned nodes; constrain: --switches/--segment, ranks sorted "
        "in the job.",
    )(fn)
    return click.option(
        "--topology",
        "topology_src",
        metavar="FILE|live",
        help="Plan placement on this topology (any format slurmfm imports, or 'live').",
    )(fn)


def _placement(
    r: Recipe,
    topology_src: str | None,
    mode: str,
    unavailable: str | None,
    topology_order: bool,
    slurm_version: str | None,
    risk: str = "none",
) -> Placement | None:
    from slurmfm.plan.types import Placement

    if topology_src is None:
        if risk != "none":
            raise click.UsageError("--risk needs --topology (it decides how a plan is made)")
        return Placement(mode="constrain") if topology_order else None
    from slurmfm import api
    from slurmfm.cli.plan import _unavailable

    p = api.plan(
        r,
        topology_src,
        mode=mode,  # type: ignore[arg-type]
        unavailable=_unavailable(unavailable),
        slurm_version=slurm_version,
        risk="model" if risk == "model" else "none",
    )
    for line in p.explanation:
        click.echo(f"plan: {line}", err=True)
    return p.placement()


_set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="FIELD=VALUE",
    help="Override a recipe field by dotted path, e.g. --set resources.nodes=4 (repeatable).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurmfm")
def main() -> None:
    """Turn a training or inference recipe into a topology-aware Slurm batch job.

    \b
    slurmfm validate recipe.yaml         check a recipe
    slurmfm render recipe.yaml           print the sbatch script
    slurmfm submit recipe.yaml           submit it (add --dry-run to only show it)
    slurmfm status JOBID | cancel JOBID
    slurmfm report JOBID | logs JOBID    what ran where and why it restarted; its logs
    slurmfm endpoint recipe.yaml         URL of the recipe's running server
    slurmfm submit a.yaml --then b.yaml  chain jobs (--condition afterok|afterany|afternotok)
    slurmfm pipeline submit FILE         a pipeline of stages in dependency order
    """


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@_set_option
@click.option("--json", "as_json", is_flag=True, help="Print the validated recipe as JSON.")
@friendly
def validate(recipe: str, sets: tuple[str, ...], as_json: bool) -> None:
    """Check RECIPE against the schema; problems are printed as FILE:LINE: field: message."""
    r = _load(recipe, sets)
    if as_json:
        click.echo(r.model_dump_json(indent=2))
        return
    click.echo(
        f"{recipe}: ok: {r.name}, {r.resources.nodes} x {r.cluster.instance_type}"
        + (f" + {r.resources.spare_nodes} spare(s)" if r.resources.spare_nodes else "")
        + ", "
        f"world size {r.world_size} (tp={r.parallelism.tp} pp={r.parallelism.pp} "
        f"cp={r.parallelism.cp} ep={r.parallelism.ep} dp={r.dp}), launcher {r.launcher.kind}"
        + (
            f"; {r.serve.launcher.kind} server on {r.serve.nodes} node(s) ({r.serve.placement})"
            if r.serve is not None
            else ""
        )
    )
    _say_run_dir(r)
    from slurmfm.backends.preflight import file_checks

    # The files the job needs, as this machine sees them: a warning here (a recipe may be
    # written away from the cluster), a refusal at submit.
    _warn([f"{c.name}: {c.message}" for c in file_checks(r)])
    from slurmfm.job.masking import env_warnings

    _warn(env_warnings(r.env))  # a token under env: instead of secrets:
    from slurmfm.recipe.rdzv import c10d_warnings

    _warn(c10d_warnings(r))  # a c10d rendezvous in the launcher's words discards the order
    # Which save protocol the job uses at the time limit, and whether its window holds a save.
    click.echo(r.save_mode)
    window = r.save_window_warning()
    if window:
        click.echo(f"warning: {window}", err=True)
    if r.resilience.expected_failure_interval is not None:
        # Megatron's save interval is a launcher argument: the Young/Daly interval beside it
        from slurmfm.observe.goodput import last_run, validate_advice

        for line in validate_advice(r, last_run(r)):
            click.echo(line)
    if r.sweep is not None:
        from slurmfm.api import sweep_tasks

        limit = r.sweep.max_concurrent
        click.echo(
            f"sweep: {r.sweep.size} array tasks" + (f", at most {limit} at once" if limit else "")
        )
        for t in sweep_tasks(r):
            click.echo(f"  task {t.index}: run id {t.run_id} {t.overrides_json}")


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@_set_option
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), help="Write here.")
@click.option("--slurm-version", help="Render for this Slurm version instead of the recipe's.")
@click.option(
    "--no-cache",
    is_flag=True,
    help="Render afresh (also: SLURMFM_NO_CACHE=1); see docs/development.md.",
)
@friendly
def render(
    recipe: str,
    sets: tuple[str, ...],
    output: str | None,
    slurm_version: str | None,
    no_cache: bool,
) -> None:
    """Print (or write with -o) the sbatch script for RECIPE, without asking any cluster.

    Unchanged inputs are served from a content-addressed cache (slurmfm.cli.cache), which
    skips importing pydantic and jinja2.
    """
    from slurmfm.cli import cache as render_cache

    if output:
        _check_output(output)
    key = None
    if not no_cache and render_cache.enabled():
        key = render_cache.key(recipe, sets, slurm_version)
    hit = render_cache.get(key) if key else None
    if hit is not None:
        text, warnings = hit.text, hit.warnings
    else:
        from slurmfm.api import render as do_render

        r = _load(recipe, sets)
        install_template_cache()
        script = do_render(r, slurm_version=slurm_version)
        text, warnings = script.text, script.warnings
        if key:
            render_cache.put(key, text, warnings)
    _warn(warnings)
    if output:
        _write_atomic(output, text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@_set_option
@click.option(
    "--dry-run", is_flag=True, help="Render and show what would be submitted; submit nothing."
)
@click.option(
    "-o",
    "--output",
    type=click.Path(),
    help="Also save what is (or would be) sent to this directory: NAME.sh (the script), "
    "NAME.argv.json (the sbatch command line) and NAME.files/ (runtime files); with --then "
    "NN-NAME.* per recipe.",
)
@backend_option
@click.option("--wait", is_flag=True, help="Wait for the job to end; exit 1 unless it COMPLETED.")
@click.option(
    "--timeout", type=float, default=3600.0, show_default=True, help="For --wait, seconds."
)
@click.option(
    "--slurm-version",
    help="With --dry-run: render for this Slurm version (default: ask the cluster, as submit "
    "does).",
)
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Only run the preflight checks against the live cluster; queue nothing.",
)
@click.option("--no-check", is_flag=True, help="Skip the preflight that runs before submitting.")
@click.option(
    "--allow-shared-run-dir",
    is_flag=True,
    help="Submit even if a live job already uses this run's checkpoint directory.",
)
@click.option(
    "--experiment",
    default="",
    metavar="NAME",
    help="Record the job under this experiment in the history (fm.Experiment.from_id(NAME)).",
)
@click.option(
    "--then",
    "then",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="RECIPE",
    help="Submit RECIPE after this one ends (see --condition); repeat for a chain. --set "
    "applies to every recipe of the chain.",
)
@click.option(
    "--condition",
    type=click.Choice(["afterok", "afterany", "afternotok"]),
    default="afterok",
    show_default=True,
    help="With --then: when the next recipe may start (sbatch --dependency).",
)
@click.option(
    "--keep-submitted",
    is_flag=True,
    help="With --then: if a later recipe cannot be submitted, keep those already queued.",
)
@_placement_options
@friendly
def submit(
    recipe: str,
    sets: tuple[str, ...],
    dry_run: bool,
    output: str | None,
    backend: str,
    host: str | None,
    wait: bool,
    timeout: float,
    slurm_version: str | None,
    check_only: bool,
    no_check: bool,
    topology_src: str | None,
    mode: str,
    unavailable: str | None,
    risk: str,
    topology_order: bool,
    then: tuple[str, ...],
    condition: str,
    keep_submitted: bool,
    allow_shared_run_dir: bool,
    experiment: str,
) -> None:
    """Render RECIPE for the cluster's Slurm and submit it with sbatch.

    A live job that already uses RECIPE's run directory (its checkpoints) makes submit refuse
    unless --allow-shared-run-dir; give the run its own id with --set storage.run_id=NEW.

    Before submitting, a preflight asks the cluster whether the job can run (partition, node
    count, time limit, features, sbatch --test-only); when it cannot, nothing is queued and
    the reason is printed (exit status 2). Slurm gives the --test-only request a job id of
    its own, so ids advance by 2 per checked submission.

    With --then, RECIPE and every --then recipe form a chain: each starts only after the one
    before ended as --condition says, and is cancelled when that can no longer happen.
    """
    import os

    from slurmfm import api
    from slurmfm.errors import SlurmfmError

    if then:
        if topology_src is not None or topology_order or check_only:
            raise click.UsageError("--then cannot be combined with --topology/--check")
        from slurmfm.cli.pipeline import submit_chain

        submit_chain(
            recipe,
            then,
            sets,
            condition,
            dry_run=dry_run,
            output_dir=output,
            backend=backend,
            host=host,
            wait=wait,
            timeout=timeout,
            slurm_version=slurm_version,
            no_check=no_check,
            keep_submitted=keep_submitted,
            as_json=False,
        )
        return

    r = _load(recipe, sets)
    if output and os.path.exists(output) and not os.path.isdir(output):
        raise SlurmfmError(f"-o {output}: exists and is not a directory")  # before Slurm is asked
    if check_only:
        if slurm_version is None and topology_src is not None:
            # plan for the cluster's Slurm
            slurm_version = api.get_backend(backend, host=host).version()  # type: ignore[arg-type]
        placement = _placement(
            r, topology_src, mode, unavailable, topology_order, slurm_version, risk
        )
        _check_and_exit(r, placement, backend, host)
    be, slurm_version = _backend_for(r, dry_run, no_check, backend, host, slurm_version)
    placement = _placement(r, topology_src, mode, unavailable, topology_order, slurm_version, risk)
    install_template_cache()
    request = api.render(r, slurm_version=slurm_version, placement=placement)
    _warn(request.warnings)
    if dry_run:
        _show_dry_run(r, request, output)
        return
    job = api.submit_request(
        request,
        backend=be if be is not None else backend,  # type: ignore[arg-type]
        preflight=not no_check,
        allow_shared_run_dir=allow_shared_run_dir,
        experiment=experiment,
    )
    if output and job.request is not None:
        write_requests(output, [(r.name, job.request)])
    click.echo(job.job_id)
    if wait:
        _wait_and_exit(job, timeout)


def _backend_for(
    r: Recipe, dry_run: bool, no_check: bool, backend: str, host: str | None, version: str | None
) -> tuple[Backend | None, str | None]:
    """The backend a submission goes through (none for a dry run) and the Slurm version the
    script is rendered for, asked of the cluster once. A submission first checks the secrets
    and what this login node can tell (the script, the image; a remote backend's paths are
    the cluster's)."""
    from slurmfm import api

    if dry_run:
        if r.cluster.slurm_version == "auto":
            # The dry run is the submission: rendered for the same Slurm that submit would ask.
            version = cluster_version(version, backend, host)
        return None, version
    api.require_secrets({"": r})  # before Slurm is asked anything
    if not no_check and backend not in ("ssh", "rest"):
        from slurmfm.backends.preflight import require_files

        require_files([r])
    be = api.get_backend(backend, host=host)  # type: ignore[arg-type]
    return be, be.version()


def _check_and_exit(
    r: Recipe, placement: Placement | None, backend: str, host: str | None
) -> NoReturn:
    """``submit --check``: the preflight's answer, exit 0 when the job could run, else 2."""
    from slurmfm import api

    report = api.check(r, placement=placement, backend=backend, host=host)  # type: ignore[arg-type]
    for line in report.lines():
        click.echo(line, err=not report.ok)
    sys.exit(0 if report.ok else 2)


def _show_dry_run(r: Recipe, request: SubmitRequest, output: str | None) -> None:
    """``submit --dry-run``: the header, what the job needs from the environment, and the
    exact script that submit would send (written under ``-o`` too)."""
    from slurmfm import api

    if output:
        write_requests(output, [(r.name, request)])
    for line in request.header():
        click.echo(line)
    if request.env_names:
        missing = api.missing_secrets(r)
        state = f"; missing now: {', '.join(missing)}" if missing else ""
        click.echo(f"# needs from the environment: {', '.join(request.env_names)}{state}")
    click.echo(request.text, nl=False)


def _wait_and_exit(job: Job, timeout: float) -> NoReturn:
    """``submit --wait``: the job's end on stderr; exit 0 when it completed, else 1."""
    st = job.wait(timeout=timeout)
    click.echo(f"{st.job_id} {st.state} exit={st.exit_code} nodes={st.nodes}", err=True)
    if st.stdout:
        click.echo(f"output: {st.stdout}", err=True)
    sys.exit(0 if st.ok else 1)


@main.command()
@click.argument("job_id")
@backend_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--events",
    type=int,
    default=10,
    show_default=True,
    help="Show the last N events of the job's state file (0: all).",
)
@friendly
def status(job_id: str, backend: str, host: str | None, as_json: bool, events: int) -> None:
    """Show the state of JOB_ID (scontrol, or sacct for older jobs)."""
    from slurmfm import api

    st = api.status(job_id, backend=backend, host=host)  # type: ignore[arg-type]
    if as_json:
        import json
        from dataclasses import asdict

        click.echo(json.dumps({**asdict(st), "done": st.done}, indent=2))
        return
    # Plain lines, not a table: a table cut long values (a checkpoint path) with an ellipsis
    # to fit the terminal, and a path is only useful whole.
    rows = [
        (key, value)
        for key, value in (
            ("job", st.job_id),
            ("name", st.name),
            ("state", st.state),
            ("reason", st.reason),
            ("nodes", st.nodes),
            ("exit code", st.exit_code),
            ("restarts", str(st.restarts)),
            ("run time", st.run_time),
            ("output", st.stdout),
            ("last requeue", st.last_requeue_reason),
            ("last stop", st.last_stop_reason),
            ("last checkpoint", st.last_checkpoint),
            ("from", st.source),
            ("array tasks", st.raw.get("ArrayTasks", "")),
        )
        if value
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {value}")
    if st.events:
        shown = st.events[-events:] if events > 0 else st.events
        older = len(st.events) - len(shown)
        click.echo(
            "events:"
            + (f" (the last {len(shown)}; {older} older: --events 0 shows all)" if older else "")
        )
        for line in shown:
            click.echo(f"  {line}")
    for why in st.ignored:
        click.echo(f"slurmfm: ignored {why}", err=True)


@main.command()
@click.argument("job_id")
@backend_option
@friendly
def cancel(job_id: str, backend: str, host: str | None) -> None:
    """Cancel JOB_ID."""
    from slurmfm import api

    api.cancel(job_id, backend=backend, host=host)  # type: ignore[arg-type]
    click.echo(f"cancelled {job_id}")


@main.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@_set_option
@click.option("--wait", type=float, default=0.0, show_default=True, help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole endpoint record.")
@friendly
def endpoint(recipe: str, sets: tuple[str, ...], wait: float, as_json: bool) -> None:
    """Print the URL of RECIPE's running server (vllm/sglang, or a train-and-serve server).

    Exit status 1 when no running job of RECIPE has published one (within --wait seconds).
    """
    from slurmfm import api

    r = _load(recipe, sets)
    info = api.endpoint(r, wait=wait)
    if info is None:
        click.echo(f"no running server has published {api.endpoint_path(r)}", err=True)
        sys.exit(1)
    if as_json:
        import json

        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(info["url"])


# Command groups in their own modules (each imports only click at the top).
from slurmfm.cli.observe import logs_command, report_command  # noqa: E402
from slurmfm.cli.pipeline import pipeline as _pipeline_group  # noqa: E402
from slurmfm.cli.plan import plan_command as _plan_command  # noqa: E402
from slurmfm.cli.topology import topology as _topology_group  # noqa: E402

main.add_command(_topology_group)
main.add_command(_plan_command)
main.add_command(_pipeline_group)
main.add_command(report_command)
main.add_command(logs_command)

if __name__ == "__main__":  # pragma: no cover
    main()
