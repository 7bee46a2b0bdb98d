"""Failures judged by evidence (slurmfm.job.classify): one test per rule of its table, the
parsers of what torch and srun print, and the evidence files the node entry writes."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from slurmfm.job import evidence as ev
from slurmfm.job.classify import (
    DETERMINISTIC,
    Evidence,
    NodeReport,
    TaskLine,
    classify,
    first_failure,
    parse_error_file,
    parse_launcher_output,
    parse_srun_line,
    signature_in,
)

IMPORT_N2 = NodeReport("n2", 1, False, 10.0, "ModuleNotFoundError", "No module named 'apex'", 2)
KILLED_N1 = NodeReport("n1", 143, True, 11.0)


def test_import_error_on_one_node_fails_at_once_naming_it_whatever_srun_says() -> None:
    for rc in (1, 137, 143):
        v = classify(Evidence(rc, nodes=(KILLED_N1, IMPORT_N2), progress=False))
        assert not v.retry
        assert v.node == "n2"
        assert v.reason.startswith("ModuleNotFoundError: No module named 'apex' on n2 (rank 2)")
        assert "before any progress" in v.reason


def test_the_same_error_after_progress_is_retried() -> None:
    v = classify(
        Evidence(1, nodes=(IMPORT_N2,), progress=True, progress_note="new checkpoint step_20")
    )
    assert v.retry
    assert "after progress (new checkpoint step_20)" in v.reason


def test_runtime_error_after_progress_is_retried() -> None:
    err = NodeReport("n1", 1, False, 5.0, "RuntimeError", "NCCL watchdog timeout", 0)
    v = classify(Evidence(1, nodes=(err, NodeReport("n2", 143, True, 6.0)), progress=True))
    assert v.retry
    assert v.reason.startswith("RuntimeError: NCCL watchdog timeout on n1 (rank 0) after progress")


def test_same_signature_twice_without_progress_is_a_crash_loop() -> None:
    err = NodeReport("n1", 1, False, 5.0, "RuntimeError", "CUDA error at step 7", 0)
    first = classify(Evidence(1, nodes=(err,), progress=False))
    assert first.retry  # a first exception without progress: once more
    # numbers in the message differ between attempts; the signature does not
    again = err._replace(message="CUDA error at step 9", node="n2")
    v = classify(Evidence(1, nodes=(again,), progress=False, previous=first.signature))
    assert not v.retry
    assert v.reason.startswith("crash loop: RuntimeError")
    assert signature_in(first.reason) == first.signature


def test_a_different_failure_is_not_a_loop() -> None:
    err = NodeReport("n1", 1, False, 5.0, "RuntimeError", "boom", 0)
    v = classify(Evidence(1, nodes=(err,), progress=False, previous="deadbeef"))
    assert v.retry


def test_a_worker_killed_by_a_signal_is_retried() -> None:
    kill = NodeReport("n2", 1, False, 5.0, signal=9)
    v = classify(Evidence(1, nodes=(kill, KILLED_N1), progress=False))
    assert v.retry
    assert "a worker killed by signal 9 on n2" in v.reason


def test_lost_node_is_retried_off_it() -> None:
    v = classify(Evidence(1, nodes=(IMPORT_N2,), lost=("n3",), progress=False))
    assert v.retry
    assert v.reason == "step failed with exit 1; unresponsive: n3"


def test_retry_exit_codes_override_the_evidence() -> None:
    v = classify(Evidence(1, nodes=(IMPORT_N2,), progress=False, retryable=[1]))
    assert v.retry
    assert v.reason == "step failed with exit 1"
    assert classify(Evidence(1, nodes=(IMPORT_N2,), retryable=None)).retry
    # srun said 143 (the TERMed node); the first failed launcher exited 1, which is listed
    v = classify(Evidence(143, nodes=(KILLED_N1, IMPORT_N2), progress=False, retryable=[1]))
    assert v.retry
    assert v.reason == "step failed with exit 1"


def test_srun_failing_before_any_task_fails_at_once() -> None:
    """No Pyxis: srun rejects --container-image and exits 255; no node ever reported."""
    v = classify(Evidence(255, srun_errors=("srun: unrecognized option '--container-image'",)))
    assert not v.retry
    assert "srun failed before any task started (exit 255)" in v.reason
    assert "--container-image" in v.reason
    # nothing srun said (its log unreadable) or slurmctld not answering: the exit-code rule
    assert classify(Evidence(255)).retry
    timed_out = ("srun: error: Socket timed out on send/recv operation",)
    assert not classify(Evidence(143, srun_errors=timed_out)).reason.startswith("srun failed")


def test_oom_is_exit_1_from_srun_and_fails_before_progress() -> None:
    """A cgroup OOM ends srun with exit 1 (SchedMD/slurm src/srun/srun.c), never 137."""
    lines = (TaskLine("n2", "oom"), TaskLine("n1", "signal", 15))
    v = classify(Evidence(1, tasks=lines, oom=True, progress=False, reported=False))
    assert not v.retry
    assert v.reason.startswith("out of memory on n2 before any progress")
    assert classify(Evidence(1, tasks=lines, oom=True, progress=True, reported=False)).retry


def test_exit_code_alone_keeps_the_exit_code_rule() -> None:
    """A container launch (no node reports): 137 retries, 2 fails."""
    assert classify(Evidence(137, reported=False)).retry
    v = classify(Evidence(2, reported=False))
    assert not v.retry
    assert "resilience.retry_exit_codes" in v.reason
    # srun's first failing task is named
    v = classify(
        Evidence(
            2,
            tasks=(TaskLine("n1", "signal", 15), TaskLine("n2", "exit", 2)),
            reported=False,
        )
    )
    assert "on n2" in v.reason


def test_a_peers_echo_is_not_the_first_failure_even_when_its_launcher_ended_first() -> None:
    # seen on the lab under load: the faulting rank's torchrun ended after its peer's
    fault = NodeReport(
        "n1", 1, ended=105.0, exc_type="RuntimeError", message="injected fault at step 12"
    )
    echo = NodeReport(
        "n2",
        1,
        ended=104.0,
        exc_type="RuntimeError",
        message="[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:17829."
        " This is typically caused by a remote worker crashing. Check the logs",
    )
    assert first_failure([echo, fault]) == fault
    assert first_failure([fault, echo]) == fault
    # only echoes (the faulting node sent no report): the earliest echo, as before
    other = echo._replace(node="n3", ended=106.0)
    assert first_failure([other, echo]) == echo
    # a stopped node's report stays out, echo or not
    assert first_failure([fault._replace(stopped=True), echo]) == echo


def test_first_failure_is_the_unstopped_earliest() -> None:
    late = NodeReport("n3", 1, False, 30.0, "RuntimeError", "x", when=2.0)
    early = NodeReport("n4", 1, False, 20.0, "RuntimeError", "y", when=3.0)
    assert first_failure([KILLED_N1, late, early]) == early
    assert first_failure([KILLED_N1]) == KILLED_N1
    assert first_failure([NodeReport("n1", 0)]) is None


reports = st.builds(
    NodeReport,
    node=st.sampled_from(["n1", "n2", "n3"]),
    exit=st.integers(0, 255),
    stopped=st.booleans(),
    ended=st.floats(0, 100),
    exc_type=st.sampled_from(["", "RuntimeError", "ValueError", *DETERMINISTIC]),
    message=st.text(max_size=40),
    rank=st.integers(-1, 8),
    when=st.floats(0, 100),
    signal=st.sampled_from([0, 9, 15]),
)


@given(st.lists(reports, max_size=5), st.integers(1, 255), st.booleans())
def test_a_deterministic_first_failure_before_progress_always_fails(
    nodes: list[NodeReport], rc: int, stopped_first: bool
) -> None:
    bad = NodeReport("n9", 1, False, -1.0, "ImportError", "cannot import name 'x'")
    v = classify(Evidence(rc, nodes=(*nodes, bad), progress=False))
    assert not v.retry
    assert "ImportError" in v.reason
    assert "n9" in v.reason


@given(st.lists(reports, min_size=1, max_size=5), st.integers(1, 255))
def test_progress_always_retries_unless_an_override_or_lost(
    nodes: list[NodeReport], rc: int
) -> None:
    v = classify(Evidence(rc, nodes=tuple(nodes), progress=True))
    assert v.retry
    assert v.signature
    assert len(v.signature) == 8


def test_error_file_written_by_record() -> None:
    """The layout of torch's error_handler.record_exception."""
    text = json.dumps(
        {
            "message": {
                "message": "RuntimeError: boom at step 12",
                "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1764650000"},
                "errorCode": 1,
            }
        }
    )
    assert parse_error_file(text) == ("RuntimeError", "boom at step 12", 1764650000.0)
    assert parse_error_file("not json") == ("", "", 0.0)
    assert parse_error_file(json.dumps({"message": "plain text"})) == ("", "plain text", 0.0)


