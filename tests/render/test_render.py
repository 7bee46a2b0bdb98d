"""Rendering rules: version and flavor gates, environment precedence, launchers."""

from __future__ import annotations

from pathlib import Path

import pytest
from render_helpers import recipe, render, shellcheck

from slurmfm.errors import UnsupportedError
from slurmfm.plan.types import Placement
from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script


def sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("22.05", "#SBATCH --gpus-per-node=8"),
        ("24.11", "#SBATCH --gpus-per-node=8"),
        ("18.08", "#SBATCH --gres=gpu:8"),
    ],
)
def test_gpu_request_gate(version: str, expected: str) -> None:
    assert expected in sbatch_lines(render(recipe(), version))


@pytest.mark.parametrize(("version", "ok"), [("23.11", False), ("24.05", True), ("26.05", True)])
def test_segment_gate(version: str, ok: bool) -> None:
    r = recipe(cluster__instance_type="p6e-gb200.36xlarge", resources__nodes=18, parallelism__tp=4)
    plan = Placement(mode="constrain", segment=9)
    if ok:
        assert "#SBATCH --segment=9" in render(r, version, plan)
    else:
        with pytest.raises(UnsupportedError, match=r"--segment needs Slurm >= 24.05"):
            render(r, version, plan)


def test_pin_and_switches(tmp_path: Path) -> None:
    plan = Placement(mode="pin", nodes=("node007", "node003"), switches="1@00:05:00")
    text = render(recipe(), placement=plan)
    lines = sbatch_lines(text)
    assert "#SBATCH --switches=1@00:05:00" in lines
    assert "#SBATCH --nodelist=node[003,007]" in lines
    assert "prepare --planned 'node007 node003'" in text
    shellcheck(text, tmp_path)


def test_pin_with_segment_adds_no_segment_rule() -> None:
    """A pinned GB200 plan on Slurm 26.05 carries the --segment topology/block needs to take
    its --nodelist; no --consolidate-segments, which could only refuse the fixed nodes."""
    r = recipe(cluster__instance_type="p6e-gb200.36xlarge", resources__nodes=8, parallelism__tp=4)
    nodes = tuple(f"gb-{i:03d}" for i in (10, 11, 12, 13, 14, 15, 16, 30))
    lines = sbatch_lines(render(r, "26.05", Placement(mode="pin", nodes=nodes, segment=1)))
    assert "#SBATCH --nodelist=gb-[010-016,030]" in lines
    assert any(line.startswith("#SBATCH --segment=1") for line in lines)
    assert not any("consolidate" in line for line in lines)


def launch(text: str) -> str:
    """The launch command (the srun after the "# Launch:" comment, to the payload line)."""
    start = text.index("# Launch:")
    return text[text.index("\n  srun ", start) + 3 : text.index("\n# slurmfm-runtime ", start)]


def test_hyperpod_auto_resume_only_on_srun() -> None:
    text = render(recipe(cluster__flavor="hyperpod"))
    assert not any("auto-resume" in line for line in sbatch_lines(text))
    assert launch(text).startswith("srun --auto-resume=1 ")
    assert text.count("--auto-resume=1") == 1  # once (issue 12.16)
    assert "--hyperpod 1" in text
    assert "#SBATCH --open-mode=append" in sbatch_lines(text)
    assert not any("gpus-per-node" in line for line in sbatch_lines(text))
    for flavor in ("parallelcluster", "pcs", "generic"):
        other = render(recipe(cluster__flavor=flavor))
        # only when the runtime finds /opt/sagemaker_cluster on the node
        assert "auto-resume" not in other
        assert "--hyperpod 0" in other


def test_runtime_adds_auto_resume_on_a_hyperpod_node_once() -> None:
    from slurmfm.job.batch import with_auto_resume

    assert with_auto_resume(["srun", "--nodes=2", "x"]) == [
        "srun",
        "--auto-resume=1",
        "--nodes=2",
        "x",
    ]
    assert with_auto_resume(["srun", "--auto-resume=1", "x"]) == ["srun", "--auto-resume=1", "x"]
    assert with_auto_resume([]) == []


def test_profile_env_is_commented_with_source_and_user_wins() -> None:
    text = render(recipe(env={"NCCL_DEBUG": "INFO", "MY_VAR": "a b"}))
    lines = text.splitlines()
    i = lines.index("export NCCL_SOCKET_IFNAME='^docker,lo,veth'")
    assert lines[i - 1].startswith("# ")
    assert "[" in lines[i - 1]  # reason [source]
    assert "export NCCL_DEBUG=INFO" in lines
    assert "export NCCL_DEBUG=WARN" not in lines
    j = lines.index("export NCCL_DEBUG=INFO")
    assert "overrides the slurmfm profile value" in lines[j - 1]
    assert "export MY_VAR='a b'" in lines


