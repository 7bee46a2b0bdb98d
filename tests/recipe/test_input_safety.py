"""Issue 15 items 10-13: recipe reading bounds, values kept as written, paths refused early.

Each refusal is one located line ``FILE:LINE: field: message`` (a RecipeError), and
``validate`` refuses what ``render`` would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from lab import REPO_ROOT

from slurmfm import api
from slurmfm.errors import RecipeError
from slurmfm.recipe.loader import load_recipe, parse_override, validate

BASE = """\
name: demo
cluster:
  instance_type: lab-cpu
resources:
  nodes: 1
  procs_per_node: 2
launcher:
  kind: torchrun
  script: train.py
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text(text)
    return p


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, text))
    assert len(info.value.problems) == 1, str(info.value)
    return str(info.value)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "r.yaml"
    os.mkfifo(fifo)
    for cmd in ("validate", "render"):
        proc = subprocess.run(
            [sys.executable, "-m", "slurmfm.cli", cmd, str(fifo)],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            timeout=120,  # a hang (the bug) fails the test instead of blocking the run
        )
        assert proc.returncode == 2
        assert proc.stderr == f"{fifo}: (file): is a FIFO, not a regular file\n"


def test_devices_and_large_files_are_refused(tmp_path: Path) -> None:
    from slurmfm.fsutil import MAX_INPUT_BYTES

    with pytest.raises(RecipeError, match=r"^/dev/zero: \(file\): is a character device"):
        load_recipe("/dev/zero")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a" * (MAX_INPUT_BYTES + 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(big)
    assert str(info.value) == (
        f"{big}: (file): is {MAX_INPUT_BYTES + 1} bytes, over the limit of {MAX_INPUT_BYTES}"
    )


def test_deep_nesting_is_a_located_error(tmp_path: Path) -> None:
    deep = BASE + "env: " + "{a: " * 500 + "1" + "}" * 500 + "\n"
    assert refusal(tmp_path, deep).endswith(
        ": (yaml): invalid YAML: nested more than 64 levels deep"
    )
    deeper = BASE + "env: " + "[" * 20000 + "]" * 20000 + "\n"
    assert ": (yaml): invalid YAML: nested more than 64 levels" in refusal(tmp_path, deeper)


def test_non_utf8_recipe_is_located(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_bytes(BASE.encode() + b"env:\n  A: caf\xe9\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(p)
    assert str(info.value) == f"{p}:11: (file): not UTF-8 text (byte 0xe9)"


@pytest.mark.parametrize("value", ["3.10", "0123", "0x1F", "1e400", "true", "no", "1_000", ".inf"])
def test_env_values_are_kept_as_written(tmp_path: Path, value: str) -> None:
    """Issue 15 item 11: 3.10 became 3.1, 0123 123, 0x1F 31, 1e400 inf, true 1."""
    r = load_recipe(write(tmp_path, BASE + f"env:\n  V: {value}\n"))
    assert r.env["V"] == value
    assert parse_override(f"env.V={value}") == ("env.V", value)
    assert load_recipe(write(tmp_path, BASE), {"env.V": value}).env["V"] == value
    swept = load_recipe(write(tmp_path, BASE + f"sweep:\n  parameters:\n    env.V: [{value}, x]\n"))
    assert [t.recipe.env["V"] for t in _tasks(swept)] == [value, "x"]


def _tasks(r):  # type: ignore[no-untyped-def]
    from slurmfm.recipe.sweep import expand

    return expand(r)


def test_env_from_python_dicts(tmp_path: Path) -> None:
    data = {
        "name": "d",
        "cluster": {"instance_type": "lab-cpu"},
        "resources": {"procs_per_node": 2},
        "launcher": {"kind": "torchrun", "script": "t.py"},
    }
    with pytest.raises(RecipeError, match=r"env\.A: inf is not a number; quote the value"):
        validate({**data, "env": {"A": float("inf")}})


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        (
            "resources:\n  nodes: true\n",
            ":5: resources.nodes: true is a yes/no value, not a number",
        ),
        (
            "parallelism:\n  tp: false\n",
            ":11: parallelism.tp: false is a yes/no value, not a number",
        ),
        (
            "storage:\n  log_dir: /fsx/logs/%u\n",
            ":11: storage.log_dir: '/fsx/logs/%u': '%' is a filename pattern",
        ),
        ("storage:\n  log_dir: ''\n", ":11: storage.log_dir: must not be empty"),
        ("storage:\n  log_dir: /fsx/my logs\n", ":11: storage.log_dir: '/fsx/my logs' has"),
        ("storage:\n  checkpoint_root: ''\n", ":11: storage.checkpoint_root: '': give a"),
        ("storage:\n  checkpoint_root: /\n", ":11: storage.checkpoint_root: '/': give a"),
        (
            'storage:\n  checkpoint_root: "/fsx/a\\nb"\n',
            ":11: storage.checkpoint_root: '/fsx/a\\nb': a path must not contain a line break",
        ),
        (
            'storage:\n  data:\n    X: "/d\\n2026-01-01T00:00:00 restart=9 event=requeue x"\n',
            ":11: storage.data: ",
        ),
        ('env:\n  A: "x\\0y"\n', ":10: env: 'x\\x00y' contains a NUL byte"),
        ("resources:\n  procs_per_node: 1024\n", ":5: resources.procs_per_node: 1024 exceeds"),
    ],
)
def test_bad_values_are_refused_with_their_line(
    tmp_path: Path, fragment: str, expected: str
) -> None:
    """Issue 15 items 11, 12, 13 and 14: each one located line, at validate already."""
    text = BASE
    section = fragment.split(":", maxsplit=1)[0]
    if section == "resources":  # replace the base's section instead of a duplicate key
        text = text.replace("resources:\n  nodes: 1\n  procs_per_node: 2\n", "")
        extra = "  procs_per_node: 2\n" if "procs_per_node" not in fragment else "  nodes: 1\n"
        text = text.replace("launcher:", fragment + extra + "launcher:")
    else:
        text += fragment
    msg = refusal(tmp_path, text)
    assert msg.startswith(str(tmp_path / "recipe.yaml") + expected), msg


