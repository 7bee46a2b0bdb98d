"""``slurmfm report JOBID``: what a job ran where, how it restarted, and what it wrote.

Why a report built from files: Slurm keeps a job's record (nodes, times, restart count) but
not why it restarted, which rank ran where, which checkpoints it wrote or whether NCCL used
EFA. The job script leaves those next to its log: the state file (one line per event,
:mod:`slurmfm.backends.state`), the observe directory (per-node facts and EFA counter
snapshots from :mod:`slurmfm.observe.agent`, the training progress), the NCCL logs of the
transport check, and the run's checkpoint directory. This module reads them, with Slurm's
record (``scontrol show job``, or ``sacct`` for old jobs), into one :class:`Report`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from slurmfm.job import fsafe
from slurmfm.job.nccl import EFA as _NCCL_EFA
from slurmfm.job.nccl import SOCKET as _NCCL_SOCKET
from slurmfm.job.slurm import user_id
from slurmfm.job.state import events, state_name
from slurmfm.job.state import find as find_state

# Counters summed per node in the text report; the JSON report has every counter per device.
EFA_SUMMARY = ("tx_bytes", "rx_bytes", "rdma_read_bytes", "rdma_write_bytes", "rx_drops")
# "stop": a TERM from Slurm (scancel, an operator's requeue, preemption) with what Slurm said.
TERMINAL_EVENTS = {"requeue", "give-up", "fail", "finished", "stop"}


@dataclass
class Run:
    """One start of the job (restart N): when, where, and how it ended."""

    restart: int
    start: str = ""
    end: str = ""
    outcome: str = "running"
    reason: str = ""
    hosts: list[str] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    seconds: float | None = None
    # The ranks' order by leaf as the job's prepare step logged it, and whether that is
    # topology order (slurmfm/job/rankorder.py: issue 42 item 1); the serving group's too.
    order: str = ""
    serve_order: str = ""


@dataclass
class Checkpoint:
    name: str
    step: int
    time: str


@dataclass
class NcclSeen:
    restart: int
    transport: str  # "efa", "socket" or "unknown"
    evidence: str
    file: str


@dataclass
class Report:
    job_id: str
    name: str = ""
    state: str = ""
    exit_code: str = ""
    slurm_nodes: str = ""
    nodes: list[str] = field(default_factory=list)  # rank order of the last run
    topology: dict[str, str] = field(default_factory=dict)  # node -> SLURM_TOPOLOGY_ADDR
    topology_summary: str = ""
    restarts: int = 0
    runs: list[Run] = field(default_factory=list)
    checkpoint_dir: str = ""
    latest_checkpoint: str = ""
    checkpoints: list[Checkpoint] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)
    nccl: list[NcclSeen] = field(default_factory=list)
    # the pre-flight fabric test per run: (restart, "ok: ..." or "failed: ...")
    fabric: list[tuple[int, str]] = field(default_factory=list)
    # node -> "r<restart>:<device>:<port>" -> counter -> end minus start
    efa_delta: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    efa_totals: dict[str, dict[str, int]] = field(default_factory=dict)
    start: str = ""
    end: str = ""
    wall_time_s: float | None = None
    slurm_run_time: str = ""
    log_dir: str = ""
    logs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    goodput: dict[str, Any] = field(default_factory=dict)  # slurmfm.observe.goodput.build

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def _ts(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def parse_runs(state_text: str, now: datetime | None = None) -> list[Run]:
    """The runs of a job from its state file, in restart order.

    A last run without an end event is still running (or was killed): with ``now`` its
    duration so far is counted.
    """
    runs: dict[int, Run] = {}
    for e in events(state_text):
        n = e.restart
        run = runs.setdefault(n, Run(n))
        event, rest, ts = e.event, e.detail, e.time
        if event == "start":
            run.start = run.start or ts
        elif event == "hosts":
            run.hosts = rest.split()
        elif event == "order":
            run.order = rest
        elif event == "serve-order":
            run.serve_order = rest
        elif event == "signal":
            run.signals.append(rest)
        elif event in TERMINAL_EVENTS:
            run.outcome, run.reason, run.end = event, rest, ts
        elif event == "restart" and n - 1 in runs and runs[n - 1].outcome in ("running", "stop"):
            # the next attempt learnt that the last one was requeued, by Slurm or an operator
            runs[n - 1].outcome, runs[n - 1].reason = "requeue", rest
    for run in runs.values():
        a, b = _ts(run.start), _ts(run.end)
        if a and b:
            run.seconds = (b - a).total_seconds()
    if runs:
        last = runs[max(runs)]
        began = _ts(last.start)
        if last.outcome == "running" and began and now is not None:
            last.seconds = max(0.0, (now - began).total_seconds())
    return [runs[k] for k in sorted(runs)]


def topology_summary(addrs: dict[str, str]) -> str:
    """ "2 nodes under 1 leaf switch (s1.l1)" from each node's SLURM_TOPOLOGY_ADDR.

    The cause of an empty summary is named by what is known: no node record at all means no
    node agent ran (observability off, or the job never started a launch); records without
    an address mean Slurm set none (no topology plugin on the cluster).
    """
    if not addrs:
        return (
            "not recorded: no node agent ran (observability.enabled: on records each node's "
            "address)"
        )
    if not any(addrs.values()):
        return "no topology addresses: Slurm set no SLURM_TOPOLOGY_ADDR (no topology plugin)"
    leaves: dict[str, list[str]] = {}
    for node, addr in addrs.items():
        parent = addr.rsplit(".", 1)[0] if "." in addr else "(none)"
        leaves.setdefault(parent, []).append(node)
    parts = ", ".join(f"{leaf}: {len(nodes)}" for leaf, nodes in sorted(leaves.items()))
    n = len(addrs)
    return (
        f"{n} node{'s' if n != 1 else ''} under {len(leaves)} leaf switch"
        f"{'es' if len(leaves) != 1 else ''} ({parts})"
    )


def efa_delta(start: dict[str, Any], end: dict[str, Any]) -> dict[str, dict[str, dict[str, int]]]:
    """Per device and port, end minus start of every counter present in both."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for dev, ports in end.get("devices", {}).items():
        for port, counters in ports.items():
            before = start.get("devices", {}).get(dev, {}).get(port, {})
            out.setdefault(dev, {})[port] = {
                k: int(v) - int(before[k]) for k, v in counters.items() if k in before
            }
    return out


