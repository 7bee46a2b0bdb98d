"""One spec per launcher (slurmfm/launchers/): the registry is complete, each spec answers
for its own launcher, and nothing outside the launcher modules tests a launcher's kind."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from slurmfm.api import load, override
from slurmfm.launchers import (
    SAVE_ON_SIGNAL_LAUNCHERS,
    SERVE_KINDS,
    SPECS,
    Launcher,
    ServeLauncher,
    spec,
)
from slurmfm.recipe.schema import Recipe

RUN_MODULE = 'python3 -c "$slurmfm_run_module"'  # defined once in the script

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"


def _kinds(union: object) -> set[str]:
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["kind"].annotation)[0] for m in members}


def test_every_launcher_of_the_schema_has_a_spec_and_no_spec_is_without_one() -> None:
    assert _kinds(Launcher) == set(SPECS)
    assert _kinds(ServeLauncher) == set(SERVE_KINDS) == {"vllm", "sglang"}
    assert set(SAVE_ON_SIGNAL_LAUNCHERS) == {"torchrun", "megatron", "nemo"}
    for kind, s in SPECS.items():
        assert s.kind == kind
        assert s.server == (kind in SERVE_KINDS)
        # a server has no training state to save; a Ray cluster's daemons share the step
        # with its driver, so Slurm's USR2 would reach them too (slurmfm/launchers/ray.py)
        assert (s.save_signal is None) == (s.server or kind == "ray")


def _recipe(name: str, **changes: object) -> Recipe:
    return override(load(RECIPES / name), changes) if changes else load(RECIPES / name)


def test_the_completion_check_follows_the_launcher() -> None:
    megatron = _recipe("llama3-70b-p5en-megatron.yaml")
    assert spec("megatron").done_check(megatron) == "megatron:250000"
    by_samples = override(
        megatron,
        {
            "launcher.model_args.train-iters": None,
            "launcher.model_args.train-samples": 1000,
            "launcher.model_args.global-batch-size": 32,
        },
    )
    # Megatron counts iterations; 1000 samples at 32 a batch are 31 of them
    assert spec("megatron").done_check(by_samples) == "megatron:31"
    assert spec("torchrun").done_check(_recipe("quickstart.yaml")) == "marker"
    assert spec("nemo").done_check(_recipe("nemo-llama3-8b-p6-b200.yaml")) == "marker"
    assert spec("vllm").done_check(_recipe("vllm-llama3-70b-2xp5.yaml")) == "none"


def test_the_save_signal_and_what_is_forwarded_follow_the_launcher() -> None:
    nemo = _recipe("nemo-llama3-8b-p6-b200.yaml")
    assert spec("nemo").forward(nemo) == "TERM"  # PreemptionCallback saves on TERM
    assert spec("nemo").forward(override(nemo, {"resilience.save_on_signal": False})) == "none"
    assert spec("megatron").forward(_recipe("llama3-70b-p5en-megatron.yaml")) == "TERM"
    assert spec("torchrun").forward(_recipe("quickstart.yaml")) == "none"  # Slurm's USR2
    assert spec("nemo").tasks_per_node(nemo) == nemo.procs_per_node  # one task per GPU
    assert spec("torchrun").tasks_per_node(_recipe("quickstart.yaml")) == 1


def test_a_spec_asked_about_another_launchers_recipe_says_it_is_a_bug() -> None:
    with pytest.raises(TypeError, match="internal"):
        spec("megatron").launch(_recipe("quickstart.yaml"), "$D")


def test_the_launch_line_of_torchrun_is_its_specs() -> None:
    line = spec("torchrun").launch(_recipe("quickstart.yaml"), "$D")
    assert line.lines[0] == f"{RUN_MODULE} torch.distributed.run"
    assert line.prefix == 4  # --node-rank goes after python3 -c RUN torch.distributed.run
    assert any("--master-port=" in w for w in line.lines)


# What may still name a launcher kind outside slurmfm/launchers: type narrowing of a server
# section (render/script.py _serve), the planner's message sizes from Megatron's model
# arguments (cli/plan.py), and the runtime's reading of its --done-check word
# (megatron:ITERS), which is not a launcher kind.
ALLOWED = {
    ("slurmfm/job/batch_judge.py", 'kind == "megatron"'),
    ("slurmfm/cli/plan.py", "isinstance(launcher, MegatronLauncher)"),
}
KIND_TEST = re.compile(
    r"""kind\s*(?:==|!=|in|not in)\s*\(?\s*["'](?:torchrun|megatron|nemo|vllm|sglang)["']"""
    r"""|isinstance\([^)]*(?:Torchrun|Megatron|Nemo|Vllm|Sglang)Launcher[^)]*\)"""
)


def test_no_module_outside_the_launchers_branches_on_a_launcher_kind() -> None:
    found = set()
    for path in sorted((ROOT / "slurmfm").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("slurmfm/launchers/"):
            continue
        for m in KIND_TEST.finditer(path.read_text()):
            found.add((rel, m.group(0)))
    assert found <= ALLOWED, sorted(found - ALLOWED)
