"""The NeMo rank-order check on a real lab, shared by the tests that run it on the host and
in a real Pyxis container (tests/render/test_real_slurm_nemo_order.py,
tests/e2e/test_real_container_launch.py).

NeMo runs one Slurm task per GPU under Lightning, whose ``SLURMEnvironment`` takes the global
rank from ``SLURM_PROCID``. The rendered script lays the tasks out with ``srun
--distribution=arbitrary`` and a node list in the planned order; the "python" of the NeMo
launcher is a probe that reports the ranks instead of building a NeMo recipe. On 22.05 outside
a container the probe asks the real ``lightning`` package's ``SLURMEnvironment`` (on each
node's first task); elsewhere it
reads the variables ``SLURMEnvironment`` reads (``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NTASKS``: Lightning-AI/pytorch-lightning:
src/lightning/fabric/plugins/environments/slurm.py): each Lightning import costs ~8 s of CPU,
and the container's image has no Lightning.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from lab import SlurmLab

from slurmfm.plan.types import Placement
from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script

PER_NODE = 2

# The first task on each node asks Lightning itself; the others read what it reads, since
# Lightning's answer is the same function of the task's variables on every task and each
# import costs ~6 s of CPU (six tasks made 36 CPU-s of the real tier; three now).
PROBE = """#!PYTHON
import os

if os.environ["SLURM_LOCALID"] == "0":
    from lightning.fabric.plugins.environments import SLURMEnvironment

    env = SLURMEnvironment()
    print(
        f"LIGHTNING rank={env.global_rank()} local={env.local_rank()} world={env.world_size()} "
        f"host={os.environ['SLURMD_NODENAME']} master={env.main_address} "
        f"node_rank={os.environ.get('SLURMFM_NODE_RANK')} via=lightning",
        flush=True,
    )
else:
    print(
        f"LIGHTNING rank={os.environ['SLURM_PROCID']} local={os.environ['SLURM_LOCALID']} "
        f"world={os.environ['SLURM_NTASKS']} host={os.environ['SLURMD_NODENAME']} master=- "
        f"node_rank={os.environ.get('SLURMFM_NODE_RANK')} via=environment",
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


def run_nemo(
    lab: SlurmLab,
    tmp_path: Path,
    container: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run the rendered NeMo script with the Lightning probe in the planned order; its log.
    ``container``: the recipe's ``container:`` (the probe then runs with the image's python3,
    and ``container["mounts"]`` must hold ``tmp_path``); ``env``: the submitting environment."""
    probe = tmp_path / "lightning-probe"
    real = lab.suite == "host" and not container
    python = "/usr/bin/python3" if container else sys.executable
    probe.write_text((PROBE if real else ENV_PROBE).replace("#!PYTHON", f"#!{python}"))
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
            **({"container": container} if container else {}),
        }
    )
    # Planned order: the reverse of Slurm's own (sorted) order, so rank 0 must move.
    planned = list(reversed(_idle_nodes(lab, 3)))
    placement = Placement(mode="pin", nodes=tuple(planned))
    text = render_script(recipe, Target.for_recipe(recipe), placement).text
    (tmp_path / "logs").mkdir()
    script = tmp_path / "job.sh"
    script.write_text(text)
    proc = lab.run(["sbatch", "--parsable", str(script)], cwd=tmp_path, env=env or lab.env)
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
    # every task runs the runtime's node entry, in the image's python3 in a container (issue 37)
    assert '"$slurmfm_checked" node' in text
    assert ('sh -c "$slurmfm_in_container"' in text) is bool(container)
    # on 22.05 outside a container each node's first rank came from Lightning itself
    assert log.count("via=lightning") == (3 if real else 0), log
    return log
