"""Why a launch failed, judged from evidence rather than from srun's exit code (pure; no I/O).

srun's exit code does not say what happened: torchrun exits 1 for every worker failure (its
``@record`` re-raises ``ChildFailedError``: pytorch/pytorch
torch/distributed/elastic/multiprocessing/errors/__init__.py), ``--kill-on-bad-exit`` turns the
healthy nodes' launchers into TERMed tasks (SchedMD/slurm src/srun/launch.c reports each task's
end as it comes), and a cgroup OOM ends srun with exit 1 (SchedMD/slurm src/srun/srun.c:
``if ((global_rc & 0xff) == SIG_OOM) global_rc = 1;``). So :func:`classify` weighs, in this
order (docs/resilience.md, "Failure classification" has the same table):

===  ==========================================================  ==========================
 #   evidence                                                    verdict
===  ==========================================================  ==========================
 1   a node did not answer, or sacct says NODE_FAIL              retry (off that node)
 1a  the hang watch stopped it (no progress for hang_timeout,    retry; twice without
     or none yet within startup_timeout)                         progress: crash loop
 2   the exit code is listed in ``resilience.retry_exit_codes``  retry (the override)
 3   srun failed before any task started (bad option, no Pyxis)  fail at once
 4   ImportError / ModuleNotFoundError / SyntaxError / argument  fail at once, naming the
     error / missing script, before any progress                 exception and the node
 5   out of memory (srun's "Out Of Memory", sacct OUT_OF_MEMORY) retry after progress,
                                                                 else fail
 6   any failure after progress (new checkpoint, reported step)  retry
 7   the same signature as the last attempt, no progress since   fail: crash loop
 8   an exception or a signal, no progress, first time           retry
 9   nothing but an exit code                                    the exit-code rule: retry
                                                                 a signal (> 128), fail
                                                                 the rest
===  ==========================================================  ==========================

The *first* failure is the one judged: of the nodes' reports, the launchers srun did not stop
(a stopped one was killed for another's failure), and of those the ones whose exception is not
a peer's echo (:data:`PEER_ECHOES`: a collective that lost its peer), the one whose launcher
ended first (torch's own exception timestamp is whole seconds: only a tie-breaker); without
node reports, the first ``srun: error: HOST: task N: ...`` line that is not a signal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

# How the hang watch's reason for a launch stopped before its first progress begins
# (:meth:`.hang.HangWatch.reason`): "no first progress within 1h: ..."
STARTUP = "no first progress within"

# Errors that repeat identically on every retry when they happen before the training did
# anything: the code or its environment is wrong, not the machine.
DETERMINISTIC = (
    "ImportError",
    "ModuleNotFoundError",
    "SyntaxError",
    "IndentationError",
    "TabError",
    "ArgumentError",
    "MissingScript",
)


class NodeReport(NamedTuple):
    """What the per-node entry saw of its launcher (torchrun) in one launch."""

    node: str
    exit: int  # the launcher's exit (128+N: killed by signal N)
    stopped: bool = False  # srun stopped it (TERM) before its launcher ended on its own
    ended: float = 0.0  # when the launcher ended (seconds since the epoch)
    exc_type: str = ""  # the first failing worker's exception, where known
    message: str = ""
    rank: int = -1  # the first failing worker's global rank, where torchrun named it
    when: float = 0.0  # the exception's own timestamp (torchelastic error file), 0: unknown
    signal: int = 0  # the first failing worker died of this signal (torchrun: exitcode -N)


class TaskLine(NamedTuple):
    """One ``srun: error: HOST: task N: WHAT`` line, in the order srun printed them."""

    host: str
    what: str  # "exit" | "signal" | "oom"
    code: int = 0


class Evidence(NamedTuple):
    rc: int  # srun's exit code
    nodes: tuple[NodeReport, ...] = ()
    tasks: tuple[TaskLine, ...] = ()
    srun_errors: tuple[str, ...] = ()  # srun's own error lines (not a task's end)
    oom: bool = False  # slurmstepd's oom-kill line or a step state OUT_OF_MEMORY
    lost: tuple[str, ...] = ()  # nodes that did not answer, or NODE_FAIL
    progress: bool | None = None  # None: nothing to tell progress by
    progress_note: str = ""
    previous: str = ""  # the signature the last attempt failed with ("" none)
    retryable: Sequence[int] | None = ()  # None: every exit code is retried
    reported: bool = True  # the launch runs the node entry, so nodes report
    hang: str = ""  # the hang watch stopped the step: what it saw ("" no hang)
    step_state: str = ""  # accounting's state of the launch step (sacct), "" unknown


class Verdict(NamedTuple):
    retry: bool
    reason: str
    signature: str = ""
    node: str = ""


# What a rank's collective raises when another rank's process died: the echo of a failure,
# never its cause, whichever launcher happened to end first. Seen on the lab: a rank raised
# RuntimeError at step 12; its peer's gloo all-reduce raised "Connection closed by peer ...
# This is typically caused by a remote worker crashing" (gloo's tcp pair, through torch's
# ProcessGroupGloo), and on a loaded machine the peer's torchrun ended first, so the job's
# evidence named the echo instead of the fault.
PEER_ECHOES = (
    "Connection closed by peer",
    "typically caused by a remote worker crashing",
    "Connection reset by peer",
)


def is_peer_echo(report: NodeReport) -> bool:
    """Whether the node's exception only says that another rank went away."""
    return bool(report.exc_type) and any(e in report.message for e in PEER_ECHOES)


