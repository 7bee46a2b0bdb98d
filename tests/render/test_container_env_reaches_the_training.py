"""Every profile and recipe variable reaches the process inside a Pyxis container.

Pyxis exports the host environment into the container after the entrypoint, but a variable the
image already defines keeps the image's value unless ``--container-env`` names it
(NVIDIA/pyxis README, ``--container-env``; NVIDIA/pyxis:tests/env.bats shows
``LD_LIBRARY_PATH`` keeping the image's value until it is named). The stand-in ``srun`` below
applies exactly that rule against an image environment and runs the rendered script's launch
line; the stand-in training process records what it sees.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from stub_bin import SBCAST

from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script

# srun stand-in: a probe (-w HOST true) answers; any other step runs its command once per host.
# In a container step (--container-image) the image's environment is applied with Pyxis's
# precedence: an image value wins unless --container-env names the variable.
SRUN = r"""#!PYTHON
import json, os, subprocess, sys

args = sys.argv[1:]
if "-w" in args:
    sys.exit(0)
with open(os.environ["STUB_OUT"] + "/srun.calls", "a") as fh:
    fh.write(json.dumps(args) + "\n")
image, named, i = None, set(), 0
hosts = os.environ["FAKE_HOSTS"].split()
arbitrary = "--distribution=arbitrary" in args
while i < len(args) and args[i].startswith("-"):
    a = args[i]
    if a.startswith("--nodelist=") and arbitrary:
        # srun(1) --distribution=arbitrary: task i runs on the i-th name of the node list
        hosts = a.split("=", 1)[1].split(",")
    if a.startswith("--container-image="):
        image = a.split("=", 1)[1]
    elif a.startswith("--container-env="):
        named = set(a.split("=", 1)[1].split(","))
    elif a in ("--container-env", "--container-image"):
        raise SystemExit("stand-in srun: use the --opt=value form")
    i += 1
cmd = args[i:]
env = dict(os.environ)
if image is not None:
    with open(os.environ["FAKE_IMAGES"]) as fh:
        for name, value in json.load(fh)[image].items():
            if name not in named:
                env[name] = value
rc = 0
for rank, host in enumerate(hosts):
    e = dict(env, SLURMD_NODENAME=host, SLURM_PROCID=str(rank), SLURM_NODEID=str(rank))
    rc = max(rc, subprocess.call(cmd, env=e))
sys.exit(rc)
"""

SCONTROL = r"""#!/bin/bash
case "$1 $2" in
  "show hostnames") for h in $FAKE_HOSTS; do echo "$h"; done ;;
  "show node"*) echo "NodeName=$3 Arch=x86_64 NodeAddr=127.0.0.1 State=ALLOCATED" ;;
  *) exit 0 ;;
esac
"""

# The training process: records the variables it was given, as the container would show them.
TRAINER = r"""#!PYTHON
import json, os, sys
names = os.environ["FAKE_WATCH"].split(",")
with open(os.environ["STUB_OUT"] + "/seen." + os.environ["SLURMD_NODENAME"], "w") as fh:
    json.dump({n: os.environ.get(n) for n in names}, fh)
