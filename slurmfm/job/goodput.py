"""Where a run's hours went: the goodput ledger and ETTR, from what the job already records.

Why here, in the job runtime (standard library, Python 3.8): the node agent exports the ledger
to Prometheus from inside the job (:mod:`.agent`), and ``slurmfm report`` shows the same
numbers after it; one piece of arithmetic serves both, so they never disagree.

ETTR (effective training time ratio) is productive training time over wall time, where wall
time runs from the run's first submission to its end (or now) and counts queueing, start-up,
failures, restarts, recomputed steps and requeue waits (the measure of the ML-cluster
reliability literature; Meta's Llama 3 report, ByteDance's ByteRobust, arXiv 2509.16293).

The inputs, all recorded by the job as it runs:

* the state file (:mod:`.state`): each attempt's ``start``, each in-job ``relaunch``, and how
  the attempt ended (``finished``, ``requeue``, ``fail``, ``give-up``, ``stop``; a ``signal``
  before a requeue is the pre-timeout save: a planned requeue, not a failure);
* the progress history (:func:`history_path`): one JSON line per progress report that was
  written (``slurmfm.checkpoint.report_progress``), with the training process's pid, and for a
  checkpoint the step and how long the save took;
* the submission time (the submission history, or Slurm's ``SubmitTime``).

The timeline is cut into parts that sum to the wall time exactly (a cursor that only moves
forward; the unit tests check it with hypothesis on arbitrary records):

``queued``
    submission to the first batch start;
``startup``
    a batch start (the first, or one after a planned requeue) to the first progress;
``productive``
    training whose steps were kept, less checkpoint saves;
``checkpoint``
    saves of kept steps, where the progress history has their duration;
``detection``
    a failure's last progress to the runtime's relaunch or requeue (for a requeue Slurm did
    without the runtime, to the next start);
``restart``
    from a failure's detection to training again (the next first progress), requeue waits
    aside;
``recomputed``
    training after the checkpoint the next launch resumed from, done again;
``requeue_wait``
    an attempt's end to the next attempt's start (credential wait and queue);
``idle``
    between one job of a run and the next submission of it;
``other``
    the rest (the end of a launch after its last progress: saving and exiting).

Resolution: state-file times are whole seconds, progress times are exact; progress reports are
throttled (5 s by default), so the split between ``recomputed`` and ``detection`` is as exact
as the last report before a failure, while ``productive`` (up to the checkpoint resumed from,
always reported at once) is not affected.
"""

from __future__ import annotations

import calendar
import json
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

PARTS = (
    "queued",
    "startup",
    "productive",
    "checkpoint",
    "detection",
    "restart",
    "recomputed",
    "requeue_wait",
    "idle",
    "other",
)
FAILURE_PARTS = ("detection", "restart", "recomputed", "requeue_wait")
# A run's last attempt ends with one of these; ``restart`` is what the next attempt writes.
_ENDS = ("finished", "requeue", "fail", "give-up", "stop")
_BIG_HISTORY = 16 << 20


class Progress(NamedTuple):
    """One line of the progress history."""

    time: float
    step: int
    pid: int = 0
    job: str = ""
    restart: int = 0
    checkpoint: int | None = None  # the step saved, on a save's report
    save_s: float | None = None  # how long that save took


class Attempt(NamedTuple):
    """One start of the batch script (restart N of a job id), from the state file."""

    job: str
    restart: int
    start: float
    end: float | None  # the terminal event's time; None when none was written
    outcome: str  # finished, requeue, fail, give-up, stop, running
    reason: str
    planned: bool  # ended by the pre-timeout save signal, not by a failure
    relaunches: tuple[tuple[float, str], ...] = ()  # (time, why) of in-job relaunches
    last_seen: float = 0.0  # the newest event of this attempt


class Job(NamedTuple):
    """One job id of a run: when it was submitted and its attempts."""

    job: str
    submitted: float | None
    attempts: tuple[Attempt, ...]
    end: float | None = None  # Slurm's end time, for an attempt that wrote no end
    waiting: bool = False  # pending in the queue now (requeued, not started again yet)


def history_path(progress_file: str) -> str:
    """The progress history beside ``progress_file``: ``progress.json`` -> ``progress.jsonl``."""
    return progress_file + "l" if progress_file.endswith(".json") else progress_file + ".jsonl"