def first_failure(nodes: Iterable[NodeReport]) -> NodeReport | None:
    """The report of the node that failed first (see the module docstring)."""
    failed = [n for n in nodes if n.exit != 0]
    own = [n for n in failed if not n.stopped] or failed
    if not own:
        return None
    own = [n for n in own if not is_peer_echo(n)] or own
    return min(own, key=lambda n: (n.ended or n.when or float("inf"), n.when, n.node))


def normalise(message: str) -> str:
    """A message with what differs between attempts (numbers, addresses) blanked."""
    text = re.sub(r"0x[0-9a-fA-F]+", "0x_", message)
    text = re.sub(r"\d+", "N", text)
    return " ".join(text.split())[:160]


def digest(text: str) -> str:
    import hashlib  # here: hashlib loads OpenSSL, a cost every step's start would pay

    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]


_SIGNATURE = re.compile(r"\[signature ([0-9a-f]{8})\]")


def signature_in(reason: str) -> str:
    """The signature a recorded reason carries ("" when none)."""
    m = _SIGNATURE.search(reason or "")
    return m.group(1) if m else ""


def _what(f: NodeReport | None, ev: Evidence) -> tuple[str, str]:
    """(signature text, words) of the first failure."""
    if f is not None and f.exc_type:
        msg = f.message.strip()
        return "%s: %s" % (f.exc_type, normalise(msg)), "%s%s" % (
            f.exc_type,
            ": " + msg[:200] if msg else "",
        )
    if f is not None and f.signal:
        return "worker signal %d" % f.signal, "a worker killed by signal %d" % f.signal
    code = f.exit if f is not None else ev.rc
    if code > 128:
        return "signal %d" % (code - 128), "exit %d (killed by signal %d)" % (code, code - 128)
    return "exit %d" % code, "exit %d" % code


def _where(f: NodeReport | None, ev: Evidence) -> str:
    if f is not None:
        return " on %s%s" % (f.node, " (rank %d)" % f.rank if f.rank >= 0 else "")
    own = [t for t in ev.tasks if t.what != "signal"]
    return " on %s" % own[0].host if own else ""


def _hang_verdict(ev: Evidence) -> Verdict:
    """A launch the hang watch stopped (:mod:`.hang`): retried, unless it is the same stop
    again with no progress since. A stop in start-up has its own signature: after a hang it
    is no repeat, and one after progress (of the launch before) is not either."""
    kind = "start-up" if ev.hang.startswith(STARTUP) else "hang"
    hsig = digest("hang" if kind == "hang" else "startup")
    htag = " [signature %s]" % hsig
    if ev.previous == hsig and not ev.progress:
        return Verdict(
            False,
            "crash loop: %s again with no progress since the last attempt: %s%s"
            % ("stopped in start-up" if kind == "start-up" else "hang", ev.hang, htag),
            hsig,
        )
    return Verdict(True, "%s: %s%s" % (kind, ev.hang, htag), hsig)


