"""Worker CPU/NUMA binding by the instance's layout: what the launch asks for, with sources.

Why: p5, p5en and p6 instances have two NUMA domains, each with half the GPUs; a worker left
to the scheduler runs and allocates on either, and its host-device copies and data loading
cross the socket link (torch/numa/binding.py: "typically 1-10% overall"). Two launch shapes:

* torchrun (the torchrun and Megatron-LM launchers): ``--numa-binding=node`` binds each worker
  to the CPUs of its GPU's NUMA node, read from sysfs by torch itself, so it needs no layout
  here; the option exists from torch 2.9 and needs ``numactl`` (:data:`SRC_TORCHRUN_NUMA`), a
  gate the launch runs where the image's torch is (slurmfm/job/numa.py).
* one task per GPU (NeMo): ``srun --cpu-bind=map_ldom:L0,L1,...`` binds local task *i* to NUMA
  locality domain *Li* on every node (sbatch/srun(1) ``--cpu-bind``, ``map_ldom``), which
  needs the GPU-to-domain layout of the instance: :data:`NUMA_LAYOUT`. A type without one
  is left unbound, with a warning.

``resources.cpu_binding: off`` turns both off (a launcher that binds by itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.recipe.schema import Recipe

__all__ = ["NUMA_LAYOUT", "SRC_TORCHRUN_NUMA", "Binding", "NumaLayout", "worker_binding"]

SRC_TORCHRUN_NUMA = (
    "https://docs.pytorch.org/docs/2.9/elastic/numa.html; pytorch/pytorch#149334; "
    "pytorch/pytorch:torch/distributed/run.py (--numa-binding), torch/numa/binding.py "
    "(_raise_if_binding_invalid: numactl required)"
)
SRC_SRUN_CPU_BIND = "https://slurm.schedmd.com/srun.html#OPT_cpu-bind (map_ldom)"
SRC_P5_NUMA = (
    "https://docs.aws.amazon.com/ja_jp/sagemaker/latest/dg/sagemaker-hyperpod-topology.html "
    "(p5.48xlarge: two PCIe/NUMA domains with 4 GPUs each)"
)


@dataclass(frozen=True)
class NumaLayout:
    """GPUs in index order over ``domains`` NUMA domains, ``gpus // domains`` on each."""

    domains: int
    source: str
    verified: bool = True

    def map_ldom(self, gpus: int) -> str:
        """``map_ldom``'s list for ``gpus`` tasks per node: task i -> the domain of GPU i."""
        per = max(1, gpus // self.domains)
        return ",".join(str(min(i // per, self.domains - 1)) for i in range(gpus))


_HGX_SAME_BOARD = (
    f"{SRC_P5_NUMA}; the same two-socket 8-GPU HGX layout assumed for the other HGX "
    "types (unverified)"
)
NUMA_LAYOUT: dict[str, NumaLayout] = {
    "p5": NumaLayout(2, SRC_P5_NUMA),
    "p5e": NumaLayout(2, _HGX_SAME_BOARD, verified=False),
    "p5en": NumaLayout(2, _HGX_SAME_BOARD, verified=False),
    "p6-b200": NumaLayout(2, _HGX_SAME_BOARD, verified=False),
    "p6-b300": NumaLayout(2, _HGX_SAME_BOARD, verified=False),
}
"""Instance family -> NUMA layout. p6e-gb200 (two Grace CPUs, four GPUs, GPU memory also
shown as NUMA nodes) has no documented GPU-to-domain map here: not bound by srun."""


@dataclass(frozen=True)
class Binding:
    """What the launch asks: torchrun's ``--numa-binding`` mode (per-node entry or container
    entry), srun's ``--cpu-bind`` value, and a warning when the recipe gets neither."""

    numa: str = ""
    cpu_bind: str | None = None
    warning: str | None = None


def worker_binding(
    recipe: Recipe, inst: InstanceType, torchrun: bool, task_per_gpu: bool
) -> Binding:
    """The worker binding for ``recipe`` on ``inst`` (``torchrun``: the launch runs torchrun;
    ``task_per_gpu``: the launcher's spec runs one task per GPU, its answer passed in, so that
    the catalog asks nothing of the launchers above it)."""
    if recipe.resources.cpu_binding == "off" or not inst.gpus:
        return Binding()
    if torchrun:
        return Binding(numa="node")
    if not task_per_gpu:
        return Binding()  # a server: vLLM and SGLang place their own workers
    layout = NUMA_LAYOUT.get(inst.family)
    if layout is None:
        return Binding(
            warning=(
                f"resources.cpu_binding: {inst.name} has no GPU-to-NUMA layout in "
                "slurmfm/catalog/binding.py, so the tasks are not bound (srun --cpu-bind); "
                "set cpu_binding: off to silence this"
            )
        )
    return Binding(cpu_bind=f"map_ldom:{layout.map_ldom(recipe.procs_per_node)}")
