"""``slurmfm logs JOBID``: a job's output per restart and per rank.

Where the output is: sbatch's ``--output`` is ``<log_dir>/<name>_<jobid>.out`` and every
restart appends to it (``--open-mode=append``); each start begins with the job script's line
``slurmfm: job <id> start <N>``, which is where a restart's part begins. With
``resilience.log_mode: per_restart`` the launch step of restart N writes
``<name>_<jobid>_r<N>.out`` instead.

Per rank: with observability on, the launch step runs with ``srun --label``, so each line of
the training's output starts with ``T: `` where T is the Slurm task. With one task per GPU
(NeMo) a task is a global rank. With one torchrun per node (torchrun, Megatron-LM) a task is a
node, and rank R's lines are those of the node that holds it (node R // G of the job's host
order, G processes per node), together with that node's other local ranks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

_LABEL = re.compile(r"^\s*(\d+): ?(.*)$", re.DOTALL)


def _start_marker(job_id: str) -> re.Pattern[str]:
    return re.compile(rf"^slurmfm: job {re.escape(job_id)} start (\d+)\b")


# What `slurmfm logs` reads of a job's logs in all, whatever their number and size: the
# newest bytes (each file's tail). Two sparse 300 MB files, which cost their writer no quota,
# took the command to 917 MiB resident before.
MAX_TOTAL = 32 << 20

# Control characters (C0 but tab and newline, DEL, C1): shown as \xNN, never sent to the
# terminal as they are. An escape sequence in a log line (a planted file, or a program's
# output) could set the window title, write the clipboard (OSC 52) or hide lines.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with its control characters made visible (``\\x1b``), tab and newline kept."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def log_files(
    log_dir: Path,
    name: str,
    job_id: str,
    stdout: str = "",
    uid: int | None = None,
    ignored: list[str] | None = None,
) -> list[tuple[int, Path]]:
    """``(restart, path)`` of every log of the job: -1 for the main log, N for ``_rN.out``.

    ``uid``: the job's user (from Slurm): only that user's regular files count; each other
    one is added to ``ignored`` as ``ignored FILE (uid N)`` (a name in a shared log directory
    says nothing about who wrote it). None: anyone's (still no link, FIFO or device).
    """
    from slurmfm.job import fsafe

    main = Path(stdout) if stdout else log_dir / f"{name}_{job_id}.out"
    found: list[tuple[int, Path]] = []
    if os.path.lexists(main):
        found.append((-1, main))
    for p in log_dir.glob(f"{name}_{job_id}_r*.out"):
        m = re.fullmatch(rf"{re.escape(name)}_{re.escape(job_id)}_r(\d+)\.out", p.name)
        if m:
            found.append((int(m.group(1)), p))
    kept, skipped = fsafe.owned([str(p) for _, p in found], fsafe.ANY_OWNER if uid is None else uid)
    if ignored is not None:
        ignored.extend(w for w in skipped if w not in ignored)
    out = [(n, p) for n, p in found if str(p) in kept]
    return sorted(out, key=lambda rp: (rp[0], str(rp[1])))


def split_restarts(text: str, job_id: str) -> dict[int, list[str]]:
    """The main log's lines by restart, cut at each ``slurmfm: job ID start N`` line."""
    marker = _start_marker(job_id)
    parts: dict[int, list[str]] = {}
    current = 0
    for line in text.splitlines(keepends=True):
        m = marker.match(line)
        if m:
            current = int(m.group(1))
        parts.setdefault(current, []).append(line)
    return parts


def task_for_rank(
    rank: int,
    *,
    launcher: str,
    procs_per_node: int,
    hosts: list[str],
    allocation: list[str],
) -> int:
    """The Slurm task of the launch step whose output holds global rank ``rank``."""
    if launcher == "nemo":
        return rank
    node_rank = rank // max(procs_per_node, 1)
    if node_rank >= len(hosts):
        raise ValueError(
            f"rank {rank} is not in this job ({len(hosts)} nodes x {procs_per_node} processes)"
        )
    node = hosts[node_rank]
    # One task per node: Slurm numbers the tasks in the allocation's node order.
    return allocation.index(node) if node in allocation else node_rank


def filter_task(lines: Iterable[str], task: int) -> Iterator[str]:
    """Lines labelled ``task`` by ``srun --label``, label removed."""
    for line in lines:
        m = _LABEL.match(line)
        if m and int(m.group(1)) == task:
            yield m.group(2)


