"""The goodput ledger of ``slurmfm report``: where a run's hours went, and its ETTR.

Why a separate module: the arithmetic is the job runtime's (:mod:`slurmfm.job.goodput`, the
node agent exports the same numbers to Prometheus); this module only gathers its inputs after
the fact, for every job id of the run (the submission history groups them by run id): each
job's state file, its progress history (``<job>.observe/progress.jsonl``, or beside the
launch evidence when observability is off), the submission time (the history's, and Slurm's
``SubmitTime`` while the job was never requeued: a requeue resets it,
https://slurm.schedmd.com/sacct.html#OPT_Submit) and Slurm's ``EndTime`` for an attempt that
could not record its end. Every file is read with the job user's ownership checks
(:mod:`slurmfm.job.fsafe`), as the rest of the report.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from slurmfm.job import fsafe
from slurmfm.job import goodput as gp
from slurmfm.job.state import events, state_name
from slurmfm.job.state import find as find_state

_RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"}
_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
_LABELS = {
    "queued": "queued",
    "startup": "start-up",
    "productive": "productive training",
    "checkpoint": "checkpoint saves",
    "detection": "failure detection",
    "restart": "restart after failure",
    "recomputed": "recomputed steps",
    "requeue_wait": "requeue waits",
    "idle": "between jobs",
    "other": "other (ends of launches)",
}


def progress_history(log_dir: Path, name: str, job_id: str, uid: int | None) -> list[gp.Progress]:
    """A job's progress history: the observe directory's, else the evidence directory's."""
    base = f"{name}_{job_id}"
    for sub in ("observe", "evidence"):
        d = fsafe.find_dir(str(log_dir / f"{base}.{sub}"), uid)
        if d is None:
            continue
        text = fsafe.read_text(gp.history_path(str(Path(d) / "progress.json")), uid, 64 << 20)
        if text:
            return gp.parse_history(text)
    return []


def _job(
    job_id: str, log_dir: Path, name: str, uid: int | None, submitted: float | None
) -> tuple[gp.Job, list[gp.Progress]]:
    found, _ = find_state(str(log_dir / state_name(name, job_id)), uid)
    text = (fsafe.read_text(found, uid, 16 << 20) if found else None) or ""
    job = gp.Job(job_id, submitted, tuple(gp.attempts(job_id, events(text))))
    return job, progress_history(log_dir, name, job_id, uid)


def run_jobs(job_id: str, history: list[Any], log_dir: str | None = None) -> list[Any]:
    """The submissions of ``job_id``'s run up to it, oldest first: those of its run id, log
    directory and checkpoint directory (one lineage of checkpoints), the job alone without a
    run id.

    A job id names a job only within one cluster's current numbering: a cluster rebuilt (or
    another cluster, or a lab brought up afresh) numbers from the start again, so the history
    can hold older submissions with the same id. The job's own is the newest one with that id
    (in ``log_dir`` where given): an older one made a ledger span another run's half hour.
    Within the lineage, too, each id is taken once (its newest submission): a job's state file
    is named by its id in the log directory, so an older submission of the same id, in the same
    directories (the run started again there on a cluster that numbers afresh), would read the
    same file again and count its attempts and failures twice."""
    same_id = [s for s in history if s.job_id == job_id]
    if log_dir is not None and any(s.log_dir == log_dir for s in same_id):
        same_id = [s for s in same_id if s.log_dir == log_dir]
    mine = max(same_id, key=lambda s: s.submitted_at, default=None)
    if mine is None or not mine.run_id:
        return [mine] if mine is not None else []

    def lineage(s: Any) -> tuple[str, str, str]:
        return (s.run_id, s.log_dir, s.checkpoint_dir)

    newest: dict[str, Any] = {}  # job id -> its newest submission (a later one replaces it)
    for s in sorted(history, key=lambda s: s.submitted_at):
        if lineage(s) == lineage(mine) and s.submitted_at <= mine.submitted_at:
            newest[s.job_id] = s
    newest[job_id] = mine
    return sorted(newest.values(), key=lambda s: (s.submitted_at, s.job_id))