def classify(ev: Evidence) -> Verdict:
    """Retry or fail a launch that ended non-zero, with the reason and its signature."""
    f = first_failure(ev.nodes)
    sig_text, words = _what(f, ev)
    if ev.step_state == "OUT_OF_MEMORY":
        ev = ev._replace(oom=True)
    if ev.oom:
        sig_text = "oom"
    where = _where(f, ev)
    node = f.node if f is not None else ""
    sig = digest(sig_text)
    tag = " [signature %s]" % sig
    prog = " after progress (%s)" % ev.progress_note if ev.progress_note else " after progress"
    if ev.step_state == "NODE_FAIL" and not ev.lost:
        return Verdict(True, "step failed with exit %d; Slurm: NODE_FAIL" % ev.rc, sig, node)
    if ev.lost:
        lost = " ".join(ev.lost)
        return Verdict(
            True, "step failed with exit %d; unresponsive: %s" % (ev.rc, lost), sig, ev.lost[0]
        )
    if ev.hang:
        return _hang_verdict(ev)
    first_exit = f.exit if f is not None else ev.rc
    if ev.retryable is None or ev.rc in ev.retryable or first_exit in ev.retryable:
        # The recipe's override: these exit codes (srun's, or the first failed launcher's:
        # srun may report the TERMed others') are retried whatever the evidence says.
        code = ev.rc if ev.retryable is None or ev.rc in ev.retryable else first_exit
        return Verdict(True, "step failed with exit %d" % code, sig, node)
    transient = any(t in e for e in ev.srun_errors for t in ("timed out", "Unable to contact"))
    if ev.reported and not ev.nodes and not ev.tasks and ev.srun_errors and not transient:
        # srun's own words are the evidence: without them (a log it cannot read) the exit
        # code rule below decides
        why = ev.srun_errors[-1]
        return Verdict(
            False,
            "srun failed before any task started (exit %d): %s" % (ev.rc, why),
            digest("srun %d" % ev.rc),
        )
    exc = f.exc_type if f is not None else ""
    if exc in DETERMINISTIC and not ev.progress:
        return Verdict(
            False,
            "%s%s before any progress (deterministic: it fails the same way on every retry; "
            "srun exit %d)%s" % (words, where, ev.rc, tag),
            sig,
            node,
        )
    if ev.oom:
        if ev.progress:
            return Verdict(True, "out of memory%s%s%s" % (where, prog, tag), sig, node)
        return Verdict(
            False,
            "out of memory%s before any progress (srun exit %d; a cgroup OOM ends srun with "
            "exit 1): the same job would run out again%s" % (where, ev.rc, tag),
            sig,
            node,
        )
    if ev.progress:
        return Verdict(True, "%s%s%s%s" % (words, where, prog, tag), sig, node)
    if ev.previous and ev.previous == sig:
        return Verdict(
            False,
            "crash loop: %s%s again with no progress since the last attempt%s"
            % (words, where, tag),
            sig,
            node,
        )
    if exc or (f is not None and f.signal):
        return Verdict(
            True,
            "%s%s before any progress (first time; a repeat without progress fails)%s"
            % (words, where, tag),
            sig,
            node,
        )
    code = f.exit if f is not None and f.exit else ev.rc
    if code > 128 or ev.rc > 128:
        shown = code if code > 128 else ev.rc
        return Verdict(
            True,
            "step failed with exit %d (killed by signal %d)%s" % (shown, shown - 128, tag),
            sig,
            node,
        )
    return Verdict(
        False,
        "exit %d%s (not a retryable exit code and no evidence of a transient fault: a "
        "deterministic error such as a bad argument, an ImportError or an unknown srun option; "
        "see the job log; resilience.retry_exit_codes lists retryable ones)" % (ev.rc, where),
        sig,
        node,
    )


# --- parsing what the tools print and write (pure: text in, values out) ------------------

_EXC = re.compile(
    r"^(?:\[[^\]]*\]:?\s*)?((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt)):\s?(.*)$"
)
_ARGERR = re.compile(r"^(?:\[[^\]]*\]:?\s*)?\S+: error: (.*)$")
_NOFILE = re.compile(r"^(?:\[[^\]]*\]:?\s*)?\S+: can't open file (.*)$")
_RANK = re.compile(r"\brank\s*:\s*(\d+)\s*\(local_rank")
_EXITCODE = re.compile(r"\bexitcode\s*:\s*(-?\d+)")
_TASK = re.compile(r"^srun: error: (\S+): tasks? [\d,\-\[\]]+: (.*?)\s*$")
_OOM = re.compile(r"oom[-_ ]kill event", re.IGNORECASE)
_IGNORED_EXC = ("ChildFailedError", "SignalException")


