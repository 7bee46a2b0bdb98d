"""What the runtime asks of Slurm, against a recording fake runner."""

from __future__ import annotations

from collections.abc import Sequence

from slurmfm.job import slurm as sl


def NO_WAIT(seconds: float) -> None:
    """A retry delay that waits for nothing."""


class Fake:
    def __init__(self, *answers: tuple[int, str]) -> None:
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        self.calls.append(list(argv))
        return self.answers.pop(0) if self.answers else (0, "")


def test_array_task_requeues_itself_alone() -> None:
    env = {"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1"}
    assert sl.self_id(env) == "40_1"
    assert sl.self_id({"SLURM_JOB_ID": "41"}) == "41"


def test_requeue_is_retried_while_slurmctld_is_away() -> None:
    """15.4: a requeue that fails is retried; success is only reported after it happened."""
    run = Fake((1, "Unable to contact slurm controller"), (0, ""))
    slept: list[float] = []
    assert sl.requeue("7", run, sl.Retry(tries=3, delay_s=2, sleep=slept.append)) == (True, "")
    assert run.calls == [["scontrol", "requeue", "7"]] * 2
    assert slept == [2]
    run = Fake(*[(1, "Unable to contact slurm controller")] * 3)
    ok, why = sl.requeue("7", run, sl.Retry(tries=3, delay_s=2, sleep=slept.append, away_s=0))
    assert not ok
    assert "Unable to contact" in why


def test_requeue_backs_off_for_minutes_while_slurmctld_is_away() -> None:
    """Issue 20: a slurmctld away for minutes (a restart of a big cluster's controller) must
    not end the job after 30 s; a failure for another reason is not retried for minutes."""
    away = [(1, "scontrol: error: Unable to contact slurm controller (connect failure)")]
    run = Fake(*away * 11)
    slept: list[float] = []
    ok, _ = sl.requeue("7", run, sl.Retry(sleep=slept.append))
    assert ok  # the 12th call: slurmctld is back after 9 minutes
    assert slept[:4] == [10, 20, 40, 60]
    assert sum(slept) <= 600
    run = Fake(*away * 20)
    slept = []
    ok, _ = sl.requeue("7", run, sl.Retry(sleep=slept.append))
    assert not ok
    assert 540 <= sum(slept) <= 600
    run = Fake(*[(1, "Invalid job id specified")] * 5)
    slept = []
    assert not sl.requeue("7", run, sl.Retry(sleep=slept.append))[0]
    assert len(run.calls) == 3


def test_probe_is_one_parallel_step_with_one_timeout() -> None:
    """Node probes after a failure: one srun over all nodes, not one per node."""
    nodes = [f"n{i}" for i in range(1000)]
    run = Fake((1, "\n".join(n for n in nodes if n not in ("n7", "n999"))))
    assert sl.probe(nodes, run, timeout_s=60) == (["n7", "n999"], "")
    assert len(run.calls) == 1
    argv = run.calls[0]
    assert argv[0] == "srun"
    assert "--nodes=1000" in argv
    assert "--no-kill" in argv
    # beside a launch step that holds (or is still freeing) the job's memory
    assert argv[argv.index("--overlap") + 1] == "--mem=0"


REFUSED = "srun: error: Unable to create step for job 7: Memory required by task is not available"


def test_a_probe_slurmctld_refused_judges_no_node() -> None:
    """A probe step that was never created asked no node: it must not name them all dead
    (the runtime would DOWN every node of its job, and Slurm requeue it for a node failure);
    Slurm's reason comes back instead. Nodes that did not answer a step that ran are dead."""
    found = sl.probe(["n1", "n2"], Fake((1, REFUSED + "\n")), timeout_s=60)
    assert found == ([], REFUSED)
    found = sl.probe(["n1", "n2"], Fake((1, "n1\nsrun: error: Task launch failed on node n2")))
    assert found == (["n2"], "")
    # a timeout or silence without Slurm's refusal: every node is unheard from
    assert sl.probe(["n1", "n2"], Fake((124, "srun timed out after 60 s"))) == (["n1", "n2"], "")
    assert sl.probe([], Fake()) == ([], "")


def test_controller_ping() -> None:
    assert sl.controller_up(Fake((0, "Slurmctld(primary) at ctl is UP")))
    assert not sl.controller_up(Fake((1, "Slurmctld(primary) at ctl is DOWN")))


