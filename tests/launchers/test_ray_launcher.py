"""``launcher.kind: ray`` (slurmfm/launchers/ray.py): the launch it renders, what each node's
entry is told, and the one-line refusals of recipes it cannot run."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from slurmfm.api import load, override
from slurmfm.cli import main
from slurmfm.job.options import NodeOptions
from slurmfm.launchers import spec
from slurmfm.render.script import render_script

ROOT = Path(__file__).resolve().parents[2]
VERL = ROOT / "recipes" / "grpo-verl-ray-p5.yaml"


def node_options(script: str) -> NodeOptions:
    """The node entry's options as the runtime parses them from the rendered launch."""
    line = next(ln for ln in script.splitlines() if '"$slurmfm_checked" node ' in ln)
    words = shlex.split(line.split('"$slurmfm_checked" node ', 1)[1].rsplit(" -- ", 1)[0])
    return NodeOptions.from_argv(words)


def test_the_verl_recipe_runs_its_driver_on_the_head_with_the_checkpoint_dir() -> None:
    r = load(VERL)
    text = render_script(r).text
    no = node_options(text)
    settings = no.ray_settings()
    assert settings is not None
    # the head's port is the job's rendezvous port (picked out of the ephemeral range)
    assert settings == {
        "ray": "ray",
        "python": "python3",
        "port": "rdzv",
        "nodes": "4",
        "timeout": "600",
        "driver": "1",
    }
    assert no.prefix == 0  # no --node-rank: Ray ranks nothing
    # veRL's sample: python3 -m verl.trainer.main_ppo on the head, kept off the working dir
    assert 'python3 -c "$slurmfm_run_module" verl.trainer.main_ppo' in text
    assert "'trainer.default_local_dir='\"$SLURMFM_CHECKPOINT_DIR\"" in text
    assert "--ntasks-per-node=1" in text  # one task per node: the head or a worker
    assert "--done-check none" in text  # the driver's exit 0 is the end of the work
    assert "--save-protocol 0" in text  # no USR2 save: requeue at the signal
    assert spec("ray").host_script(r) is None  # a module: nothing on the login node to check


def test_a_driver_script_is_run_by_the_launchers_python_and_checked_before_submit(
    tmp_path: Path,
) -> None:
    r = override(
        load(VERL),
        {
            "launcher.driver": str(tmp_path / "grpo.py"),
            "launcher.module": False,
            "launcher.python": "/opt/venv/bin/python",
            "launcher.ray_port": 6379,
            "launcher.checkpoint_arg": None,
            "launcher.args": ["--steps", "a b"],
        },
    )
    argv, prefix, _ = spec("ray").launch(r, "$SLURMFM_CHECKPOINT_DIR")
    assert argv == [f"/opt/venv/bin/python {tmp_path}/grpo.py", "--steps 'a b'"]
    assert prefix == 0
    settings = node_options(render_script(r).text).ray_settings()
    assert settings is not None
    assert settings["port"] == "6379"
    assert spec("ray").host_script(r) == str(tmp_path / "grpo.py")


def _cli_error(tmp_path: Path, edit: dict[str, object], drop: str | None = None) -> str:
    """validate a copy of the veRL recipe with ``edit`` applied (dotted keys) and ``drop``
    removed; the one stderr line of the refusal (exit 2)."""
    yaml = YAML()
    raw = yaml.load(VERL.read_text())
    for key, value in edit.items():
        cur = raw
        *parents, last = key.split(".")
        for p in parents:
            cur = cur[p]
        cur[last] = value
    if drop:
        *parents, last = drop.split(".")
        cur = raw
        for p in parents:
            cur = cur[p]
        del cur[last]
    bad = tmp_path / "bad.yaml"
    with bad.open("w") as fh:
        yaml.dump(raw, fh)
    res = CliRunner().invoke(main, ["validate", str(bad)])
    assert res.exit_code == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{bad}:"), lines
    return lines[0]


def test_a_recipe_without_a_driver_is_refused_at_its_launcher_line(tmp_path: Path) -> None:
    line = _cli_error(tmp_path, {}, drop="launcher.driver")
    assert ": launcher.driver: " in line
    assert "required" in line.lower()


@pytest.mark.parametrize(
    ("edit", "field", "what"),
    [
        ({"parallelism.tp": 2}, "parallelism.tp", "launcher ray does not apply it"),
        ({"launcher.ray_port": 8265}, "launcher.ray_port", "the Ray head's own dashboard port"),
        ({"launcher.ray_port": 12000}, "launcher.ray_port", "Ray's worker port range"),
        ({"launcher.join_timeout_s": 0}, "launcher.join_timeout_s", "greater than or equal"),
        ({"launcher.driver": ""}, "launcher.driver", "at least 1 character"),
        ({"launcher.checkpoint_arg": ""}, "launcher.checkpoint_arg", "at least 1 character"),
        ({"launcher.workers": 3}, "launcher.workers", "unknown field"),
        (
            {
                "serve": {
                    "nodes": 1,
                    "parallelism": {"tp": 8},
                    "launcher": {"kind": "vllm", "model": "m"},
                }
            },
            "serve",
            "does not apply",
        ),
    ],
)
def test_fields_that_do_not_apply_are_refused_in_one_located_line(
    tmp_path: Path, edit: dict[str, object], field: str, what: str
) -> None:
    line = _cli_error(tmp_path, edit)
    assert f": {field}: " in line, line
    assert what in line, line
    # the line number is that of the field (or its section) in the file
    number = int(line.split(":")[1])
    text = (tmp_path / "bad.yaml").read_text().splitlines()
    assert text[number - 1].strip().startswith(field.rsplit(".", maxsplit=1)[-1] + ":"), (
        number,
        line,
    )
