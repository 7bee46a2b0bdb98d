"""The one submit path: a lone recipe, a chain, a pipeline and a sweep all go through here.

Why one path: the checks that protect a submission (secrets present, preflight against the live
cluster, the log directory created, already-queued jobs cancelled when a later one fails) must
hold the same way for one job and for ten stages. Every item is a ready
:class:`~slurmfm.request.SubmitRequest` (rendered once, shown by the dry run); the only change
made here is replacing ``<stage>`` placeholders in a dependency with the job ids just returned.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slurmfm.errors import Problem, RecipeError, SlurmfmError

if TYPE_CHECKING:
    from slurmfm.backends.base import Backend
    from slurmfm.recipe.schema import Recipe
    from slurmfm.request import SubmitRequest


@dataclass(frozen=True)
class Submitted:
    """One queued job: its label (a stage name, ``""`` for a lone job), id and exact request."""

    label: str
    job_id: str
    request: SubmitRequest


class PipelineSubmitError(SlurmfmError):
    """A stage could not be submitted after others were; says what was queued and its fate."""

    def __init__(self, message: str, submitted: dict[str, str], cancelled: bool) -> None:
        self.submitted = submitted
        self.cancelled = cancelled
        super().__init__(message)


def missing_secrets(recipe: Recipe, env: Mapping[str, str] | None = None) -> list[str]:
    """Names in ``recipe.secrets`` that the submitting environment does not provide."""
    env = os.environ if env is None else env
    return [name for name in recipe.secrets if not env.get(name)]


def require_secrets(recipes: Mapping[str, Recipe], env: Mapping[str, str] | None = None) -> None:
    """Refuse to submit, with one problem naming every secret the environment lacks.

    ``recipes`` maps a label to a recipe: a pipeline stage's name, or ``""`` for a lone recipe.
    Checked before anything is queued, so a pipeline never half-submits for want of a token.
    """
    missing = {label: m for label, r in recipes.items() if (m := missing_secrets(r, env))}
    if not missing:
        return
    named = "; ".join(
        f"{label}: {', '.join(m)}" if label else ", ".join(m) for label, m in missing.items()
    )
    raise RecipeError(
        [
            Problem(
                "<environment>",
                None,
                "secrets",
                f"not set in the submitting environment: {named} "
                "(slurmfm passes secrets through the environment, never the script)",
            )
        ]
    )


def _preflight(
    items: Sequence[tuple[str, SubmitRequest]],
    env: Mapping[str, str] | None,
    backend: Backend | None = None,
) -> None:
    """Ask the cluster whether each job can run. A remote backend asks its own cluster: over
    ssh the same questions (the recipe's paths are the cluster's, so no local file is
    checked); slurmrestd has no ``--test-only``, so a REST submission is not preflighted."""
    from slurmfm.backends.preflight import PreflightError, preflight
    from slurmfm.backends.slurm_cli import SlurmCLI

    remote = bool(getattr(backend, "remote", False))
    if remote and not isinstance(backend, SlurmCLI):
        return
    cli = backend if isinstance(backend, SlurmCLI) and remote else None
    cli = cli or SlurmCLI(dict(env) if env is not None else None)
    failed: list[str] = []
    for label, req in items:
        if req.recipe is None:
            continue
        report = preflight(req.recipe, req.text, cli, req.test_only_args(), files=not remote)
        if not report.ok and len(items) == 1 and not label:
            raise PreflightError(report)
        failed.extend(f"{label}: {c.name}: {c.message}" for c in report.failures())
    if failed:
        raise SlurmfmError("\n".join(f"preflight: {line}" for line in failed))


def _make_dirs(items: Sequence[tuple[str, SubmitRequest]]) -> None:
    """sbatch does not create the ``--output`` directory; a job whose log directory is missing
    fails without any output, so create it before submitting. The run directories too: the
    job refuses to save into (or resume from) one that is not its user's own."""
    from slurmfm import run_lock

    for _, req in items:
        for d in req.creates_dirs:
            try:
                Path(d).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SlurmfmError(
                    f"storage.log_dir: cannot create {d}: {exc.strerror or exc}"
                ) from None
        if req.recipe is not None:
            for run in run_lock.run_dirs(req.recipe):
                _own_run_dir(run)


