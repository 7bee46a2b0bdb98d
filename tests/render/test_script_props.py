"""Property: any user value either is refused with a clear error, or, when bash runs the
rendered script with stub Slurm commands, arrives exactly and nothing else is executed.

The script runs for real under bash with a PATH that holds only stubs (srun, scontrol, mkdir),
the few coreutils the script uses and python3 for the job runtime it extracts from its own last
line (prepare, then the batch step, which starts the stub srun). Every payload also carries a canary command
substitution: had any value been interpreted by the shell, the canary file would exist.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from stub_bin import stub_bin

from slurmfm.errors import RecipeError, SlurmfmError
from slurmfm.job.hosts import choose_port, ephemeral_range
from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script

SRUN = """#!/bin/bash
for a in "$@"; do
  if [ "$a" = --kill-on-bad-exit=1 ]; then
    printf '%s\\0' "$@" > "$STUB_OUT/argv"
    env -0 > "$STUB_OUT/env"
  fi
done
"""
SCONTROL = """#!/bin/bash
if [ "$2" = hostnames ]; then printf 'node002\\nnode001\\n'; exit 0; fi
# scontrol -o show node a,b: one line per node
IFS=, read -r -a nodes <<<"$4"
for n in "${nodes[@]}"; do echo "NodeName=$n Arch=x86_64 NodeAddr=10.0.0.7 NodeHostName=$n"; done
"""
# Records every directory; creates only the runtime's directory under the sandbox log dir
# (a user's checkpoint path must never be created on this host).
MKDIR = """#!/bin/bash
printf '%s\\0' "$@" >> "$STUB_OUT/mkdir"
for a in "$@"; do
  case $a in "$SANDBOX_LOGS"/*) /bin/mkdir -p "$a" ;; esac
done
"""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stubs")
    tools = ["base64", "mv", "sha256sum", "sed", "head", "sort", "cut", "env", "cat", "uname"]
    tools += ["date", "tail", "mktemp", "rm", "stat", "grep", "sleep", "timeout", "df", "awk"]
    stub_bin(root / "bin", {"srun": SRUN, "scontrol": SCONTROL, "mkdir": MKDIR}, tools)
    return root


def run_script(sandbox: Path, text: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    out = tmp / "out"
    out.mkdir()
    script = tmp / "job.sh"
    script.write_bytes(text.encode("utf-8"))
    env = {
        "PATH": str(sandbox / "bin"),
        "STUB_OUT": str(out),
        "SLURM_JOB_NODELIST": "node[001-002]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "prop",
        "HF_TOKEN": "s3cr3t-value",
        "SANDBOX_LOGS": str(sandbox / "logs"),
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


CANARY = "$(printf x > canary)`printf y > canary`"
PAYLOAD = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30),
    st.sampled_from(
        [
            CANARY,
            "'; printf z > canary; '",
            '"$HOME"',
            "a\nb",
            "--flag=x y",
            "*",
            "~",
            "-n",
            "$((1+1))",
            "!!",
            "\\",
            "'",
            '"',
            "${IFS}",
            "é ü 漢字",
        ]
    ),
)


def build(values: dict[str, Any], logs: Path) -> dict[str, Any]:
    return {
        "name": "prop",
        "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
        "resources": {"nodes": 2},
        "parallelism": {"tp": 8},
        "launcher": {
            "kind": "torchrun",
            "script": values["script"],
            "args": values["args"],
            "python": values["python"],
        },
        "container": {
            "image": values["image"],
            "mounts": ["/fsx:/fsx"],
            "workdir": values["workdir"],
        },
        "env": {"USER_VALUE": values["env"]},
        "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
        "secrets": ["HF_TOKEN"],
        "storage": {
            "checkpoint_root": values["ckpt"],
            "log_dir": str(logs),
            "data": {"train": values["data"]},
        },
    }


@settings(
    max_examples=40,  # each example runs bash and the runtime twice (~3 s)
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    script=PAYLOAD,
    args=st.lists(PAYLOAD, max_size=3),
    python=PAYLOAD,
    image=PAYLOAD,
    workdir=PAYLOAD,
    env_value=PAYLOAD,
    ckpt=PAYLOAD,
    data=PAYLOAD,
)
def test_user_values_arrive_exactly(
    sandbox: Path,
    tmp_path_factory: pytest.TempPathFactory,
    script: str,
    args: list[str],
    python: str,
    image: str,
    workdir: str,
    env_value: str,
    ckpt: str,
    data: str,
) -> None:
    values = {
        "script": script,
        "args": args,
        "python": python,
        "image": image,
        "workdir": workdir,
        "env": env_value,
        "ckpt": ckpt,
        "data": data,
    }
    try:
        recipe = validate(build(values, sandbox / "logs"))
        rendered = render_script(recipe, Target.for_recipe(recipe, "24.11.5"))
    except (RecipeError, SlurmfmError) as exc:
        # Refusal is allowed, but it must be one clear located message.
        assert str(exc).strip()
        return
    tmp = tmp_path_factory.mktemp("run")
    assert "s3cr3t-value" not in rendered.text
    argv, envs = run_script(sandbox, rendered.text, tmp)
    assert not (tmp / "canary").exists(), "a user value was executed by the shell"
    # srun argv: options, then (a container launch) sh -c PROGRAM slurmfm-node, the node
    # entry up to "--", then the per-node command; the program is fixed text, no user value
    # in it.
    i = argv.index("slurmfm-node")
    assert argv[i - 2] == "-c"
    assert "$SLURMFM_HOST_ORDER" in argv[i - 1]
    assert argv[i + 1 : i + 4] == ["python3", "-I", "-S"]
    cmd = argv[argv.index("--", i) + 1 :]
    port = choose_port(4242, 0, 20000, 6000, ephemeral_range(), is_free=lambda p: True)
    assert cmd[0] == python
    assert cmd[cmd.index(f"--master-port={port}") + 1] == script
    assert cmd[-len(args) :] == args if args else True
    assert f"--container-image={image}" in argv
    assert f"--container-workdir={workdir}" in argv
    assert envs["USER_VALUE"] == env_value
    assert envs["SLURMFM_DATA_TRAIN"] == data
    root = ckpt.rstrip("/")
    expected_ckpt = f"{root}/prop/prop" if root else "/prop/prop"
    assert envs["SLURMFM_CHECKPOINT_DIR"] == expected_ckpt
    assert envs["HF_TOKEN"] == "s3cr3t-value"  # passed through the environment only
    assert envs["MASTER_ADDR"] == "10.0.0.7"
    assert envs["SLURMFM_HOST_ORDER"] == "node002 node001"


def test_missing_secret_stops_the_job(sandbox: Path, tmp_path: Path) -> None:
    recipe = validate(
        build(
            {
                "script": "t.py",
                "args": [],
                "python": "python3",
                "image": "i",
                "workdir": "/w",
                "env": "v",
                "ckpt": "/c",
                "data": "/d",
            },
            tmp_path / "logs",
        )
    )
    text = render_script(recipe, Target.for_recipe(recipe, "24.11")).text
    script = tmp_path / "job.sh"
    script.write_text(text)
    proc = subprocess.run(
        ["/bin/bash", str(script)],
        env={
            "PATH": str(sandbox / "bin"),
            "STUB_OUT": str(tmp_path),
            "SLURM_JOB_NODELIST": "n1",
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_JOB_ID": "1",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "secret HF_TOKEN is not set in the submitting environment" in proc.stderr
    assert not (tmp_path / "argv").exists()