def history_line(
    now: float,
    step: int,
    env: dict[str, str],
    pid: int,
    checkpoint: int | None = None,
    save_s: float | None = None,
) -> str:
    """The line :func:`parse_history` reads back (written by ``report_progress``)."""
    rec: dict[str, Any] = {
        "t": round(now, 3),
        "step": int(step),
        "pid": pid,
        "job": env.get("SLURM_JOB_ID", ""),
        "restart": int(env.get("SLURMFM_RESTART") or env.get("SLURM_RESTART_COUNT") or 0),
    }
    if checkpoint is not None:
        rec["ckpt"] = int(checkpoint)
    if save_s is not None:
        rec["save_s"] = round(max(0.0, save_s), 3)
    return json.dumps(rec, sort_keys=True) + "\n"


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def parse_history(text: str) -> list[Progress]:
    """The records of a progress history, in time order; a line that does not parse is skipped
    (a report cut short by a kill, or anything else)."""
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict):
            continue
        t, step = _num(d.get("t")), _num(d.get("step"))
        if t is None or step is None:
            continue
        ck, save = _num(d.get("ckpt")), _num(d.get("save_s"))
        pid, restart = _num(d.get("pid")), _num(d.get("restart"))
        out.append(
            Progress(
                t,
                int(step),
                int(pid or 0),
                str(d.get("job", "")),
                int(restart or 0),
                None if ck is None else int(ck),
                None if save is None else max(0.0, save),
            )
        )
    out.sort(key=lambda p: p.time)
    return out


def epoch(stamp: str) -> float | None:
    """Seconds since the epoch of a state-file or Slurm time (``...Z`` is UTC)."""
    text = stamp.strip()
    for fmt, utc in (("%Y-%m-%dT%H:%M:%SZ", True), ("%Y-%m-%dT%H:%M:%S", False)):
        try:
            parsed = time.strptime(text, fmt)
        except ValueError:
            continue
        return float(calendar.timegm(parsed) if utc else time.mktime(parsed))
    return None


def attempts(job: str, events: Sequence[Any]) -> list[Attempt]:
    """The attempts of one job from its state-file events (:func:`.state.events`)."""
    found: dict[int, dict[str, Any]] = {}
    for e in events:
        t = epoch(e.time)
        if t is None:
            continue
        a = found.setdefault(
            e.restart,
            {
                "start": None,
                "end": None,
                "outcome": "running",
                "reason": "",
                "signal": False,
                "relaunches": [],
                "last": t,
            },
        )
        a["last"] = max(a["last"], t)
        if e.event == "start" and a["start"] is None:
            a["start"] = t
        elif e.event == "signal":
            a["signal"] = True
        elif e.event == "relaunch":
            a["relaunches"].append((t, e.detail))
        elif e.event in _ENDS:
            a["end"], a["outcome"], a["reason"] = t, e.event, e.detail
        elif e.event == "restart" and e.restart - 1 in found:
            prev = found[e.restart - 1]
            if prev["outcome"] in ("running", "stop"):
                prev["outcome"] = "requeue"
                prev["reason"] = e.detail
    out = []
    for n in sorted(found):
        a = found[n]
        start = a["start"] if a["start"] is not None else a["last"]
        planned = a["signal"] and a["outcome"] in ("requeue", "finished")
        out.append(
            Attempt(
                job,
                n,
                start,
                a["end"],
                a["outcome"],
                a["reason"],
                planned,
                tuple(a["relaunches"]),
                a["last"],
            )
        )
    return out


class _Cursor:
    """Cuts the timeline into parts: every second between ``t0`` and the last ``add`` is
    counted once, so the parts always sum to the wall time."""

    def __init__(self, t0: float) -> None:
        self.t0 = self.now = t0
        self.parts = dict.fromkeys(PARTS, 0.0)
        self.failures: list[dict[str, Any]] = []

    def add(self, part: str, until: float, failure: int | None = None) -> None:
        if until <= self.now:
            return
        dur = until - self.now
        self.now = until
        self.parts[part] += dur
        if failure is not None and part in FAILURE_PARTS:
            self.failures[failure][part] += dur

    def fail(self, at: float, reason: str, job: str, restart: int, steps: int = 0) -> int:
        rec: dict[str, Any] = {"at": at, "reason": reason, "job": job, "attempt": restart}
        rec.update(dict.fromkeys(FAILURE_PARTS, 0.0))
        rec["recomputed_steps"] = steps
        self.failures.append(rec)
        return len(self.failures) - 1


def _launches(att: Attempt, end: float) -> list[tuple[float, float, str]]:
    """(start, end, why it ended) of each launch of an attempt; "" for the attempt's end."""
    bounds = [att.start] + [t for t, _ in att.relaunches] + [end]
    whys = [w for _, w in att.relaunches] + [""]
    return [(bounds[i], max(bounds[i], bounds[i + 1]), whys[i]) for i in range(len(whys))]


