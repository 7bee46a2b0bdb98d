"""What the job asks of Slurm: requeue itself, drain or down a node, probe the nodes.

Every call goes through an injected runner so the unit tests can stand in for Slurm.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from .health import run_command

if TYPE_CHECKING:
    from .health import Runner


def self_id(env: dict[str, str]) -> str:
    """The id ``scontrol requeue`` must get: ``ARRAYID_TASKID`` for an array task.

    An array task's SLURM_JOB_ID can be the array's own id, which scontrol takes as every task
    of the array, finished ones included (seen on 22.05, 24.11 and 26.05:
    tests/e2e/test_dependencies.py).
    """
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return "{}_{}".format(env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"])
    return env.get("SLURM_JOB_ID", "0")


def controller_up(run: Runner = run_command, timeout_s: float = 20.0) -> bool:
    """``scontrol ping``: does slurmctld answer? (Any user may ask.)"""
    rc, out = run(["scontrol", "ping"], timeout_s)
    return rc == 0 and "UP" in out


class Retry(NamedTuple):
    """How a state-changing ``scontrol`` call is retried while slurmctld does not answer.

    Why retried at all: slurmctld may be away for a moment (a restart, a failover), and a
    requeue that fails then would end the job with restarts left. A failure
    that says slurmctld cannot be reached (see :data:`AWAY`) is retried with a doubling delay
    (``delay_s`` up to ``max_delay_s``) for ``away_s`` in all, minutes rather than the 30 s
    a slurmctld restart or failover can outlast; any other failure ``tries``
    times. ``sleep`` is injected so the unit tests wait for nothing.
    """

    tries: int = 3
    delay_s: float = 10.0
    timeout_s: float = 30.0
    sleep: Callable[[float], None] = time.sleep
    away_s: float = 600.0
    max_delay_s: float = 60.0


DEFAULT_RETRY = Retry()

# What scontrol says when slurmctld does not answer (SchedMD/slurm src/common/slurm_errno.c:
# SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR "Unable to contact slurm controller (connect
# failure)", SLURM_COMMUNICATIONS_* "Socket timed out on send/recv operation") or a call the
# runner timed out (exit 124).
AWAY = ("Unable to contact slurm controller", "Socket timed out", "Connection refused")


def _away(rc: int, out: str) -> bool:
    return rc == 124 or any(a in out for a in AWAY)


def _retried(argv: Sequence[str], run: Runner, retry: Retry) -> tuple[bool, str]:
    """Run an ``scontrol`` call until it succeeds: while slurmctld is away, with a doubling
    delay for ``retry.away_s`` in all; otherwise at most ``retry.tries`` times,
    ``retry.delay_s`` apart; (succeeded, last output)."""
    out = ""
    waited = 0.0
    delay = retry.delay_s
    i = 0
    while True:
        rc, out = run(list(argv), retry.timeout_s)
        if rc == 0:
            return True, out
        i += 1
        if _away(rc, out):
            if waited + delay > retry.away_s and i >= retry.tries:
                return False, out
        elif i >= max(1, retry.tries):
            return False, out
        retry.sleep(delay)
        waited += delay
        delay = min(delay * 2, retry.max_delay_s) if _away(rc, out) else retry.delay_s


def requeue(job: str, run: Runner = run_command, retry: Retry = DEFAULT_RETRY) -> tuple[bool, str]:
    """``scontrol requeue JOB``, retried while slurmctld does not answer."""
    ok, out = _retried(["scontrol", "requeue", job], run, retry)
    return (True, "") if ok else (False, _last(out, "scontrol requeue"))


_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_record(text: str) -> dict[str, str]:
    """One ``scontrol show -o`` record (``Key=Value`` pairs) as ``{Key: value}``; the one
    parser of scontrol records, the submitting side's too.

    A key is a word followed by ``=``; its value runs to the next `` Key=``, so a value may
    hold spaces: ``Reason=launch failed requeued held``, ``Reason=Node down (by admin)``,
    ``Command=/path with space`` (split on spaces, the runtime once read the first as
    ``launch``). The first of a repeated key wins: Slurm prints its own fields before the
    free text a user sets (``Comment``, ``Command``, paths), so a ``JobState=`` inside those
    cannot replace the real one.
    """
    out: dict[str, str] = {}
    matches = list(_KEY.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        out.setdefault(m.group(1), text[m.end() : end].strip())
    return out


_NODE_SPLIT = re.compile(r"(?:^|\s)(?=NodeName=)")


def node_records(text: str) -> list[dict[str, str]]:
    """The records of ``scontrol show node`` output, one line per node (``-o``) or the
    default multi-line form: split at each ``NodeName=``, then :func:`parse_record`."""
    return [parse_record(r) for r in _NODE_SPLIT.split(text) if r.startswith("NodeName=")]


def job_record(job: str, run: Runner = run_command, timeout_s: float = 30.0) -> dict[str, str]:
    """``scontrol show job -o JOB`` as ``{Key: value}`` (empty when scontrol fails); a
    heterogeneous job's first line, component 0 (where the batch step runs)."""
    rc, out = run(["scontrol", "show", "job", "-o", job], timeout_s)
    if rc != 0 or not out.strip():
        return {}
    return parse_record(out.strip().splitlines()[0])


