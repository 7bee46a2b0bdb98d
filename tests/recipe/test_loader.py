"""Recipe loading: every problem is one located line ``FILE:LINE: field: message``."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmfm.errors import RecipeError
from slurmfm.recipe.loader import load_recipe, parse_override, validate

GOOD = """\
name: demo
cluster:
  instance_type: p5.48xlarge
  partition: gpu
resources:
  nodes: 4
parallelism:
  tp: 8
  pp: 2
launcher:
  kind: torchrun
  script: /fsx/train.py
  args: ["--lr", "3e-4"]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text(text)
    return p


def problems(tmp_path: Path, text: str, **kw: object) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, text), **kw)  # type: ignore[arg-type]
    return [str(p) for p in info.value.problems]


def test_good_recipe_loads(tmp_path: Path) -> None:
    r = load_recipe(write(tmp_path, GOOD))
    assert r.name == "demo"
    assert r.world_size == 32
    assert r.dp == 2
    assert r.procs_per_node == 8


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # unknown key, nested: points at its own line
        (
            GOOD.replace("  pp: 2\n", "  pp: 2\n  tensor_paralel: 8\n"),
            ":10: parallelism.tensor_paralel: unknown field",
        ),
        # wrong type
        (
            GOOD.replace("nodes: 4", "nodes: four"),
            ":6: resources.nodes: Input should be a valid integer",
        ),
        # missing required field inside the launcher union
        (
            GOOD.replace("  script: /fsx/train.py\n", ""),
            ":10: launcher.script: required field is missing",
        ),
        # unknown launcher kind
        (
            GOOD.replace("kind: torchrun", "kind: deepspeed"),
            ":11: launcher.kind: unknown launcher kind",
        ),
        # list item type
        (
            GOOD.replace('args: ["--lr", "3e-4"]', 'args: ["--lr", {a: 1}]'),
            ":13: launcher.args.1: Input should be a valid string",
        ),
        # cross-field: tp*pp does not divide the world size (points at parallelism.tp)
        (
            GOOD.replace("pp: 2", "pp: 3"),
            ":8: parallelism.tp: tp*pp*cp = 8*3*1 = 24 does not divide",
        ),
        # NVLink domain bound
        (
            GOOD.replace("tp: 8", "tp: 16").replace("pp: 2", "pp: 1"),
            ":8: parallelism.tp: tp*cp = 16 exceeds the NVLink domain",
        ),
        # unknown instance type
        (GOOD.replace("p5.48xlarge", "p9.huge"), ":3: cluster.instance_type:"),
        # sbatch-unsafe partition name
        (GOOD.replace("partition: gpu", "partition: 'gpu; rm -rf /'"), ":4: cluster.partition:"),
        # bad time limit
        (
            GOOD.replace("  nodes: 4\n", "  nodes: 4\n  time_limit: soon\n"),
            ":7: resources.time_limit: 'soon' is not a Slurm time limit",
        ),
        # bad env name
        (GOOD + "env:\n  BAD-NAME: x\n", ":15: env.BAD-NAME:"),
        # secret also in env
        (
            GOOD + "env:\n  HF_TOKEN: x\nsecrets: [HF_TOKEN]\n",
            "secrets: ['HF_TOKEN'] are listed both",
        ),
    ],
)
def test_schema_errors_are_located(tmp_path: Path, text: str, expected: str) -> None:
    msgs = problems(tmp_path, text)
    path = str(tmp_path / "recipe.yaml")
    assert any(m.startswith(path) and expected in m for m in msgs), msgs


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("name: a\nlauncher:\n  kind: torchrun\n   script: x\n", 4),  # bad indentation
        ("name: a\nname: b\nlauncher: {kind: torchrun, script: x}\n", 2),  # duplicate key
        ("name: [unclosed\n", 2),
    ],
)
def test_yaml_errors_are_located(tmp_path: Path, text: str, line: int) -> None:
    msgs = problems(tmp_path, text)
    assert len(msgs) == 1
    assert msgs[0].startswith(f"{tmp_path / 'recipe.yaml'}:{line}: (yaml): invalid YAML"), msgs


@pytest.mark.parametrize(
    ("text", "line", "msg"),
    [
        ("name: a\nname: b\n", 2, "duplicate key 'name' (first at line 1)"),
        ("a: &x [*x]\n", 1, "an alias refers to a value that contains it"),
        ("a: {b: 1}\nc:\n  <<: [1]\n", 3, "a merge key (<<) takes a mapping"),
        ("? [a, b]\n: 1\n", 1, "a key must be a plain value"),
        ("a: 1\n---\nb: 2\n", 2, "expected a single document"),
        ("a: !custom 1\n", 1, "could not determine a constructor"),
    ],
)
def test_yaml_structure_errors(tmp_path: Path, text: str, line: int, msg: str) -> None:
    msgs = problems(tmp_path, text)
    assert len(msgs) == 1
    assert msgs[0].startswith(f"{tmp_path / 'recipe.yaml'}:{line}: (yaml): invalid YAML"), msgs
    assert msg in msgs[0], msgs