def test_forbidden_variables_warn() -> None:
    r = recipe(env={"NCCL_ALGO": "Tree"})
    rs = render_script(r, Target.for_recipe(r, "24.11"))
    assert any(w.startswith("env.NCCL_ALGO:") for w in rs.warnings)
    assert "export NCCL_ALGO=Tree" in rs.text  # the user's value still wins


def test_lab_cpu_has_no_nccl_profile() -> None:
    r = validate(
        {
            "name": "c",
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"procs_per_node": 2},
            "launcher": {"kind": "torchrun", "script": "t.py"},
        }
    )
    text = render(r)
    exports = [line for line in text.splitlines() if line.startswith("export ")]
    assert not any("NCCL_" in line or "FI_" in line for line in exports)
    assert "SLURMFM_NCCL_LOG=" not in text  # no transport check without EFA
    assert not any("gpus-per-node" in line or "gres" in line for line in sbatch_lines(text))


def test_container_leaves_plugin_path_to_the_loader(tmp_path: Path) -> None:
    """Issue 12.14: no guessed aws-ofi-nccl directory; the package's ld.so.conf.d entry wins."""
    text = render(recipe(container={"image": "/fsx/img.sqsh", "mounts": ["/fsx:/fsx"]}))
    assert "--container-image=/fsx/img.sqsh" in text
    assert "--container-mounts=/fsx:/fsx" in text
    assert "--no-container-mount-home" in text
    assert "uname -m" not in text
    assert "LD_LIBRARY_PATH" not in text
    shellcheck(text, tmp_path)


def test_host_python_env(tmp_path: Path) -> None:
    text = render(recipe(python_env={"activate": "/fsx/venv/bin/activate", "modules": ["cuda/12"]}))
    assert "module load cuda/12" in text
    assert "source /fsx/venv/bin/activate" in text
    shellcheck(text, tmp_path)


def test_megatron_launch(tmp_path: Path) -> None:
    r = validate(
        {
            "name": "m",
            "resources": {"nodes": 4},
            "parallelism": {"tp": 8, "pp": 2, "ep": 2},
            "launcher": {
                "kind": "megatron",
                "model_args": {"num-layers": 32, "bf16": True, "no-bias": False, "lr": 3e-4},
            },
            "storage": {"checkpoint_root": "/fsx/ckpt"},
        }
    )
    text = render(r)
    for arg in (
        "--tensor-model-parallel-size=8",
        "--pipeline-model-parallel-size=2",
        "--context-parallel-size=1",
        "--expert-model-parallel-size=2",
        '--save="$SLURMFM_CHECKPOINT_DIR"',
        '--load="$SLURMFM_CHECKPOINT_DIR"',
        "--num-layers 32",
        "--bf16",
        "--lr 0.0003",
        "/workspace/Megatron-LM/pretrain_gpt.py",
    ):
        assert arg in text
    assert "--no-bias" not in text
    assert "export SLURMFM_CHECKPOINT_DIR=/fsx/ckpt/m/m" in text
    shellcheck(text, tmp_path)


def test_nemo_launch(tmp_path: Path) -> None:
    r = validate(
        {
            "name": "n",
            "cluster": {"instance_type": "p6-b200.48xlarge"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 2, "pp": 2},
            "launcher": {
                "kind": "nemo",
                "recipe": "llama3_8b",
                "overrides": {"trainer.max_steps": 100, "log.name": 'it\'s "quoted"'},
            },
        }
    )
    text = render(r)
    assert "#SBATCH --ntasks-per-node=8" in sbatch_lines(text)
    assert "--ntasks-per-node=8" in launch(text)
    assert "<<'SLURMFM_NEMO_DRIVER_EOF'" in text
    assert 'getattr(llm, "llama3_8b")' in text
    assert "pretrain_recipe" in text
    shellcheck(text, tmp_path)
    # the driver is valid Python and carries the overrides exactly
    start = text.index("<<'SLURMFM_NEMO_DRIVER_EOF'\n") + len("<<'SLURMFM_NEMO_DRIVER_EOF'\n")
    driver = text[start : text.index("SLURMFM_NEMO_DRIVER_EOF\n)", start)]
    compile(driver, "driver", "exec")
    assert '\\"log.name\\": \\"it\'s \\\\\\"quoted\\\\\\"\\"' in driver


def test_rendering_is_deterministic() -> None:
    r = recipe(env={"B": "2", "A": "1"})
    assert render(r) == render(r)


def test_assumed_version_is_said() -> None:
    r = recipe()
    rs = render_script(r, Target.for_recipe(r))
    assert rs.target.assumed
    assert "(assumed: recipe says auto and no cluster was asked)" in rs.text


def test_exclusive_gpu_jobs_take_all_memory() -> None:
    assert "#SBATCH --mem=0" in sbatch_lines(render(recipe()))
    assert "#SBATCH --mem=64G" in sbatch_lines(render(recipe(resources__mem="64G")))


