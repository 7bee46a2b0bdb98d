"""A recipe file's relative paths mean "next to this file", in the API and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmfm import api

REPO_ROOT = Path(__file__).resolve().parents[2]

BASE = """\
name: own
cluster: {partition: batch, instance_type: lab-cpu}
resources: {nodes: 1, procs_per_node: 1, time_limit: "5"}
launcher:
  kind: torchrun
  script: scripts/train.py
  args: [--data, data/x.bin]
storage:
  checkpoint_root: ../runs/ckpt
  log_dir: logs
  data: {train: data/train.bin, abs: /fsx/data}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    proj = tmp_path / "proj"
    (proj / "scripts").mkdir(parents=True)
    (proj / "scripts" / "train.py").write_text("print('hi')\n")
    (proj / "recipe.yaml").write_text(BASE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return proj


def test_relative_paths_in_a_recipe_file_resolve_against_the_file(project: Path) -> None:
    r = api.load(project / "recipe.yaml")
    assert r.launcher.script == str(project / "scripts" / "train.py")  # type: ignore[union-attr]
    assert r.storage.checkpoint_root == str(project.parent / "runs" / "ckpt")
    assert r.storage.log_dir == str(project / "logs")
    assert r.storage.data == {"train": str(project / "data" / "train.bin"), "abs": "/fsx/data"}
    # The program's own arguments are its business: never rewritten.
    assert r.launcher.args == ["--data", "data/x.bin"]  # type: ignore[union-attr]
    text = api.render(r).text
    assert str(project / "scripts" / "train.py") in text
    assert f"--output={project}/logs/" in text


def test_a_relative_load_path_resolves_too(project: Path) -> None:
    os.chdir(project.parent)
    r = api.load("proj/recipe.yaml")
    assert r.launcher.script == str(project / "scripts" / "train.py")  # type: ignore[union-attr]


def test_overrides_and_dict_recipes_stay_relative_to_the_working_directory(
    project: Path,
) -> None:
    r = api.load(project / "recipe.yaml", {"launcher.script": "other.py"})
    assert r.launcher.script == "other.py"  # type: ignore[union-attr]
    import ruamel.yaml

    data = ruamel.yaml.YAML(typ="safe").load(BASE)
    d = api.load(data)
    assert d.launcher.script == "scripts/train.py"  # type: ignore[union-attr]
    assert d.storage.log_dir == "logs"


def test_in_a_container_the_training_paths_are_the_containers(project: Path) -> None:
    text = BASE + (
        'container:\n  image: images/pt.sqsh\n  mounts: ["./data:/data", "/fsx:/fsx"]\n'
        "  workdir: /workspace\n"
    )
    (project / "recipe.yaml").write_text(text)
    r = api.load(project / "recipe.yaml")
    assert r.container is not None
    assert r.container.image == str(project / "images" / "pt.sqsh")
    assert r.container.mounts == [f"{project}/data:/data", "/fsx:/fsx"]
    assert r.launcher.script == "scripts/train.py"  # type: ignore[union-attr]  # in /workspace
    assert r.storage.data["train"] == "data/train.bin"
    assert r.storage.log_dir == str(project / "logs")  # sbatch writes it on the host
    reg = text.replace("images/pt.sqsh", "nvcr.io#nvidia/pytorch:25.01-py3")
    (project / "recipe.yaml").write_text(reg)
    assert api.load(project / "recipe.yaml").container.image == (  # type: ignore[union-attr]
        "nvcr.io#nvidia/pytorch:25.01-py3"
    )


def test_a_module_name_is_not_a_path(project: Path) -> None:
    text = BASE.replace("script: scripts/train.py", "module: true\n  script: lm_eval")
    (project / "recipe.yaml").write_text(text)
    assert api.load(project / "recipe.yaml").launcher.script == "lm_eval"  # type: ignore[union-attr]


def test_cli_render_from_another_directory_carries_the_resolved_paths(project: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "render", "--no-cache", str(project / "recipe.yaml")],
        cwd=project.parent / "elsewhere",
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(project / "scripts" / "train.py") in out.stdout


def test_a_sweep_tasks_training_paths_are_relative_to_the_file_too(project: Path) -> None:
    text = BASE + (
        "sweep:\n  tasks:\n    - {launcher.script: scripts/a.py, storage.data.train: d/a}\n"
        "  parameters: {env.LR: ['1', '2']}\n"
    )
    (project / "recipe.yaml").write_text(text)
    (task, _) = api.sweep_tasks(api.load(project / "recipe.yaml"))
    assert task.recipe.launcher.script == str(project / "scripts" / "a.py")  # type: ignore[union-attr]
    assert task.recipe.storage.data["train"] == str(project / "d" / "a")
