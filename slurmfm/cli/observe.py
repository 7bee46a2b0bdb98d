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

from slurmfm.cli.common import friendly

if TYPE_CHECKING:
    from slurmfm.backends.base import JobStatus


def _job(job_id: str, log_dir: str | None, name: str | None) -> tuple[JobStatus, Path, str]:
    """Slurm's record of the job, its log directory and its job name."""
    from slurmfm.backends.slurm_cli import SlurmCLI
    from slurmfm.observe.logs import locate

    st = SlurmCLI().status(job_id)
    directory, job_name = locate(st.job_id, st.stdout, st.name, log_dir, name)
    return st, directory, job_name


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
@friendly
def report_command(job_id: str, as_json: bool, log_dir: str | None, name: str | None) -> None:
    """What JOB_ID ran where, its restarts, checkpoints, NCCL transport, EFA use, wall time.

    \b
    Nodes in rank order and each node's topology address, every restart with its reason, the
    checkpoints written during the job, what NCCL chose (EFA or sockets), the EFA hardware
    counters' change per node (end minus start), and the wall time.
    """
    from slurmfm.observe.report import build_report, render_text

    st, directory, job_name = _job(job_id, log_dir, name)
    record = dict(st.raw)
    record.setdefault("JobState", st.state)
    record.setdefault("Restarts", str(st.restarts))
    rep = build_report(st.job_id, record=record, log_dir=directory, name=job_name)
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
@_log_dir_option
@_name_option
@friendly
def logs_command(
    job_id: str,
    follow: bool,
    rank: int | None,
    restart: int | None,
    log_dir: str | None,
    name: str | None,
) -> None:
    """Print JOB_ID's output, per restart and optionally for one rank.

    \b
    Each restart's part starts with a "== restart N ==" line; a restart that never happened is
    an error (exit status 2). --rank R needs a job run with observability on
    (observability.enabled: on): its launch step labels every line with its Slurm task
    (srun --label); with one torchrun per node, rank R's task is its node, shown with the
    node's other ranks.
    """
    from slurmfm.observe.logs import check_restart, filter_task, log_files, restarts_in, select

    st, directory, job_name = _job(job_id, log_dir, name)
    task = _rank_task(st.job_id, rank, directory, job_name, st) if rank is not None else None
    files = log_files(directory, job_name, st.job_id, st.stdout)
    if not files and not follow:
        from slurmfm.errors import SlurmfmError

        raise SlurmfmError(f"job {job_id}: no log in {directory} yet")
    if restart is not None and (not follow or st.done):
        check_restart(st.job_id, restart, restarts_in(files, st.job_id))
    printed: dict[int, int] = {}
    while True:
        files = log_files(directory, job_name, st.job_id, st.stdout)
        for n, lines in select(files, st.job_id, restart):
            shown = list(filter_task(lines, task)) if task is not None else lines
            start = printed.get(n, 0)
            if start == 0 and shown:
                click.echo(f"== restart {n} ==")
            for line in shown[start:]:
                click.echo(line, nl=not line.endswith("\n"))
            printed[n] = len(shown)
        if not follow:
            return
        if st.done:
            return
        time.sleep(2)
        from slurmfm.backends.slurm_cli import SlurmCLI

        try:
            st = SlurmCLI().status(st.job_id)
        except Exception:
            return
        sys.stdout.flush()
