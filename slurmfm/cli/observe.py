"""``slurmfm report`` and ``slurmfm logs``: a job's run report and its logs.

Why a separate module: like topology.py and plan.py it imports only click at module
level (``slurmfm --help`` stays fast); the report and log readers are imported inside each
command. Errors the user can fix print one line and exit with status 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from slurmfm.cli.common import backend_option, friendly

if TYPE_CHECKING:
    from slurmfm.backends.base import Backend, JobStatus


def _job(
    job_id: str, log_dir: str | None, name: str | None, backend: Backend
) -> tuple[JobStatus, Path, str]:
    """Slurm's record of the job, its log directory and its job name, as this machine reads
    them: over ssh, a private local copy of the job's files (slurmfm.api._remote_logs)."""
    from slurmfm.api import _as_local, _remote_logs
    from slurmfm.observe.logs import locate

    st = backend.status(job_id)
    directory, job_name = locate(st.job_id, st.stdout, st.name, log_dir, name)
    local = _remote_logs(backend, st, directory, job_name)
    if local != directory:
        st = _as_local(st, directory, local)
    return st, local, job_name


def _backend(backend: str, host: str | None) -> Backend:
    from slurmfm import api

    return api.get_backend(backend, host=host)  # type: ignore[arg-type]


_log_dir_option = click.option(
    "--log-dir",
    type=click.Path(file_okay=False),
    help="The recipe's storage.log_dir (default: the directory of the job's StdOut).",
)
_name_option = click.option("--name", help="The job name (default: from Slurm).")


@click.command("report")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_log_dir_option
@_name_option
@backend_option
@friendly
def report_command(
    job_id: str,
    as_json: bool,
    log_dir: str | None,
    name: str | None,
    backend: str,
    host: str | None,
) -> None:
    """What JOB_ID ran where, its restarts, checkpoints, NCCL transport, EFA use, wall time.

    \b
    Nodes in rank order and each node's topology address, every restart with its reason, the
    checkpoints written during the job, what NCCL chose (EFA or sockets), the EFA hardware
    counters' change per node (end minus start), and the wall time.
    """
    from slurmfm import api
    from slurmfm.observe.report import render_text

    rep = api.report(job_id, backend=_backend(backend, host), log_dir=log_dir, name=name)
    if as_json:
        click.echo(rep.to_json())
    else:
        click.echo(render_text(rep), nl=False)


def _rank_task(job_id: str, rank: int, directory: Path, job_name: str, st: JobStatus) -> int:
    from slurmfm.observe.logs import rank_task
    from slurmfm.topology.hostlist import expand_hostlist

    allocation = expand_hostlist(st.nodes) if st.nodes else []
    return rank_task(job_id, rank, directory, job_name, allocation)


@click.command("logs")
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("--rank", type=int, help="Only the output of this global rank's task.")
@click.option("--restart", type=int, help="Only this restart (0 is the first run).")
@click.option(
    "--raw", is_flag=True, help="Print control characters as written (default: shown as \\xNN)."
)
@_log_dir_option
@_name_option
@backend_option
@friendly
def logs_command(
    job_id: str,
    follow: bool,
    rank: int | None,
    restart: int | None,
    raw: bool,
    log_dir: str | None,
    name: str | None,
    backend: str,
    host: str | None,
) -> None:
    """Print JOB_ID's output, per restart and optionally for one rank.

    \b
    Each restart's part starts with a "== restart N ==" line; a restart that never happened is
    an error (exit status 2). --rank R needs a job run with observability on
    (observability.enabled: on): its launch step labels every line with its Slurm task
    (srun --label); with one torchrun per node, rank R's task is its node, shown with the
    node's other ranks. Only the job's user's files are read ("ignored FILE (uid N)" for the
    rest), at most 32 MiB in all (the newest output), and control characters are shown as
    \\xNN unless --raw.
    """
    be = _backend(backend, host)
    _print_logs(job_id, be, follow, rank, restart, log_dir, name, raw)


def _print_logs(
    job_id: str,
    be: Backend,
    follow: bool,
    rank: int | None,
    restart: int | None,
    log_dir: str | None,
    name: str | None,
    raw: bool = False,
) -> None:
    """The loop of ``logs``. Over ssh each poll reads a fresh private local copy of the job's
    files (the last one is removed at the end). Only the job's user's files are read, and
    control characters are shown as ``\\xNN`` unless ``raw`` (docs/security.md)."""
    import shutil

    from slurmfm.backends.state import job_uid
    from slurmfm.errors import SlurmfmError
    from slurmfm.observe.logs import (
        check_restart,
        filter_task,
        log_files,
        restarts_in,
        select,
        visible,
    )

    remote = bool(getattr(be, "remote", False))
    st, directory, job_name = _job(job_id, log_dir, name, be)
    ignored: list[str] = []
    said: set[str] = set()

    def say_ignored() -> None:
        for why in ignored:
            if why not in said:
                said.add(why)
                click.echo(f"slurmfm: {visible(why)}", err=True)

    try:
        uid = job_uid(st)
        task = _rank_task(st.job_id, rank, directory, job_name, st) if rank is not None else None
        files = log_files(directory, job_name, st.job_id, st.stdout, uid, ignored)
        say_ignored()
        if not files and not follow:
            where = "its log directory on the cluster" if remote else str(directory)
            raise SlurmfmError(f"job {job_id}: no log in {where} yet")
        if restart is not None and (not follow or st.done):
            check_restart(st.job_id, restart, restarts_in(files, st.job_id, uid))
        printed: dict[int, int] = {}
        while True:
            files = log_files(directory, job_name, st.job_id, st.stdout, uid, ignored)
            say_ignored()
            for n, lines in select(files, st.job_id, restart, uid):
                shown = list(filter_task(lines, task)) if task is not None else lines
                start = printed.get(n, 0)
                if start == 0 and shown:
                    click.echo(f"== restart {n} ==")
                for line in shown[start:]:
                    click.echo(line if raw else visible(line), nl=not line.endswith("\n"))
                printed[n] = len(shown)
            if not follow or st.done:
                return
            time.sleep(2)
            sys.stdout.flush()
            try:
                if remote:
                    shutil.rmtree(directory, ignore_errors=True)
                    st, directory, job_name = _job(job_id, log_dir, name, be)
                else:
                    st = be.status(st.job_id)
                uid = job_uid(st)
            except SlurmfmError:
                return
    finally:
        if remote:
            shutil.rmtree(directory, ignore_errors=True)