def nccl_transport(
    log_dir: Path, job_id: str, uid: int | None = None, ignored: list[str] | None = None
) -> list[NcclSeen]:
    """What NCCL chose per restart, from the transport check's logs (``nccl-JOB-rN-*``).

    The line patterns are the job runtime's (:mod:`slurmfm.job.nccl`), so the report and the
    running job's transport check never disagree about which plugin versions' lines mean EFA.
    ``uid``: the job's user: another user's file of that name is skipped and added to
    ``ignored`` (a planted log must not say which transport the job used).
    """
    seen: dict[int, NcclSeen] = {}
    want = fsafe.ANY_OWNER if uid is None else uid
    paths, skipped = fsafe.owned(
        [str(p) for p in sorted(log_dir.glob(f"nccl-{job_id}-r*-*"))], want
    )
    if ignored is not None:
        ignored.extend(skipped)
    for path in map(Path, paths):
        m = re.match(rf"nccl-{re.escape(job_id)}-r(\d+)-", path.name)
        if not m:
            continue
        n = int(m.group(1))
        text = fsafe.read_text(str(path), want, 64 << 20)
        if text is None:
            continue
        for pattern, kind in ((_NCCL_EFA, "efa"), (_NCCL_SOCKET, "socket")):
            hit = next((ln for ln in text.splitlines() if pattern.search(ln)), None)
            if hit and (n not in seen or seen[n].transport == "unknown"):
                seen[n] = NcclSeen(n, kind, hit.strip(), str(path))
                break
        else:
            seen.setdefault(n, NcclSeen(n, "unknown", "", str(path)))
    return [seen[k] for k in sorted(seen)]


def checkpoints(
    directory: Path, since: datetime | None, uid: int | None = None
) -> tuple[str, list[Checkpoint]]:
    """The ``latest`` pointer and the ``step_N`` checkpoints written since ``since``: the
    job user's (``uid``) only, in a run directory whose chain is safe (the runtime's rule)."""
    from slurmfm import checkpoint as ck

    found: list[Checkpoint] = []
    try:
        latest = ck.latest(directory, uid)
        entries = sorted(directory.iterdir())
    except OSError:
        return ("", found)
    for p in entries:
        if not re.fullmatch(r"step_\d+", p.name) or p.is_symlink() or not p.is_dir():
            continue
        if uid is not None and p.lstat().st_uid != uid:
            continue
        mtime = datetime.fromtimestamp(p.stat().st_mtime, tz=timezone.utc)
        if since is not None and mtime < since:
            continue
        found.append(Checkpoint(p.name, ck.step_of(p), mtime.strftime("%Y-%m-%dT%H:%M:%SZ")))
    return (str(latest) if latest else "", found)


