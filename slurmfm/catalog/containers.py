"""Pyxis and Enroot feature gates as data: which container option exists from which version.

Why: what a container step needs differs by runtime version, and the wrong guess fails either
way. Without ``--container-env`` a variable the image defines keeps the image's value (Pyxis
exports the host environment after the entrypoint but does not override image variables), so
the NCCL/EFA profile and the recipe's ``env:`` never reach the training processes; passing
``--container-env`` to a Pyxis that does not know it fails the step. Likewise Enroot 3.x does
not put the IMEX channel devices into the container, which GB200 multi-node NVLink needs.

A version of ``None`` ("auto") means unknown. The assumption is stated per gate: AWS's stacks
install Pyxis 0.19-0.20 (HyperPod lifecycle scripts, PCS templates, ParallelCluster cookbook)
and Enroot 3.4-3.5, so "auto" assumes a Pyxis with ``--container-env`` and an Enroot without
the IMEX mount.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from packaging.version import InvalidVersion, Version

__all__ = ["CONTAINER_FEATURES", "IMEX_CHANNELS_DIR", "ContainerFeature", "has", "parse_version"]

IMEX_CHANNELS_DIR = "/dev/nvidia-caps-imex-channels"


@dataclass(frozen=True)
class ContainerFeature:
    """A capability of Pyxis or Enroot, the release that brought it, and the source."""

    name: str
    component: Literal["pyxis", "enroot"]
    introduced: Version
    assume_when_unknown: bool
    description: str
    source: str


CONTAINER_FEATURES: Mapping[str, ContainerFeature] = MappingProxyType(
    {
        "container_env": ContainerFeature(
            name="container_env",
            component="pyxis",
            introduced=Version("0.15.0"),
            assume_when_unknown=True,
            description=(
                "srun --container-env=NAME[,NAME...]: these host variables override the "
                "image's values (without it an image-defined variable keeps the image's value)"
            ),
            source=(
                "NVIDIA/pyxis:README.md (--container-env); NVIDIA/pyxis:tests/env.bats; "
                "first released in v0.15.0: https://github.com/NVIDIA/pyxis/issues/105"
            ),
        ),
        "imex_channels": ContainerFeature(
            name="imex_channels",
            component="enroot",
            introduced=Version("4.0.0"),
            assume_when_unknown=False,
            description=(
                "Enroot's NVIDIA hook makes /dev/nvidia-caps-imex-channels available in the "
                "container; before it the step must bind-mount the directory"
            ),
            source=(
                "NVIDIA/enroot:conf/hooks/98-nvidia.sh (the 3.x hook passes no IMEX channel to "
                "nvidia-container-cli); NVIDIA/nccl:src/mnnvl.cc"
            ),
        ),
    }
)


def parse_version(field: str, text: str) -> Version | None:
    """``"auto"`` -> None; a version string -> Version; anything else -> ValueError."""
    cleaned = text.strip()
    if cleaned.lower() == "auto":
        return None
    try:
        return Version(cleaned.removeprefix("v"))
    except InvalidVersion:
        raise ValueError(
            f"{field}: {text!r} is not a version (use e.g. '0.20.0' or 'auto')"
        ) from None


def has(feature: str, version: Version | None) -> bool:
    """Whether the component at ``version`` has ``feature`` (None: the stated assumption)."""
    f = CONTAINER_FEATURES[feature]
    if version is None:
        return f.assume_when_unknown
    return Version(version.base_version) >= f.introduced