def test_pinned_job_is_requeued_off_the_failed_node() -> None:
    """12.6: the node leaves ReqNodeList (pin mode) and joins the job's ExcNodeList."""
    run = Fake(
        (0, ""),  # requeuehold
        (0, "JobId=9 ReqNodeList=n[1-3] ExcNodeList=n7 NodeList=n[1-3]"),
        (0, "n1\nn2\nn3\n"),  # scontrol show hostnames
        (0, ""),  # update
        (0, ""),  # release
    )
    assert sl.requeue_excluding("9", ["n2"], run) == (True, "", "excluded n2")
    assert run.calls == [
        ["scontrol", "requeuehold", "9"],
        ["scontrol", "show", "job", "-o", "9"],
        ["scontrol", "show", "hostnames", "n[1-3]"],
        ["scontrol", "update", "JobId=9", "ReqNodeList=n1,n3", "ExcNodeList=n7,n2"],
        ["scontrol", "release", "9"],
    ]


def test_requeue_hold_refused_falls_back_to_a_plain_requeue() -> None:
    run = Fake(*[(1, "Access/permission denied")] * 2, (0, ""))
    ok, why, note = sl.requeue_excluding("9", ["n2"], run, sl.Retry(tries=2, sleep=NO_WAIT))
    assert ok
    assert why == ""
    assert note == "not excluded (Access/permission denied)"
    assert run.calls[-1] == ["scontrol", "requeue", "9"]


def test_held_job_is_released_even_when_the_update_fails() -> None:
    run = Fake((0, ""), (0, "JobId=9 ExcNodeList=(null)"), (1, "Job is no longer pending"))
    ok, _, note = sl.requeue_excluding("9", ["n2"], run, sl.Retry(sleep=NO_WAIT))
    assert ok
    assert note == "not excluded (Job is no longer pending)"
    assert run.calls[-1] == ["scontrol", "release", "9"]
    run = Fake((0, ""), (0, ""), (0, ""), *[(1, "Unable to contact slurm controller")] * 3)
    ok, _, note = sl.requeue_excluding("9", ["n2"], run, sl.Retry(tries=3, sleep=NO_WAIT, away_s=0))
    assert ok
    assert "the job is held: scontrol release 9" in note
    assert run.calls[-3:] == [["scontrol", "release", "9"]] * 3  # retried like the requeue


def test_requeue_off_is_retried_like_the_requeue() -> None:
    """``Requeue=0`` before an expedited job gives up is retried while slurmctld is away."""
    run = Fake((1, "Unable to contact slurm controller"), (0, ""))
    slept: list[float] = []
    assert sl.no_requeue("5", run, sl.Retry(tries=2, delay_s=3, sleep=slept.append))
    assert run.calls == [["scontrol", "update", "JobId=5", "Requeue=0"]] * 2
    assert slept == [3]
    assert not sl.no_requeue("5", Fake(*[(1, "denied")] * 2), sl.Retry(tries=2, sleep=NO_WAIT))


def test_last_step_state_from_accounting() -> None:
    out = "77|FAILED\n77.batch|FAILED\n77.extern|COMPLETED\n77.0|COMPLETED\n77.1|OUT_OF_MEMORY\n"
    run = Fake((0, out))
    assert sl.last_step_state("77", run) == "OUT_OF_MEMORY"
    assert run.calls == [["sacct", "-j", "77", "-n", "-P", "-o", "JobID,State"]]
    assert sl.last_step_state("77", Fake((1, "accounting storage is disabled"))) == ""
    assert sl.last_step_state("77", Fake((0, "77.0|CANCELLED by 0\n"))) == "CANCELLED"


def test_one_scontrol_parser_keeps_a_reason_with_spaces_whole() -> None:
    """The runtime read ``Reason=launch failed requeued held`` as ``launch``; the backend kept
    the whole text. Both now use slurmfm.job.slurm.parse_record."""
    from slurmfm.backends.slurm_cli import parse_scontrol_record
    from slurmfm.job import slurm as sl

    line = (
        "JobId=7 JobName=t UserId=me(1000) JobState=REQUEUE_HOLD "
        "Reason=launch failed requeued held Dependency=(null) Restarts=2 "
        "Comment=see JobState=COMPLETED"
    )
    assert parse_scontrol_record is sl.parse_record
    rec = sl.job_record("7", lambda argv, timeout: (0, line + "\n"))
    assert rec["Reason"] == "launch failed requeued held"
    assert rec["JobState"] == "REQUEUE_HOLD"  # a later free-text field cannot replace it
    assert rec["Restarts"] == "2"
    assert sl.user_id(rec) == 1000
    multi = "NodeName=n1 Arch=x86_64\n   NodeAddr=10.0.0.1 NodeHostName=n1\n\nNodeName=n2 Arch=x\n"
    assert [r.get("NodeAddr") for r in sl.node_records(multi)] == ["10.0.0.1", None]
