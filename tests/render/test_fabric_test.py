"""``resilience.fabric_test``: the runtime's options, the catalog's cited floor, bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from render_helpers import rendered

from slurmfm.catalog.fabric import FLOOR_FRACTION, REFERENCE, TEST_ARGS
from slurmfm.catalog.instances import INSTANCES
from slurmfm.errors import RecipeError
from slurmfm.recipe.loader import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_off_by_default_and_on_it_passes_the_catalogs_floor_to_the_runtime() -> None:
    assert "--fabric-test" not in rendered(load_recipe(RECIPES / "llama3-8b-p5-fsdp.yaml")).text
    r = load_recipe(RECIPES / "llama3-8b-p5-fsdp.yaml", {"resilience.fabric_test": "fail"})
    text = rendered(r).text
    floor = round(REFERENCE["p5"].busbw_gbs * FLOOR_FRACTION, 1)
    assert (
        f"--fabric-test fail --fabric-cmd all_reduce_perf --fabric-args='{' '.join(TEST_ARGS)}' "
        f"--fabric-floor-gbs {floor:g} --fabric-tasks 8 --fabric-mpi pmix" in text
    )
    own = load_recipe(
        RECIPES / "llama3-8b-p5-fsdp.yaml",
        {
            "resilience.fabric_test": "warn",
            "resilience.fabric_min_busbw_gbs": 250,
            "resilience.fabric_test_command": "/fsx/nccl-tests/build/all_reduce_perf",
        },
    )
    text = rendered(own).text
    assert "--fabric-test warn --fabric-cmd /fsx/nccl-tests/build/all_reduce_perf" in text
    assert "--fabric-floor-gbs 250" in text


def test_every_reference_cites_its_source_and_names_a_known_family() -> None:
    families = {i.family for i in INSTANCES.values()}
    for family, ref in REFERENCE.items():
        assert family in families
        assert ref.busbw_gbs > 0
        assert "/" in ref.source  # owner/repo:path
        assert ref.setup


def test_fail_without_a_floor_is_refused_and_warn_logs_the_figures_only() -> None:
    with pytest.raises(RecipeError, match="fabric_min_busbw_gbs"):
        load_recipe(RECIPES / "gb200-llama3-405b.yaml", {"resilience.fabric_test": "fail"})
    r = load_recipe(RECIPES / "gb200-llama3-405b.yaml", {"resilience.fabric_test": "warn"})
    assert "--fabric-floor-gbs 0 " in rendered(r, "25.05").text  # 0: figures only
    assert "--fabric-test warn" in rendered(r, "25.05").text


def test_a_serving_job_has_no_launch_to_test_before() -> None:
    with pytest.raises(RecipeError, match="fabric_test: it runs before a training launch"):
        load_recipe(RECIPES / "vllm-llama3-70b-2xp5.yaml", {"resilience.fabric_test": "warn"})


@pytest.mark.parametrize(
    ("value", "what"),
    [("fast", "valid number"), ("-5", "greater than 0"), ("[1]", "valid number")],
)
def test_a_floor_that_is_not_a_number_is_one_located_line_and_exit_2(
    tmp_path: Path, value: str, what: str
) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(
        "name: r\nresources: {nodes: 2}\nresilience:\n  fabric_test: fail\n"
        f"  fabric_min_busbw_gbs: {value}\nlauncher: {{kind: torchrun, script: /fsx/t.py}}\n"
    )
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{f}:5: resilience.fabric_min_busbw_gbs: ")
    assert what in line
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "validate", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert ":5: resilience.fabric_min_busbw_gbs:" in proc.stderr