def user_id(rec: dict[str, str]) -> int | None:
    """The job's user id from a record's ``UserId=name(uid)`` (None: not reported)."""
    m = re.search(r"\((\d+)\)$", rec.get("UserId", ""))
    return int(m.group(1)) if m else None


def _last(out: str, what: str) -> str:
    """The last line scontrol printed, or ``WHAT failed``."""
    return out.strip().splitlines()[-1] if out.strip() else what + " failed"


def _listed(value: str) -> bool:
    return bool(value) and value not in ("(null)", "None")


def requeue_excluding(
    job: str, nodes: Sequence[str], run: Runner = run_command, retry: Retry = DEFAULT_RETRY
) -> tuple[bool, str, str]:
    """Requeue ``job`` so that it cannot start again on ``nodes``; (requeued, why, note).

    A job owner who may not drain a node can still keep the requeued job off it:
    ``scontrol requeuehold`` (the job is pending and held, so it cannot start before the
    change), ``scontrol update JobId=J ExcNodeList=...`` (Slurm takes it only for a pending
    job), then ``scontrol release``. A pinned job (``--nodelist``) also lists the node in its
    ReqNodeList, which would contradict the exclusion, so the node is dropped from it; Slurm
    then picks the missing nodes itself. When requeuehold fails, a plain requeue is the
    fallback (the job may come back on the node). After a hold succeeded the release is
    always attempted: a job left held would never run again.
    ``note`` says what happened to the exclusion, for the log and the state file.
    """
    if not nodes:
        ok, why = requeue(job, run, retry)
        return ok, why, ""
    held, out = _retried(["scontrol", "requeuehold", job], run, retry)
    if not held:
        last = _last(out, "scontrol requeuehold")
        ok, why = requeue(job, run, retry)
        return ok, why, f"not excluded ({last})"
    bad = list(dict.fromkeys(nodes))
    timeout_s = retry.timeout_s
    rec = job_record(job, run, timeout_s)
    exc = rec.get("ExcNodeList", "")
    update = ["scontrol", "update", "JobId=" + job]
    req = rec.get("ReqNodeList", "")
    if _listed(req):
        try:
            pinned = hostnames(req, run, timeout_s)
        except RuntimeError:
            pinned = []
        if any(h in bad for h in pinned):
            update.append("ReqNodeList=" + ",".join(h for h in pinned if h not in bad))
    update.append("ExcNodeList=" + ",".join(([exc] if _listed(exc) else []) + bad))
    rc, out = run(update, timeout_s)
    note = "excluded " + ",".join(bad) if rc == 0 else f"not excluded ({_last(out, 'update')})"
    released, out = _retried(["scontrol", "release", job], run, retry)
    if not released:
        last = _last(out, "scontrol release")
        return True, "", f"{note}; the job is held: scontrol release {job} ({last})"
    return True, "", note


def no_requeue(job: str, run: Runner = run_command, retry: Retry = DEFAULT_RETRY) -> bool:
    """``scontrol update JobId=JOB Requeue=0``: a job that ends itself stays ended.

    Why: a job submitted with ``--requeue=expedite`` (Slurm 25.11+) whose batch script exits
    non-zero is requeued *held* (26.05.5 on the lab: ``JobState=REQUEUE_HOLD``), so a job
    slurmfm gave up on would never end and its ``afternotok`` stages never start. With
    Requeue=0 set first it ends FAILED (checked on the same lab).
    """
    ok, _ = _retried(["scontrol", "update", "JobId=" + job, "Requeue=0"], run, retry)
    return ok


def set_node(
    node: str, state: str, why: str, run: Runner = run_command, timeout_s: float = 30.0
) -> bool:
    """DRAIN (answers but unhealthy) or DOWN (no longer answers) a node, when permitted."""
    rc, _ = run(
        ["scontrol", "update", "NodeName=" + node, "State=" + state, "Reason=slurmfm: " + why],
        timeout_s,
    )
    return rc == 0


def srun_per_node(nodes: int | str, het_group: int | None = None) -> list[str]:
    """``srun`` with one task on each of ``nodes`` nodes: how the runtime runs a step of its
    own everywhere (``whoami``, the health gate, the observe agent, the liveness probe); in a
    heterogeneous job on the nodes of component ``het_group`` (``srun --het-group``)."""
    n = str(nodes)
    het = [] if het_group is None else ["--het-group=%d" % het_group]
    return ["srun", *het, "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1"]