TORCHRUN_TAIL = """\
Traceback (most recent call last):
  File "/x/train.py", line 3, in <module>
    import nosuchmodule
ModuleNotFoundError: No module named 'nosuchmodule'
E1202 03:10:11.000000 1234 torch/distributed/elastic/multiprocessing/api.py:882] failed
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/distributed/run.py", line 9, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/x/train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_03:10:11
  host      : lab
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 1234)
  error_file: <N/A>
============================================================
"""


def test_launcher_output_names_the_exception_and_rank() -> None:
    assert parse_launcher_output(TORCHRUN_TAIL.splitlines()) == (
        "ModuleNotFoundError",
        "No module named 'nosuchmodule'",
        3,
        0,
    )
    killed = TORCHRUN_TAIL.replace("exitcode  : 1", "exitcode  : -9").splitlines()
    assert parse_launcher_output(killed) == ("", "", 3, 9)
    # torch 2.13's summary when rank 0 was SIGKILLed: its root cause is the sibling torchrun
    # TERMed after its collective failed; the killed worker is the failure
    kill_summary = [
        "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer",
        "Failures:",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : -9 (pid: 13462)  (SIGKILL)",
        "Root Cause (first observed failure):",
        "[1]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -15 (pid: 13464)  (SIGTERM)",
        "  RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer",
    ]
    assert parse_launcher_output(kill_summary) == ("", "", 0, 9)
    rep = ev.report("n1", 1, False, "", kill_summary, now=1.0)
    assert (rep["exc_type"], rep["rank"], rep["signal"]) == ("", 0, 9)
    prefixed = ["[rank1]: RuntimeError: oops"]
    assert parse_launcher_output(prefixed)[:2] == ("RuntimeError", "oops")