def _who(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"uid {uid}"


def _own_run_dir(d: Path) -> None:
    """Create the run directory's chain (``<root>/<name>/<run_id>``, each part 0755) or check
    it: no part a link, each ours or root's and not open to others' renames unless sticky
    (:func:`slurmfm.job.checkpoint.ensure_run_dir`, the job's own rule); one line when
    another user's directory or a link stands in the way. A checkpoint file system not
    mounted here is not checked."""
    import errno
    import stat

    from slurmfm.job import fsafe
    from slurmfm.job.checkpoint import ensure_run_dir

    hint = "choose another storage.run_id or storage.checkpoint_root"
    try:
        ensure_run_dir(str(d))
    except fsafe.Refused as exc:
        raise SlurmfmError(
            f"storage.checkpoint_root: the run directory {d} is not safe: {exc}: the job would "
            f"refuse to save or resume there (docs/security.md); {hint}"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM):
            return
        there, pst = d, None
        for there in d.parents:  # the nearest directory that exists (and we may look into)
            with contextlib.suppress(OSError):
                pst = there.stat()
                break
        if pst is None:
            raise SlurmfmError(
                f"storage.checkpoint_root: cannot create the run directory {d}: "
                f"{exc.strerror}; {hint}"
            ) from None
        raise SlurmfmError(
            f"storage.checkpoint_root: cannot create the run directory {d}: {there} belongs to "
            f"{_who(pst.st_uid)} (mode {stat.S_IMODE(pst.st_mode):04o}) and does not let you "
            "add to it; ask its owner for a group-writable, sticky directory (chmod 3775), "
            f"or {hint}"
        ) from None


def submit_all(
    items: Sequence[tuple[str, SubmitRequest]],
    *,
    backend: Backend,
    env: Mapping[str, str] | None = None,
    preflight: bool = True,
    keep_submitted: bool = False,
    allow_shared_run_dir: bool = False,
    shared_run_dir_hint: str = "pass --allow-shared-run-dir",
) -> list[Submitted]:
    """Submit ``(label, request)`` items in order; later dependencies may name earlier labels.

    Nothing is queued when a recipe's secrets or a preflight fail, or when a live job already
    trains in an item's run directory (:mod:`slurmfm.run_lock`; the items of one submission
    may share one, as they run in dependency order). When a later ``sbatch`` fails, the jobs
    already queued are cancelled unless ``keep_submitted``.
    """
    from slurmfm import run_lock

    require_secrets({label: r.recipe for label, r in items if r.recipe is not None}, env)
    if preflight:
        _preflight(items, env, backend)
    if getattr(backend, "remote", False):
        return _submit_remote(items, backend, env, keep_submitted)
    _make_dirs(items)
    child_env = dict(env) if env is not None else None
    with contextlib.ExitStack() as held:
        # Sorted: two submissions never wait for each other's records in opposite orders.
        by_path = {
            path: r.recipe
            for _, r in items
            if r.recipe is not None
            for path in run_lock.record_paths(r.recipe)
        }
        records = {
            path: held.enter_context(
                run_lock.exclusive(
                    by_path[path],
                    lambda job: _live_state(backend, job),
                    path=path,
                    allow_shared=allow_shared_run_dir,
                    override=shared_run_dir_hint,
                )
            )
            for path in sorted(by_path)
        }

        def record(req: SubmitRequest, job_id: str) -> None:
            if req.recipe is not None:
                for path in run_lock.record_paths(req.recipe):
                    records[path](job_id)

        return _submit_each(items, backend, child_env, keep_submitted, record)


def _submit_remote(
    items: Sequence[tuple[str, SubmitRequest]],
    backend: Backend,
    env: Mapping[str, str] | None,
    keep_submitted: bool,
) -> list[Submitted]:
    """Submit through a remote backend (ssh, rest): the recipe's paths are the cluster's, so
    the log directories are made there when the backend can (``make_dirs``: ssh; slurmrestd
    cannot, so they must exist), and the one-live-job rule of :mod:`slurmfm.run_lock`, whose
    records live in the run directory on the cluster, is not checked (docs/backends.md)."""
    make_dirs = getattr(backend, "make_dirs", None)
    if make_dirs is not None:
        make_dirs(sorted({d for _, req in items for d in req.creates_dirs}))
    child_env = dict(env) if env is not None else None
    return _submit_each(items, backend, child_env, keep_submitted)


def _submit_each(
    items: Sequence[tuple[str, SubmitRequest]],
    backend: Backend,
    child_env: dict[str, str] | None,
    keep_submitted: bool,
    after: Callable[[SubmitRequest, str], None] | None = None,
) -> list[Submitted]:
    """Each request in order, its stage placeholders resolved to the job ids before it; on a
    refusal the earlier ones are cancelled unless ``keep_submitted`` (``_abort``). ``after``
    sees each request and its job id (the run lock's record)."""
    done: list[Submitted] = []
    for label, req in items:
        final = req.resolved({s.label: s.job_id for s in done})
        try:
            result = backend.submit(final, env=child_env)
        except SlurmfmError as exc:
            _abort(backend, done, label, exc, keep_submitted)
            raise  # pragma: no cover - _abort always raises
        if after is not None:
            after(req, result.job_id)
        done.append(Submitted(label, result.job_id, final))
    return done


def _live_state(backend: Backend, job_id: str) -> str | None:
    """The job's state while Slurm still has it alive, else None (ended or unknown)."""
    from slurmfm.errors import BackendError

    try:
        st = backend.status(job_id)
    except BackendError:
        return None
    return None if st.done or not st.state else st.state


def _abort(
    backend: Backend, done: list[Submitted], label: str, exc: SlurmfmError, keep: bool
) -> None:
    if not done:
        raise exc
    queued = {s.label: s.job_id for s in done}
    listed = ", ".join(f"{n}={j}" for n, j in queued.items())
    if keep:
        raise PipelineSubmitError(
            f"pipeline: stage {label} was not submitted: {exc}\n"
            f"pipeline: already submitted and kept (--keep-submitted): {listed}",
            queued,
            cancelled=False,
        ) from exc
    errors = []
    for s in reversed(done):
        try:
            backend.cancel(s.job_id)
        except SlurmfmError as cancel_exc:
            errors.append(f"{s.label}={s.job_id}: {cancel_exc}")
    tail = f"; could not cancel {', '.join(errors)}" if errors else ""
    raise PipelineSubmitError(
        f"pipeline: stage {label} was not submitted: {exc}\n"
        f"pipeline: cancelled the stages already submitted: {listed}{tail}",
        queued,
        cancelled=not errors,
    ) from exc
