"""Helpers shared by the CLI modules; imports only click (``slurmfm --help`` stays fast)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from slurmfm.request import SubmitRequest

F = TypeVar("F", bound=Callable[..., Any])

# The Slurm clients of slurmfm.api.get_backend (api.BackendKind; not imported here, see above).
_backend_choice = click.option(
    "--backend",
    type=click.Choice(["cli", "pyslurm", "auto", "ssh", "rest"]),
    default="cli",
    show_default=True,
    help="How to talk to Slurm: its commands here (cli), pyslurm, or from elsewhere: over "
    "ssh on a login node (--host), or through slurmrestd (rest: $SLURMFM_REST_URL, token "
    "in $SLURM_JWT).",
)
_host_option = click.option(
    "--host",
    envvar="SLURMFM_SSH_HOST",
    metavar="USER@LOGIN",
    help="With --backend ssh: the login node, as ssh takes it (also $SLURMFM_SSH_HOST).",
)


def backend_option(fn: F) -> F:
    """--backend and --host (the login node of --backend ssh)."""
    return _host_option(_backend_choice(fn))


# slurmfm.plan.planner.PlanRequest.risk (plan.guard.Risk; not imported here, see above).
risk_option = click.option(
    "--risk",
    type=click.Choice(["none", "model"]),
    default="none",
    show_default=True,
    help="When a pinned plan on a tree fabric may leave Slurm's own choice. none: only for a "
    "gain predicted in every scenario the planner cannot rule out (taper, NCCL ring or "
    "tree, other jobs' share of the uplinks). model: also when the cost model predicts a "
    "2% gain in one scenario and a loss in none; the referee found no median gain on "
    "fresh seeds (docs/placement-plans.md).",
)


def cluster_version(given: str | None, backend: str = "cli", host: str | None = None) -> str | None:
    """The Slurm version a dry run renders for: ``given`` (``--slurm-version``), else the
    reachable cluster's (``sbatch --version``, as ``submit`` asks), else None with a warning
    that says why, so the dry run is the script ``submit`` would send.

    Why ask: a dry run rendered for an assumed 22.05 differs from what ``submit`` sends to a
    24.11 or 26.05 cluster (options gated by version). ``sbatch --version`` reads the configuration
    but sends the controller nothing; a missing ``$SLURM_CONF`` is refused at once
    (:func:`slurmfm.backends.slurm_cli.check_slurm_conf`).
    """
    if given:
        return given
    from slurmfm import api
    from slurmfm.errors import SlurmfmError

    try:
        return api.get_backend(backend, host=host).version()  # type: ignore[arg-type]
    except SlurmfmError as exc:
        click.echo(
            f"warning: Slurm version: could not ask the cluster ({exc}); a recipe with "
            "cluster.slurm_version: auto is rendered for its flavor's assumed version",
            err=True,
        )
        return None


def friendly(fn: F) -> F:
    """Turn slurmfm's errors into one clean line each on stderr and exit status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from slurmfm.errors import SlurmfmError

        try:
            return fn(*args, **kwargs)
        except SlurmfmError as exc:
            for line in str(exc).splitlines() or [type(exc).__name__]:
                click.echo(line, err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


def write_atomic(path: str, text: str, mode: int | None = None) -> None:
    """Whole file or nothing (see :func:`slurmfm.fsutil.write_atomic`)."""
    from slurmfm.fsutil import write_atomic as _write

    _write(path, text, mode=mode)


def install_template_cache() -> None:
    """Let the renderer keep compiled templates and built runtimes in the CLI's cache
    (slurmfm.cli.cache)."""
    from slurmfm.cli.cache import install_template_cache as _install

    _install()


def write_requests(directory: str, items: list[tuple[str, SubmitRequest]]) -> None:
    """Write each request's exact bytes as ``<dir>/<stem>.sh``, ``.argv.json`` and ``.files/``
    (see :meth:`slurmfm.request.SubmitRequest.write`); one clear error, no traceback, when the
    directory cannot be made or written."""
    import os

    from slurmfm.errors import SlurmfmError

    if os.path.exists(directory) and not os.path.isdir(directory):
        raise SlurmfmError(f"-o {directory}: exists and is not a directory")
    try:
        for stem, request in items:
            request.write(directory, stem)
    except OSError as exc:
        raise SlurmfmError(f"-o {directory}: cannot write: {exc.strerror or exc}") from None
    click.echo(f"wrote {directory}", err=True)
