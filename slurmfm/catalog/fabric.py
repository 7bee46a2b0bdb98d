"""The pre-flight fabric test: nccl-tests' ``all_reduce_perf`` and its bus bandwidth floor.

Why: a large launch on a fabric that runs at a fraction of its speed (a bad EFA link, a
plugin that fell back, a node on a sick switch) wastes the whole allocation before anyone
sees the step time. AWS's samples run nccl-tests by hand before such a launch
(aws-samples/awsome-distributed-training:micro-benchmarks/nccl-tests); ``resilience.fabric_test``
runs the same test across the allocation before the first launch of an attempt and compares
its peak bus bandwidth with a floor (slurmfm/job/fabric.py).

The floor is :data:`FLOOR_FRACTION` of AWS's own measured all_reduce bus bandwidth for the type
(:data:`REFERENCE`, each with its source and the setup it was measured on): a healthy fabric
measures near it, and nccl-tests' own bandwidth check flags a result below 0.9 of the
expected one (NVIDIA/nccl-tests src/util.cu, ``check_avg_bw*(0.9)``); slurmfm leaves more room,
since AWS's figures come from other node counts and stack versions. A recipe may set its own
floor (``resilience.fabric_min_busbw_gbs``). The test's arguments are the AWS sample's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType

__all__ = ["FLOOR_FRACTION", "REFERENCE", "TEST_ARGS", "Reference", "floor_for"]

SRC_ADT_NCCL_TESTS = "aws-samples/awsome-distributed-training:micro-benchmarks/nccl-tests/README.md"
SRC_ADA_PCS_TEST = "awslabs/awsome-distributed-ai:architectures/aws-pcs/tests/compute-test.md"
SRC_ADT_TOPO_TESTS = (
    "aws-samples/awsome-distributed-training:micro-benchmarks/nccl-tests/"
    "topology-aware-nccl-tests/README.md"
)
SRC_TEST_ARGS = (
    "aws-samples/awsome-distributed-training:micro-benchmarks/nccl-tests/slurm/"
    "nccl-tests-container.sbatch (all_reduce_perf -b 8 -e 16G -f 2 -g 1 -c 1 -n 100)"
)

TEST_ARGS: tuple[str, ...] = ("-b", "8", "-e", "16G", "-f", "2", "-g", "1", "-c", "1", "-n", "100")
"""The AWS sample's ``all_reduce_perf`` arguments: 8 B to 16 GiB, doubling, one GPU per
process, data checked, 100 iterations (:data:`SRC_TEST_ARGS`)."""

FLOOR_FRACTION = 0.8


@dataclass(frozen=True)
class Reference:
    """AWS's measured peak all_reduce bus bandwidth (GB/s) for an instance family."""

    busbw_gbs: float
    setup: str
    source: str

    @property
    def floor_gbs(self) -> float:
        return round(self.busbw_gbs * FLOOR_FRACTION, 1)


REFERENCE: dict[str, Reference] = {
    "p4de": Reference(78.3, "2 x p4de, 2 GiB", SRC_ADT_NCCL_TESTS),
    "p5": Reference(487.0, "2 x p5, 16 GiB", SRC_ADT_NCCL_TESTS),
    "p5en": Reference(369.9, "p5en, 16 GiB", SRC_ADT_TOPO_TESTS),
    "p6-b200": Reference(377.0, "4 x p6-b200 untuned (PCS), 16 GiB", SRC_ADA_PCS_TEST),
    "p6-b300": Reference(654.0, "2 x p6-b300, 16 GiB", SRC_ADA_PCS_TEST),
}
"""Instance family -> AWS's reference figure. p5e and p6e-gb200 have none published in these
sources: a fabric test there needs the recipe's own floor."""


def floor_for(inst: InstanceType, recipe_floor: float | None) -> tuple[float | None, str]:
    """(the floor in GB/s, where it comes from): the recipe's, else the catalog's, else
    (None, why there is none)."""
    if recipe_floor is not None:
        return recipe_floor, "resilience.fabric_min_busbw_gbs"
    ref = REFERENCE.get(inst.family)
    if ref is None:
        return None, f"no reference bus bandwidth for {inst.name} in slurmfm/catalog/fabric.py"
    return ref.floor_gbs, (
        f"{FLOOR_FRACTION:g} x {ref.busbw_gbs:g} GB/s measured by AWS ({ref.setup}; {ref.source})"
    )