def parse_error_file(text: str) -> tuple[str, str, float]:
    """(exception type, message, timestamp) from the JSON torch's ``@record`` writes.

    Its layout: ``{"message": {"message": "TYPE: MSG", "extraInfo": {"py_callstack": ...,
    "timestamp": "EPOCH"}, "errorCode": N}}`` (pytorch/pytorch
    torch/distributed/elastic/multiprocessing/errors/error_handler.py ``record_exception``;
    the launcher copies its first failed worker's file into its own,
    ``dump_error_file``). Anything else gives ("", "", 0).
    """
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return "", "", 0.0
    msg = data.get("message") if isinstance(data, dict) else None
    info: dict[str, object] = {}
    if isinstance(msg, str):
        head = msg
    elif isinstance(msg, dict):
        head = str(msg.get("message", ""))
        extra = msg.get("extraInfo")
        if isinstance(extra, dict):
            info = extra
    else:
        return "", "", 0.0
    typ, sep, rest = head.partition(": ")
    if not sep or not re.match(r"^[A-Za-z_][\w.]*$", typ):
        typ, rest = "", head
    try:
        when = float(str(info.get("timestamp", "0")))
    except ValueError:
        when = 0.0
    return typ.rpartition(".")[2], rest, when


def parse_launcher_output(lines: Sequence[str]) -> tuple[str, str, int, int]:
    """(exception type, message, failed rank, worker signal) from a launcher's last lines.

    Read from the workers' tracebacks and torchrun's failure summary ("Failures:" and "Root
    Cause (first observed failure):" entries, each with ``rank: R (local_rank: L)`` and
    ``exitcode: N``): an ImportError at a script's top level happens before ``@record`` runs,
    so no error file holds it. A worker killed by a signal other than TERM (``exitcode: -9``:
    the OOM killer, an operator, a crash) is the failure whatever torch calls the root cause:
    the others then fail in their collectives ("Connection closed by peer") and torchrun
    stops them with TERM, and torch's root cause is the earliest error file, which a killed
    worker never writes (seen with torch 2.13 on the lab). Python's "can't open file" (a
    missing script) and argparse's ``PROG: error:`` after a ``usage:`` line count as
    MissingScript and ArgumentError; with a killed worker the exception is cleared.
    """
    exc, msg = "", ""
    usage = False
    summary = False
    root_rank = -1
    root = False
    entry_rank = -1
    kills: list[tuple[int, int]] = []  # (rank, signal) of workers killed by a non-TERM signal
    for raw in lines:
        line = raw.rstrip("\r\n")
        if line.strip() in ("Failures:", "Root Cause (first observed failure):"):
            summary = True
            root = line.strip().startswith("Root Cause")
            continue
        if summary:
            m = _RANK.search(line)
            if m:
                entry_rank = int(m.group(1))
                if root and root_rank < 0:
                    root_rank = entry_rank
            m = _EXITCODE.search(line)
            if m and int(m.group(1)) < 0 and int(m.group(1)) != -15:
                kills.append((entry_rank, -int(m.group(1))))
        if "usage:" in line:
            usage = True
        m = _NOFILE.match(line)
        if m:
            exc, msg = "MissingScript", "can't open file " + m.group(1)
            continue
        m = _EXC.match(line)
        if m and m.group(1).rpartition(".")[2] not in _IGNORED_EXC:
            exc, msg = m.group(1).rpartition(".")[2], m.group(2)
            continue
        m = _ARGERR.match(line)
        if m and usage and not exc:
            exc, msg = "ArgumentError", m.group(1)
    if kills:
        return "", "", kills[0][0], kills[0][1]
    return exc, msg, root_rank, 0


def parse_srun_line(line: str) -> TaskLine | None:
    """A task's end as srun reports it (src/srun/launch.c): exit code, signal or OOM."""
    m = _TASK.match(line.strip())
    if not m:
        return None
    host, what = m.group(1), m.group(2)
    e = re.match(r"Exited with exit code (\d+)", what)
    if e:
        return TaskLine(host, "exit", int(e.group(1)))
    if what.startswith("Out Of Memory"):
        return TaskLine(host, "oom", 0)
    return TaskLine(host, "signal", 9 if what.startswith("Killed") else 15)


def is_oom_line(line: str) -> bool:
    """slurmstepd's ``Detected N oom-kill event(s)`` or srun's task ``Out Of Memory``."""
    return bool(_OOM.search(line)) or line.rstrip().endswith(": Out Of Memory")


def is_srun_error(line: str) -> bool:
    """srun's own failure (``srun: error: ...`` that is no task's end, ``srun: fatal:``,
    an unknown option)."""
    s = line.strip()
    if parse_srun_line(s) is not None:
        return False
    return s.startswith(("srun: error:", "srun: fatal:", "srun: unrecognized option")) or (
        s.startswith("srun: ") and "invalid option" in s
    )
