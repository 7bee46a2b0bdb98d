"""The sweep section: which fields may vary, expansion order and size, located errors."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmfm import api
from slurmfm.errors import RecipeError
from slurmfm.recipe.loader import load_recipe, validate
from slurmfm.recipe.sweep import ALLOWED, MAX_TASKS, Sweep, allowed_key, expand

HEAD = """\
name: sw
cluster: {instance_type: lab-cpu, partition: batch}
resources: {nodes: 1, procs_per_node: 2}
launcher: {kind: torchrun, script: t.py}
storage: {run_id: base}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(HEAD + text)
    return p


def base(sweep: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "sw",
        "cluster": {"instance_type": "lab-cpu"},
        "resources": {"nodes": 1, "procs_per_node": 2},
        "launcher": {"kind": "torchrun", "script": "t.py"},
        "sweep": sweep,
    }


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("resources.nodes", "nodes, time limit"),
        ("resources.time_limit", "#SBATCH options"),
        ("cluster.partition", "sbatch applies to every array task"),
        ("cluster.instance_type", "instance type"),
        ("resilience.max_restarts", "requeue"),
        ("name", "one --job-name"),
        ("storage.log_dir", "--output"),
        ("storage.run_id", "<run_id>-t<index>"),
        ("container.image", "not confined to the script body"),
        ("launcher.kind", "the launcher kind decides the launch"),
    ],
)
def test_fixed_fields_are_refused_with_the_reason(tmp_path: Path, key: str, why: str) -> None:
    p = write(tmp_path, f"sweep:\n  tasks:\n    - {{{key}: 1}}\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(p)
    (problem,) = exc.value.problems
    assert problem.line == 8
    assert problem.field == "sweep.tasks.0"
    assert "cannot vary across a job array" in problem.message
    assert why in problem.message


def test_megatron_train_iters_cannot_vary() -> None:
    # it decides the job runtime's completion check, one batch option for the whole array
    data = {
        "name": "mg",
        "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
        "resources": {"nodes": 2},
        "launcher": {"kind": "megatron", "model_args": {"train-iters": 10}},
        "sweep": {"parameters": {"launcher.model_args.train-iters": [10, 20]}},
    }
    with pytest.raises(RecipeError) as exc:
        validate(data)
    (problem,) = exc.value.problems
    assert problem.field == "sweep.parameters"
    assert "array task 1" in problem.message
    assert "train-iters cannot vary across a job array" in problem.message
    data["sweep"] = {"parameters": {"launcher.model_args.lr": [0.1, 0.2]}}
    assert len(api.sweep_tasks(validate(data))) == 2


def test_grid_key_refused_at_its_line(tmp_path: Path) -> None:
    p = write(tmp_path, "sweep:\n  parameters:\n    env.A: [1]\n    resources.exclusive: [true]\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(p)
    assert str(exc.value).startswith(f"{p}:7: sweep.parameters: 'resources.exclusive' cannot vary")


def test_invalid_task_value_is_located_at_the_task(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "sweep:\n  tasks:\n    - {parallelism.tp: 2}\n    - {parallelism.tp: 3}\n",
    )
    with pytest.raises(RecipeError) as exc:
        load_recipe(p)
    (problem,) = exc.value.problems
    assert (problem.line, problem.field) == (9, "sweep.tasks.1")
    assert "array task 1" in problem.message
    assert "does not divide the world size 2" in problem.message


def test_grid_value_error_names_the_grid(tmp_path: Path) -> None:
    p = write(tmp_path, "sweep:\n  parameters:\n    launcher.args: [[a], 3]\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(p)
    (problem,) = exc.value.problems
    assert (problem.line, problem.field) == (7, "sweep.parameters")
    assert "launcher.args" in problem.message


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ({}, "give tasks, parameters, or both"),
        ({"parameters": {"env.A": []}}, "at least one value"),
        ({"max_concurrent": 0, "tasks": [{}]}, "greater than or equal to 1"),
        (
            {"parameters": {"env.A": list(range(40)), "env.B": list(range(40))}},
            f"1600 tasks exceed {MAX_TASKS}",
        ),
        ({"tasks": [{"env.A": "1"}], "parameters": {"env.A": ["2"]}}, "both by tasks and"),
        ({"tasks": [{"env.A b": "1"}]}, "not a dotted field path"),
        ({"tasks": [{}], "grid": {}}, "unknown field"),
    ],
)
def test_sweep_shape_errors(sweep: dict[str, Any], message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        validate(base(sweep))


def test_tasks_times_grid_in_order_with_own_run_ids() -> None:
    r = validate(
        {
            **base(
                {
                    "tasks": [{"launcher.args": ["a"]}, {"launcher.args": ["b"]}],
                    "parameters": {"env.X": ["1", "2"], "env.Y": ["u"]},
                }
            ),
            "storage": {"run_id": "base", "checkpoint_root": "/ck/"},
        }
    )
    tasks = expand(r)
    assert [(t.index, t.overrides) for t in tasks] == [
        (0, {"launcher.args": ["a"], "env.X": "1", "env.Y": "u"}),
        (1, {"launcher.args": ["a"], "env.X": "2", "env.Y": "u"}),
        (2, {"launcher.args": ["b"], "env.X": "1", "env.Y": "u"}),
        (3, {"launcher.args": ["b"], "env.X": "2", "env.Y": "u"}),
    ]
    assert [t.run_id for t in tasks] == ["base-t0", "base-t1", "base-t2", "base-t3"]
    assert tasks[3].checkpoint_dir == "/ck/sw/base-t3"
    assert tasks[2].recipe.launcher.args == ["b"]  # type: ignore[union-attr]
    assert tasks[2].recipe.env == {"X": "1", "Y": "u"}
    assert all(t.recipe.sweep is None for t in tasks)
    # the run id defaults to the name
    r2 = validate(base({"parameters": {"env.X": ["1"]}}))
    assert expand(r2)[0].run_id == "sw-t0"


def test_api_override_keeps_the_sweep() -> None:
    r = validate(base({"parameters": {"env.X": ["1", "2"]}, "max_concurrent": 1}))
    r2 = api.override(r, {"resources.time_limit": "5"})
    assert r2.sweep == r.sweep
    assert len(api.sweep_tasks(r2)) == 2


def test_allowed_keys() -> None:
    assert allowed_key("env.LR")
    assert allowed_key("launcher.model_args.lr")
    assert allowed_key("parallelism")
    assert not allowed_key("environment.X")
    assert not allowed_key("launcher.kind")
    assert set(ALLOWED) >= {"env", "launcher.args", "parallelism"}


KEYS = st.sampled_from(["env.A", "env.B", "env.C", "storage.data.x", "launcher.args"])


@settings(max_examples=60, deadline=None)
@given(
    grid=st.dictionaries(KEYS, st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=3)),
    explicit=st.lists(
        st.dictionaries(st.sampled_from(["env.D", "env.E"]), st.text(max_size=3)), max_size=3
    ),
    limit=st.none() | st.integers(1, 5),
)
def test_expansion_is_the_cartesian_product(
    grid: dict[str, list[str]], explicit: list[dict[str, str]], limit: int | None
) -> None:
    grid = {k: ([[v] for v in vals] if k == "launcher.args" else vals) for k, vals in grid.items()}
    if not grid and not explicit:
        return
    sweep = Sweep(max_concurrent=limit, parameters=grid, tasks=explicit)
    points = sweep.points()
    combos = list(itertools.product(*grid.values())) if grid else [()]
    assert sweep.size == len(points) == max(len(explicit), 1) * len(combos)
    for n, (origin, point) in enumerate(points):
        j, g = divmod(n, len(combos))
        assert origin == (j if explicit else None)
        assert point == {
            **(explicit[j] if explicit else {}),
            **dict(zip(grid, combos[g], strict=True)),
        }
    from slurmfm.recipe.sweep import array_spec

    spec = array_spec(sweep)
    assert spec.split("%")[0] == ("0" if sweep.size == 1 else f"0-{sweep.size - 1}")
    assert ("%" in spec) == (limit is not None)


def test_hetjob_cannot_be_an_array(tmp_path: Path) -> None:
    """sbatch refuses --array with hetjob components (22.05 lab: "Invalid job array
    specification"), so a sweep of a hetjob train-and-serve recipe is refused up front."""
    import shutil

    from lab import REPO_ROOT

    src = REPO_ROOT / "recipes" / "grpo-train-and-serve-p5.yaml"
    p = tmp_path / "grpo.yaml"
    shutil.copy(src, p)
    with p.open("a") as f:
        f.write("sweep:\n  parameters:\n    env.SWEEP_X: ['1', '2']\n")
    assert len(api.sweep_tasks(load_recipe(p))) == 2  # the split placement is fine
    overrides = {
        "serve.placement": "hetjob",
        "serve.instance_type": "p5en.48xlarge",
        "serve.partition": "p5en",
    }
    with pytest.raises(RecipeError, match="cannot be a job array"):
        load_recipe(p, overrides)


def test_a_sweep_warns_when_its_tasks_replace_a_users_override() -> None:
    import warnings

    from slurmfm import api

    data = {
        "name": "s",
        "cluster": {"instance_type": "lab-cpu"},
        "resources": {"nodes": 1, "procs_per_node": 1},
        "launcher": {"kind": "torchrun", "script": "t.py"},
        "sweep": {"tasks": [{"launcher.args": ["--lr", "1"]}, {"env.X": "1"}]},
    }
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = api.load(data, {"launcher": {"kind": "torchrun", "script": "u.py"}, "env.Y": "2"})
    assert [str(w.message) for w in seen] == [
        "override launcher: the sweep sets launcher.args in 1 of 2 array tasks, whose value "
        "replaces the override there (put the value in sweep.tasks or sweep.parameters instead)"
    ]
    assert all(issubclass(w.category, api.SweepOverrideWarning) for w in seen)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an override no task touches: silent
        api.override(r, {"resources.nodes": 1})


def test_cli_warns_when_a_sweep_replaces_a_set_value() -> None:
    from click.testing import CliRunner

    from slurmfm.cli import main

    quick = str(Path(__file__).resolve().parents[2] / "recipes" / "sweep-quickstart.yaml")
    res = CliRunner().invoke(main, ["validate", quick, "--set", "launcher.args=[--lr, '9']"])
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith(
        "warning: override launcher.args: the sweep sets launcher.args in 3 of 3 array tasks"
    )
