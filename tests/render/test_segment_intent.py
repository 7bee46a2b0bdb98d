"""GB200 segments from the recipe's intent, and Slurm 25.11's segment options by version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from render_helpers import recipe, rendered

from slurmfm.errors import UnsupportedError
from slurmfm.plan.types import Placement
from slurmfm.recipe.loader import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
GB200: dict[str, Any] = {"cluster__instance_type": "p6e-gb200.36xlarge", "parallelism": {"tp": 4}}


def sbatch(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def test_the_shipped_gb200_recipe_takes_one_whole_ultraserver() -> None:
    """18 nodes fit one u-p6e-gb200x72: one segment of 18, not 9 + 9 on two UltraServers."""
    out = rendered(load_recipe(RECIPES / "gb200-llama3-405b.yaml"))
    assert "#SBATCH --segment=18" in sbatch(out.text)
    assert "#SBATCH --segment=9" not in out.text
    assert not any("NVLink domains of" in w for w in out.warnings)
    assert "the whole job in one NVLink domain" in out.text


def test_a_split_that_halves_the_domain_warns() -> None:
    # 27 nodes: segments of 9 are all that divide it, so Slurm may use 18-instance
    # UltraServers half-full; a planned segment of 9 for 18 nodes does the same.
    out = rendered(recipe(**GB200, resources__nodes=27), "24.11")
    assert "#SBATCH --segment=9" in sbatch(out.text)
    assert any(
        "NVLink domains of 9 nodes (36 GPUs) instead of 18 (72 GPUs)" in w for w in out.warnings
    )
    planned = rendered(recipe(**GB200, resources__nodes=18), "24.11", Placement(segment=9))
    assert any("instead of 18 (72 GPUs)" in w for w in planned.warnings)
    whole = rendered(recipe(**GB200, resources__nodes=36), "24.11")
    assert not any("NVLink domains of" in w for w in whole.warnings)


@pytest.mark.parametrize(
    ("version", "expected"),
    [("24.11", False), ("25.05", False), ("25.11", True), ("26.05", True)],
)
def test_consolidate_segments_from_25_11_when_the_job_has_several(
    version: str, expected: bool
) -> None:
    lines = sbatch(rendered(recipe(**GB200, resources__nodes=36), version).text)
    assert "#SBATCH --segment=18" in lines
    assert ("#SBATCH --consolidate-segments" in lines) is expected
    # one segment: nothing to consolidate
    one = sbatch(rendered(recipe(**GB200, resources__nodes=18), version).text)
    assert "#SBATCH --consolidate-segments" not in one


def test_spread_segments_and_a_channel_per_segment_are_gated() -> None:
    r = recipe(
        **GB200, resources__nodes=36, resources__segments="spread", network__imex_channel="segment"
    )
    lines = sbatch(rendered(r, "25.11").text)
    assert "#SBATCH --spread-segments" in lines
    assert "#SBATCH --consolidate-segments" not in lines
    assert "#SBATCH --network=unique-channel-per-segment" in lines
    with pytest.raises(UnsupportedError, match=r"--spread-segments needs Slurm >= 25.11"):
        rendered(r, "24.11")
    with pytest.raises(UnsupportedError, match=r"unique-channel-per-segment needs Slurm >= 25.11"):
        rendered(recipe(**GB200, resources__nodes=18, network__imex_channel="segment"), "24.11")
    with pytest.raises(UnsupportedError, match=r"--consolidate-segments needs Slurm >= 25.11"):
        rendered(recipe(**GB200, resources__nodes=36, resources__segments="consolidate"), "24.11")


def test_a_gb200_sglang_tp16_job_gets_one_ultraserver_segment() -> None:
    """SGLang's --ep-size divides --tp and reuses its GPUs: the NVLink unit of TP16/EP16 is 16
    GPUs (4 GB200 nodes), not tp x ep = 256 (64 nodes), so the 4-node job gets --segment=4."""
    r = load_recipe(
        RECIPES / "sglang-deepseek-v3-p6-b200.yaml",
        {"cluster.instance_type": "p6e-gb200.36xlarge", "resources.nodes": 4},
    )
    assert (r.parallelism.tp, r.parallelism.ep) == (16, 16)
    out = rendered(r, "25.05")
    assert "#SBATCH --segment=4" in sbatch(out.text)
    assert not any("no --segment" in w for w in out.warnings)


def test_a_gb200_vllm_replica_is_kept_in_one_nvlink_domain() -> None:
    """vLLM's replica is tp x pp: TP4 x PP4 on 4 GB200 nodes is one 16-GPU span, one segment."""
    r = load_recipe(
        RECIPES / "vllm-llama3-70b-2xp5.yaml",
        {
            "cluster.instance_type": "p6e-gb200.36xlarge",
            "cluster.constraints": None,
            "resources.nodes": 4,
            "parallelism.tp": 4,
            "parallelism.pp": 4,
        },
    )
    out = rendered(r, "25.05")
    assert "#SBATCH --segment=4" in sbatch(out.text)


def test_the_serving_span_is_the_servers_own() -> None:
    from slurmfm.launchers import server_spec
    from slurmfm.recipe.schema import Parallelism

    p = Parallelism(tp=16, pp=2, ep=8)
    assert server_spec("sglang").nvlink_span(p) == 16
    assert server_spec("vllm").nvlink_span(p) == 32