def _read_json(path: Path, uid: int | None = None) -> dict[str, Any]:
    try:
        data = json.loads(
            fsafe.read_text(str(path), fsafe.ANY_OWNER if uid is None else uid) or "{}"
        )
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def build_report(
    job_id: str,
    *,
    record: dict[str, str],
    log_dir: Path,
    name: str,
) -> Report:
    """Assemble the report from Slurm's ``record`` and the files in ``log_dir``."""
    rep = Report(job_id=job_id, name=name, log_dir=str(log_dir))
    rep.state = record.get("JobState", record.get("State", ""))
    rep.exit_code = record.get("ExitCode", "")
    rep.slurm_nodes = record.get("NodeList", "")
    rep.restarts = int(record.get("Restarts", "0") or 0)
    rep.slurm_run_time = record.get("RunTime", record.get("Elapsed", ""))
    uid = user_id(record)
    _add_state(rep, log_dir / state_name(name, job_id), uid)
    _add_observed(rep, log_dir, f"{name}_{job_id}", uid)
    ignored_files: list[str] = []
    rep.nccl = nccl_transport(log_dir, job_id, uid, ignored_files)
    if rep.checkpoint_dir:
        since = _ts(rep.start) if rep.start else None
        rep.latest_checkpoint, rep.checkpoints = checkpoints(Path(rep.checkpoint_dir), since, uid)
    from slurmfm.observe.logs import log_files

    logs = log_files(log_dir, name, job_id, record.get("StdOut", ""), uid, ignored_files)
    rep.logs = [str(p) for _, p in logs]
    rep.notes.extend(ignored_files)
    rep.goodput = goodput_ledger(job_id, record, log_dir, name, uid)
    return rep


def _add_state(rep: Report, state_file: Path, uid: int | None) -> None:
    """The runs, restarts, checkpoint directory and fabric tests from the job's state file
    (only the job's user's: another user's planted file is named and ignored)."""
    found, ignored = find_state(str(state_file), uid)
    state_text = (fsafe.read_text(found, uid, 16 << 20) if found else None) or ""
    rep.notes.extend(f"ignored state file {why} (not the job's user's)" for why in ignored)
    if not found:
        rep.notes.append(f"no state file {state_file} (not a slurmfm job, or another log dir)")
    still = not rep.state or rep.state in {"RUNNING", "COMPLETING", "CONFIGURING", "PENDING"}
    rep.runs = parse_runs(state_text, datetime.now(timezone.utc) if still else None)
    rep.restarts = max(rep.restarts, max((r.restart for r in rep.runs), default=0))
    for e in events(state_text):
        if e.event == "checkpoint-dir":
            rep.checkpoint_dir = e.detail
        elif e.event == "fabric":  # slurmfm/job/fabric.py, recorded by the batch step
            rep.fabric.append((e.restart, e.detail))
    if rep.runs:
        rep.nodes = next((r.hosts for r in reversed(rep.runs) if r.hosts), [])
        rep.start = rep.runs[0].start
        rep.end = rep.runs[-1].end
        done = [r.seconds for r in rep.runs if r.seconds is not None]
        rep.wall_time_s = sum(done) if done else None


def _add_observed(rep: Report, log_dir: Path, base: str, uid: int | None) -> None:
    """What the node agents wrote (``BASE.observe``): each node's topology address in the last
    run, the progress, and each node's EFA counters over each run."""
    obs = Path(fsafe.find_dir(str(log_dir / f"{base}.observe"), uid) or log_dir / f"{base}.observe")
    last = rep.runs[-1].restart if rep.runs else 0
    for path in sorted(obs.glob(f"node_*_r{last}.json")):
        info = _read_json(path, uid)
        if info.get("node"):
            rep.topology[str(info["node"])] = str(info.get("topology_addr", ""))
    rep.topology_summary = topology_summary(rep.topology)
    rep.progress = _read_json(obs / "progress.json", uid)
    for start_path in sorted(obs.glob("efa_start_*.json")):
        m = re.fullmatch(r"efa_start_(.+)_r(\d+)\.json", start_path.name)
        if not m:
            continue
        node, restart = m.group(1), m.group(2)
        end = _read_json(obs / f"efa_end_{node}_r{restart}.json", uid)
        if not end:
            continue
        delta = efa_delta(_read_json(start_path, uid), end)
        rep.efa_delta.setdefault(node, {}).update(
            {
                f"r{restart}:{dev}:{port}": c
                for dev, ports in delta.items()
                for port, c in ports.items()
            }
        )
        totals = rep.efa_totals.setdefault(node, dict.fromkeys(EFA_SUMMARY, 0))
        for ports in delta.values():
            for counters in ports.values():
                for k in EFA_SUMMARY:
                    totals[k] += counters.get(k, 0)


