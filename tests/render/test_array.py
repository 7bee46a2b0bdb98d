"""Sweeps rendered once as a job array with a per-task table: directives, per-task values,
quoting, refusals.

The property test runs the array script under bash with stub Slurm commands once per array
task (``SLURM_ARRAY_TASK_ID``) and checks that each task's own launch arguments, environment,
run id and checkpoint directory arrive exactly (line breaks included), and that no value is
ever executed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from render_helpers import shellcheck
from test_script_props import PAYLOAD, sandbox  # noqa: F401 - the fixture is used by name

from slurmfm import api
from slurmfm.errors import RecipeError, SlurmfmError
from slurmfm.recipe.loader import validate
from slurmfm.render.array import TABLE_MARK
from slurmfm.render.script import Target, render_script

# The job runtime is extracted into the log directory: one this host may write, and one of this
# test process only (another checkout's run may test at the same time).
LOGS = str(Path(tempfile.gettempdir()) / f"slurmfm-test-array-logs-{os.getpid()}")


@pytest.fixture(scope="module", autouse=True)
def _remove_logs() -> Iterator[None]:
    yield
    shutil.rmtree(LOGS, ignore_errors=True)


def base(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "sw",
        "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
        "resources": {"nodes": 2, "procs_per_node": 2, "exclusive": False},
        "launcher": {"kind": "torchrun", "script": "train.py", "args": ["--lr", "1"]},
        "env": {"A": "base"},
        "resilience": {"health_gate": "off"},
        "storage": {"checkpoint_root": "/ck", "log_dir": LOGS, "run_id": "run"},
    }
    data.update(extra)
    return data


def sbatch(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def run_task(sandbox: Path, text: str, tmp: Path, task: int) -> tuple[list[str], dict[str, str]]:  # noqa: F811
    out = tmp / f"out{task}"
    out.mkdir()
    script = tmp / "job.sh"
    script.write_bytes(text.encode("utf-8"))
    env = {
        "PATH": str(sandbox / "bin"),
        "STUB_OUT": str(out),
        "SLURM_JOB_NODELIST": "node[001-002]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": str(100 + task),
        "SLURM_ARRAY_JOB_ID": "99",
        "SLURM_ARRAY_TASK_ID": str(task),
        "SLURM_JOB_NAME": "sw",
        "SANDBOX_LOGS": LOGS,
    }
    proc = subprocess.run(
        ["/bin/bash", str(script)], env=env, cwd=tmp, capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    argv = (out / "argv").read_bytes().decode("utf-8").split("\0")[:-1]
    envs = dict(
        item.split("=", 1)
        for item in (out / "env").read_bytes().decode("utf-8").split("\0")[:-1]
        if "=" in item
    )
    return argv, envs


def test_array_directives_and_logs(tmp_path: Path) -> None:
    r = validate(base(sweep={"max_concurrent": 2, "parameters": {"env.A": ["x", "y", "z"]}}))
    text = api.render(r, slurm_version="22.05").text
    lines = sbatch(text)
    assert "#SBATCH --array=0-2%2" in lines
    assert f"#SBATCH --output={LOGS}/%x_%A_%a.out" in lines
    assert not any("%x_%j" in line for line in lines)
    # every other directive is what a single task would get
    single = render_script(api.sweep_tasks(r)[0].recipe, Target.for_recipe(r, "22.05")).text
    assert [x for x in lines if "--array" not in x and "--output" not in x] == [
        x for x in sbatch(single) if "--output" not in x
    ]
    shellcheck(text, tmp_path)


def test_no_limit_and_single_task() -> None:
    r = validate(base(sweep={"tasks": [{"env.A": "only"}]}))
    assert "#SBATCH --array=0" in sbatch(api.render(r, slurm_version="24.11").text)
    r = validate(base(sweep={"parameters": {"env.A": ["a", "b"]}}))
    assert "#SBATCH --array=0-1" in sbatch(api.render(r, slurm_version="24.11").text)


def test_each_task_gets_its_overrides_run_id_and_checkpoint_dir(
    sandbox: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    r = validate(
        base(
            sweep={
                "max_concurrent": 2,
                "tasks": [
                    {"launcher.args": ["--lr", "0.1"]},
                    {"launcher.args": ["--lr", "0.3"], "launcher.script": "other.py"},
                ],
                "parameters": {"env.A": ["p q", "r"], "storage.data.train": ["/d1", "/d2"]},
            }
        )
    )
    info = api.dry_run(r, slurm_version="22.05")
    assert len(info.tasks) == 8
    shellcheck(info.text, tmp_path)
    for t in info.tasks:
        argv, env = run_task(sandbox, info.text, tmp_path, t.index)
        cmd = argv[argv.index("--", argv.index("node")) + 1 :]
        want_args = t.recipe.launcher.args  # type: ignore[union-attr]
        assert cmd[-len(want_args) :] == want_args
        assert cmd[-len(want_args) - 1] == t.recipe.launcher.script  # type: ignore[union-attr]
        assert env["A"] == t.recipe.env["A"]
        assert env["SLURMFM_DATA_TRAIN"] == t.recipe.storage.data["train"]
        assert env["SLURMFM_RUN_ID"] == f"run-t{t.index}"
        assert env["SLURMFM_CHECKPOINT_DIR"] == f"/ck/sw/run-t{t.index}"
        assert env["SLURMFM_SWEEP_OVERRIDES"] == t.overrides_json
    # the per-task order: explicit task, then grid in the order written
    assert [t.overrides for t in info.tasks][:2] == [
        {"launcher.args": ["--lr", "0.1"], "env.A": "p q", "storage.data.train": "/d1"},
        {"launcher.args": ["--lr", "0.1"], "env.A": "p q", "storage.data.train": "/d2"},
    ]


def test_unknown_task_index_stops(sandbox: Path, tmp_path: Path) -> None:  # noqa: F811
    r = validate(base(sweep={"parameters": {"env.A": ["a", "b"]}}))
    script = tmp_path / "job.sh"
    script.write_text(api.render(r, slurm_version="22.05").text)
    env = {
        "PATH": str(sandbox / "bin"),
        "SLURM_ARRAY_TASK_ID": "7",
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_NAME": "sw",
    }
    proc = subprocess.run(["/bin/bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "array task 7 is not one of the 2 tasks" in proc.stderr


def test_megatron_and_nemo_sweeps(tmp_path: Path) -> None:
    mg = {
        "name": "mg",
        "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
        "resources": {"nodes": 2},
        "launcher": {"kind": "megatron", "model_args": {"lr": 0.0003, "num-layers": 2}},
        "sweep": {
            "parameters": {"launcher.model_args.lr": [0.0001, 0.001], "parallelism.tp": [2, 4]}
        },
    }
    text = api.render(validate(mg), slurm_version="24.11").text
    rows = table(text)
    assert len(rows) == 4
    assert "--tensor-model-parallel-size=4" in rows[1]["argv"]
    assert "--tensor-model-parallel-size" not in script_part(text)
    shellcheck(text, tmp_path)
    nemo = {
        "name": "nm",
        "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
        "resources": {"nodes": 1},
        "launcher": {"kind": "nemo", "recipe": "llama3_8b"},
        "sweep": {"parameters": {"launcher.overrides.optim.config.lr": [0.0001, 0.0003]}},
    }
    text = api.render(validate(nemo), slurm_version="24.11").text
    assert "SLURMFM_NEMO_DRIVER_EOF" not in text  # the driver is per task, in the table
    drivers = [dict(row["exports"])["SLURMFM_NEMO_DRIVER"] for row in table(text)]
    assert r"\"optim.config.lr\": 0.0003" in drivers[1]
    assert r"\"optim.config.lr\": 0.0001" in drivers[0]
    shellcheck(text, tmp_path)


def table(text: str) -> list[dict[str, Any]]:
    """The rows of a sweep script's table (its next-to-last line)."""
    lines = text.rstrip("\n").split("\n")
    assert lines[-2].startswith(TABLE_MARK)
    rows: list[dict[str, Any]] = json.loads(lines[-2][len(TABLE_MARK) :])["tasks"]
    return rows