def test_yaml_alias_bomb_is_refused_not_expanded(tmp_path: Path) -> None:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    msgs = problems(tmp_path, "\n".join(rows) + "\n")
    assert len(msgs) == 1, msgs
    assert "alias expansion" in msgs[0], msgs


def test_yaml_1_2_scalars_lines_and_merges() -> None:
    from slurmfm.recipe.loader import parse_yaml

    text = (
        "base: &base\n"
        "  NCCL_DEBUG: WARN\n"
        "  FI_PROVIDER: efa\n"
        "env:\n"
        "  <<: *base\n"
        "  NCCL_DEBUG: INFO\n"
        "  FLAG: on\n"
        "  T: 1:30:00\n"
        "  OCT: 0755\n"
        "  N: 12\n"
        "  B: true\n"
        "  Q: '12'\n"
        "list:\n"
        "  - a\n"
        "  - {k: v}\n"
    )
    data, lines = parse_yaml(text, "r.yaml")
    # YAML 1.2: "on" and "1:30:00" stay strings; explicit keys beat merges; env values are
    # kept as written (issue 15 item 11).
    assert data["env"] == {
        "NCCL_DEBUG": "INFO",
        "FLAG": "on",
        "T": "1:30:00",
        "OCT": "0755",
        "N": "12",
        "B": "true",
        "Q": "12",
        "FI_PROVIDER": "efa",
    }
    assert lines[("env", "NCCL_DEBUG")] == 6
    assert lines[("env", "FI_PROVIDER")] == 3  # a merged key points at its definition
    assert lines[("list", 1)] == 15
    assert lines[("list", 1, "k")] == 15
    assert parse_yaml("", "r.yaml") == (None, {(): 1})
    assert parse_yaml("x: 0755\ny: true\n", "r.yaml")[0] == {"x": 755, "y": True}  # 1.2: decimal


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    text = GOOD.replace("nodes: 4", "nodes: -1").replace("  pp: 2\n", "  pp: 2\n  zz: 1\n")
    msgs = problems(tmp_path, text)
    assert len(msgs) == 2
    assert any("resources.nodes" in m for m in msgs)
    assert any("parallelism.zz" in m for m in msgs)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"no such file"):
        load_recipe(tmp_path / "nope.yaml")
    assert problems(tmp_path, "") == [f"{tmp_path / 'recipe.yaml'}:1: (recipe): the file is empty"]
    assert "a recipe is a YAML mapping" in problems(tmp_path, "- a\n- b\n")[0]


def test_a_pipeline_file_is_refused_naming_the_command_that_checks_it(tmp_path: Path) -> None:
    """One problem at the ``stages:`` line, not every recipe field it lacks."""
    path = tmp_path / "recipe.yaml"
    assert problems(tmp_path, "# a pipeline\nname: p\nstages:\n  a: {recipe: a.yaml}\n") == [
        f"{path}:3: stages: this is a pipeline file, not a recipe; "
        f"check it with: slurmfm pipeline validate {path}"
    ]


def test_overrides_apply_and_report_as_override(tmp_path: Path) -> None:
    r = load_recipe(write(tmp_path, GOOD), {"resources.nodes": 8})
    assert r.world_size == 64
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, GOOD), {"resources.nodes": "many"})
    assert str(info.value).startswith("<override>: resources.nodes:")


def test_parse_override_reads_yaml_scalars() -> None:
    assert parse_override("resources.nodes=4") == ("resources.nodes", 4)
    assert parse_override("launcher.args=[a, b]") == ("launcher.args", ["a", "b"])
    assert parse_override("env.X=") == ("env.X", "")
    with pytest.raises(RecipeError):
        parse_override("novalue")


def test_dict_recipes_and_env_coercion() -> None:
    r = validate(
        {
            "name": "d",
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"procs_per_node": 2},
            "launcher": {"kind": "torchrun", "script": "t.py"},
            "env": {"A": 1, "B": True, "C": "x"},
        }
    )
    assert r.env == {"A": "1", "B": "1", "C": "x"}


def test_cpu_instances_need_procs_per_node() -> None:
    with pytest.raises(RecipeError, match="procs_per_node: required"):
        validate(
            {
                "name": "d",
                "cluster": {"instance_type": "lab-cpu"},
                "launcher": {"kind": "torchrun", "script": "t.py"},
            }
        )


