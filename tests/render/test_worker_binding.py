"""Worker CPU/NUMA binding by the instance's layout (slurmfm/catalog/binding.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from render_helpers import rendered

from slurmfm.catalog.binding import NUMA_LAYOUT
from slurmfm.catalog.instances import INSTANCES
from slurmfm.errors import RecipeError
from slurmfm.recipe.loader import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def launch_lines(text: str) -> str:
    return text.split("# Launch:", 1)[1]


def test_torchrun_launches_ask_the_node_entry_for_numa_binding() -> None:
    out = rendered(load_recipe(RECIPES / "llama3-8b-p5-fsdp.yaml"))
    assert " node --prefix 4 --forward none --numa node --" in launch_lines(out.text)
    off = rendered(
        load_recipe(RECIPES / "llama3-8b-p5-fsdp.yaml", {"resources.cpu_binding": "off"})
    )
    assert "--numa node" not in off.text


def test_a_torchrun_launch_in_a_container_binds_through_the_node_entry_in_the_image() -> None:
    """Issue 37 moved the node entry into the image: its ``--numa node`` gate runs there,
    with the image's torch and numactl (slurmfm/job/numa.py), as on the host; the container's
    shell program no longer edits the launch words."""
    for name in ("gb200-llama3-405b.yaml", "llama3-70b-p5en-megatron.yaml"):
        out = rendered(load_recipe(RECIPES / name))
        assert " node --prefix 4 --forward TERM --numa node --" in launch_lines(out.text), name
        assert "--numa-binding" not in out.text
        off = rendered(load_recipe(RECIPES / name, {"resources.cpu_binding": "off"}))
        assert "--numa" not in launch_lines(off.text)


def test_one_task_per_gpu_is_bound_by_srun_to_its_gpus_numa_domain() -> None:
    out = rendered(load_recipe(RECIPES / "nemo-llama3-8b-p6-b200.yaml"))
    assert "--cpu-bind=map_ldom:0,0,0,0,1,1,1,1" in launch_lines(out.text)
    off = rendered(
        load_recipe(RECIPES / "nemo-llama3-8b-p6-b200.yaml", {"resources.cpu_binding": "off"})
    )
    assert "--cpu-bind" not in off.text


def test_a_type_without_a_known_layout_is_left_unbound_with_a_warning() -> None:
    r = load_recipe(
        RECIPES / "nemo-llama3-8b-p6-b200.yaml",
        {"cluster.instance_type": "p6e-gb200.36xlarge", "resources.nodes": 9},
    )
    out = rendered(r, "25.05")
    assert "--cpu-bind" not in out.text
    assert any("no GPU-to-NUMA layout" in w for w in out.warnings)


def test_servers_and_the_cpu_lab_are_not_bound() -> None:
    for name in ("vllm-llama3-70b-2xp5.yaml", "sglang-deepseek-v3-p6-b200.yaml", "quickstart.yaml"):
        text = rendered(load_recipe(RECIPES / name)).text
        assert "--numa node" not in text
        assert "--numa-binding" not in text
        assert "--cpu-bind=map_ldom" not in text


def test_every_layout_names_an_instance_family_and_a_source() -> None:
    families = {i.family for i in INSTANCES.values()}
    for family, layout in NUMA_LAYOUT.items():
        assert family in families
        assert layout.source
        inst = next(i for i in INSTANCES.values() if i.family == family)
        ldoms = layout.map_ldom(inst.gpus).split(",")
        assert len(ldoms) == inst.gpus
        assert sorted(set(ldoms)) == [str(d) for d in range(layout.domains)]


def test_an_unknown_binding_mode_is_one_located_line_and_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(
        "name: r\nresources:\n  nodes: 1\n  cpu_binding: sockets\n"
        "launcher: {kind: torchrun, script: /fsx/t.py}\n"
    )
    with pytest.raises(RecipeError) as err:
        load_recipe(f)
    assert str(err.value).startswith(f"{f}:4: resources.cpu_binding: ")
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "validate", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert ":4: resources.cpu_binding:" in proc.stderr