# A step of the runtime's own beside the launch (the probe, the observe agent, the save-signal
# forwarder, the stack dump). --overlap shares the launch step's CPUs only: with memory as a
# consumable resource (CR_*_Memory) a step that asks for the default memory while the launch
# step holds it, or is still being torn down after a failure, is refused at once with "Unable
# to create step for job N: Memory required by task is not available" (seen on the lab,
# 22.05). --mem=0 grants the step the job's memory instead of a share of its own
# (https://slurm.schedmd.com/srun.html#OPT_overlap, https://slurm.schedmd.com/srun.html#OPT_mem).
OVERLAP = ("--overlap", "--mem=0")

# srun's words when slurmctld refused the step itself ("Unable to create step for job %u: %m",
# SchedMD/slurm:src/srun/launch.c, src/srun/libsrun/launch.c in older releases; an error that
# is not a busy-resources one is not retried, whatever --immediate allows; seen on 22.05,
# 24.11 and 26.05: tests/resilience/test_real_probe.py): no task ran, so no node was asked.
NOT_CREATED = "Unable to create step"


class Probe(NamedTuple):
    """What one probe step found: the nodes that did not answer, or, when the step could not
    be created at all, Slurm's reason in ``unknown`` (and no node judged)."""

    dead: list[str]
    unknown: str = ""


def probe(nodes: Sequence[str], run: Runner = run_command, timeout_s: float = 60.0) -> Probe:
    """The nodes that did NOT answer one parallel step (one timeout, whatever the count).

    Each task prints its node name; ``--no-kill`` keeps the step running when a node cannot
    be reached, so every node that answers is heard from. A step slurmctld refused says
    nothing about the nodes: it once made the runtime set both nodes of a job DOWN (and Slurm
    then requeued the job for a node failure) because the probe asked for memory the failed
    launch step still held. Such a probe judges no node; its reason is returned instead.
    """
    if not nodes:
        return Probe([])
    _rc, out = run(
        [
            *srun_per_node(len(nodes)),
            "--no-kill",
            "--kill-on-bad-exit=0",
            "--nodelist=" + ",".join(nodes),
            *OVERLAP,
            "--immediate=%d" % max(1, int(timeout_s)),
            "printenv",
            "SLURMD_NODENAME",
        ],
        timeout_s,
    )
    # A task's answer is a line of its own; srun's error lines name nodes too ("Task launch
    # for StepId=... failed on node n2: ..."), which must not count as that node answering.
    lines = [line.strip() for line in out.splitlines()]
    answered = set(lines)
    dead = [h for h in nodes if h not in answered]
    refused = [line for line in lines if NOT_CREATED in line]
    if refused and len(dead) == len(nodes):
        return Probe([], refused[-1])
    return Probe(dead)


def hostnames(nodelist: str, run: Runner = run_command, timeout_s: float = 30.0) -> list[str]:
    """Expand a Slurm host list with ``scontrol show hostnames``."""
    rc, out = run(["scontrol", "show", "hostnames", nodelist], timeout_s)
    if rc != 0:
        raise RuntimeError(f"scontrol show hostnames failed: {out.strip()}")
    return out.split()


def _restarts(rec: dict[str, str], default: int) -> int:
    value = rec.get("Restarts", "")
    return int(value) if value.isdigit() else default


def at_time_limit(rec: dict[str, str], restart: int) -> bool:
    """Whether attempt ``restart`` is being ended by its time limit, from ``scontrol show job``
    taken at its TERM (``Reason=TimeLimit`` while it completes, then ``JobState=TIMEOUT``),
    and not requeued meanwhile (see :func:`stop_reason`)."""
    if _restarts(rec, restart) > restart:
        return False
    return rec.get("JobState") == "TIMEOUT" or rec.get("Reason") == "TimeLimit"