def test_megatron_reserved_args_rejected() -> None:
    with pytest.raises(RecipeError, match="set by slurmfm"):
        validate({"name": "m", "launcher": {"kind": "megatron", "model_args": {"save": "/x"}}})


def test_expert_parallel_rule() -> None:
    base = {"name": "m", "resources": {"nodes": 2}, "launcher": {"kind": "megatron"}}
    validate({**base, "parallelism": {"tp": 8, "ep": 2}})  # dp=2, ep=2 divides dp*cp
    with pytest.raises(RecipeError, match=r"parallelism.ep: ep=4 must divide dp\*cp"):
        validate({**base, "parallelism": {"tp": 8, "ep": 4}})


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("30", 30),
        ("1:30", 2),
        ("01:00:00", 60),
        ("2-00", 2880),
        ("1-02:03:04", 1564),
        ("UNLIMITED", -1),
    ],
)
def test_time_limits(text: str, minutes: int) -> None:
    from slurmfm.recipe.schema import parse_time_limit

    assert parse_time_limit(text) == minutes


@pytest.mark.parametrize(
    ("raw", "ok"), [(24.11, "24.11"), (22.05, "22.05"), ("25.11.4", "25.11.4")]
)
def test_slurm_version_numbers(raw: object, ok: str) -> None:
    r = validate(
        {
            "name": "v",
            "cluster": {"slurm_version": raw},
            "launcher": {"kind": "torchrun", "script": "t.py"},
        }
    )
    assert r.cluster.slurm_version == ok


def test_ambiguous_slurm_version_number_is_refused(tmp_path: Path) -> None:
    msgs = problems(
        tmp_path, GOOD.replace("  partition: gpu\n", "  partition: gpu\n  slurm_version: 22.10\n")
    )
    assert any(
        ":5: cluster.slurm_version: 22.1 is ambiguous as a number; quote the version" in m
        for m in msgs
    ), msgs


def test_nemo_parallel_sizes_only_through_parallelism() -> None:
    with pytest.raises(RecipeError, match="set by slurmfm from resources/parallelism"):
        validate(
            {
                "name": "n",
                "launcher": {
                    "kind": "nemo",
                    "recipe": "llama3_8b",
                    "overrides": {"trainer.strategy.tensor_model_parallel_size": 16},
                },
            }
        )


def test_time_limit_as_a_bare_number_is_minutes() -> None:
    r = validate(
        {
            "name": "t",
            "resources": {"time_limit": 30},
            "launcher": {"kind": "torchrun", "script": "t.py"},
        }
    )
    assert r.resources.time_limit == "30"
    assert r.resources.time_minutes == 30


_ONE_RECIPE_PER_KIND = {
    "torchrun": "llama3-8b-p5-fsdp",
    "megatron": "llama3-70b-p5en-megatron",
    "nemo": "nemo-llama3-8b-p6-b200",
    "vllm": "vllm-llama3-70b-2xp5",
    "sglang": "sglang-deepseek-v3-p6-b200",
    "ray": "grpo-verl-ray-p5",
}


def test_every_launcher_kind_has_a_recipe_here() -> None:
    from slurmfm.launchers import SPECS

    assert set(_ONE_RECIPE_PER_KIND) == set(SPECS)


@pytest.mark.parametrize("kind", sorted(_ONE_RECIPE_PER_KIND))
def test_a_bad_launcher_field_is_named_at_its_own_line_for_every_kind(
    kind: str, tmp_path: Path
) -> None:
    """The launcher's tag is not part of the field's name, whatever the kind (the loader knew
    only torchrun, megatron and nemo: a vLLM field was reported as ``launcher.vllm.port`` at
    the ``launcher:`` line), and a bad ``--set`` is blamed on the override, not the file."""
    import slurmfm.api as fm
    from slurmfm.errors import RecipeError

    src = Path(__file__).resolve().parents[2] / "recipes" / f"{_ONE_RECIPE_PER_KIND[kind]}.yaml"
    lines = src.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip() == f"kind: {kind}")
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at + 1, f"{indent}bogus_field: 1\n")
    bad = tmp_path / src.name
    bad.write_text("".join(lines))
    field = "launcher.serve.bogus_field" if indent == "    " else "launcher.bogus_field"
    with pytest.raises(RecipeError) as err:
        fm.load(bad)
    problem = err.value.problems[0]
    assert (problem.file, problem.line, problem.field) == (str(bad), at + 2, field)
    with pytest.raises(RecipeError) as err:
        fm.load(src, overrides={field: 1})
    problem = err.value.problems[0]
    assert (problem.file, problem.line, problem.field) == ("<override>", None, field)