def test_megatron_by_samples_gets_its_iteration_count_as_the_completion_check() -> None:
    """Megatron run by --train-samples (AWS's Megatron sample) never writes a DONE marker: the
    check reads its tracker against the iterations Megatron computes from the samples."""
    base = {
        "name": "m",
        "resources": {"nodes": 4},
        "parallelism": {"tp": 8, "pp": 2},
        "storage": {"checkpoint_root": "/fsx/ckpt"},
    }
    args = {"num-layers": 32, "train-samples": 10000, "global-batch-size": 64}
    r = validate({**base, "launcher": {"kind": "megatron", "model_args": args}})
    text = render(r)
    assert "--done-check megatron:156" in text  # 10000 // 64
    assert "--done-check marker" not in text


def test_megatron_train_iters_follows_megatrons_arithmetic() -> None:
    from slurmfm.launchers.megatron import train_iters as megatron_train_iters

    assert megatron_train_iters({"train-samples": 1000, "global-batch-size": 32}, 4) == 31
    assert megatron_train_iters({"train-samples": 1000, "micro-batch-size": 2}, 4) == 125
    # --rampup-batch-size: current Megatron ignores it, older Megatron ramps: the count
    # depends on the image's Megatron, so it is not computed
    ramp = {"train-samples": 1000, "global-batch-size": 32, "rampup-batch-size": "16 16 64"}
    assert megatron_train_iters(ramp, 4) is None
    assert megatron_train_iters({"train-samples": "x", "global-batch-size": 32}, 4) is None
    # --step-batch-size-schedule: thresholds are tokens (pretrain passes seq_length), so
    # 0:16 and 32K tokens / 1024 = 32 samples:64 -> 2 batches of 16, then (1000-32)/64 -> 16
    sched = {"train-samples": 1000, "seq-length": 1024, "step-batch-size-schedule": "0:16 32K:64"}
    assert megatron_train_iters(sched, 4) == 2 + 16
    # without seq-length the thresholds' unit is not known here: not computable
    assert megatron_train_iters({**sched, "seq-length": None}, 4) is None
    assert megatron_train_iters({**sched, "step-batch-size-schedule": "5000:16"}, 4) is None


def test_megatron_step_schedule_follows_megatrons_own_loop() -> None:
    """The closed-form count equals Megatron's ``update_train_iters`` loop, iteration by
    iteration, on the schedule of Megatron's own GPT-3 175B example, scaled down."""
    from slurmfm.launchers.megatron import schedule_iters, step_schedule

    steps = step_schedule("0:16 2.4K:320 4.8K:624 7.2K:928 9.6K:1232 12K:1536", 1)
    assert steps is not None
    for samples in (0, 1, 15, 16, 17, 2400, 2401, 9999, 12000, 50000):
        iters = consumed = 0
        while consumed < samples:  # megatron/training/training.py update_train_iters
            consumed += [b for t, b in steps if t <= consumed][-1]
            iters += 1
        assert schedule_iters(steps, samples) == iters, samples


def test_megatron_without_a_computable_target_checks_megatrons_end_line() -> None:
    base = {
        "name": "m",
        "resources": {"nodes": 4},
        "parallelism": {"tp": 8, "pp": 2},
        "storage": {"checkpoint_root": "/fsx/ckpt"},
    }
    for args in (
        {"num-layers": 32},  # the count comes from a config file or extra_args
        {"train-samples": 1000, "step-batch-size-schedule": "0:16 32K:64"},  # no seq-length
        {"train-samples": 1000, "global-batch-size": 32, "rampup-batch-size": "16 16 64"},
    ):
        r = validate({**base, "launcher": {"kind": "megatron", "model_args": args}})
        text = render(r)
        assert "--done-check megatron-log" in text, args
    sched = {"train-samples": 1000, "seq-length": 1024, "step-batch-size-schedule": "0:16 32K:64"}
    r = validate({**base, "launcher": {"kind": "megatron", "model_args": sched}})
    assert "--done-check megatron:18" in render(r)


def test_a_multi_node_server_gets_the_nccl_transport_check() -> None:
    """vLLM and SGLang set up NCCL themselves, but an image without aws-ofi-nccl serves over
    TCP sockets silently: a server across nodes is checked as training is."""
    from slurmfm.recipe.loader import load_recipe

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    for name in ("vllm-llama3-70b-2xp5.yaml", "sglang-deepseek-v3-p6-b200.yaml"):
        text = render(load_recipe(recipes / name))
        assert "--nccl-check fail" in text, name
        assert 'export SLURMFM_NCCL_LOG="$slurmfm_nccl_dir/%h-%p.log"' in text
        warn = render(load_recipe(recipes / name, {"resilience.nccl_transport_check": "warn"}))
        assert "--nccl-check warn" in warn
        off = render(load_recipe(recipes / name, {"resilience.nccl_transport_check": "off"}))
        assert "--nccl-check" not in off
        assert "SLURMFM_NCCL_LOG" not in off
    one = load_recipe(
        recipes / "vllm-llama3-70b-2xp5.yaml", {"resources.nodes": 1, "parallelism.pp": 1}
    )
    assert "--nccl-check" not in render(one)  # one node: no network for NCCL to choose
