"""A health gate that fails many nodes for one reason: the job's configuration, not sick
nodes (pure; no I/O).

A wrong expected EFA count for the instance type (the catalog marks p6e-gb200's as
unverified), a launch template with fewer NICs, a job sent to a partition of another instance
type: every node fails the same check the same way. Draining them (and, on HyperPod, asking
for every instance to be replaced: ``Action:Replace``) and requeueing would do the same to the
next nodes, job after job. So when at least half of the checked nodes, and at least two, fail
with the same reason, the job fails with that reason and the recipe field to fix; nothing is
drained, replaced or requeued.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import NamedTuple

# What each check's reason starts or ends with (slurmfm/job/health.py, check_node; the
# in-container IMEX check, hetjob.CONTAINER_IMEX_CHECK) -> the recipe field that decides it.
FIELDS = (
    (
        "GPUs visible, expected",
        "cluster.instance_type (the GPUs it expects; is the partition of that type?) or "
        "resilience.health_gate",
    ),
    (
        "EFA devices, expected",
        "cluster.instance_type (the EFA devices it expects; the launch template's network "
        "interfaces) or resilience.health_gate",
    ),
    ("nvidia-caps-imex-channels", "container.mounts or container.enroot (the IMEX channel)"),
    ("nvidia-imex-ctl", "cluster.instance_type (an NVLink domain across instances)"),
    ("dcgmi diag", "resilience.dcgm_level"),
    ("nvidia-smi failed", "cluster.instance_type or resilience.health_gate"),
)
OTHER_FIELD = "resilience.health_gate"


class Systemic(NamedTuple):
    why: str  # the reason every one of ``nodes`` gave
    nodes: tuple[str, ...]
    checked: int  # how many nodes the gate checked
    field: str  # the recipe field to fix

    def reason(self) -> str:
        return (
            "health gate: %d of %d nodes fail the same check (%s): a configuration error, "
            "not sick nodes; nothing drained. Fix %s"
            % (len(self.nodes), self.checked, self.why, self.field)
        )


def systemic(bad: Sequence[tuple[str, str]], checked: int) -> Systemic | None:
    """The reason at least half of ``checked`` nodes (and at least two) failed with, or None.

    A node without a verdict (``no health verdict ...``) says nothing of its checks and never
    counts: a gate that timed out is not a configuration error.
    """
    counts = collections.Counter(why for _, why in bad if not why.startswith("no health verdict"))
    if not counts:
        return None
    why, n = counts.most_common(1)[0]
    if n < 2 or 2 * n < checked:
        return None
    field = next((f for key, f in FIELDS if key in why), OTHER_FIELD)
    nodes = tuple(node for node, w in bad if w == why)
    return Systemic(why, nodes, checked, field)
