"""What each EFA installer bundles, and which NCCL each aws-ofi-nccl release was tested with.

Why: a recipe (or ``slurmfm`` probing a node) often knows only the EFA installer version, while
the NCCL/EFA rules (slurmfm/catalog/nccl.py) are gated on the aws-ofi-nccl and libfabric
versions it installs. And an aws-ofi-nccl release states the NCCL releases it was tested with:
an NCCL newer than those is untested with that plugin, which is worth a warning, not a failure
(each release keeps "backward compatibility with older NCCL versions (NCCL v2.17.1 and later)").

Sources, per entry: the EFA installer release notes
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-changelog.html) and the aws-ofi-nccl
release notes (https://github.com/aws/aws-ofi-nccl/releases/tag/vX.Y.Z).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from packaging.version import Version

__all__ = ["EFA_BUNDLES", "OFI_TESTED_NCCL", "Bundle", "bundled", "untested_nccl"]

SRC_EFA_CHANGELOG = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-changelog.html"


@dataclass(frozen=True)
class Bundle:
    """The aws-ofi-nccl and libfabric an EFA installer release installs."""

    efa_installer: str
    aws_ofi_nccl: str
    libfabric: str
    source: str


EFA_BUNDLES: Mapping[str, Bundle] = MappingProxyType(
    {
        b.efa_installer: b
        for b in (
            Bundle("1.51.0", "1.22.0", "2.7.0amzn2.0", f"{SRC_EFA_CHANGELOG} (1.51.0)"),
            Bundle("1.50.0", "1.21.1", "2.6.0amzn1.0", f"{SRC_EFA_CHANGELOG} (1.50.0)"),
        )
    }
)
"""EFA installer release -> what it bundles (only the releases a source here records)."""


@dataclass(frozen=True)
class TestedNccl:
    """The newest NCCL an aws-ofi-nccl release series names as tested."""

    series: str  # "1.19": every 1.19.x release
    nccl: str
    source: str


OFI_TESTED_NCCL: Mapping[str, TestedNccl] = MappingProxyType(
    {
        t.series: t
        for t in (
            TestedNccl(
                "1.19",
                "2.29.7",
                "https://github.com/aws/aws-ofi-nccl/releases/tag/v1.19.2 (NCCL v2.27.3-1, "
                "v2.28.7-1, v2.29.7-1)",
            ),
            TestedNccl(
                "1.20",
                "2.30.4",
                "https://github.com/aws/aws-ofi-nccl/releases/tag/v1.20.0 (NCCL v2.28.9-1, "
                "v2.29.7-1, v2.30.4-1)",
            ),
            TestedNccl(
                "1.21",
                "2.31.2",
                "https://github.com/aws/aws-ofi-nccl/releases/tag/v1.21.1 (NCCL v2.31.2-1)",
            ),
        )
    }
)


def _base(v: Version) -> Version:
    return Version(v.base_version)


def bundled(efa_installer: Version | None) -> Bundle | None:
    """What this EFA installer release bundles, when a source records it."""
    if efa_installer is None:
        return None
    return EFA_BUNDLES.get(str(_base(efa_installer)))


def untested_nccl(aws_ofi_nccl: Version | None, nccl: Version | None) -> str | None:
    """A warning when ``nccl`` is newer than any NCCL the plugin's release series was tested
    with; None when either version is unknown or the series is not recorded."""
    if aws_ofi_nccl is None or nccl is None:
        return None
    series = f"{aws_ofi_nccl.major}.{aws_ofi_nccl.minor}"
    tested = OFI_TESTED_NCCL.get(series)
    if tested is None or _base(nccl) <= Version(tested.nccl):
        return None
    return (
        f"aws-ofi-nccl {series}.x was tested up to NCCL {tested.nccl}; NCCL {nccl} is untested "
        f"with it (it keeps compatibility with older NCCL only) [{tested.source}]"
    )
