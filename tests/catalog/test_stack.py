"""The EFA installer bundles and the aws-ofi-nccl tested NCCL ranges, and how rules use them."""

from __future__ import annotations

from packaging.version import Version

from slurmfm.catalog.instances import get_instance
from slurmfm.catalog.nccl import StackVersions, check_minimums
from slurmfm.catalog.stack import EFA_BUNDLES, bundled, untested_nccl


def test_efa_installer_1_51_and_1_50_bundles() -> None:
    assert (EFA_BUNDLES["1.51.0"].aws_ofi_nccl, EFA_BUNDLES["1.51.0"].libfabric) == (
        "1.22.0",
        "2.7.0amzn2.0",
    )
    assert EFA_BUNDLES["1.50.0"].aws_ofi_nccl == "1.21.1"
    assert all("efa-changelog" in b.source for b in EFA_BUNDLES.values())
    assert bundled(Version("1.43.2")) is None  # not recorded: stays unknown


def test_a_known_installer_fills_the_plugin_and_libfabric_versions() -> None:
    s = StackVersions.parse(efa_installer="1.51.0")
    assert s.aws_ofi_nccl == Version("1.22.0")
    assert s.libfabric == Version("2.7.0")  # the amzn suffix is the vendor build
    # a version the recipe states wins over the bundle's
    assert StackVersions.parse(efa_installer="1.51.0", aws_ofi_nccl="1.21.1").aws_ofi_nccl == (
        Version("1.21.1")
    )
    assert StackVersions.parse().aws_ofi_nccl is None


def test_nccl_newer_than_the_plugin_was_tested_with_warns() -> None:
    assert untested_nccl(Version("1.19.2"), Version("2.29.7")) is None
    why = untested_nccl(Version("1.19.2"), Version("2.30.4"))
    assert why is not None
    assert "tested up to NCCL 2.29.7" in why
    assert "v1.19.2" in why
    assert untested_nccl(Version("1.18.0"), Version("2.30.4")) is None  # series not recorded
    warnings = check_minimums(
        get_instance("p5.48xlarge"), StackVersions.parse(aws_ofi_nccl="1.19.2", nccl="2.31.2")
    )
    assert any("aws-ofi-nccl 1.19.x was tested up to NCCL 2.29.7" in w for w in warnings)


def test_p6_b300_stays_unverified() -> None:
    b300 = get_instance("p6-b300.48xlarge")
    assert b300.verified is False
    assert any(n.startswith("Unverified:") for n in b300.notes)