def build(
    job_id: str,
    *,
    record: dict[str, str],
    log_dir: Path,
    name: str,
    uid: int | None,
    history: list[Any] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The ledger of ``job_id``'s run (every job id of its run id), with checkpoint advice."""
    now = time.time() if now is None else now
    if history is None:
        from slurmfm.history import HistoryError
        from slurmfm.history import read as read_history

        try:
            history = list(read_history())
        except HistoryError:
            history = []
    subs = run_jobs(job_id, history, str(log_dir)) or []
    jobs: list[gp.Job] = []
    progress: list[gp.Progress] = []
    state = record.get("JobState", record.get("State", "")).split()[0:1]
    slurm_state = state[0] if state else ""
    for sub in subs or [None]:
        jid = sub.job_id if sub is not None else job_id
        submitted = gp.epoch(sub.submitted_at) if sub is not None else None
        directory, jname = log_dir, name
        if sub is not None and jid != job_id:
            directory, jname = Path(sub.log_dir or log_dir), sub.name or name
        if jid == job_id and (record.get("Restarts", "0") or "0") == "0":
            slurm_submit = gp.epoch(record.get("SubmitTime", ""))
            if slurm_submit is not None:
                submitted = min(submitted or slurm_submit, slurm_submit)
        job, recs = _job(jid, directory, jname, uid, submitted)
        if jid == job_id:
            end = (
                None if slurm_state in _RUNNING | _PENDING else gp.epoch(record.get("EndTime", ""))
            )
            job = job._replace(end=end, waiting=slurm_state in _PENDING)
        jobs.append(job)
        progress.extend(recs)
    led = gp.ledger(jobs, progress, now)
    led["run_id"] = next((s.run_id for s in subs if s.run_id), "")
    a = gp.advice(
        led.get("save_s"), led.get("failure_interval_s"), led.get("interval_s"), led.get("step_s")
    )
    led["advice"] = a
    led["advice_text"] = gp.advice_line(a, led.get("interval_steps")) if a else ""
    return led


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render(led: dict[str, Any]) -> list[str]:
    """The ledger as a small table for ``slurmfm report``."""
    if not led or not led.get("wall_s"):
        return ["goodput: nothing recorded (no state file)"]
    ettr = led.get("ettr")
    jobs = led.get("jobs", [])
    head = "goodput"
    if led.get("run_id"):
        head += f" of run {led['run_id']}"
    head += (
        f" (job{'s' if len(jobs) != 1 else ''} {', '.join(jobs)}; {led.get('attempts', 0)} "
        f"attempt(s), {len(led.get('failures', []))} failure(s)): ETTR "
        + (f"{100 * ettr:.1f} %" if ettr is not None else "not measurable")
    )
    wall = float(led["wall_s"])
    out = [head, f"  {'part':<26} {'time':>9} {'share':>7}"]
    for part in gp.PARTS:
        v = float(led["parts"].get(part, 0.0))
        if v <= 0 and part != "productive":
            continue
        out.append(f"  {_LABELS[part]:<26} {_clock(v):>9} {100 * v / wall:6.1f} %")
    out.append(f"  {'wall time':<26} {_clock(wall):>9} {100.0:6.1f} %")
    for i, f in enumerate(led.get("failures", []), 1):
        lost = sum(float(f[p]) for p in gp.FAILURE_PARTS)
        at = time.strftime("%H:%M:%S", time.gmtime(float(f["at"])))
        out.append(
            f"  failure {i} (job {f['job']}, attempt {f['attempt']}, {at}Z): lost "
            f"{_clock(lost)}: detection {f['detection']:.0f} s, restart {f['restart']:.0f} s, "
            f"recomputed {f['recomputed']:.0f} s ({f['recomputed_steps']} steps), requeue "
            f"wait {f['requeue_wait']:.0f} s"
        )
        if f.get("reason"):
            out.append(f"    {f['reason']}")
    if led.get("save_s") is not None:
        line = f"  checkpoints: a save takes {gp.hours(led['save_s'])} (median of {led['saves']})"
        if led.get("interval_s"):
            line += f", one every {gp.hours(led['interval_s'])}"
            if led.get("interval_steps"):
                line += f" ({led['interval_steps']} steps)"
        out.append(line)
    if led.get("advice_text"):
        out.append(f"  advice: {led['advice_text']}")
    out.extend(f"  note: {n}" for n in led.get("notes", []))
    return out


# ------------------------------------------------------------- advice at validate


def save_interval_iters(recipe: Any) -> int | None:
    """The launcher's own periodic save interval in steps (Megatron-LM's ``--save-interval``:
    slurmfm.launchers, ``save_interval``), None where the training script decides."""
    from slurmfm.launchers import spec

    return spec(recipe.launcher.kind).save_interval(recipe)


def last_run(recipe: Any, history: list[Any] | None = None) -> dict[str, Any]:
    """The ledger of the newest job of the recipe's run (run id and checkpoint directory), {}
    without one: its observed save time and time per iteration."""
    from slurmfm.history import HistoryError
    from slurmfm.history import read as read_history

    try:
        subs = list(read_history()) if history is None else history
    except HistoryError:
        return {}
    mine = [
        s
        for s in subs
        if s.run_id == recipe.run_id and s.checkpoint_dir == recipe.checkpoint_dir and s.log_dir
    ]
    if not mine:
        return {}
    newest = max(mine, key=lambda s: (s.submitted_at, s.job_id))
    try:
        return build(
            newest.job_id,
            record={},
            log_dir=Path(newest.log_dir),
            name=newest.name,
            uid=None,
            history=subs,
        )
    except (OSError, ValueError):
        return {}


def validate_advice(recipe: Any, observed: dict[str, Any] | None = None) -> list[str]:
    """What ``slurmfm validate`` says of a Megatron recipe's ``--save-interval`` when its
    ``resilience.expected_failure_interval`` is stated: the Young/Daly interval (see
    :func:`slurmfm.job.goodput.optimum`) from the save time C the last run of this run id
    measured, else the estimate from ``resilience.model_params_b`` at
    ``storage.write_mb_s``; with the last run's time per iteration, what the gap costs."""
    m = recipe.resilience.expected_failure_interval_s
    from slurmfm.launchers import spec

    arg = spec(recipe.launcher.kind).save_interval_arg
    if m is None or arg is None:
        return []
    observed = observed or {}
    iters = save_interval_iters(recipe)
    every = f"{arg} {iters}" if iters else f"no {arg} (no periodic saves)"
    step_s = observed.get("step_s")
    c, source = observed.get("save_s"), f"measured by job {', '.join(observed.get('jobs', []))}"
    if not c:
        c = recipe.save_estimate_s
        source = "estimated: resilience.model_params_b at storage.write_mb_s"
    head = f"checkpoint interval ({every})"
    if not c:
        examples = ", ".join(
            f"{gp.hours(gp.optimum(save, m))} for a {gp.hours(save)} save" for save in (60, 600)
        )
        return [
            f"{head}: Young/Daly's optimum sqrt(2*C*M) needs the save time C "
            f"(resilience.model_params_b, or a first run): {examples}"
        ]
    a = gp.advice(c, m, iters * step_s if iters and step_s else None, step_s)
    if a is None:  # pragma: no cover - c and m are positive here
        return []
    out = [f"{head}: {gp.advice_line(a, iters)} (save time {source})"]
    if not step_s:
        best = a["optimum_s"]
        out.append(
            f"  {every} is that interval when an iteration takes {gp.hours(best / iters)}"
            if iters
            else f"  set {arg} to {gp.hours(best)} of iterations"
        )
    return out
