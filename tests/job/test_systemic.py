"""A health gate that fails many nodes for one reason fails the job as a configuration error:
nothing drained, no HyperPod replacement, no requeue (slurmfm.job.systemic; issue 37)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_batch import Slurm, Step, go, make, state

from slurmfm.job.systemic import systemic

EFA = "16 EFA devices, expected 32 (after 3 tries)"


def test_the_same_reason_on_half_the_nodes_is_systemic() -> None:
    s = systemic([("n1", EFA), ("n2", EFA)], 4)
    assert s is not None
    assert s.nodes == ("n1", "n2")
    assert "cluster.instance_type" in s.field
    assert s.reason().startswith("health gate: 2 of 4 nodes fail the same check (16 EFA")
    assert "nothing drained" in s.reason()


@pytest.mark.parametrize(
    ("bad", "checked"),
    [
        ([("n1", EFA)], 1),  # one node: may be one sick node
        ([("n1", EFA)], 2),  # one of two
        ([("n1", EFA), ("n2", EFA)], 5),  # under half
        ([("n1", EFA), ("n2", "7 GPUs visible, expected 8")], 2),  # two different reasons
        ([("n1", "no health verdict within 600 s")] * 2, 2),  # a timeout says nothing
        ([], 4),
    ],
)
def test_otherwise_it_is_sick_nodes(bad: list[tuple[str, str]], checked: int) -> None:
    assert systemic(bad, checked) is None


def test_each_check_names_its_field() -> None:
    fields = {
        "7 GPUs visible, expected 8": "cluster.instance_type",
        "dcgmi diag -r 1 failed": "resilience.dcgm_level",
        "no /dev/nvidia-caps-imex-channels (IMEX channel missing)": "container.mounts",
        "something new": "resilience.health_gate",
    }
    for why, field in fields.items():
        s = systemic([("a", why), ("b", why)], 2)
        assert s is not None
        assert s.field.startswith(field), (why, s.field)


@pytest.mark.parametrize("hyperpod", ["0", "1"])
def test_a_systemic_gate_failure_fails_the_job_and_drains_nothing(
    tmp_path: Path, hyperpod: str
) -> None:
    report = "".join(f"slurmfm-health {n} FAIL {EFA}\n" for n in ("n1", "n2"))
    slurm = Slurm(health=report)
    step = Step(0)
    b = make(tmp_path, step, slurm, "--health", "1", "--efa", "32", "--hyperpod", hyperpod)
    assert go(b) == 2
    assert not step.done  # never launched
    assert not [c for c in slurm.calls if any(w.startswith("NodeName=") for w in c)]
    assert not [
        c for c in slurm.calls if c[:2] in (["scontrol", "requeue"], ["scontrol", "requeuehold"])
    ]
    last = state(tmp_path)[-1]
    assert last.startswith("event=fail health gate: 2 of 2 nodes fail the same check (16 EFA")
    assert "Fix cluster.instance_type" in last
