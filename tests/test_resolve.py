"""Resolve once (issue 43, item 1): :func:`slurmfm.resolve.resolve` looks up the facts a
script is rendered from, and the renderer formats them without asking the catalog again.

Before: one render asked ``get_instance`` again in the directives, the sweep table and the
script's helpers, the launcher registry in each helper, and ``slurm_features.supports`` up to
seven times; two parts of one script could be rendered from different answers.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

from slurmfm.catalog.instances import get_instance
from slurmfm.catalog.slurm_features import FEATURES, SlurmVersion, supports
from slurmfm.launchers import spec
from slurmfm.recipe.loader import load_recipe, validate
from slurmfm.render.script import render_resolved, render_script
from slurmfm.resolve import ResolvedJob, resolve
from slurmfm.target import Target

ROOT = Path(__file__).resolve().parents[1]
RENDER = str(ROOT / "slurmfm" / "render")
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))

# The questions resolve() answers once. (The serving group's own launcher, a train-and-serve
# recipe's ``serve.launcher``, is still asked in render/serve.py: ``server_spec``.)
LOOKUPS: dict[CodeType, str] = {
    get_instance.__code__: "get_instance",
    supports.__code__: "supports",
    spec.__code__: "spec",
}


def lookups_by_render(job: ResolvedJob) -> Counter[str]:
    """The catalog's and the registry's answers that code under ``slurmfm/render`` asks for
    while it renders ``job`` (``sys.setprofile`` sees every call, however it was imported)."""
    asked: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in LOOKUPS and frame.f_back is not None:
            caller = frame.f_back.f_code.co_filename
            if caller.startswith(RENDER):
                asked[f"{LOOKUPS[frame.f_code]} from {Path(caller).name}"] += 1

    sys.setprofile(profile)
    try:
        render_resolved(job)
    finally:
        sys.setprofile(None)
    return asked


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_render_asks_the_catalog_nothing_again(path: Path) -> None:
    recipe = load_recipe(path)
    job = resolve(recipe)
    assert lookups_by_render(job) == Counter()
    assert render_resolved(job).text == render_script(recipe).text


def test_the_check_sees_a_lookup_from_the_renderer() -> None:
    """The check above can fail: a renderer that asks the registry again is counted."""
    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml")
    job = resolve(recipe)
    asked: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in LOOKUPS and frame.f_back is not None:
            asked[LOOKUPS[frame.f_code]] += 1

    sys.setprofile(profile)
    try:
        from slurmfm.render.runtime_opts import _prepare_opts

        _prepare_opts(recipe, job.placement, None)  # without the resolved spec: asks again
    finally:
        sys.setprofile(None)
    assert asked["spec"] == 1


@pytest.mark.parametrize("version", ["19.05", "22.05", "24.05", "24.11", "25.11", "26.05"])
def test_the_resolved_gates_are_the_catalogs(version: str) -> None:
    recipe = validate(
        {
            "name": "x",
            "cluster": {"instance_type": "p5.48xlarge", "slurm_version": version},
            "launcher": {"kind": "torchrun", "script": "/fsx/train.py"},
        }
    )
    job = resolve(recipe)
    v = SlurmVersion.parse(version)
    assert job.version == v
    assert {f for f in FEATURES if job.supports(f)} == {f for f in FEATURES if supports(f, v)}
    with pytest.raises(KeyError):
        job.supports("no_such_feature")


def test_a_heterogeneous_server_gets_its_own_instance_type() -> None:
    raw: dict[str, Any] = {
        "name": "grpo",
        "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
        "resources": {"nodes": 2},
        "parallelism": {"tp": 8},
        "launcher": {"kind": "torchrun", "script": "/fsx/grpo.py"},
        "serve": {
            "nodes": 1,
            "placement": "hetjob",
            "instance_type": "p5en.48xlarge",
            "launcher": {"kind": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct"},
            "parallelism": {"tp": 8},
        },
    }
    job = resolve(validate(raw), Target.for_recipe(validate(raw), "24.11"))
    assert (job.inst.name, job.serve_inst and job.serve_inst.name) == (
        "p5.48xlarge",
        "p5en.48xlarge",
    )
    assert lookups_by_render(job) == Counter()
    raw["serve"]["placement"] = "split"
    raw["serve"].pop("instance_type")
    raw["resources"]["nodes"] = 4
    assert resolve(validate(raw)).serve_inst is None


def test_a_resolved_job_is_frozen_and_short() -> None:
    job = resolve(load_recipe(ROOT / "recipes" / "quickstart.yaml"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.inst = job.inst  # type: ignore[misc]
    assert len(repr(job)) < 200
    assert job.launcher.kind in repr(job)


def test_a_dry_run_carries_what_it_was_rendered_from() -> None:
    import slurmfm.api as fm

    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml")
    request = fm.dry_run(recipe)
    job = request.resolved_job
    assert job is not None
    assert job.recipe == recipe
    assert job.target == request.target
    assert job.inst.name == recipe.cluster.instance_type
    assert "resolved" not in repr(request)  # the request's repr stays short
