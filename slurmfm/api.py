"""The Python API for research scripts: load, override, render, dry-run, submit, poll,
read logs and reports, and reopen earlier runs.

Every function here is a thin composition of the pure core (recipe -> script) and one backend,
so that what a script does and what ``slurmfm submit`` does are the same code path.

The public types (``Recipe``, ``SubmitRequest``, ``JobStatus``, ``Report``, ...) are
importable from here at run time (``fm.SubmitRequest``, ``isinstance(x, fm.Recipe)``) but
imported only when first used (PEP 562 ``__getattr__``), so ``import slurmfm.api`` and the
CLI stay fast.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

from slurmfm.errors import (
    BackendError,
    JobFailed,
    RecipeError,
    RenderError,
    SlurmfmError,
    UnsafeValueError,
    UnsupportedError,
)
from slurmfm.submit import missing_secrets as missing_secrets  # noqa: PLC0414 - re-exported
from slurmfm.submit import require_secrets as require_secrets  # noqa: PLC0414 - re-exported

if TYPE_CHECKING:
    from collections.abc import Iterable

    from slurmfm.backends.base import Backend, JobStatus
    from slurmfm.backends.preflight import PreflightError, PreflightReport
    from slurmfm.backends.rest import LostAnswer
    from slurmfm.backends.ssh import SshTransportError
    from slurmfm.catalog.instances import UnknownInstanceType
    from slurmfm.catalog.slurm_features import UnsupportedBySlurm
    from slurmfm.fsutil import InputFileError, OutputError
    from slurmfm.history import HistoryError, Submission
    from slurmfm.observe.report import Report
    from slurmfm.pipeline import Pipeline, PipelineDryRun, PipelineRun, PipelineSubmitError
    from slurmfm.plan.cost import CostParamsError
    from slurmfm.plan.failed import FailedNodesError
    from slurmfm.plan.planner import Plan, PlanError
    from slurmfm.plan.simulate import SimulationError
    from slurmfm.plan.types import Placement
    from slurmfm.recipe.schema import Recipe
    from slurmfm.recipe.sweep import SweepTask
    from slurmfm.request import SubmitRequest
    from slurmfm.run_lock import RunDirInUse
    from slurmfm.submit import Submitted
    from slurmfm.topology.model import Topology, TopologyError

BackendKind = Literal["auto", "cli", "pyslurm", "rest", "ssh"]

DEFAULT_BACKEND: BackendKind = "cli"
"""The one default of every function here and of the CLI's ``--backend``: Slurm's own
commands. ``auto`` (a matching pyslurm, else the CLI) and ``pyslurm`` are opt-in, and so are
the remote ones: ``ssh`` (the same commands on a login node, ``host=user@login``) and
``rest`` (slurmrestd, ``host=`` its URL or ``$SLURMFM_REST_URL``; docs/backends.md)."""

# Public types, imported on first use (see the module docstring): name -> defining module.
_LAZY_TYPES = {
    "Backend": "slurmfm.backends.base",
    "JobStatus": "slurmfm.backends.base",
    "PreflightError": "slurmfm.backends.preflight",
    "PreflightReport": "slurmfm.backends.preflight",
    "Submission": "slurmfm.history",
    "Report": "slurmfm.observe.report",
    "Pipeline": "slurmfm.pipeline",
    "PipelineDryRun": "slurmfm.pipeline",
    "PipelineRun": "slurmfm.pipeline",
    "PipelineSubmitError": "slurmfm.pipeline",
    "Plan": "slurmfm.plan.planner",
    "Placement": "slurmfm.plan.types",
    "Recipe": "slurmfm.recipe.schema",
    "SweepTask": "slurmfm.recipe.sweep",
    "SubmitRequest": "slurmfm.request",
    "RunDirInUse": "slurmfm.run_lock",
    "Topology": "slurmfm.topology.model",
    # errors raised by the modules above, caught by name in users' scripts
    "CostParamsError": "slurmfm.plan.cost",
    "FailedNodesError": "slurmfm.plan.failed",
    "HistoryError": "slurmfm.history",
    "InputFileError": "slurmfm.fsutil",
    "OutputError": "slurmfm.fsutil",
    "PlanError": "slurmfm.plan.planner",
    "SimulationError": "slurmfm.plan.simulate",
    "TopologyError": "slurmfm.topology.model",
    "UnknownInstanceType": "slurmfm.catalog.instances",
    "UnsupportedBySlurm": "slurmfm.catalog.slurm_features",
    "LostAnswer": "slurmfm.backends.rest",
    "SshTransportError": "slurmfm.backends.ssh",
}


def __getattr__(name: str) -> Any:
    module = _LAZY_TYPES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [  # noqa: RUF022 - grouped: functions, then types, then errors
    "load",
    "override",
    "render",
    "dry_run",
    "check",
    "submit",
    "submit_request",
    "status",
    "cancel",
    "report",
    "history",
    "endpoint",
    "endpoint_path",
    "load_topology",
    "plan",
    "sweep_tasks",
    "get_backend",
    "missing_secrets",
    "require_secrets",
    "load_pipeline",
    "chain",
    "dry_run_pipeline",
    "submit_pipeline",
    "DEFAULT_BACKEND",
    "BackendKind",
    "Job",
    "FunctionJob",
    "Executor",
    "Experiment",
    "SweepOverrideWarning",
    "Backend",
    "JobStatus",
    "PreflightError",
    "PreflightReport",
    "Submission",
    "Report",
    "Pipeline",
    "PipelineDryRun",
    "PipelineRun",
    "PipelineSubmitError",
    "Plan",
    "Placement",
    "Recipe",
    "SweepTask",
    "SubmitRequest",
    "RunDirInUse",
    "Topology",
    "SlurmfmError",
    "RecipeError",
    "BackendError",
    "UnsupportedError",
    "JobFailed",
    "RenderError",
    "UnsafeValueError",
    "CostParamsError",
    "FailedNodesError",
    "HistoryError",
    "InputFileError",
    "OutputError",
    "PlanError",
    "SimulationError",
    "TopologyError",
    "UnknownInstanceType",
    "UnsupportedBySlurm",
    "LostAnswer",
    "SshTransportError",
]


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
    import logging

    from slurmfm.backends.slurm_cli import SlurmCLI
    from slurmfm.topology.live import read_live

    # A cluster without switches or blocks (topology/flat, or HyperPod's empty topology.yaml)
    # gives a flat fabric and a note saying so (slurmfm/topology/live.py).
    topo, notes = read_live(SlurmCLI(dict(env) if env is not None else None))
    for note in notes:
        logging.getLogger("slurmfm.topology").warning("%s", note)
    return topo


def plan(
    recipe: Recipe,
    topology: Topology | str,
    *,
    mode: Literal["pin", "constrain"] = "pin",
    unavailable: Iterable[str] = (),
    slurm_version: str | None = None,
    env: Mapping[str, str] | None = None,
    risk: Literal["none", "model"] = "none",
) -> Plan:
    """Choose nodes and rank order for ``recipe`` on ``topology`` (a value, a file, or
    ``live``); feed ``plan(...).placement()`` to :func:`render` or :func:`submit`.

    ``risk``: when a pinned plan may leave Slurm's own choice
    (:class:`slurmfm.plan.planner.PlanRequest`; docs/placement-plans.md)."""
    from slurmfm.plan.planner import plan_for_recipe

    topo = load_topology(topology, env=env) if isinstance(topology, str) else topology
    return plan_for_recipe(
        recipe,
        topo,
        mode=mode,
        unavailable=unavailable,
        slurm_version=slurm_version,
        risk=risk,
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


def get_backend(
    kind: BackendKind = DEFAULT_BACKEND,
    env: Mapping[str, str] | None = None,
    *,
    host: str | None = None,
) -> Backend:
    """The Slurm CLI backend (the default, :data:`DEFAULT_BACKEND`), or pyslurm when asked
    for (``auto`` prefers a matching pyslurm), or a remote one: ``ssh`` to ``host``
    (``user@login``; default ``$SLURMFM_SSH_HOST``) or ``rest`` at ``host`` (slurmrestd's
    URL; default ``$SLURMFM_REST_URL``, token from ``$SLURM_JWT``)."""
    if kind == "ssh":
        from slurmfm.backends.ssh import SshBackend

        return SshBackend(host, dict(env) if env is not None else None)
    if kind == "rest":
        from slurmfm.backends.rest import RestBackend

        return RestBackend(host, env)
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


def _backend(
    backend: BackendKind | Backend,
    env: Mapping[str, str] | None = None,
    host: str | None = None,
) -> Backend:
    return get_backend(backend, env, host=host) if isinstance(backend, str) else backend


def _remote_logs(backend: Backend, st: JobStatus, directory: Path, job_name: str) -> Path:
    """Where this machine can read the job's logs: ``directory`` itself, or, for a remote
    backend, a private local copy of them (ssh), or one line saying it cannot (rest)."""
    if not getattr(backend, "remote", False):
        return directory
    fetch = getattr(backend, "fetch_logs", None)
    if fetch is None:
        from slurmfm.backends.rest import LOGS_UNSUPPORTED

        raise BackendError(LOGS_UNSUPPORTED)
    local: Path = fetch(st, directory, job_name)
    return local


def _as_local(st: JobStatus, remote: Path, local: Path) -> JobStatus:
    """``st`` with its log path and user made this machine's, for the copy in ``local``
    (only the job's own user's files were copied, and they are now this user's)."""
    import dataclasses
    import os

    raw = dict(st.raw)
    raw["UserId"] = f"local({os.geteuid()})"
    out = Path(st.stdout) if st.stdout else None
    stdout = str(local / out.name) if out is not None and out.parent == remote else ""
    return dataclasses.replace(st, stdout=stdout, raw=raw)


@dataclass
class Job:
    """A submitted job with the backend that can ask about it.

    ``Job.from_id("12345")`` reopens one by id (from a later script, or from
    :func:`history`); ``result()`` waits and raises :class:`~slurmfm.errors.JobFailed` with
    the reason and the log's last lines unless it COMPLETED; ``logs()`` reads its output per
    restart and per rank; ``report()`` is ``slurmfm report``.
    """

    job_id: str
    backend: Backend
    request: SubmitRequest | None = None

    @classmethod
    def from_id(
        cls,
        job_id: str,
        *,
        backend: BackendKind | Backend = DEFAULT_BACKEND,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
    ) -> Job:
        """The job with this id; its state is asked when it is used, not here. ``host``: the
        login node (``backend="ssh"``) or slurmrestd's URL (``backend="rest"``)."""
        from slurmfm.backends.slurm_cli import _check_job_id

        return cls(_check_job_id(str(job_id)), _backend(backend, env, host))

    def status(self) -> JobStatus:
        """Slurm's state with the job's own record (restarts, reasons, last checkpoint)."""
        return status(self.job_id, backend=self.backend)

    def wait(
        self,
        timeout: float = 3600.0,
        interval: float = 1.0,
        max_interval: float = 60.0,
    ) -> JobStatus:
        """Until the job ended (any end); raises BackendError after ``timeout`` seconds.

        Polls with backoff (:mod:`slurmfm.polling`): ``interval`` first, a quarter longer each
        time, at most ``max_interval``: a short job is seen to end within about a second, a
        day-long one costs slurmctld one query a minute."""
        from slurmfm.polling import wait_for_end

        wait_for_end(
            lambda: self.backend.status(self.job_id),
            self.job_id,
            timeout=timeout,
            first=interval,
            most=max_interval,
        )
        return self.status()

    def result(self, timeout: float = 3600.0, interval: float = 1.0, tail: int = 30) -> JobStatus:
        """Wait for the end; the final status when COMPLETED, else raise
        :class:`~slurmfm.errors.JobFailed` carrying the state, the reason and the last
        ``tail`` lines of the log."""
        from slurmfm.errors import JobFailed, SlurmfmError

        st = self.wait(timeout=timeout, interval=interval)
        if st.ok:
            return st
        reason = st.last_stop_reason or st.last_requeue_reason or st.reason
        try:
            text = self.logs()
        except SlurmfmError:
            text = ""
        lines = text.splitlines()[-tail:] if tail > 0 else []
        raise JobFailed(
            self.job_id,
            st.state,
            reason="" if reason in {"None", ""} else reason,
            job_exit_code=st.exit_code,
            log_tail="\n".join(lines),
            log_path=st.stdout,
        )

    @overload
    def logs(
        self,
        *,
        rank: int | None = ...,
        restart: int | None = ...,
        follow: Literal[False] = ...,
        log_dir: str | Path | None = ...,
        name: str | None = ...,
        interval: float = ...,
    ) -> str: ...

    @overload
    def logs(
        self,
        *,
        rank: int | None = ...,
        restart: int | None = ...,
        follow: Literal[True],
        log_dir: str | Path | None = ...,
        name: str | None = ...,
        interval: float = ...,
    ) -> Iterator[str]: ...

    def logs(
        self,
        *,
        rank: int | None = None,
        restart: int | None = None,
        follow: bool = False,
        log_dir: str | Path | None = None,
        name: str | None = None,
        interval: float = 2.0,
    ) -> str | Iterator[str]:
        """The job's output, as ``slurmfm logs`` shows it without its headers.

        ``restart``: only that run (0 is the first; one that never happened raises
        :class:`~slurmfm.errors.SlurmfmError`); ``rank``: only that global rank's task
        (needs observability on: its launch step labels each line); ``follow``: an iterator
        of lines as they are written, until the job ends. ``log_dir``/``name`` default to
        Slurm's record of the job (its StdOut's directory and name).
        """
        lines = self._log_lines(rank, restart, log_dir, name, follow, interval)
        return lines if follow else "".join(lines)

    def _log_lines(
        self,
        rank: int | None,
        restart: int | None,
        log_dir: str | Path | None,
        name: str | None,
        follow: bool,
        interval: float,
    ) -> Iterator[str]:
        import shutil
        import time

        from slurmfm.observe.logs import (
            check_restart,
            filter_task,
            locate,
            log_files,
            rank_task,
            restarts_in,
            select,
        )
        from slurmfm.topology.hostlist import expand_hostlist

        st = self.backend.status(self.job_id)
        remote_dir, job_name = locate(st.job_id, st.stdout, st.name, log_dir, name)
        directory = _remote_logs(self.backend, st, remote_dir, job_name)
        from slurmfm.backends.state import job_uid

        try:  # a remote job: a private local copy, made again at each poll
            if directory != remote_dir:
                st = _as_local(st, remote_dir, directory)
            uid = job_uid(st)  # only the job's user's files (docs/security.md)
            task = None
            if rank is not None:
                allocation = expand_hostlist(st.nodes) if st.nodes else []
                task = rank_task(st.job_id, rank, directory, job_name, allocation)
            printed: dict[int, int] = {}
            while True:
                files = log_files(directory, job_name, st.job_id, st.stdout, uid)
                if restart is not None and (not follow or st.done):
                    check_restart(st.job_id, restart, restarts_in(files, st.job_id, uid))
                for n, lines in select(files, st.job_id, restart, uid):
                    shown = list(filter_task(lines, task)) if task is not None else lines
                    yield from shown[printed.get(n, 0) :]
                    printed[n] = len(shown)
                if not follow or st.done:
                    return
                time.sleep(interval)
                st = self.backend.status(self.job_id)
                if directory != remote_dir:  # a fresh copy of the logs at each poll
                    shutil.rmtree(directory, ignore_errors=True)
                    directory = _remote_logs(self.backend, st, remote_dir, job_name)
                    st = _as_local(st, remote_dir, directory)
                uid = job_uid(st)
        finally:
            if directory != remote_dir:
                shutil.rmtree(directory, ignore_errors=True)

    def report(self, *, log_dir: str | Path | None = None, name: str | None = None) -> Report:
        """What ran where, restarts, checkpoints, NCCL transport (``slurmfm report``)."""
        return report(self.job_id, backend=self.backend, log_dir=log_dir, name=name)

    def close(self) -> None:
        """Let go of the backend's connection now (ssh: its shared connection)."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    def cancel(self) -> None:
        self.backend.cancel(self.job_id)


def report(
    job_id: str,
    *,
    backend: BackendKind | Backend = DEFAULT_BACKEND,
    log_dir: str | Path | None = None,
    name: str | None = None,
    host: str | None = None,
) -> Report:
    """The run report of a job (``slurmfm report``): nodes in rank order, restarts and their
    reasons, checkpoints, NCCL transport, EFA counters, wall time; ``.to_json()`` for all.
    Over ssh the job's files are read from a private local copy (its paths stay the
    cluster's in the report); slurmrestd cannot read them, which is said in one line."""
    import dataclasses
    import shutil

    from slurmfm.observe.logs import locate
    from slurmfm.observe.report import build_report

    be = _backend(backend, host=host)
    st = be.status(job_id)
    remote_dir, job_name = locate(st.job_id, st.stdout, st.name, log_dir, name)
    directory = _remote_logs(be, st, remote_dir, job_name)
    local = _as_local(st, remote_dir, directory) if directory != remote_dir else st
    record = dict(local.raw)
    record.setdefault("JobState", st.state)
    record.setdefault("Restarts", str(st.restarts))
    if local.stdout:
        record["StdOut"] = local.stdout
    try:
        rep = build_report(st.job_id, record=record, log_dir=directory, name=job_name)
    finally:
        if directory != remote_dir:
            shutil.rmtree(directory, ignore_errors=True)
    if directory == remote_dir:
        return rep
    logs = [str(remote_dir / Path(p).relative_to(directory)) for p in rep.logs]
    return dataclasses.replace(rep, log_dir=str(remote_dir), logs=logs)


def history(experiment: str | None = None) -> list[Submission]:
    """Every job submitted through slurmfm by this user (:mod:`slurmfm.history`), oldest
    first; only ``experiment``'s when given. ``Job.from_id(s.job_id)`` reopens one."""
    from slurmfm.history import read

    subs = read()
    return [s for s in subs if experiment is None or s.experiment == experiment]


@dataclass(frozen=True)
class Experiment:
    """A named group of submissions: ``Experiment("lr-sweep").submit(recipe)`` records the
    job under the name; ``Experiment.from_id("lr-sweep").jobs()`` reopens them later, from
    any script (NeMo-Run's ``Experiment.from_id``, with the history as the store)."""

    name: str

    @classmethod
    def from_id(cls, name: str) -> Experiment:
        """An experiment that has submissions on record; SlurmfmError when it has none."""
        from slurmfm.errors import SlurmfmError

        if not history(name):
            raise SlurmfmError(f"experiment {name!r}: no submissions recorded")
        return cls(name)

    def submit(self, recipe: Recipe, **kw: Any) -> Job:
        """:func:`submit`, recorded under this experiment."""
        return submit(recipe, experiment=self.name, **kw)

    def runs(self) -> list[Submission]:
        return history(self.name)

    def jobs(self, *, backend: BackendKind | Backend = DEFAULT_BACKEND) -> list[Job]:
        be = _backend(backend)
        return [Job(s.job_id, be) for s in self.runs()]


def _record(done: Sequence[Submitted], experiment: str) -> None:
    """Write each queued job to the history; a failure warns and never undoes a submission."""
    import warnings

    from slurmfm.errors import SlurmfmError
    from slurmfm.history import Submission, here, now_utc
    from slurmfm.history import record as write

    where = here()
    for s in done:
        r = s.request.recipe
        try:
            write(
                Submission(
                    job_id=s.job_id,
                    name=r.name if r is not None else "",
                    run_id=r.run_id if r is not None else "",
                    experiment=experiment,
                    submitted_at=now_utc(),
                    host=str(where["host"]),
                    cwd=str(where["cwd"]),
                    argv=tuple(where["argv"]),  # type: ignore[arg-type]
                    log_dir=r.storage.log_dir if r is not None else "",
                    checkpoint_dir=r.checkpoint_dir if r is not None else "",
                    label=s.label,
                )
            )
        except (SlurmfmError, OSError) as exc:
            warnings.warn(f"job {s.job_id} was submitted but not recorded: {exc}", stacklevel=3)


@dataclass
class FunctionJob(Job):
    """A job that runs a Python call (:class:`Executor`); ``result()`` returns its value."""

    call_dir: Path = Path()

    def result(self, timeout: float = 3600.0, interval: float = 1.0, tail: int = 30) -> Any:
        """Wait; the function's return value (rank 0's), or :class:`~slurmfm.errors.JobFailed`
        whose reason is the exception and whose log tail is its traceback."""
        import pickle

        from slurmfm.call import RESULT, check_dir, read_owned
        from slurmfm.errors import JobFailed

        try:
            super().result(timeout=timeout, interval=interval, tail=tail)
        except JobFailed as failed:
            errors = sorted(self.call_dir.glob("error-r*.txt"))
            if not errors:
                raise
            text = read_owned(errors[0]).decode("utf-8", "replace")
            raise JobFailed(
                self.job_id,
                failed.state,
                reason=text.strip().splitlines()[-1] if text.strip() else failed.reason,
                job_exit_code=failed.job_exit_code,
                log_tail=text.rstrip(),
                log_path=str(errors[0]),
            ) from None
        check_dir(self.call_dir)
        return pickle.loads(read_owned(self.call_dir / RESULT))  # noqa: S301 - our own file


@dataclass(frozen=True)
class Executor:
    """Submit Python calls as jobs, submitit-style: ``Executor(recipe).submit(fn, *args)``.

    ``recipe`` (a :class:`Recipe`, a file or a dict) gives everything but the program:
    cluster, resources, environment, storage. Its launcher becomes torchrun running
    ``python -m slurmfm.call CALL_DIR`` (:mod:`slurmfm.call`), so the call runs on every
    node and process with torchrun's ranks (``RANK``, ``WORLD_SIZE``) and the recipe's
    restarts and logs; rank 0's return value is the result. The call is pickled into an
    owner-only directory under the recipe's log directory (``calls/<id>/``), which the nodes
    must see (the shared file system); each call gets its own run id, so calls run side by
    side. The function must be importable on the nodes: a module on the job's ``sys.path``
    (the submitting ``sys.path`` is carried), or the submitting script itself, imported as
    multiprocessing's spawn does. The nodes' Python needs torch (torchrun).
    """

    recipe: Recipe | Mapping[str, Any] | str | Path
    backend: BackendKind | Backend = DEFAULT_BACKEND
    env: Mapping[str, str] | None = None
    experiment: str = ""
    preflight: bool = True

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> FunctionJob:
        import json
        import os
        import pickle
        import secrets
        import sys

        from slurmfm.call import CALL, META, check_dir, write_new

        call_id = secrets.token_hex(6)
        launcher = {"kind": "torchrun", "module": True, "script": "slurmfm.call"}
        base = self.recipe
        if isinstance(base, str | Path | Mapping):
            recipe = load(base, {"launcher": {**launcher, "args": ["<call dir>"]}})
        else:
            recipe = override(base, {"launcher": {**launcher, "args": ["<call dir>"]}})
        calls = Path(os.path.abspath(recipe.storage.log_dir)) / "calls"
        calls.parent.mkdir(parents=True, exist_ok=True)
        calls.mkdir(mode=0o700, exist_ok=True)
        check_dir(calls)
        call_dir = calls / call_id
        call_dir.mkdir(mode=0o700)
        main = sys.modules.get("__main__")
        main_file = getattr(main, "__file__", None) if fn.__module__ == "__main__" else None
        write_new(call_dir / CALL, pickle.dumps((fn, args, kwargs)))
        meta = {
            "main": os.path.abspath(main_file) if main_file else "",
            "sys_path": [os.path.abspath(p) for p in sys.path if p],
            "function": f"{fn.__module__}.{getattr(fn, '__qualname__', repr(fn))}",
        }
        write_new(call_dir / META, json.dumps(meta).encode())
        recipe = override(
            recipe,
            {
                "launcher.args": [str(call_dir)],
                "storage.run_id": f"{recipe.run_id}-{call_id}",
            },
        )
        job = submit(
            recipe,
            backend=self.backend,
            env=self.env,
            preflight=self.preflight,
            experiment=self.experiment,
        )
        return FunctionJob(job.job_id, job.backend, job.request, call_dir=call_dir)


def check(
    recipe: Recipe,
    *,
    env: Mapping[str, str] | None = None,
    placement: Placement | None = None,
    backend: BackendKind | Backend = DEFAULT_BACKEND,
    host: str | None = None,
) -> PreflightReport:
    """Preflight against the live cluster: partition, nodes, time, features, --test-only.
    Over ``backend="ssh"`` the login node is asked (the recipe's paths are the cluster's, so
    none is checked here); slurmrestd has no ``--test-only``, so ``rest`` cannot check."""
    from slurmfm.backends.preflight import preflight
    from slurmfm.backends.slurm_cli import SlurmCLI

    remote = backend in ("ssh", "rest") or bool(getattr(backend, "remote", False))
    be = _backend(backend, env, host) if remote else None  # else: Slurm's commands here
    if be is not None and not isinstance(be, SlurmCLI):
        raise BackendError(f"{be.name}: cannot check a job (no sbatch --test-only); use ssh or cli")
    cli = be if be is not None else SlurmCLI(dict(env) if env is not None else None)
    request = render(recipe, slurm_version=cli.version(), placement=placement)
    return preflight(recipe, request.text, cli, request.test_only_args(), files=not remote)


def submit(
    recipe: Recipe,
    *,
    backend: BackendKind | Backend = DEFAULT_BACKEND,
    env: Mapping[str, str] | None = None,
    placement: Placement | None = None,
    preflight: bool = True,
    slurm_version: str | None = None,
    allow_shared_run_dir: bool = False,
    experiment: str = "",
    host: str | None = None,
) -> Job:
    """Render for the cluster's real Slurm version and submit; secrets must be in ``env``.

    ``backend="ssh", host="user@login"`` renders here and submits on the login node;
    ``backend="rest"`` through slurmrestd (``host``: its URL). The recipe's paths are then
    the cluster's (docs/backends.md).

    A live job already using the run's checkpoint directory makes this refuse
    (:class:`~slurmfm.run_lock.RunDirInUse`) unless ``allow_shared_run_dir``.

    ``slurm_version``: what the caller already asked the cluster (the CLI does, to plan), so
    that ``sbatch --version`` is not asked twice; by default the backend is asked.

    With ``preflight`` (the default) the job is first checked against the live cluster and
    nothing is queued when it cannot run (:class:`~slurmfm.backends.preflight.PreflightError`).

    The job is recorded in the history (:func:`history`), under ``experiment`` if given.
    """
    be = _backend(backend, env, host)
    if preflight and not getattr(be, "remote", False):
        from slurmfm.backends.preflight import require_files

        require_files([recipe])  # before Slurm is asked anything
    request = render(recipe, slurm_version=slurm_version or be.version(), placement=placement)
    return submit_request(
        request,
        backend=be,
        env=env,
        preflight=preflight,
        allow_shared_run_dir=allow_shared_run_dir,
        experiment=experiment,
    )


def submit_request(
    request: SubmitRequest,
    *,
    backend: BackendKind | Backend = DEFAULT_BACKEND,
    env: Mapping[str, str] | None = None,
    preflight: bool = True,
    allow_shared_run_dir: bool = False,
    experiment: str = "",
    host: str | None = None,
) -> Job:
    """Submit exactly ``request`` (from :func:`dry_run` or :func:`render`), nothing re-rendered:
    secrets checked, preflight (unless off), log directory created, one live job per run
    directory (:class:`~slurmfm.run_lock.RunDirInUse` unless ``allow_shared_run_dir``), then
    the backend sends it."""
    from slurmfm.submit import submit_all

    be = _backend(backend, env, host)
    done = submit_all(
        [("", request)],
        backend=be,
        env=env,
        preflight=preflight,
        allow_shared_run_dir=allow_shared_run_dir,
    )
    _record(done, experiment)
    return Job(done[0].job_id, be, done[0].request)


def status(
    job_id: str, *, backend: BackendKind | Backend = DEFAULT_BACKEND, host: str | None = None
) -> JobStatus:
    """The state of a job by id, with restarts, the last checkpoint and the last requeue reason
    from the state file that slurmfm's job script keeps next to the job's log (not through a
    remote backend: that file is on the cluster)."""
    import dataclasses

    from slurmfm.backends.state import read_state

    be = _backend(backend, host=host)
    st = be.status(job_id)
    if getattr(be, "remote", False):
        return st
    state = read_state(st)
    if state is None:
        return st
    return dataclasses.replace(
        st,
        last_requeue_reason=state.last_requeue_reason,
        last_stop_reason=state.last_stop_reason,
        last_checkpoint=state.last_checkpoint,
        events=tuple(state.events),
        ignored=tuple(state.ignored),
        restarts=max(st.restarts, state.restarts),
    )


def cancel(
    job_id: str, *, backend: BackendKind | Backend = DEFAULT_BACKEND, host: str | None = None
) -> None:
    """Cancel a job by id."""
    _backend(backend, host=host).cancel(job_id)


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
    backend: BackendKind | Backend | None = DEFAULT_BACKEND,
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
    backend: BackendKind | Backend = DEFAULT_BACKEND,
    env: Mapping[str, str] | None = None,
    preflight: bool = True,
    keep_submitted: bool = False,
    experiment: str = "",
) -> PipelineRun:
    """Submit every stage in dependency order; if one fails, cancel those already queued
    (unless ``keep_submitted``) and raise :class:`~slurmfm.pipeline.PipelineSubmitError`."""
    from slurmfm.pipeline import submit as _submit
    from slurmfm.submit import Submitted

    be = get_backend(backend, env) if isinstance(backend, str) else backend
    run = _submit(pipeline, backend=be, env=env, preflight=preflight, keep_submitted=keep_submitted)
    _record([Submitted(st.name, st.job_id, st.request) for st in run.stages], experiment)
    return run