def _assign(records: Sequence[Progress], starts: Sequence[float]) -> list[list[Progress]]:
    """The records of one attempt per launch (``starts``: each launch's start).

    By time; a relaunch's time is whole seconds, truncated, so a report of the launch before
    it in that same second is kept with the process (pid) that wrote it.
    """
    out: list[list[Progress]] = [[] for _ in starts]
    for p in sorted(records, key=lambda r: r.time):
        i = max([k for k, s in enumerate(starts) if s <= p.time] or [0])
        same = i > 0 and out[i - 1] and out[i - 1][-1].pid == p.pid
        if same and p.time - starts[i] < 1.0 and (not out[i] or out[i][-1].pid == p.pid):
            i -= 1
        out[i].append(p)
    return out


def _attempt_end(job: Job, att: Attempt, last_attempt: bool, now: float) -> float:
    """When an attempt ended: its recorded end, else (the run's last attempt) the job's end or
    ``now`` while it runs, else the last time it was seen."""
    if att.end is not None:
        return att.end
    if last_attempt and att.outcome == "running":
        return job.end if job.end is not None else now
    return job.end if (last_attempt and job.end is not None) else att.last_seen


def _count_saves(
    cur: _Cursor,
    recs: Sequence[Progress],
    kept_until: float,
    saves: list[float],
    intervals: list[tuple[float, int]],
) -> None:
    """A launch's kept saves: the time each took (``checkpoint``, before it ``productive``)
    added to ``cur``, each save's seconds to ``saves``, and (seconds, steps) between two saves
    to ``intervals``."""
    prev: Progress | None = None
    for p in recs:
        if p.time > kept_until:
            break
        if p.checkpoint is None:
            continue
        if p.save_s is not None:
            cur.add("productive", p.time - p.save_s)
            cur.add("checkpoint", p.time)
            saves.append(p.save_s)
        if prev is not None and p.checkpoint > (prev.checkpoint or 0):
            gap = p.checkpoint - (prev.checkpoint or 0)
            intervals.append((p.time - prev.time, gap))
        prev = p


def _summary(
    cur: _Cursor,
    t0: float,
    jobs: Sequence[Job],
    trained: list[list[Progress]],
    saves: list[float],
    intervals: list[tuple[float, int]],
) -> dict[str, Any]:
    """The ledger's figures from its accounted parts (:func:`ledger`)."""
    wall = cur.now - t0
    productive = cur.parts["productive"]
    notes: list[str] = []
    if not trained:
        notes.append("no progress history: productive time not measurable")
    ettr = min(1.0, max(0.0, productive / wall)) if wall > 0 and trained else None
    in_alloc = wall - cur.parts["queued"] - cur.parts["idle"] - cur.parts["requeue_wait"]
    steps_kept = _steps_kept(trained)
    step_s = (productive / steps_kept) if steps_kept > 0 else None
    # the interval in use: measured between two saves of one launch, else from the steps
    # between saves (a save interval is set in steps) at the run's time per step
    saved = sorted({p.checkpoint for recs in trained for p in recs if p.checkpoint is not None})
    every = _median_int([saved[i + 1] - saved[i] for i in range(len(saved) - 1)])
    interval = _median([s for s, _ in intervals])
    if interval is None and every and step_s:
        interval = every * step_s
    return {
        "start": t0,
        "end": cur.now,
        "wall_s": wall,
        "ettr": ettr,
        "parts": cur.parts,
        "failures": cur.failures,
        "attempts": sum(len(j.attempts) for j in jobs),
        "jobs": [j.job for j in jobs],
        "steps": steps_kept,
        "step_s": step_s,
        "save_s": _median(saves),
        "saves": len(saves),
        "interval_s": interval,
        "interval_steps": _median_int([n for _, n in intervals]) or every,
        "failure_interval_s": (in_alloc / len(cur.failures)) if cur.failures else None,
        "notes": notes,
    }