def script_part(text: str) -> str:
    """The script without its table and payload lines."""
    return "\n".join(text.rstrip("\n").split("\n")[:-2])


def test_the_script_is_rendered_once_and_only_the_table_differs() -> None:
    r = validate(
        base(sweep={"parameters": {"env.A": ["1", "2"], "launcher.args": [["--lr", "9"]]}})
    )
    text = api.render(r, slurm_version="24.11").text
    body = script_part(text)
    # no per-task selection in the script text: one launch, one set of exports
    assert "case " not in body
    assert body.count("exec python3") == 1
    assert "export A=" not in body  # A differs per task: set from the table
    # the launch is the same in every task: it stays in the script, whole
    assert "  train.py \\\n  --lr 9" in body
    assert "slurmfm_task_argv" not in body
    rows = table(text)
    assert [dict(row["exports"])["A"] for row in rows] == ["1", "2"]
    assert all("argv" not in row for row in rows)
    # arguments that differ come from the table; the script before them stays in the script
    r = validate(base(sweep={"parameters": {"launcher.args": [["--lr", "1"], ["--lr", "2"]]}}))
    text = api.render(r, slurm_version="24.11").text
    assert '  train.py \\\n  "${slurmfm_task_argv[@]}"' in script_part(text)
    assert [row["argv"] for row in table(text)] == ["--lr 1", "--lr 2"]


