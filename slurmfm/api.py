"""The Python API for research scripts: load, override, render, dry-run, submit, poll.

Every function here is a thin composition of the pure core (recipe -> script) and one backend,
so that what a script does and what ``slurmfm submit`` does are the same code path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from slurmfm.submit import missing_secrets as missing_secrets  # noqa: PLC0414 - re-exported
from slurmfm.submit import require_secrets as require_secrets  # noqa: PLC0414 - re-exported

if TYPE_CHECKING:
    from collections.abc import Iterable

    from slurmfm.backends.base import Backend, JobStatus
    from slurmfm.backends.preflight import PreflightReport
    from slurmfm.pipeline import Pipeline, PipelineDryRun, PipelineRun
    from slurmfm.plan.planner import Plan
    from slurmfm.plan.types import Placement
    from slurmfm.recipe.schema import Recipe
    from slurmfm.recipe.sweep import SweepTask
    from slurmfm.request import SubmitRequest
    from slurmfm.topology.model import Topology

BackendKind = Literal["auto", "cli", "pyslurm"]


def load(
    source: str | Path | Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> Recipe:
    """Load a recipe from a YAML file path or a dict, applying dotted-path overrides.

    A file's relative paths are relative to the file; a dict has no file, so its paths (and
    those in ``overrides``) stay relative to the working directory. An override that a
    sweep's array tasks replace is reported as a :class:`SweepOverrideWarning`.
    """
    from slurmfm.recipe.loader import load_recipe, validate

    if isinstance(source, Mapping):
        recipe = validate(dict(source), source="<dict>", overrides=overrides)
    else:
        recipe = load_recipe(source, overrides)
    _warn_shadowed(recipe, overrides)
    return recipe


class SweepOverrideWarning(UserWarning):
    """An override that a sweep's array tasks replace with their own values."""


def _warn_shadowed(recipe: Recipe, overrides: Mapping[str, Any] | None) -> None:
    if recipe.sweep is None or not overrides:
        return
    import warnings

    from slurmfm.recipe.sweep import shadowed_overrides

    for message in shadowed_overrides(recipe.sweep, overrides):
        warnings.warn(message, SweepOverrideWarning, stacklevel=3)


def override(recipe: Recipe, overrides: Mapping[str, Any]) -> Recipe:
    """Return a new recipe with ``{"resources.nodes": 4, ...}`` applied and re-validated."""
    from slurmfm.recipe.loader import validate

    data = recipe.model_dump(mode="json", exclude_unset=False)
    result = validate(data, source="<recipe>", overrides=overrides)
    _warn_shadowed(result, overrides)
    return result


def render(
    recipe: Recipe, *, slurm_version: str | None = None, placement: Placement | None = None
) -> SubmitRequest:
    """The submit request for ``recipe`` (script, runtime files, sbatch arguments, array):
    rendered for ``slurm_version``, what a cluster reported, if known. Pure: nothing is asked
    and nothing written."""
    from slurmfm.request import build

    return build(recipe, slurm_version=slurm_version, placement=placement)


def load_topology(source: str, *, env: Mapping[str, str] | None = None) -> Topology:
    """A topology from a file in any supported format, or ``live`` for the cluster's own
    (``scontrol show topology``) with node states from ``sinfo``."""
    if source != "live":
        from slurmfm.topology.store import load_any

        return load_any(source)
    from slurmfm.backends.slurm_cli import SlurmCLI
    from slurmfm.topology.slurm_formats import parse_scontrol_topology, slurm_node_states

    cli = SlurmCLI(dict(env) if env is not None else None)
    topo = parse_scontrol_topology(cli.show_topology())
    return topo.with_states(slurm_node_states(cli.node_states()))