def test_every_leaf_field_is_checked_for_exact_values() -> None:
    """The list the NUL/boolean/line-break check runs on names every field of the schema."""
    from pydantic import BaseModel

    from slurmfm.strict import _LEAF_FIELDS, _Strict

    def models(cls: type[BaseModel]) -> list[type[BaseModel]]:
        return [cls, *(m for sub in cls.__subclasses__() for m in models(sub))]

    leaves = set()
    for m in models(_Strict):
        for name, f in m.model_fields.items():
            ann = f.annotation
            is_model = isinstance(ann, type) and issubclass(ann, BaseModel)
            nested = name in {"launcher", "serve", "container", "python_env", "sweep"}
            if name != "kind" and not is_model and not nested:
                leaves.add(name)
    assert leaves <= set(_LEAF_FIELDS), sorted(leaves - set(_LEAF_FIELDS))


def _gpu(**resources: object) -> dict[str, object]:
    return {
        "name": "conv",
        "cluster": {"instance_type": "p5.48xlarge"},
        "resources": {"nodes": 1, **resources},
        "launcher": {"kind": "torchrun", "script": "t.py"},
    }


def test_shared_gpu_nodes_ask_for_the_cpus_the_launch_uses() -> None:
    """Issue 15 item 13: a non-exclusive GPU job asked for one CPU per node."""
    one = api.render(validate(_gpu(exclusive=False, procs_per_node=1)), slurm_version="24.11")
    assert "#SBATCH --cpus-per-task=24" in one.text  # p5: 192 vCPUs / 8 GPUs, one process
    four = api.render(validate(_gpu(exclusive=False, procs_per_node=4)), slurm_version="24.11")
    assert "#SBATCH --cpus-per-task=96" in four.text
    nemo = _gpu(exclusive=False)
    nemo["launcher"] = {"kind": "nemo", "recipe": "llama3_8b"}
    text = api.render(validate(nemo), slurm_version="24.11").text
    assert "#SBATCH --ntasks-per-node=8" in text
    assert "#SBATCH --cpus-per-task=24" in text  # one task per GPU
    whole = api.render(validate(_gpu()), slurm_version="24.11").text
    assert "--cpus-per-task" not in whole  # --exclusive already gives every CPU