def ledger(
    jobs: Sequence[Job],
    progress: Sequence[Progress],
    now: float,
) -> dict[str, Any]:
    """The goodput ledger of a run: its parts (seconds), failures, ETTR and what checkpoints
    cost. ``jobs`` in submission order; ``now`` ends a run that is still running. Pure: no
    clock, no files."""
    jobs = [j for j in jobs if j.attempts]
    if not jobs:
        return {
            "wall_s": 0.0,
            "ettr": None,
            "parts": dict.fromkeys(PARTS, 0.0),
            "failures": [],
            "notes": ["no attempt recorded"],
        }
    first = jobs[0]
    t0 = first.attempts[0].start
    if first.submitted is not None:
        t0 = min(t0, first.submitted)
    cur = _Cursor(t0)
    ordered = sorted(progress, key=lambda r: r.time)
    # what the time until the next first progress is lost to: None (start-up) or a failure
    pending: int | None = None
    unobserved: int | None = None  # a failure whose end only the next start shows
    trained: list[list[Progress]] = []
    saves: list[float] = []
    intervals: list[tuple[float, int]] = []  # (seconds, steps) between kept saves
    for ji, job in enumerate(jobs):
        if ji > 0 and job.submitted is not None:
            cur.add("idle", job.submitted)
        cur.add("queued", job.attempts[0].start)
        for ai, att in enumerate(job.attempts):
            if ai > 0:
                if unobserved is not None:
                    cur.add("detection", att.start, unobserved)
                else:
                    cur.add("requeue_wait", att.start, pending)
            unobserved = None
            last_attempt = ji == len(jobs) - 1 and ai == len(job.attempts) - 1
            launches = _launches(att, _attempt_end(job, att, last_attempt, now))
            mine = [p for p in ordered if p.job in ("", job.job) and p.restart == att.restart]
            per_launch = _assign(mine, [s for s, _, _ in launches])
            for li, (_, ends, why) in enumerate(launches):
                recs = per_launch[li]
                last_launch = li == len(launches) - 1
                l_end = max(ends, recs[-1].time) if recs else ends
                if recs:
                    trained.append(recs)
                if not last_launch:
                    failed, reason = True, why
                else:
                    reason = att.reason or att.outcome
                    failed = not att.planned and (
                        att.outcome in ("requeue", "fail", "give-up")
                        or (att.outcome in ("running", "stop") and not last_attempt)
                    )
                resumed: int | None = None
                if recs:
                    kept_until, resumed = _kept(recs, ordered)
                    cur.add("restart" if pending is not None else "startup", recs[0].time, pending)
                    _count_saves(cur, recs, kept_until, saves, intervals)
                    cur.add("productive", kept_until)
                    pending = None
                if not failed:
                    cur.add(
                        "other" if recs else ("restart" if pending is not None else "startup"),
                        l_end,
                        pending,
                    )
                    continue
                steps = recs[-1].step - resumed if recs and resumed is not None else 0
                k = cur.fail(l_end, reason, job.job, att.restart, max(0, steps))
                if recs:
                    cur.add("recomputed", recs[-1].time, k)
                    cur.add("detection", l_end, k)
                    pending = k
                else:
                    cur.add("restart" if pending is not None else "startup", l_end, pending)
                    if pending is None:
                        pending = k
                if last_launch and att.end is None and not last_attempt:
                    unobserved = k
    if _running(jobs):
        cur.add("other", now)
    elif jobs[-1].waiting:
        cur.add("requeue_wait", now, pending)
    elif jobs[-1].end is not None:
        cur.add("other", jobs[-1].end)  # the allocation ends when the batch script has exited
    return _summary(cur, t0, jobs, trained, saves, intervals)


def _running(jobs: Sequence[Job]) -> bool:
    last = jobs[-1].attempts[-1]
    return last.outcome == "running" and last.end is None and jobs[-1].end is None


def _kept(recs: Sequence[Progress], ordered: Sequence[Progress]) -> tuple[float, int | None]:
    """Until when a launch's training was kept, and the step the next launch resumed from.

    The next report after the launch's last one (a later launch's first) is the step after the
    one it resumed from; the launch's report of that step (a checkpoint's report is written at
    once) ends what was kept. With no later report everything up to the last one was kept.
    """
    later = [p for p in ordered if p.time > recs[-1].time]
    if not later:
        return (recs[-1].time, None)
    resumed = later[0].step - 1
    if resumed < recs[0].step:
        return (recs[0].time, resumed)
    saved = [p for p in recs if p.checkpoint == resumed]
    if saved:
        return (saved[0].time, resumed)
    reached = [p for p in recs if p.step >= resumed]
    return ((reached[0].time if reached else recs[-1].time), resumed)


def _steps_kept(launches: Sequence[Sequence[Progress]]) -> int:
    """Steps trained and kept: the last step reported minus the step the first launch began
    after."""
    if not launches:
        return 0
    first = launches[0][0].step - 1
    last = max(p.step for recs in launches for p in recs)
    return max(0, last - first)