"""

IMAGE = "/fsx/ngc-pytorch.sqsh"
# What an NGC PyTorch image defines itself (its Dockerfile ENV lines).
IMAGE_ENV = {
    "LD_LIBRARY_PATH": "/usr/local/cuda/compat/lib:/usr/local/nvidia/lib64",
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_DEBUG": "VERSION",
    "PYTORCH_CUDA_ALLOC_CONF": "",
    "UNRELATED_IMAGE_VAR": "kept",
}
RECIPE_ENV = {
    "LD_LIBRARY_PATH": "/fsx/mylibs",
    "NCCL_DEBUG": "INFO",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


def _recipe(tmp: Path, container: dict[str, Any]) -> Any:
    return validate(
        {
            "name": "ce",
            "cluster": {"instance_type": "p5.48xlarge"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "torchrun", "script": "train.py", "python": "fake-trainer"},
            "container": {"image": IMAGE, **container},
            "env": RECIPE_ENV,
            "storage": {"checkpoint_root": str(tmp / "ckpt"), "log_dir": str(tmp / "logs")},
            "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
            "observability": {"enabled": "off"},
        }
    )


def _run(
    tmp: Path, text: str, watch: str = "", images: dict[str, dict[str, str]] | None = None
) -> dict[str, dict[str, str | None]]:
    bindir = tmp / "bin"
    bindir.mkdir()
    out = tmp / "out"
    out.mkdir()
    stubs = {"srun": SRUN, "scontrol": SCONTROL, "fake-trainer": TRAINER, "sbcast": SBCAST}
    for name, body in stubs.items():
        (bindir / name).write_text(body.replace("#!PYTHON", f"#!{sys.executable}"))
        (bindir / name).chmod(0o755)
    (tmp / "images.json").write_text(json.dumps(images or {IMAGE: IMAGE_ENV}))
    (tmp / "logs").mkdir(exist_ok=True)
    script = tmp / "job.sh"
    script.write_text(text)
    hosts = "n1 n2"
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "STUB_OUT": str(out),
        "FAKE_HOSTS": hosts,
        "FAKE_IMAGES": str(tmp / "images.json"),
        "FAKE_WATCH": ",".join(
            sorted({*IMAGE_ENV, *RECIPE_ENV, "FI_PROVIDER", "NCCL_SOCKET_IFNAME", *watch.split()})
        ),
        "SLURM_JOB_NODELIST": "n1,n2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": "91",
        "SLURM_JOB_NAME": "ce",
    }
    proc = subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    (out / "stderr").write_text(proc.stdout + proc.stderr)
    return {h: json.loads((out / f"seen.{h}").read_text()) for h in hosts.split()}


def test_profile_and_recipe_values_win_over_the_image(tmp_path: Path) -> None:
    r = _recipe(tmp_path, {})
    rendered = render_script(r, Target.for_recipe(r, "24.11"))
    seen = _run(tmp_path, rendered.text)
    for host in ("n1", "n2"):
        got = seen[host]
        # the recipe's own values, although the image defines every one of them
        assert got["LD_LIBRARY_PATH"] == "/fsx/mylibs"
        assert got["NCCL_DEBUG"] == "INFO"
        assert got["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
        # the NCCL/EFA profile's value, although the image defines it
        assert got["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth"
        assert got["FI_PROVIDER"] == "efa"
        # what neither slurmfm nor the recipe sets stays the image's
        assert got["UNRELATED_IMAGE_VAR"] == "kept"
    assert "UNRELATED_IMAGE_VAR" not in rendered.container_env
    assert {"NCCL_SOCKET_IFNAME", "LD_LIBRARY_PATH"} <= set(rendered.container_env)


def test_old_pyxis_gets_no_container_env_and_a_warning(tmp_path: Path) -> None:
    """Pyxis < 0.15 does not know --container-env (first released in v0.15.0): passing it
    would fail the step, so the script leaves it out and says what the image may override."""
    r = _recipe(tmp_path, {"pyxis": "0.14.0"})
    rendered = render_script(r, Target.for_recipe(r, "24.11"))
    assert "--container-env" not in rendered.text
    (warning,) = [w for w in rendered.warnings if w.startswith("container.pyxis")]
    assert "0.15.0" in warning
    assert "NCCL_SOCKET_IFNAME" in warning
    seen = _run(tmp_path, rendered.text)
    assert seen["n1"]["NCCL_SOCKET_IFNAME"] == "eth0"  # the documented loss, now warned about


@pytest.mark.parametrize("version", ["0.15.0", "0.20.0", "auto"])
def test_container_env_from_pyxis_0_15(tmp_path: Path, version: str) -> None:
    r = _recipe(tmp_path, {"pyxis": version})
    text = render_script(r, Target.for_recipe(r, "24.11")).text
    assert "--container-env=" in text


def test_bad_pyxis_version_is_a_recipe_error(tmp_path: Path) -> None:
    from slurmfm.errors import SlurmfmError

    with pytest.raises((ValueError, SlurmfmError), match="pyxis"):
        _recipe(tmp_path, {"pyxis": "new"})


def test_the_launch_in_a_container_runs_the_node_entry_in_the_image(tmp_path: Path) -> None:
    """Issue 37: a training launch in a container runs the runtime's node entry with the
    image's python3, on the runtime file mounted read-only at the same path; the entry ranks
    each node by the planned host order and inserts ``--node-rank``, as on the host. No node
    list is fixed in the launch (HyperPod's auto-resume would replay it)."""
    from slurmfm.plan.types import Placement

    r = _recipe(tmp_path, {})
    rendered = render_script(r, Target.for_recipe(r, "24.11"), Placement(nodes=("n2", "n1")))
    seen = _run(tmp_path, rendered.text, "SLURMFM_NODE_RANK PET_NODE_RANK SLURMD_NODENAME")
    assert seen["n2"]["SLURMFM_NODE_RANK"] == "0"
    assert seen["n1"]["SLURMFM_NODE_RANK"] == "1"
    assert seen["n1"]["PET_NODE_RANK"] is None  # the entry inserts --node-rank itself
    calls = [json.loads(x) for x in (tmp_path / "out" / "srun.calls").read_text().splitlines()]
    (launch,) = [c for c in calls if any(w.startswith("--container-image=") for w in c)]
    assert "--distribution=arbitrary" not in launch
    assert not any(w.startswith("--nodelist") for w in launch)
    (mounts,) = [w for w in launch if w.startswith("--container-mounts=")]
    runtime = launch[launch.index("-c", launch.index("slurmfm-node")) - 3 :]
    assert runtime[:3] == ["python3", "-I", "-S"]
    path = mounts.split(",")[0].split("=", 1)[1].split(":")[0]
    assert mounts.startswith(f"--container-mounts={path}:{path}:ro"), mounts
    assert launch[launch.index("slurmfm-node") + 6] == "node"


def test_an_image_without_python3_runs_the_launch_with_one_line(tmp_path: Path) -> None:
    """Issue 37: where the image has no ``python3`` the launch runs as it did before the
    entry moved into the container (rank from the host order in ``PET_NODE_RANK``), and the
    job log says so once."""
    from slurmfm.plan.types import Placement

    nopy = tmp_path / "nopy"
    nopy.mkdir()
    (nopy / "sh").symlink_to("/bin/sh")
    images = {IMAGE: {**IMAGE_ENV, "PATH": f"{tmp_path / 'bin'}:{nopy}"}}
    r = _recipe(tmp_path, {})
    rendered = render_script(r, Target.for_recipe(r, "24.11"), Placement(nodes=("n2", "n1")))
    seen = _run(tmp_path, rendered.text, "SLURMFM_NODE_RANK PET_NODE_RANK", images=images)
    assert seen["n2"]["PET_NODE_RANK"] == seen["n2"]["SLURMFM_NODE_RANK"] == "0"
    assert seen["n1"]["PET_NODE_RANK"] == seen["n1"]["SLURMFM_NODE_RANK"] == "1"
    log = (tmp_path / "out" / "stderr").read_text()
    said = [x for x in log.splitlines() if x.startswith("slurmfm: n1: no python3 in the")]
    assert len(said) == 1, log  # task 0's line only (the launch line shows the program too)


def test_one_named_container_per_attempt_unless_squashfuse(tmp_path: Path) -> None:
    """Pyxis keeps a named container for the attempt's next steps on the node; with
    use_squashfuse=1 a name would unpack the image instead (container.named: false)."""
    text = render_script(_recipe(tmp_path, {}), Target.for_recipe(_recipe(tmp_path, {}))).text
    assert '--container-name="slurmfm-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}-launch"' in text
    unnamed = _recipe(tmp_path, {"named": False})
    assert "--container-name" not in render_script(unnamed, Target.for_recipe(unnamed)).text