def test_tasks_may_set_different_variables(sandbox: Path, tmp_path: Path) -> None:  # noqa: F811
    # one task sets B, the other does not: each task exports only its own
    r = validate(base(sweep={"tasks": [{"env.A": "1"}, {"env.B": "2"}]}))
    info = api.dry_run(r, slurm_version="24.11")
    _, env0 = run_task(sandbox, info.text, tmp_path, 0)
    assert env0["A"] == "1"
    assert "B" not in env0
    _, env1 = run_task(sandbox, info.text, tmp_path, 1)
    assert env1["A"] == "base"
    assert env1["B"] == "2"


@settings(
    max_examples=15,  # each example runs bash and the runtime per task
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    values=st.lists(st.tuples(PAYLOAD, PAYLOAD), min_size=1, max_size=3),
)
def test_task_values_arrive_exactly(
    sandbox: Path,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
    values: list[tuple[str, str]],
) -> None:
    tasks = [{"env.A": env, "launcher.args": ["--x", arg]} for env, arg in values]
    try:
        r = validate(base(sweep={"tasks": tasks}))
        text = api.render(r, slurm_version="24.11").text
    except (RecipeError, SlurmfmError) as exc:
        assert str(exc).strip()
        return
    tmp = tmp_path_factory.mktemp("arr")
    for i, (env_value, arg) in enumerate(values):
        argv, env = run_task(sandbox, text, tmp, i)
        assert not (tmp / "canary").exists(), "a task value was executed by the shell"
        assert argv[-2:] == ["--x", arg]
        assert env["A"] == env_value
        assert env["SLURMFM_CHECKPOINT_DIR"] == f"/ck/sw/run-t{i}"


def test_pinned_sweep_warns_that_tasks_serialize() -> None:
    from slurmfm.plan.types import Placement

    r = validate(base(sweep={"parameters": {"env.A": ["a", "b"]}}))
    pinned = Placement(mode="pin", nodes=("node001", "node002"))
    script = api.render(r, slurm_version="22.05", placement=pinned)
    assert "#SBATCH --nodelist=node[001-002]" in script.text
    assert any("run one after another" in w for w in script.warnings)


def test_line_breaks_in_sweep_values_arrive(sandbox: Path, tmp_path: Path) -> None:  # noqa: F811
    # the table is JSON, not lines of the script: a value may span lines
    r = validate(
        base(
            env={"C": "one\ntwo"},
            sweep={"tasks": [{"env.A": "x\nexport B=1", "launcher.args": ["a\n#c", "b"]}, {}]},
        )
    )
    text = api.render(r, slurm_version="24.11").text
    argv, env = run_task(sandbox, text, tmp_path, 0)
    assert argv[-2:] == ["a\n#c", "b"]
    assert env["A"] == "x\nexport B=1"
    assert "B" not in env
    assert env["C"] == "one\ntwo"