def _median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2.0


def _median_int(values: Sequence[int]) -> int | None:
    m = _median([float(v) for v in values])
    return None if m is None else round(m)


# ----------------------------------------------------------------- checkpoint interval


def waste(interval_s: float, save_s: float, failure_interval_s: float) -> float:
    """The share of time a checkpoint interval costs, to first order: ``C/tau`` in saves
    plus ``(tau + C)/(2M)`` recomputed after a failure (on average half an interval of work
    and its save is lost). Young (1974), the model :func:`optimum` minimises."""
    if interval_s <= 0 or failure_interval_s <= 0:
        return 1.0
    return min(1.0, save_s / interval_s + (interval_s + save_s) / (2.0 * failure_interval_s))


def optimum(save_s: float, failure_interval_s: float) -> float:
    """The checkpoint interval (compute seconds between saves) that wastes least.

    J. W. Young, "A first order approximation to the optimum checkpoint interval",
    Communications of the ACM 17(9):530-531, 1974: ``sqrt(2 C M)`` for a save time ``C`` and
    a mean time between failures ``M``. J. T. Daly, "A higher order estimate of the optimum
    checkpoint interval for restart dumps", Future Generation Computer Systems 22(3):303-312,
    2006, refines it for ``C`` that is not small against ``M``:
    ``sqrt(2CM) * (1 + sqrt(C/(2M))/3 + C/(18M)) - C`` when ``C < 2M``, else ``M``; that is
    the value returned (it equals Young's when ``C`` is much smaller than ``M``).
    """
    c, m = max(0.0, save_s), max(1e-9, failure_interval_s)
    if c >= 2.0 * m:
        return m
    young = math.sqrt(2.0 * c * m)
    return max(young * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c, 1e-9)


def advice(
    save_s: float | None,
    failure_interval_s: float | None,
    interval_s: float | None,
    step_s: float | None = None,
) -> dict[str, Any] | None:
    """Young/Daly's interval next to the one in use and what the gap costs, or None when the
    save time or the failure interval is not known."""
    if not save_s or not failure_interval_s or save_s <= 0 or failure_interval_s <= 0:
        return None
    best = optimum(save_s, failure_interval_s)
    out: dict[str, Any] = {
        "save_s": save_s,
        "failure_interval_s": failure_interval_s,
        "young_s": math.sqrt(2.0 * save_s * failure_interval_s),
        "optimum_s": best,
        "optimum_steps": round(best / step_s) if step_s else None,
        "interval_s": interval_s,
        "waste_optimum": waste(best, save_s, failure_interval_s),
        "waste_now": None,
        "ettr_gain": None,
    }
    if interval_s and interval_s > 0:
        out["waste_now"] = waste(interval_s, save_s, failure_interval_s)
        out["ettr_gain"] = max(0.0, out["waste_now"] - out["waste_optimum"])
    return out


def hours(seconds: float) -> str:
    """A short duration: ``45 s``, ``12 min``, ``4.7 h``."""
    if seconds < 10:
        return "%.2g s" % seconds
    if seconds < 90:
        return "%.0f s" % seconds
    if seconds < 5400:
        return "%.0f min" % (seconds / 60.0)
    return "%.1f h" % (seconds / 3600.0)


def advice_line(a: dict[str, Any], interval_steps: int | None = None) -> str:
    """One sentence of advice, e.g. "saving every 500 steps (4.7 h) at one failure per
    6.0 h and 2 min per save: Young/Daly's optimum is about 1.2 h (130 steps), which would
    lose 9.1 points of ETTR less"."""
    fail = "one failure per %s" % hours(a["failure_interval_s"])
    save = "%s per save" % hours(a["save_s"])
    best = "Young/Daly's optimum sqrt(2*C*M) is about %s" % hours(a["optimum_s"])
    if a.get("optimum_steps"):
        best += " (%d steps)" % a["optimum_steps"]
    if not a.get("interval_s"):
        return "at %s and %s: %s" % (fail, save, best)
    every = "saving every "
    every += (
        ("%d steps (%s)" % (interval_steps, hours(a["interval_s"])))
        if interval_steps
        else (hours(a["interval_s"]))
    )
    gain = a.get("ettr_gain") or 0.0
    if gain < 0.005:
        return "%s at %s and %s: close to %s" % (every, fail, save, best)
    return "%s at %s and %s: %s, which would lose %.1f points of ETTR less" % (
        every,
        fail,
        save,
        best,
        100.0 * gain,
    )
