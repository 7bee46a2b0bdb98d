"""Slurm feature gates: parsing, every gate at its boundary, and the error message."""

from __future__ import annotations

import pytest

from slurmfm.catalog import slurm_features
from slurmfm.catalog.slurm_features import (
    FEATURES,
    Feature,
    SlurmVersion,
    UnsupportedBySlurm,
    require,
    supports,
)
from slurmfm.errors import SlurmfmError, UnsupportedError

V = SlurmVersion


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("22.05.8", V(22, 5, 8)),
        ("24.11", V(24, 11)),
        ("slurm 24.11.5", V(24, 11, 5)),
        ("SLURM 24.11.5", V(24, 11, 5)),
        ("26.05.5-1", V(26, 5, 5)),
        ("25.11.4", V(25, 11, 4)),
        ("24.11.5-4+deb13u1", V(24, 11, 5)),
        ("23.11.10-4", V(23, 11, 10)),
        ("slurm-24-11-5-1", V(24, 11, 5)),
        ("  25.05  ", V(25, 5)),
        ("2.3", V(2, 3)),
    ],
)
def test_parse(text: str, expected: SlurmVersion) -> None:
    assert SlurmVersion.parse(text) == expected


@pytest.mark.parametrize("text", ["", "24", "abc", "24.11.5.6", "slurm", "v", "24.x", "1.2.3.4"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm version"):
        SlurmVersion.parse(text)


@pytest.mark.parametrize(
    ("version", "text"),
    [(V(24, 11), "24.11"), (V(24, 11, 5), "24.11.5"), (V(22, 5, 8), "22.05.8"), (V(2, 3), "2.3")],
)
def test_str(version: SlurmVersion, text: str) -> None:
    assert str(version) == text
    assert SlurmVersion.parse(text) == version


def test_ordering() -> None:
    assert V(22, 5, 8) < V(23, 11) < V(24, 5, 2) < V(24, 5, 3) < V(24, 11) < V(26, 5)
    assert V(24, 11, 0) == SlurmVersion.parse("24.11")


# feature, just below, at, above
GATES = [
    ("switches", V(2, 2), V(2, 3), V(22, 5, 8)),
    ("topology_block", V(23, 2, 7), V(23, 11), V(23, 11, 10)),
    ("segment", V(23, 11, 10), V(24, 5), V(24, 11, 5)),
    ("topology_yaml", V(24, 11, 6), V(25, 5), V(25, 11, 4)),
    ("block_as_node_rank", V(25, 5, 5), V(25, 11), V(26, 5, 5)),
    ("exclusive_topo", V(23, 11, 10), V(24, 5), V(24, 11, 5)),
    ("tree_selection_rules_2405_3", V(24, 5, 2), V(24, 5, 3), V(24, 11)),
    ("segment_larger_than_base_block", V(24, 11, 5), V(25, 11), V(26, 5, 5)),
    ("nodelist_with_segment", V(24, 11, 5), V(26, 5), V(26, 5, 5)),
    ("sbatch_test_only", V(21, 8), V(22, 5), V(22, 5, 8)),
    ("open_mode", V(21, 8), V(22, 5), V(24, 11)),
    ("signal_batch", V(21, 8), V(22, 5), V(24, 11)),
    ("requeue", V(21, 8), V(22, 5), V(24, 11)),
    ("gpus_per_node", V(18, 8), V(19, 5), V(22, 5, 8)),
    ("wait_all_nodes", V(21, 8), V(22, 5), V(25, 11)),
    ("kill_on_invalid_dep", V(21, 8), V(22, 5), V(24, 11)),
    ("hetjob", V(19, 5), V(20, 2), V(22, 5, 8)),
    ("requeue_expedite", V(25, 5, 5), V(25, 11), V(26, 5, 5)),
    ("consolidate_segments", V(25, 5, 5), V(25, 11), V(26, 5, 5)),
    ("spread_segments", V(25, 5, 5), V(25, 11), V(26, 5, 5)),
    ("network_unique_channel_per_segment", V(25, 5, 5), V(25, 11), V(26, 5, 5)),
    ("srun_async", V(25, 11, 4), V(26, 5), V(26, 5, 5)),
    ("topology_ring", V(25, 11, 4), V(26, 5), V(26, 5, 5)),
    ("topology_torus3d", V(25, 11, 4), V(26, 5), V(26, 5, 5)),
    ("slurmctld_openmetrics", V(25, 5, 5), V(25, 11), V(26, 5, 5)),
]


def test_every_feature_has_a_gate_case() -> None:
    assert {g[0] for g in GATES} == set(FEATURES)


@pytest.mark.parametrize(("feature", "below", "at", "above"), GATES)
def test_gate_boundaries(
    feature: str, below: SlurmVersion, at: SlurmVersion, above: SlurmVersion
) -> None:
    assert FEATURES[feature].introduced == at
    assert supports(feature, below) is False
    assert supports(feature, at) is True
    assert supports(feature, above) is True
    with pytest.raises(UnsupportedBySlurm):
        require(feature, below, "x")
    require(feature, at, "x")
    require(feature, above, "x")


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        # newer-slurm.md: 24.11 has no BlockAsNodeRank and rejects a segment > base block;
        # 26.05 has both. The local lab (22.05.8) has none of the block features.
        ("24.11.5", {"block_as_node_rank": False, "segment_larger_than_base_block": False}),
        ("26.05.5-1", {"block_as_node_rank": True, "segment_larger_than_base_block": True}),
        ("22.05.8", {"topology_block": False, "segment": False, "switches": True}),
        ("22.05.8", {"tree_selection_rules_2405_3": False, "sbatch_test_only": True}),
        ("24.05.8", {"segment": True, "topology_yaml": False}),
        ("24.11.5", {"requeue_expedite": False}),
        ("26.05.5", {"requeue_expedite": True}),
    ],
)
def test_observed_clusters(version: str, expected: dict[str, bool]) -> None:
    v = SlurmVersion.parse(version)
    assert {f: supports(f, v) for f in expected} == expected


def test_require_message() -> None:
    with pytest.raises(UnsupportedBySlurm) as info:
        require("segment", V(23, 11, 10), "--segment=9")
    assert (
        str(info.value) == "--segment=9 needs Slurm >= 24.05 (segment); this cluster runs 23.11.10"
    )


def test_error_types() -> None:
    assert issubclass(UnsupportedBySlurm, ValueError)
    assert issubclass(UnsupportedBySlurm, UnsupportedError)
    assert issubclass(UnsupportedBySlurm, SlurmfmError)


def test_unknown_feature_is_key_error() -> None:
    with pytest.raises(KeyError):
        supports("no_such_feature", V(26, 5))
    with pytest.raises(KeyError):
        require("no_such_feature", V(26, 5), "x")


def test_removed_features(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = Feature("gone", V(20, 2), V(24, 5), "test only", "test")
    monkeypatch.setattr(slurm_features, "FEATURES", {"gone": gone})
    assert supports("gone", V(23, 11)) is True
    assert supports("gone", V(24, 5)) is False
    assert supports("gone", V(20, 1)) is False
    with pytest.raises(UnsupportedBySlurm, match=r"was removed in Slurm 24\.05"):
        require("gone", V(24, 11), "--gone")


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_feature_metadata(feature: str) -> None:
    f = FEATURES[feature]
    assert f.name == feature
    assert f.source.strip()
    assert f.description.strip()
    if not f.verified:
        lowered = f.description.lower()
        assert "unverified" in lowered or "floor" in lowered or "not in the reference" in lowered