def select(
    files: list[tuple[int, Path]],
    job_id: str,
    restart: int | None,
    uid: int | None = None,
    limit: int = MAX_TOTAL,
) -> list[tuple[int, list[str]]]:
    """``(restart, lines)`` for every restart (or only ``restart``), in order.

    At most ``limit`` bytes are read in all (:data:`MAX_TOTAL`), the newest first: the last
    files get their whole tail, an older part cut is said in a line of its own. ``uid``: the
    files are read only when they are still that user's (None: anyone's).
    """
    by_restart: dict[int, list[str]] = {}
    from slurmfm.job import fsafe

    texts: dict[int, str] = {}
    left = limit
    for i in reversed(range(len(files))):  # the newest output first, within the cap
        path = files[i][1]
        try:  # never blocks on a FIFO planted in a shared log directory
            data, skipped = fsafe.read_tail(
                str(path), fsafe.ANY_OWNER if uid is None else uid, max(left, 0)
            )
        except OSError:
            continue
        left -= len(data)
        text = data.decode("utf-8", "replace")
        if skipped:
            text = (
                f"[slurmfm: {skipped} earlier bytes of {path} not read]\n" + text.partition("\n")[2]
            )
        texts[i] = text
    for i, (n, _path) in enumerate(files):
        if i not in texts:
            continue
        text = texts[i]
        if n == -1:
            for k, lines in split_restarts(text, job_id).items():
                by_restart.setdefault(k, []).extend(lines)
        else:
            by_restart.setdefault(n, []).extend(text.splitlines(keepends=True))
    keys = sorted(by_restart) if restart is None else [restart]
    return [(k, by_restart.get(k, [])) for k in keys]


def locate(
    job_id: str, stdout: str, slurm_name: str, log_dir: str | Path | None, name: str | None
) -> tuple[Path, str]:
    """The job's log directory and job name: given, else from Slurm's record (its StdOut's
    directory and the job's name)."""
    from slurmfm.errors import SlurmfmError

    job_name = name or slurm_name
    if log_dir:
        directory = Path(log_dir)
    elif stdout:
        directory = Path(stdout).parent
    else:
        raise SlurmfmError(
            f"job {job_id}: Slurm does not say where its log is; "
            "give the log directory (the recipe's storage.log_dir)"
        )
    if not job_name:
        raise SlurmfmError(f"job {job_id}: no job name from Slurm; give the name")
    return directory, job_name


def rank_task(job_id: str, rank: int, directory: Path, job_name: str, nodes: list[str]) -> int:
    """The Slurm task whose labelled lines hold global ``rank`` (``nodes``: the allocation
    in Slurm's order). Needs observability on: its launch step labels every line."""
    import json

    from slurmfm.errors import SlurmfmError
    from slurmfm.job import fsafe
    from slurmfm.job.state import find, state_name
    from slurmfm.observe.report import parse_runs

    base = directory / f"{job_name}_{job_id}"
    try:  # the job's own directories and files only (docs/security.md)
        obs = fsafe.find_dir(f"{base}.observe") or f"{base}.observe"
        job = json.loads(fsafe.read_text(f"{obs}/job.json", fsafe.ANY_OWNER) or "")
    except ValueError:
        raise SlurmfmError(
            f"job {job_id}: no {base}.observe/job.json: a rank's output needs a job run with "
            "observability on (observability.enabled: on; its launch step labels each line "
            "with its task)"
        ) from None
    state, _ignored = find(str(directory / state_name(job_name, job_id)))
    runs = parse_runs((fsafe.read_text(state) if state else None) or "")
    hosts = next((r.hosts for r in reversed(runs) if r.hosts), [])
    try:
        return task_for_rank(
            rank,
            launcher=str(job.get("launcher", "torchrun")),
            procs_per_node=int(job.get("procs_per_node", 1)),
            hosts=hosts,
            allocation=nodes or list(hosts),
        )
    except ValueError as exc:
        raise SlurmfmError(f"rank: {exc}") from None


def check_restart(job_id: str, restart: int, found: Iterable[int]) -> None:
    """Refuse a restart the job never had: one line naming the ones it had."""
    from slurmfm.errors import SlurmfmError

    have = sorted(found)
    if restart in have:
        return
    had = (
        f"its log holds restart{'s' if len(have) > 1 else ''} " + ", ".join(str(n) for n in have)
        if have
        else "its log holds no output yet"
    )
    raise SlurmfmError(f"job {job_id}: restart {restart} never happened; {had}")


def restarts_in(files: list[tuple[int, Path]], job_id: str, uid: int | None = None) -> set[int]:
    """The restarts that have output in ``files``."""
    return {n for n, lines in select(files, job_id, None, uid) if lines}
