"""Instance catalog: every fact the planner acts on, per instance, plus name lookup."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, replace

import pytest

from slurmfm.catalog.instances import (
    INSTANCES,
    InstanceType,
    NVLinkDomain,
    UnknownInstanceType,
    get_instance,
    known_instance_names,
)
from slurmfm.errors import SlurmfmError


@dataclass(frozen=True)
class Fact:
    name: str
    family: str
    gpu_model: str
    gpus: int
    efa: int
    depth: int
    arch: str
    domain: tuple[int, ...]
    max_gpus: int
    multi_node: bool


FACTS = [
    Fact("p4d.24xlarge", "p4d", "A100", 8, 4, 3, "x86_64", (1,), 8, False),
    Fact("p4de.24xlarge", "p4de", "A100", 8, 4, 3, "x86_64", (1,), 8, False),
    Fact("p5.48xlarge", "p5", "H100", 8, 32, 3, "x86_64", (1,), 8, False),
    Fact("p5e.48xlarge", "p5e", "H200", 8, 32, 3, "x86_64", (1,), 8, False),
    Fact("p5en.48xlarge", "p5en", "H200", 8, 16, 3, "x86_64", (1,), 8, False),
    Fact("p6-b200.48xlarge", "p6-b200", "B200", 8, 8, 4, "x86_64", (1,), 8, False),
    Fact("p6-b300.48xlarge", "p6-b300", "B300", 8, 16, 4, "x86_64", (1,), 8, False),
    Fact("p6e-gb200.36xlarge", "p6e-gb200", "GB200", 4, 16, 3, "aarch64", (9, 18), 72, True),
    Fact("lab-cpu", "lab-cpu", "none", 0, 0, 3, "x86_64", (1,), 0, False),
]


def test_catalog_covers_exactly_the_documented_types() -> None:
    assert set(INSTANCES) == {f.name for f in FACTS}
    assert known_instance_names() == sorted(f.name for f in FACTS)


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: f.name)
def test_instance_facts(fact: Fact) -> None:
    it = INSTANCES[fact.name]
    assert it.name == fact.name
    assert it.family == fact.family
    assert it.gpu_model == fact.gpu_model
    assert it.gpus == fact.gpus
    assert it.efa_interfaces == fact.efa
    assert it.topology_depth == fact.depth
    assert it.cpu_arch == fact.arch
    assert it.nvlink.instances == fact.domain
    assert it.nvlink.gpus_per_instance == fact.gpus
    assert it.nvlink.max_gpus == fact.max_gpus
    assert it.nvlink.is_multi_node is fact.multi_node
    assert it.sources
    assert all(s.strip() for s in it.sources)


@pytest.mark.parametrize(
    ("name", "mib"),
    [
        ("p4d.24xlarge", 40960),
        ("p4de.24xlarge", 81920),
        ("p5.48xlarge", 81920),
        ("p5e.48xlarge", 144384),
        ("p5en.48xlarge", 144384),
        ("p6-b200.48xlarge", 183359),
        ("p6-b300.48xlarge", 275040),
        ("p6e-gb200.36xlarge", 176428),
        ("lab-cpu", 0),
    ],
)
def test_gpu_memory(name: str, mib: int) -> None:
    assert INSTANCES[name].gpu_memory_mib == mib


@pytest.mark.parametrize(
    ("name", "vcpus", "mem"),
    [
        ("p4d.24xlarge", 96, 1152),
        ("p5.48xlarge", 192, 2048),
        ("p6-b300.48xlarge", 192, 4096),
        ("p6e-gb200.36xlarge", 144, 960),
    ],
)
def test_cpu_and_memory(name: str, vcpus: int, mem: int) -> None:
    assert INSTANCES[name].vcpus == vcpus
    assert INSTANCES[name].memory_gib == mem


def test_only_lab_cpu_is_virtual() -> None:
    assert [i.name for i in INSTANCES.values() if i.virtual] == ["lab-cpu"]
    lab = INSTANCES["lab-cpu"]
    assert lab.efa_generation is None
    assert lab.nvlink == NVLinkDomain(instances=(1,), gpus_per_instance=0)


def test_gb200_is_marked_unverified_with_notes() -> None:
    gb = INSTANCES["p6e-gb200.36xlarge"]
    assert gb.verified is False
    joined = " ".join(gb.notes)
    assert "inconsistent" in joined
    assert "IMEX" in joined
    assert "u-p6e-gb200x36" in joined


def test_depth_four_only_for_p6_hgx() -> None:
    assert {i.name for i in INSTANCES.values() if i.topology_depth == 4} == {
        "p6-b200.48xlarge",
        "p6-b300.48xlarge",
    }


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("p5.48xlarge", "p5.48xlarge"),
        ("P5.48XLARGE", "p5.48xlarge"),
        ("  p5en.48xlarge ", "p5en.48xlarge"),
        ("p5", "p5.48xlarge"),
        ("P5E", "p5e.48xlarge"),
        ("p4d", "p4d.24xlarge"),
        ("p4de", "p4de.24xlarge"),
        ("p6-b200", "p6-b200.48xlarge"),
        ("p6-b300", "p6-b300.48xlarge"),
        ("p6e-gb200", "p6e-gb200.36xlarge"),
        ("ml.p5.48xlarge", "p5.48xlarge"),
        ("ML.P6E-GB200.36XLARGE", "p6e-gb200.36xlarge"),
        ("ml.p5en", "p5en.48xlarge"),
        ("lab-cpu", "lab-cpu"),
        ("LAB-CPU", "lab-cpu"),
    ],
)
def test_get_instance_aliases(alias: str, canonical: str) -> None:
    assert get_instance(alias) is INSTANCES[canonical]


@pytest.mark.parametrize("bad", ["", "p3dn.24xlarge", "p5.24xlarge", "ml.", "g5.12xlarge", "p6"])
def test_unknown_instance_lists_known_names(bad: str) -> None:
    with pytest.raises(UnknownInstanceType) as info:
        get_instance(bad)
    message = str(info.value)
    assert repr(bad) in message
    for name in known_instance_names():
        assert name in message


def test_unknown_instance_is_value_error_and_user_error() -> None:
    with pytest.raises(ValueError, match="unknown instance type"):
        get_instance("nope")
    assert issubclass(UnknownInstanceType, SlurmfmError)


def test_catalog_is_read_only() -> None:
    with pytest.raises(TypeError):
        INSTANCES["x"] = INSTANCES["p5.48xlarge"]  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        INSTANCES["p5.48xlarge"].gpus = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("instances", "gpus"),
    [((), 8), ((0,), 8), ((1, -1), 8), ((1,), -1)],
)
def test_nvlink_domain_rejects_nonsense(instances: tuple[int, ...], gpus: int) -> None:
    with pytest.raises(ValueError, match="NVLinkDomain"):
        NVLinkDomain(instances=instances, gpus_per_instance=gpus)


@pytest.mark.parametrize(
    "changes",
    [
        {"topology_depth": 5},
        {"gpus": 4},
        {"sources": ()},
    ],
)
def test_instance_type_invariants(changes: dict[str, object]) -> None:
    base: InstanceType = INSTANCES["p5.48xlarge"]
    with pytest.raises(ValueError, match=r"p5\.48xlarge"):
        replace(base, **changes)  # type: ignore[arg-type]