def plan(
    recipe: Recipe,
    topology: Topology | str,
    *,
    mode: Literal["pin", "constrain"] = "pin",
    unavailable: Iterable[str] = (),
    slurm_version: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Plan:
    """Choose nodes and rank order for ``recipe`` on ``topology`` (a value, a file, or
    ``live``); feed ``plan(...).placement()`` to :func:`render` or :func:`submit`."""
    from slurmfm.plan.planner import plan_for_recipe

    topo = load_topology(topology, env=env) if isinstance(topology, str) else topology
    return plan_for_recipe(
        recipe, topo, mode=mode, unavailable=unavailable, slurm_version=slurm_version
    )


def dry_run(
    recipe: Recipe, *, slurm_version: str | None = None, placement: Placement | None = None
) -> SubmitRequest:
    """Everything ``submit`` would send, without sending it: the same request
    :func:`submit_request` takes (``str()`` of it is what ``submit --dry-run`` prints)."""
    return render(recipe, slurm_version=slurm_version, placement=placement)


def sweep_tasks(recipe: Recipe) -> list[SweepTask]:
    """The array tasks of a recipe with ``sweep`` (index, overrides, own recipe and run id);
    empty for a single job."""
    from slurmfm.recipe.sweep import expand

    return expand(recipe)


def get_backend(kind: BackendKind = "auto", env: Mapping[str, str] | None = None) -> Backend:
    """The Slurm CLI backend, or pyslurm when asked for (``auto`` prefers a matching pyslurm)."""
    from slurmfm.backends.slurm_cli import SlurmCLI

    cli = SlurmCLI(dict(env) if env is not None else None)
    if kind == "cli":
        return cli
    from slurmfm.backends.pyslurm_backend import PySlurmBackend, probe

    result = probe(cli.version(), env=dict(env) if env is not None else None)
    if result.usable:
        return PySlurmBackend()
    if kind == "pyslurm":
        from slurmfm.errors import BackendError

        raise BackendError(f"pyslurm backend unavailable: {result.reason}")
    return cli


@dataclass
class Job:
    """A submitted job with the backend that can ask about it."""

    job_id: str
    backend: Backend
    request: SubmitRequest | None = None

    def status(self) -> JobStatus:
        return self.backend.status(self.job_id)

    def wait(self, timeout: float = 3600.0, interval: float = 0.5) -> JobStatus:
        import time

        from slurmfm.errors import BackendError

        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if st.done:
                return st
            if time.monotonic() > deadline:
                raise BackendError(f"job {self.job_id} still {st.state} after {timeout:.0f} s")
            time.sleep(interval)

    def cancel(self) -> None:
        self.backend.cancel(self.job_id)


def check(
    recipe: Recipe,
    *,
    env: Mapping[str, str] | None = None,
    placement: Placement | None = None,
) -> PreflightReport:
    """Preflight against the live cluster: partition, nodes, time, features, --test-only."""
    from slurmfm.backends.preflight import preflight
    from slurmfm.backends.slurm_cli import SlurmCLI

    cli = SlurmCLI(dict(env) if env is not None else None)
    request = render(recipe, slurm_version=cli.version(), placement=placement)
    return preflight(recipe, request.text, cli, request.test_only_args())


def submit(
    recipe: Recipe,
    *,
    backend: BackendKind | Backend = "cli",
    env: Mapping[str, str] | None = None,
    placement: Placement | None = None,
    preflight: bool = True,
    slurm_version: str | None = None,
    allow_shared_run_dir: bool = False,
) -> Job:
    """Render for the cluster's real Slurm version and submit; secrets must be in ``env``.

    A live job already using the run's checkpoint directory makes this refuse
    (:class:`~slurmfm.run_lock.RunDirInUse`) unless ``allow_shared_run_dir``.

    ``slurm_version``: what the caller already asked the cluster (the CLI does, to plan), so
    that ``sbatch --version`` is not asked twice; by default the backend is asked.

    With ``preflight`` (the default) the job is first checked against the live cluster and
    nothing is queued when it cannot run (:class:`~slurmfm.backends.preflight.PreflightError`).
    """
    if preflight:
        from slurmfm.backends.preflight import require_files

        require_files([recipe])  # before Slurm is asked anything
    be = get_backend(backend, env) if isinstance(backend, str) else backend
    request = render(recipe, slurm_version=slurm_version or be.version(), placement=placement)
    return submit_request(
        request,
        backend=be,
        env=env,
        preflight=preflight,
        allow_shared_run_dir=allow_shared_run_dir,
    )


def submit_request(
    request: SubmitRequest,
    *,
    backend: BackendKind | Backend = "cli",
    env: Mapping[str, str] | None = None,
    preflight: bool = True,
    allow_shared_run_dir: bool = False,
) -> Job:
    """Submit exactly ``request`` (from :func:`dry_run` or :func:`render`), nothing re-rendered:
    secrets checked, preflight (unless off), log directory created, one live job per run
    directory (:class:`~slurmfm.run_lock.RunDirInUse` unless ``allow_shared_run_dir``), then
    the backend sends it."""
    from slurmfm.submit import submit_all

    be = get_backend(backend, env) if isinstance(backend, str) else backend
    done = submit_all(
        [("", request)],
        backend=be,
        env=env,
        preflight=preflight,
        allow_shared_run_dir=allow_shared_run_dir,
    )
    return Job(done[0].job_id, be, done[0].request)


def status(job_id: str, *, backend: BackendKind | Backend = "cli") -> JobStatus:
    """The state of a job by id, with restarts, the last checkpoint and the last requeue reason
    from the state file that slurmfm's job script keeps next to the job's log."""
    import dataclasses

    from slurmfm.backends.state import read_state

    be = get_backend(backend) if isinstance(backend, str) else backend
    st = be.status(job_id)
    state = read_state(st)
    if state is None:
        return st
    return dataclasses.replace(
        st,
        last_requeue_reason=state.last_requeue_reason,
        last_stop_reason=state.last_stop_reason,
        last_checkpoint=state.last_checkpoint,
        events=tuple(state.events),
        restarts=max(st.restarts, state.restarts),
    )


def cancel(job_id: str, *, backend: BackendKind | Backend = "cli") -> None:
    """Cancel a job by id."""
    be = get_backend(backend) if isinstance(backend, str) else backend
    be.cancel(job_id)


def endpoint_path(recipe: Recipe) -> Path:
    """Where a serving job of ``recipe`` writes its endpoint: ``<log_dir>/endpoints/<run_id>.json``.

    The name is the run id (default: the recipe name), not the job id, so a dependent job or
    a user who only knows the recipe finds the current server, across requeues.
    """
    return Path(recipe.storage.log_dir) / "endpoints" / f"{recipe.run_id}.json"


def endpoint(
    recipe: Recipe,
    *,
    wait: float = 0.0,
    interval: float = 2.0,
    backend: BackendKind | Backend | None = "cli",
) -> dict[str, Any] | None:
    """The endpoint a serving job of ``recipe`` published, or None.

    Waits up to ``wait`` seconds for the file. With a backend, an endpoint whose job is no
    longer running (a node crash can leave the file behind) counts as absent; pass
    ``backend=None`` to skip that check where Slurm is out of reach.
    """
    import json
    import time

    path = endpoint_path(recipe)
    deadline = time.monotonic() + wait
    while True:
        info: dict[str, Any] | None = None
        try:
            info = dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            info = None
        if info is not None and backend is not None:
            be = get_backend(backend) if isinstance(backend, str) else backend
            st = be.status(str(info.get("job_id", "")))
            if not st.state.startswith("RUNNING"):
                info = None
        if info is not None or time.monotonic() >= deadline:
            return info
        time.sleep(interval)


# Chains and pipelines (slurmfm.pipeline): stages submitted in order through slurmfm.submit, ids
# threaded through as sbatch --dependency=<condition>:<id> with --kill-on-invalid-dep=yes.


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and validate a pipeline file; problems as ``FILE:LINE: field: message``."""
    from slurmfm.pipeline import load_pipeline as _load

    return _load(path)


def chain(
    recipes: Iterable[Recipe], condition: Literal["afterok", "afterany", "afternotok"] = "afterok"
) -> Pipeline:
    """A linear pipeline: each recipe starts only after the previous one ended as
    ``condition`` requires."""
    from slurmfm.pipeline import chain as _chain

    return _chain(list(recipes), condition)


def dry_run_pipeline(
    pipeline: Pipeline, *, slurm_version: str | None = None, output_dir: str | Path | None = None
) -> PipelineDryRun:
    """Every stage's :class:`~slurmfm.request.SubmitRequest` (dependencies name upstream
    stages as ``<stage>``) and dependency expression; nothing submitted."""
    from slurmfm.pipeline import dry_run as _dry_run

    return _dry_run(pipeline, slurm_version=slurm_version, output_dir=output_dir)


def submit_pipeline(
    pipeline: Pipeline,
    *,
    backend: BackendKind | Backend = "cli",
    env: Mapping[str, str] | None = None,
    preflight: bool = True,
    keep_submitted: bool = False,
) -> PipelineRun:
    """Submit every stage in dependency order; if one fails, cancel those already queued
    (unless ``keep_submitted``) and raise :class:`~slurmfm.pipeline.PipelineSubmitError`."""
    from slurmfm.pipeline import submit as _submit

    be = get_backend(backend, env) if isinstance(backend, str) else backend
    return _submit(
        pipeline, backend=be, env=env, preflight=preflight, keep_submitted=keep_submitted
    )
