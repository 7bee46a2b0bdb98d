"""Issue 12.5 on the real lab: NeMo tasks follow the planned host order.

NeMo runs one Slurm task per GPU under Lightning, whose ``SLURMEnvironment`` takes the global
rank from ``SLURM_PROCID``. Slurm numbers tasks in its own node order, so a planned order
(pin mode, topology order) used to have no effect on which host holds rank 0. The rendered
script now lays the tasks out with ``srun --distribution=arbitrary`` and a node list in the
planned order. This runs the whole rendered script on the lab's real Slurm (22.05, 24.11,
26.05); the "python" of the NeMo launcher is a probe that reports the ranks instead of building
a NeMo recipe. On 22.05 the probe asks the real ``lightning`` package's ``SLURMEnvironment``.
Importing Lightning imports torch, about 8 s of CPU per task on the lab's two shared cores, and
what Lightning makes of the task's variables does not depend on the Slurm version; so on 24.11
and 26.05, and in the container, the probe reads the variables ``SLURMEnvironment`` reads
(``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``: Lightning-AI/pytorch-lightning:
src/lightning/fabric/plugins/environments/slurm.py), which the real probe checks on 22.05.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from lab import SlurmLab

from slurmfm.plan.types import Placement
from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script

pytestmark = [pytest.mark.slurm]

PER_NODE = 2

PROBE = """#!PYTHON
import os
from lightning.fabric.plugins.environments import SLURMEnvironment

env = SLURMEnvironment()
print(
    f"LIGHTNING rank={env.global_rank()} local={env.local_rank()} world={env.world_size()} "
    f"host={os.environ['SLURMD_NODENAME']} master={env.main_address} "
    f"node_rank={os.environ.get('SLURMFM_NODE_RANK')}",
    flush=True,
)
"""

# What SLURMEnvironment reads (Lightning-AI/pytorch-lightning:
# src/lightning/fabric/plugins/environments/slurm.py: global_rank, local_rank, world_size), without
# importing Lightning and torch.
ENV_PROBE = """#!PYTHON
import os

print(
    f"LIGHTNING rank={os.environ['SLURM_PROCID']} local={os.environ['SLURM_LOCALID']} "
    f"world={os.environ['SLURM_NTASKS']} host={os.environ['SLURMD_NODENAME']} master=- "
    f"node_rank={os.environ.get('SLURMFM_NODE_RANK')} via=environment",
    flush=True,
)
"""


def _idle_nodes(lab: SlurmLab, count: int) -> list[str]:
    proc = lab.run(["sinfo", "-h", "-p", "batch", "-t", "idle", "-N", "-o", "%N"])
    nodes = sorted(set(proc.stdout.split()))
    if len(nodes) < count:
        pytest.skip(f"needs {count} idle nodes in partition batch, found {len(nodes)}")
    return nodes[:count]


def test_nemo_ranks_follow_the_planned_order(every_lab: SlurmLab, tmp_path: Path) -> None:
    run_nemo(every_lab, tmp_path, container=False)


@pytest.mark.parametrize("every_lab", ["sid"], indirect=True)
def test_nemo_in_a_container_ranks_follow_the_planned_order(
    every_lab: SlurmLab, tmp_path: Path
) -> None:
    """The same in a container (issue 11): the tasks run the rendered ``sh`` program, not the
    runtime, and get their node's rank (task id // tasks per node); the Pyxis stand-in
    (tests/standins/pyxis/srun) runs the step with the host as the image."""
    log = run_nemo(every_lab, tmp_path, container=True)
    ranks = re.findall(r"LIGHTNING rank=(\d+) .* node_rank=(\d+)", log)
    assert sorted((int(r), int(n)) for r, n in ranks) == [(r, r // PER_NODE) for r in range(6)]


def run_nemo(lab: SlurmLab, tmp_path: Path, container: bool) -> str:
    """Run the rendered NeMo script with the Lightning probe in the planned order; its log."""
    probe = tmp_path / "lightning-probe"
    real = lab.suite == "host" and not container
    probe.write_text((PROBE if real else ENV_PROBE).replace("#!PYTHON", f"#!{sys.executable}"))
    probe.chmod(0o755)
    recipe = validate(
        {
            "name": "nemo-order",
            "cluster": {
                "instance_type": "p6-b200.48xlarge",  # the lab's nodes carry Gres=gpu:8
                "partition": "batch",
                "slurm_version": lab.version,
            },
            "resources": {
                "nodes": 3,
                "procs_per_node": PER_NODE,
                # whole nodes: a shared p6-b200 node would ask 24 CPUs per task (each GPU's
                # share of 192 vCPUs), more than a lab node's 16
                "exclusive": True,
                "time_limit": "00:05:00",
            },
            "launcher": {"kind": "nemo", "recipe": "llama3_8b", "python": str(probe)},
            "storage": {
                "checkpoint_root": str(tmp_path / "ckpt"),
                "log_dir": str(tmp_path / "logs"),
                "stripe": "off",
            },
            "resilience": {
                "health_gate": "off",
                "nccl_transport_check": "off",
                "requeue": False,
                "save_before_timeout_s": 0,
            },
            "observability": {"enabled": "off"},
            **({"container": {"image": "/nonexistent/nemo.sqsh"}} if container else {}),
        }
    )
    # Planned order: the reverse of Slurm's own (sorted) order, so rank 0 must move.
    planned = list(reversed(_idle_nodes(lab, 3)))
    placement = Placement(mode="pin", nodes=tuple(planned))
    text = render_script(recipe, Target.for_recipe(recipe), placement).text
    (tmp_path / "logs").mkdir()
    script = tmp_path / "job.sh"
    script.write_text(text)
    standin = Path(__file__).resolve().parents[1] / "standins" / "pyxis"
    env = dict(lab.env, PATH=f"{standin}:{lab.env['PATH']}") if container else lab.env
    proc = lab.run(["sbatch", "--parsable", str(script)], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    fields = lab.wait_job(job_id, timeout=180)
    log_file = tmp_path / "logs" / f"nemo-order_{job_id}.out"
    log = log_file.read_text() if log_file.exists() else ""
    assert fields.get("JobState") == "COMPLETED", f"{fields}\n{log}"
    seen = {
        int(m.group(1)): m.groupdict()
        for m in re.finditer(
            r"LIGHTNING rank=(\d+) local=(?P<local>\d+) world=(?P<world>\d+) host=(?P<host>\S+)",
            log,
        )
    }
    assert sorted(seen) == list(range(3 * PER_NODE)), log
    for rank, got in seen.items():
        assert got["host"] == planned[rank // PER_NODE], (rank, got, planned)
        assert int(got["local"]) == rank % PER_NODE
        assert int(got["world"]) == 3 * PER_NODE
    # Slurm's own first host is not the planned first host: the order really moved.
    assert lab.hostnames(fields["NodeList"])[0] != planned[0]
    assert ('"$slurmfm_checked" node' in text) is not container
    assert ("via=environment" in log) is not real  # 22.05's ranks came from Lightning itself
    return log
