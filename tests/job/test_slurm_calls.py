"""What the runtime asks of Slurm, against a recording fake runner."""

from __future__ import annotations

from collections.abc import Sequence

from slurmfm.job import slurm as sl


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
    assert sl.requeue("7", run, slept.append, tries=3, delay_s=2) == (True, "")
    assert run.calls == [["scontrol", "requeue", "7"]] * 2
    assert slept == [2]
    run = Fake(*[(1, "Unable to contact slurm controller")] * 3)
    ok, why = sl.requeue("7", run, slept.append, tries=3, delay_s=2)
    assert not ok
    assert "Unable to contact" in why


def test_probe_is_one_parallel_step_with_one_timeout() -> None:
    """Node probes after a failure: one srun over all nodes, not one per node."""
    nodes = [f"n{i}" for i in range(1000)]
    run = Fake((1, "\n".join(n for n in nodes if n not in ("n7", "n999"))))
    assert sl.probe(nodes, run, timeout_s=60) == ["n7", "n999"]
    assert len(run.calls) == 1
    argv = run.calls[0]
    assert argv[0] == "srun"
    assert "--nodes=1000" in argv
    assert "--no-kill" in argv


def test_controller_ping() -> None:
    assert sl.controller_up(Fake((0, "Slurmctld(primary) at ctl is UP")))
    assert not sl.controller_up(Fake((1, "Slurmctld(primary) at ctl is DOWN")))
