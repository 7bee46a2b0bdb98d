"""Issue 12.5 on the real lab: NeMo tasks follow the planned host order.

NeMo runs one Slurm task per GPU under Lightning, whose ``SLURMEnvironment`` takes the global
rank from ``SLURM_PROCID``. Slurm numbers tasks in its own node order, so a planned order
(pin mode, topology order) used to have no effect on which host holds rank 0. The rendered
script now lays the tasks out with ``srun --distribution=arbitrary`` and a node list in the
planned order. This runs the whole rendered script on the lab's real Slurm (22.05, 24.11,
26.05); the "python" of the NeMo launcher is a probe that reports the ranks instead of building
a NeMo recipe (tests/nemo_order.py). On 22.05 the probe asks the real ``lightning`` package's
``SLURMEnvironment``. Importing Lightning imports torch, about 8 s of CPU per task on the lab's
two shared cores, and what Lightning makes of the task's variables does not depend on the Slurm
version; so on 24.11 and 26.05 the probe reads the variables ``SLURMEnvironment`` reads, which
the real probe checks on 22.05. The same in a real Pyxis container:
tests/e2e/test_real_container_launch.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lab import SlurmLab
from nemo_order import run_nemo

pytestmark = [pytest.mark.slurm]


def test_nemo_ranks_follow_the_planned_order(every_lab: SlurmLab, tmp_path: Path) -> None:
    run_nemo(every_lab, tmp_path)