def test_missing_script_and_argument_error() -> None:
    nofile = ["/usr/bin/python3: can't open file '/x/nope.py': [Errno 2] No such file"]
    assert parse_launcher_output(nofile)[0] == "MissingScript"
    argerr = ["usage: train.py [-h] [--steps STEPS]", "train.py: error: unrecognized arguments: -x"]
    assert parse_launcher_output(argerr)[:2] == ("ArgumentError", "unrecognized arguments: -x")


def test_srun_lines() -> None:
    assert parse_srun_line("srun: error: node002: task 1: Exited with exit code 1") == TaskLine(
        "node002", "exit", 1
    )
    assert parse_srun_line("srun: error: node001: task 0: Terminated") == TaskLine(
        "node001", "signal", 15
    )
    assert parse_srun_line("srun: error: tiger: task 0: Out Of Memory") == TaskLine(
        "tiger", "oom", 0
    )
    assert parse_srun_line("srun: error: node[1-2]: tasks 0-1: Killed") == TaskLine(
        "node[1-2]", "signal", 9
    )
    assert parse_srun_line("srun: Job step aborted") is None
    seen = ev.SrunLines()
    for line in (
        "srun: unrecognized option '--container-image=x'",
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=5.0. Some of your processes",
        "srun: error: n2: task 1: Out Of Memory",
        "training output",
    ):
        seen(line)
    assert seen.oom
    assert seen.tasks == [TaskLine("n2", "oom", 0)]
    assert seen.errors == ["srun: unrecognized option '--container-image=x'"]


@given(st.lists(st.text(max_size=80), max_size=30))
def test_parsers_never_raise(lines: list[str]) -> None:
    parse_launcher_output(lines)
    for line in lines:
        parse_srun_line(line)
        parse_error_file(line)


def test_node_report_round_trip(tmp_path: Path) -> None:
    d = tmp_path / "ev"
    assert ev.private_dir(str(d))
    assert (d.stat().st_mode & 0o777) == 0o700
    watch = ev.LaunchWatch(str(d), "n2")
    env = watch.environ({})
    assert env["TORCHELASTIC_ERROR_FILE"] == str(d / "n2.torch.json")
    Path(env["TORCHELASTIC_ERROR_FILE"]).write_text(
        json.dumps({"message": {"message": "ValueError: bad", "extraInfo": {"timestamp": "7"}}})
    )
    watch.stopped = False
    watch.finish(1)
    (rep,) = ev.read_reports(str(d))
    assert (rep.node, rep.exit, rep.exc_type, rep.message, rep.when) == (
        "n2",
        1,
        "ValueError",
        "bad",
        7.0,
    )


def test_progress_since(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    ck.mkdir()
    pf = tmp_path / "progress.json"
    before = ev.progress_mark(str(ck), str(pf))
    assert ev.progress_since(before, before) == (None, "")
    assert ev.saved_since(before, before) is None
    (ck / "step_000000010").mkdir()
    (ck / "latest").write_text("step_000000010\n")
    mid = ev.progress_mark(str(ck), str(pf))
    assert ev.progress_since(before, mid) == (True, "new checkpoint step_000000010")
    assert ev.saved_since(before, mid) == "new checkpoint step_000000010"
    assert ev.saved_since(mid, mid) == ""
    pf.write_text(json.dumps({"step": 12}))
    after = ev.progress_mark(str(ck), str(pf))
    assert ev.progress_since(mid, after) == (True, "reported step 12")
    assert ev.progress_since(after, after) == (False, "")
    (ck / "latest_checkpointed_iteration.txt").write_text("300\n")
    assert ev.saved_since(after, ev.progress_mark(str(ck), str(pf))) == "Megatron tracker at 300"


def test_accounting_states_oom_and_node_fail() -> None:
    """sacct's step state: OUT_OF_MEMORY (srun said exit 1) and NODE_FAIL."""
    v = classify(Evidence(1, progress=False, step_state="OUT_OF_MEMORY", reported=False))
    assert not v.retry
    assert v.reason.startswith("out of memory before any progress")
    v = classify(Evidence(1, nodes=(IMPORT_N2,), progress=False, step_state="NODE_FAIL"))
    assert v.retry
    assert v.reason == "step failed with exit 1; Slurm: NODE_FAIL"
