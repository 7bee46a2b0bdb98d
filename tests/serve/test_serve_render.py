"""Serving recipes (vLLM, SGLang, train-and-serve, hetjob): validation and rendering, pure."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmfm.errors import RecipeError, UnsupportedError
from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script
from slurmfm.render.serve import serve_launch

RUN_MODULE = 'python3 -c "$slurmfm_run_module"'  # defined once in the script


def vllm(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "serve",
        "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
        "resources": {"nodes": 2},
        "parallelism": {"tp": 8, "pp": 2},
        "launcher": {"kind": "vllm", "model": "meta-llama/Llama-3.1-70B-Instruct"},
    }
    base.update(over)
    return base


def grpo(placement: str = "split", **serve: Any) -> dict[str, Any]:
    return {
        "name": "grpo",
        "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
        "resources": {"nodes": 4},
        "parallelism": {"tp": 8},
        "launcher": {"kind": "torchrun", "script": "/fsx/grpo.py"},
        "serve": {
            "nodes": 1,
            "placement": placement,
            "launcher": {"kind": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct"},
            "parallelism": {"tp": 8},
            **serve,
        },
    }


def text_of(raw: dict[str, Any], version: str = "24.11") -> str:
    r = validate(raw)
    return render_script(r, Target.for_recipe(r, version)).text


def checked(text: str, tmp: Path) -> str:
    f = tmp / "job.sh"
    f.write_text(text)
    assert subprocess.run(["bash", "-n", str(f)], capture_output=True).returncode == 0
    proc = subprocess.run(["shellcheck", "-S", "style", str(f)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    return text


def sbatch(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


# ------------------------------------------------------------------ validation
def test_vllm_layout_must_use_every_gpu() -> None:
    with pytest.raises(RecipeError, match=re.escape("parallelism.tp: tp*pp = 8*1 = 8 must equal")):
        validate(vllm(parallelism={"tp": 8}))


def test_vllm_tp_stays_in_the_nvlink_domain() -> None:
    with pytest.raises(RecipeError, match=re.escape("exceeds the NVLink domain of p5.48xlarge")):
        validate(vllm(parallelism={"tp": 16}))
    # a type without GPUs has no NVLink domain: the CPU build's tp runs across nodes (gloo)
    cpu = vllm(
        cluster={"instance_type": "lab-cpu", "partition": "batch"},
        resources={"nodes": 2, "procs_per_node": 1},
        parallelism={"tp": 2},
    )
    assert validate(cpu).parallelism.tp == 2


@pytest.mark.parametrize(
    ("port", "why"),
    [
        (8265, "the Ray head's own dashboard port"),
        (10001, "the Ray head's own client server port"),
        (52365, "the Ray head's own dashboard agent port"),
        (10002, "in Ray's worker port range 10002-19999"),
        (19999, "in Ray's worker port range 10002-19999"),
    ],
)
def test_a_ray_port_the_ray_head_takes_itself_is_refused(port: int, why: str) -> None:
    """`ray start --head --port=8265` (or 15000) exits 1: Ray checks its parts' ports do not
    meet (seen with Ray 2.60); the recipe says so before the job starts."""
    launcher = {"kind": "vllm", "model": "m", "ray_port": port}
    with pytest.raises(RecipeError, match=re.escape(f"launcher.ray_port: {port} is {why}")):
        validate(vllm(launcher=launcher))
    for fine in (6379, 9999, 20000):
        assert validate(vllm(launcher={**launcher, "ray_port": fine})).launcher


def test_sglang_tp_may_span_nodes_and_ep_must_divide_it() -> None:
    raw = vllm(
        parallelism={"tp": 16, "ep": 16},
        launcher={"kind": "sglang", "model": "deepseek-ai/DeepSeek-V3"},
    )
    assert validate(raw).parallelism.tp == 16
    raw["parallelism"] = {"tp": 16, "ep": 3}
    with pytest.raises(RecipeError, match="--ep-size 3 must divide --tp 16"):
        validate(raw)


def test_split_needs_a_trainer_node() -> None:
    with pytest.raises(RecipeError, match=re.escape("serve.nodes: 4 serving nodes leave none")):
        validate(grpo(nodes=4))


def test_split_takes_serving_nodes_out_of_the_world() -> None:
    r = validate(grpo())
    assert r.train_nodes == 3
    assert r.world_size == 24


def test_hetjob_only_fields() -> None:
    with pytest.raises(
        RecipeError, match=re.escape("serve.instance_type: only with placement: hetjob")
    ):
        validate(grpo(instance_type="p5en.48xlarge"))


def test_serving_recipe_cannot_nest_a_server() -> None:
    raw = vllm()
    raw["serve"] = grpo()["serve"]
    with pytest.raises(RecipeError, match="serve: a serving recipe"):
        validate(raw)


# ------------------------------------------------------------------ rendering
def test_vllm_two_nodes_by_default_lets_the_node_entry_choose(tmp_path: Path) -> None:
    raw = vllm()
    raw["launcher"]["model_cache"] = "/fsx/models"
    raw["launcher"]["extra_args"] = ["--max-model-len", "8192"]
    text = checked(text_of(raw), tmp_path)
    # auto: each node's entry runs the installed vLLM's gate (slurmfm/job/vllm.py) and adds
    # its own --nnodes/--node-rank/--headless, or takes the Ray path with these settings
    assert (
        'python3 -I -S -c "$slurmfm_checked" node --prefix 0 --ray ray --ray-python python3 '
        "--ray-port 6379 --ray-nodes 2 --ray-timeout-s 300 --vllm auto --" in text
    )
    assert "vllm serve meta-llama/Llama-3.1-70B-Instruct" in text
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2 \\\n" in text
    assert "--distributed-executor-backend" not in text  # the node entry's choice
    assert "--max-model-len 8192" in text
    assert "export HF_HOME=/fsx/models" in text
    # the master port: one per job, picked out of the ephemeral range by `prepare`
    assert "--serve all --serve-nodes 2 --serve-port 8000 --dist-port 0" in text
    assert "--serve-kind vllm" in text
    assert "--health-path /health" in text
    assert "--ready-timeout-s" in text
    assert "#SBATCH --ntasks-per-node=1" in sbatch(text)


def test_vllm_two_nodes_native_and_over_ray(tmp_path: Path) -> None:
    raw = vllm()
    raw["launcher"].update(multinode="native", master_port=24500)
    text = checked(text_of(raw), tmp_path)
    assert "node --prefix 0 --vllm native --" in text
    assert "--ray" not in text
    assert "--serve-port 8000 --dist-port 24500" in text
    raw["launcher"].update(multinode="ray")
    (tmp_path / "ray").mkdir()
    text = checked(text_of(raw), tmp_path / "ray")
    assert "--ray-nodes 2 --ray-timeout-s 300 --vllm ray --" in text


def test_vllm_data_parallel_replicas(tmp_path: Path) -> None:
    # 2 nodes x 8 GPUs: 4 replicas of tp 4, two on each node, experts across them
    raw = vllm(parallelism={"tp": 4, "pp": 1})
    raw["launcher"].update(replicas=4, expert_parallel=True)
    text = checked(text_of(raw), tmp_path)
    assert "--tensor-parallel-size 4 --pipeline-parallel-size 1 --enable-expert-parallel" in text
    assert "node --prefix 0 --vllm native --vllm-dp 4 --vllm-dp-local 2 --" in text
    assert "--serve-replicas 4" in text  # the endpoint file lists the 4 replicas
    # one node: no node entry flags, the replicas on the launch line
    one = vllm(resources={"nodes": 1}, parallelism={"tp": 2})
    one["launcher"].update(replicas=4)
    (tmp_path / "one").mkdir()
    text = checked(text_of(one), tmp_path / "one")
    assert "--pipeline-parallel-size 1 --data-parallel-size 4" in text
    assert "--vllm" not in text


def test_sglang_dp_attention_replicas(tmp_path: Path) -> None:
    raw = vllm(
        cluster={"instance_type": "p6-b200.48xlarge", "partition": "gpu"},
        parallelism={"tp": 16, "ep": 16},
        launcher={"kind": "sglang", "model": "deepseek-ai/DeepSeek-V3", "replicas": 16},
    )
    text = checked(text_of(raw), tmp_path)
    assert "--tp 16 --ep-size 16 --dp-size 16 --enable-dp-attention" in text
    # SGLang takes one port per DP-attention rank after the dist port: prepare knows them
    assert "--serve-port 30000 --dist-port 0 --serve-dp 16" in text


def test_vllm_one_node_needs_no_ray(tmp_path: Path) -> None:
    raw = vllm(resources={"nodes": 1}, parallelism={"tp": 8})
    text = checked(text_of(raw), tmp_path)
    assert "--ray" not in text
    assert "node --prefix 0 --" in text


def test_sglang_multi_node_launch(tmp_path: Path) -> None:
    raw = vllm(
        cluster={"instance_type": "p6-b200.48xlarge", "partition": "gpu"},
        parallelism={"tp": 16, "ep": 16},
        launcher={"kind": "sglang", "model": "deepseek-ai/DeepSeek-V3", "port": 30001},
    )
    text = checked(text_of(raw), tmp_path)
    assert f"{RUN_MODULE} sglang.launch_server" in text
    assert "--model-path deepseek-ai/DeepSeek-V3 --tp 16 --ep-size 16" in text
    assert '--nnodes 2 --dist-init-addr "$SLURMFM_SERVE_HEAD:$SLURMFM_SERVE_DIST_PORT"' in text
    assert "node --prefix 4 --" in text  # --node-rank=R after `python3 -c RUN sglang.launch_server`
    # the runtime picks --dist-init-addr's port outside the ephemeral range (issue 12.8)
    assert "--serve-port 30001 --dist-port 0" in text
    assert "$((40000" not in text


def test_split_train_and_serve(tmp_path: Path) -> None:
    text = checked(text_of(grpo()), tmp_path)
    assert "--nnodes=3" in text
    assert "--serve split --serve-nodes 1" in text
    assert '--nodelist="$SLURMFM_NODELIST"' in text
    assert '--nodelist="$SLURMFM_SERVE_NODELIST"' in text
    assert "_serve.out" in text
    # the server's srun comes first on the batch step's command line: it is started and
    # must be ready before the trainer launches (slurmfm/job/batch.py)
    assert '--serve-words "${#slurmfm_serve[@]}"' in text
    assert text.index('"${slurmfm_serve[@]}"') < text.index(f"{RUN_MODULE} torch.distributed.run")


def test_hetjob_component_directives(tmp_path: Path) -> None:
    raw = grpo("hetjob", instance_type="p5en.48xlarge", partition="infer")
    raw["resources"]["nodes"] = 2
    text = checked(text_of(raw), tmp_path)
    lines = sbatch(text)
    i = lines.index("#SBATCH hetjob")
    assert lines[i + 1 :] == [
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=infer",
        "#SBATCH --exclusive",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --mem=0",
    ]
    assert "#SBATCH --nodes=2" in lines[:i]
    assert "--het-group=1 --nodes=1" in text.replace(" \\\n  ", " ")
    assert "--het-group=0" in text
    assert "--serve hetjob" in text
    assert "--nnodes=2" in text


def test_hetjob_gate() -> None:
    raw = grpo("hetjob")
    with pytest.raises(UnsupportedError, match=re.escape("hetjob needs Slurm >= 20.02")):
        text_of(raw, "19.05")


@settings(max_examples=40, deadline=None)
@given(
    model=st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s and "\r" not in s),
    extra=st.lists(
        st.text(max_size=12).filter(lambda s: "\x00" not in s and "\r" not in s), max_size=3
    ),
)
def test_user_values_are_quoted(model: str, extra: list[str]) -> None:
    """Whatever the model name and extra args, bash sees them as single words."""
    from slurmfm.launchers import SglangLauncher
    from slurmfm.recipe.schema import Parallelism

    L = SglangLauncher(kind="sglang", model=model, extra_args=extra)
    s = serve_launch(L, Parallelism(tp=1), 1, "all")
    words = " ".join(s.argv)
    proc = subprocess.run(
        [
            "bash",
            "-c",
            "SLURMFM_SERVE_PORT=1; for w in " + words + '; do printf "%s\\0" "$w"; done',
        ],
        capture_output=True,
    )
    assert proc.returncode == 0
    got = proc.stdout.split(b"\0")[:-1]
    assert got[5].decode() == model  # python3 -c RUN sglang.launch_server --model-path MODEL
    if extra:
        assert [g.decode() for g in got[-len(extra) :]] == extra
