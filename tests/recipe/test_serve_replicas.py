"""Bad serving layouts (issue 44 item 5): replicas that do not fit the nodes, data parallel
beside a model-parallel size that does not divide the GPUs, flags the node entry sets itself.
Each is one located line ``FILE:LINE: field: what is wrong`` and ``slurmfm validate`` exits 2
with nothing else written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmfm.cli import main
from slurmfm.errors import RecipeError
from slurmfm.recipe.loader import load_recipe

VLLM = """\
name: serve
cluster:
  instance_type: p5.48xlarge
  partition: gpu
resources:
  nodes: 2
parallelism:
  tp: 4
  pp: 1
launcher:
  kind: vllm
  model: /fsx/m
  replicas: 4
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return [str(p) for p in info.value.problems]


def test_a_good_layout_loads(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(VLLM)
    r = load_recipe(path)
    assert r.launcher.replicas == 4  # type: ignore[union-attr]
    assert r.dp == 4  # the planner's data-parallel size is the replicas


@pytest.mark.parametrize(
    ("edit", "where", "what"),
    [
        # 3 replicas x tp 4 = 12 GPUs on 2 x 8
        (("replicas: 4", "replicas: 3"), ":13: launcher.replicas:", "= 12 GPUs must equal"),
        # a replica (tp 16) wider than a node cannot run data parallel over nodes
        (
            ("tp: 4", "tp: 16", "nodes: 2", "nodes: 4", "replicas: 4", "replicas: 2"),
            ":13: launcher.replicas:",
            "each replica must fit inside one node",
        ),
        # tp 3 x 4 replicas = 12 GPUs: the model-parallel size does not divide the GPUs
        (("tp: 4", "tp: 3"), ":13: launcher.replicas:", "= 12 GPUs must equal the serving"),
        # 4 replicas of tp 2 x pp 2 on 2 x 8, but 3 nodes: whole replicas do not split
        (
            (
                "nodes: 2",
                "nodes: 3",
                "tp: 4",
                "tp: 2",
                "pp: 1",
                "pp: 3",
                "replicas: 4",
                "replicas: 4",
            ),
            ":13: launcher.replicas:",
            "do not split into whole replicas per node over 3 nodes",
        ),
        # 6 replicas of tp 2 = 12 GPUs: neither 16 nor whole replicas per node
        (("tp: 4", "tp: 2"), ":13: launcher.replicas:", "= 8 GPUs must equal"),
        # the node entry gives every node its own rank: the user cannot
        (
            ("  replicas: 4\n", "  replicas: 4\n  extra_args: [--data-parallel-size-local, '2']\n"),
            ":14: launcher.extra_args:",
            "--data-parallel-size-local is set by slurmfm",
        ),
        (
            ("  replicas: 4\n", "  replicas: 4\n  extra_args: ['--nnodes=2']\n"),
            ":14: launcher.extra_args:",
            "--nnodes is set by slurmfm",
        ),
        (
            ("  replicas: 4\n", "  replicas: 4\n  extra_args: [-dpr, '2']\n"),
            ":14: launcher.extra_args:",
            "-dpr is set by slurmfm",
        ),
        # data parallel across nodes runs without Ray
        (
            ("  replicas: 4\n", "  replicas: 4\n  multinode: ray\n"),
            ":14: launcher.multinode:",
            "run without Ray",
        ),
        # vLLM's expert parallel follows tp x replicas; parallelism.ep is refused
        (("pp: 1", "pp: 1\n  ep: 8"), ":10: parallelism.ep:", "launcher.expert_parallel"),
    ],
)
def test_a_bad_vllm_layout_is_one_located_line(
    tmp_path: Path, edit: tuple[str, ...], where: str, what: str
) -> None:
    text = VLLM
    for old, new in zip(edit[::2], edit[1::2], strict=True):
        text = text.replace(old, new)
    got = problems(tmp_path, text)
    assert len(got) == 1, got
    assert where in got[0], got[0]
    assert what in got[0], got[0]


def test_sglang_dp_attention_replicas_must_divide_tp(tmp_path: Path) -> None:
    text = (
        VLLM.replace("kind: vllm", "kind: sglang")
        .replace("tp: 4", "tp: 16")
        .replace("replicas: 4", "replicas: 3")
    )
    got = problems(tmp_path, text)
    assert len(got) == 1, got
    assert ":13: launcher.replicas:" in got[0], got
    assert "replicas must divide parallelism.tp" in got[0]
    both = text.replace("replicas: 3", "replicas: 4\n  extra_args: [--dp-size, '4']")
    got = problems(tmp_path, both)
    assert ":14: launcher.extra_args: --dp-size is set by slurmfm" in got[0], got


def test_a_serve_section_names_its_own_fields(tmp_path: Path) -> None:
    """A train-and-serve recipe's server is ``serve.launcher``: the error says so."""
    text = (
        "name: grpo\ncluster:\n  instance_type: p5.48xlarge\n  partition: gpu\n"
        "resources:\n  nodes: 3\nlauncher:\n  kind: torchrun\n  script: /fsx/t.py\n"
        "parallelism:\n  tp: 8\n"
        "serve:\n  nodes: 1\n  parallelism:\n    tp: 4\n"
        "  launcher:\n    kind: vllm\n    model: /fsx/m\n    replicas: 3\n"
    )
    got = problems(tmp_path, text)
    assert len(got) == 1, got
    assert ":19: serve.launcher.replicas:" in got[0], got


def test_validate_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(VLLM.replace("replicas: 4", "replicas: 3"))
    res = CliRunner().invoke(main, ["validate", str(bad)])
    assert res.exit_code == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"{bad}:13: launcher.replicas: replicas x tp x pp = 3 x 4 x 1")