def goodput_ledger(
    job_id: str, record: dict[str, str], log_dir: Path, name: str, uid: int | None
) -> dict[str, Any]:
    """The run's goodput ledger (:mod:`slurmfm.observe.goodput`); it never stops a report."""
    from slurmfm.observe import goodput

    try:
        return goodput.build(job_id, record=record, log_dir=log_dir, name=name, uid=uid)
    except (OSError, ValueError) as exc:
        return {"notes": [f"goodput ledger not computed: {exc}"]}


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render_text(rep: Report) -> str:
    """The report for a terminal."""
    out = [
        f"job {rep.job_id} ({rep.name}): {rep.state or '?'}"
        + (f", exit {rep.exit_code}" if rep.exit_code else ""),
        f"  wall time {_duration(rep.wall_time_s)} over {len(rep.runs) or 1} run(s)"
        + (f"; Slurm run time {rep.slurm_run_time}" if rep.slurm_run_time else "")
        + (f"; {rep.start} .. {rep.end or 'now'}" if rep.start else ""),
        "nodes (rank order): " + (" ".join(rep.nodes) or rep.slurm_nodes or "?"),
        f"  topology: {rep.topology_summary}",
    ]
    for node in rep.nodes:
        if rep.topology.get(node):
            out.append(f"    {node}: {rep.topology[node]}")
    out.append(f"restarts: {rep.restarts}")
    for r in rep.runs:
        line = f"  run {r.restart}: {r.start or '?'} -> {r.outcome}"
        if r.reason:
            line += f": {r.reason}"
        if r.seconds is not None:
            line += f" ({_duration(r.seconds)})"
        out.append(line)
        if r.order:
            out.append(f"    rank order {r.order}")
        if r.serve_order:
            out.append(f"    serving order {r.serve_order}")
        for s in r.signals:
            out.append(f"    signal: {s}")
    out.append(f"checkpoints: {rep.checkpoint_dir or '?'}")
    if rep.latest_checkpoint:
        out.append(f"  latest: {rep.latest_checkpoint}")
    for c in rep.checkpoints:
        out.append(f"  {c.name} (step {c.step}, {c.time})")
    if rep.progress:
        out.append(
            "  progress: step "
            + str(rep.progress.get("step", "?"))
            + ", last checkpoint step "
            + str(rep.progress.get("checkpoint_step", "?"))
        )
    if rep.nccl:
        out.append("NCCL transport:")
        for seen in rep.nccl:
            why = f" ({seen.evidence})" if seen.evidence else ""
            out.append(f"  run {seen.restart}: {seen.transport}{why}")
    else:
        out.append("NCCL transport: not checked (no NCCL transport-check logs)")
    if rep.fabric:
        out.append("fabric test (nccl-tests all_reduce_perf):")
        for restart, detail in rep.fabric:
            out.append(f"  run {restart}: {detail}")
    if rep.efa_totals:
        out.append("EFA counters (end - start, all devices):")
        for node, totals in sorted(rep.efa_totals.items()):
            parts = ", ".join(
                f"{k} {_human_bytes(v) if k.endswith('bytes') else v}" for k, v in totals.items()
            )
            out.append(f"  {node}: {parts}")
    else:
        out.append("EFA counters: none recorded")
    if rep.logs:
        out.append("logs: " + " ".join(rep.logs))
    if rep.goodput:
        from slurmfm.observe.goodput import render

        out.extend(render(rep.goodput))
    for note in rep.notes:
        out.append(f"note: {note}")
    from slurmfm.observe.logs import visible

    # what the job's files said (reasons, NCCL lines) reaches the terminal without escapes
    return visible("\n".join(out) + "\n")