def stop_reason(rec: dict[str, str], restart: int) -> str:
    """What is ending attempt ``restart``, read from ``scontrol show job`` taken at its TERM.

    While the job's processes still run Slurm shows every ending as ``JobState=COMPLETING``
    (22.05 on the lab: ``scancel`` and ``scontrol requeue`` of a running job both read
    ``JobState=COMPLETING Reason=None``), so the state alone does not tell them apart. A
    requeue has already counted the next attempt (``Restarts`` above this attempt's
    ``SLURM_RESTART_COUNT``: slurmctld increments ``restart_cnt`` when it requeues,
    SchedMD/slurm:src/slurmctld/job_mgr.c ``_job_requeue_op``); the time limit sets
    ``Reason=TimeLimit``; a job still RUNNING was only sent the signal. Slurm's own words
    follow in parentheses.
    """
    if not rec:
        return ""
    state = rec.get("JobState", "?")
    why = rec.get("Reason", "")
    seen = "JobState=%s Reason=%s Restarts=%s" % (state, why or "?", rec.get("Restarts", "?"))
    if _restarts(rec, restart) > restart:
        what = "requeued by Slurm or an operator (scontrol requeue, preemption, a failed node)"
    elif at_time_limit(rec, restart):
        what = "the time limit"
    elif state == "PREEMPTED" or "preempt" in why.lower():
        what = "preempted"
    elif state == "NODE_FAIL" or why in ("NodeDown", "NodeFail"):
        what = "a node failed"
    elif state == "RUNNING":
        what = "TERM sent to the running job (scancel --signal or kill), the job goes on"
    elif state in ("CANCELLED", "COMPLETING"):
        what = "cancelled (scancel by the owner or an admin)"
    else:
        what = "ended by Slurm"
    return "%s (Slurm: %s)" % (what, seen)


def attempts(job: str, run: Runner = run_command, timeout_s: float = 20.0) -> list[dict[str, str]]:
    """Every attempt of ``job`` that accounting keeps (``sacct --duplicates``), oldest first.

    Empty when the cluster has no accounting (``AccountingStorageType=accounting_storage/none``,
    as on the lab: sacct then exits 1, "Slurm accounting storage is disabled") or sacct fails.
    """
    fields = ("JobIDRaw", "State", "ExitCode", "NodeList", "Start", "End")
    rc, out = run(
        [
            "sacct",
            "-j",
            job,
            "--duplicates",
            "--allocations",
            "--noheader",
            "--parsable2",
            "--format=" + ",".join(fields),
        ],
        timeout_s,
    )
    if rc != 0:
        return []
    rows = []
    for line in out.splitlines():
        values = line.split("|")
        if len(values) == len(fields):
            rows.append({f: values[i] for i, f in enumerate(fields)})
    return rows


def restart_reason(
    job: str, previous_stop: str, run: Runner = run_command, timeout_s: float = 20.0
) -> str:
    """Why this attempt runs when the runtime did not requeue the last one.

    Sources, each when it has something: what the last attempt recorded at its TERM
    (:func:`stop_reason`), how accounting saw the last attempt end (``sacct --duplicates``:
    REQUEUED, NODE_FAIL, PREEMPTED, ...) and when slurmctld requeued the job (a requeue
    resets ``SubmitTime``, https://slurm.schedmd.com/sacct.html#OPT_Submit; seen on 22.05).
    Without any of them the reason still says the runtime did not ask for the restart.
    """
    parts = []
    if previous_stop:
        parts.append("the last attempt recorded at its TERM: " + previous_stop)
    ended = [r for r in attempts(job, run, timeout_s) if r["State"] not in ("RUNNING", "PENDING")]
    if ended:
        r = ended[-1]
        parts.append(
            "sacct: the last attempt ended %s (exit %s) at %s on %s"
            % (r["State"], r["ExitCode"], r["End"], r["NodeList"])
        )
    rec = job_record(job, run, timeout_s)
    if rec:
        said = "requeued at %s, Restarts=%s" % (
            rec.get("SubmitTime", "?"),
            rec.get("Restarts", "?"),
        )
        if _listed(rec.get("Reason", "")):
            said += ", Reason=" + rec["Reason"]
        parts.append("scontrol: " + said)
    return "requeued by Slurm or an operator (not by slurmfm): " + (
        "; ".join(parts) or "Slurm does not say why"
    )


def last_step_state(job: str, run: Runner = run_command, timeout_s: float = 10.0) -> str:
    """The state accounting gives the job's newest numbered step (``OUT_OF_MEMORY``,
    ``NODE_FAIL``, ``FAILED``, ...), "" without accounting or an answer.

    ``sacct -j JOB -n -P -o JobID,State`` (https://slurm.schedmd.com/sacct.html): a cgroup
    OOM is a step state there (accounting records a step whose exit code is ``SIG_OOM`` as
    ``JOB_OOM``: SchedMD/slurm src/plugins/accounting_storage/mysql/as_mysql_job.c), though
    srun itself exits 1 for it.
    """
    rc, out = run(["sacct", "-j", job, "-n", "-P", "-o", "JobID,State"], timeout_s)
    if rc != 0:
        return ""
    best = (-1, "")
    for line in out.splitlines():
        jid, _, state = line.partition("|")
        step = jid.rpartition(".")[2] if "." in jid else ""
        if step.isdigit() and int(step) > best[0]:
            best = (int(step), state.split()[0] if state.split() else "")
    return best[1]
