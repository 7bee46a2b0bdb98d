"""Heterogeneous components and the in-container IMEX check in the batch step, with a fake
srun; and the rendered scripts run under bash with stub Slurm commands (issue 12 items 4, 13).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from stub_bin import stub_bin

from slurmfm.job import hetjob
from slurmfm.job.batch import Batch
from slurmfm.job.options import BatchOptions
from slurmfm.recipe.loader import load_recipe, validate
from slurmfm.render.script import Target, render_script

REPO = Path(__file__).resolve().parents[2]

HET_OPTS = [
    "--health",
    "1",
    "--gpus",
    "8",
    "--efa",
    "8",
    "--component",
    "1 nodes=2 health=1 gpus=8 efa=32 imex=1",
    "--component-env",
    "1:FI_EFA_USE_DEVICE_RDMA=1",
    "--component-env",
    "1:NCCL_X=a=b:c",
    "--component-unset",
    "1:NCCL_ONLY_ZERO",
]
SERVE = ["srun", "--het-group=1", "--nodes=2", "--container-image=img.sqsh", "python3", "srv"]
LAUNCH = [
    "srun",
    "--het-group=0",
    "--nodes=2",
    "--kill-on-bad-exit=1",
    "--container-image=img.sqsh",
    "--container-mounts=/fsx:/fsx,/dev/nvidia-caps-imex-channels",
    "--no-container-mount-home",
    "python3",
    "rt.pyz",
    "node",
]


class Run:
    """Answers the batch step's srun calls: the health step and the container check."""

    def __init__(self, container_bad: Sequence[str] = ()) -> None:
        self.calls: list[list[str]] = []
        self.container_bad = set(container_bad)

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        a = list(argv)
        self.calls.append(a)
        hosts = ["n3", "n4"] if "--het-group=1" in a else ["n1", "n2"]
        if a[0] == "srun" and "health" in a:
            return 0, "".join(f"slurmfm-health {h} OK\n" for h in hosts)
        if a[0] == "srun" and "sh" in a:
            out = ""
            for h in hosts:
                why = "FAIL no channel inside the container" if h in self.container_bad else "OK"
                out += f"slurmfm-health {h} {why}\n"
            return (1 if "FAIL" in out else 0), out
        return 0, ""


class Proc:
    def __init__(self, rc: int = 0) -> None:
        self.rc = rc

    def poll(self) -> int | None:
        return self.rc

    def wait(self, timeout: float | None = None) -> int:
        return self.rc

    def terminate(self) -> None:
        pass

    def send_signal(self, sig: int) -> None:
        pass


def make(tmp: Path, run: Run, *opts: str, **env: str) -> tuple[Batch, list[Any]]:
    a = BatchOptions.from_argv(["--runtime", "rt.pyz", "--drain", "1", *opts])
    base = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NAME": "rt",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURMFM_LOG_DIR": str(tmp),
        "SLURMFM_HOST_ORDER": "n1 n2",
        "NCCL_ONLY_ZERO": "1",
        **env,
    }
    started: list[Any] = []

    def popen(argv: list[str], env: dict[str, str] | None = None) -> Proc:
        started.append((argv, env))
        return Proc()

    b = Batch(a, base, run=run, popen=popen, clock=lambda: 0.0, sleep=lambda s: None)
    return b, started


def test_component_specs_parse() -> None:
    (c,) = hetjob.components(
        ["1 nodes=2 health=1 gpus=8 efa=32 imex=1"],
        ["1:A=1", "2:B=2", "1:C=x=y"],
        ["1:D", "2:E"],
    )
    assert c == hetjob.Component(1, 2, True, 8, 32, True, (("A", "1"), ("C", "x=y")), ("D",))
    with pytest.raises(hetjob.ComponentError):
        hetjob.parse_component("one nodes=2")
    assert hetjob.step_group(["srun", "--nodes=1", "--het-group=1", "python3"]) == 1
    assert hetjob.step_group(["srun", "--nodes=1", "python3", "--het-group=1"]) is None
    assert hetjob.container_words(LAUNCH) == LAUNCH[4:7]
    assert hetjob.container_words(["python3", "--container-image=x"]) == []


def test_every_component_is_health_checked_with_its_own_expectations(tmp_path: Path) -> None:
    run = Run()
    b, _ = make(tmp_path, run, *HET_OPTS)
    assert b.health_gate([SERVE, LAUNCH]) is None
    health = [c for c in run.calls if "health" in c]
    assert health == [
        [
            "srun",
            "--het-group=0",
            "--nodes=2",
            "--ntasks=2",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=0",
            "python3",
            "rt.pyz",
            "health",
            "--gpus",
            "8",
            "--efa",
            "8",
            "--dcgm",
            "0",
            "--efa-tries",
            "3",
            "--efa-delay-s",
            "5",
        ],
        [
            "srun",
            "--het-group=1",
            "--nodes=2",
            "--ntasks=2",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=0",
            "python3",
            "rt.pyz",
            "health",
            "--gpus",
            "8",
            "--efa",
            "32",
            "--dcgm",
            "0",
            "--efa-tries",
            "3",
            "--efa-delay-s",
            "5",
            "--imex",
        ],
    ]
    # component 1 needs IMEX and runs in a container: the channel is looked for inside it,
    # in the server step's image (its Pyxis options), on component 1's nodes
    (check,) = [c for c in run.calls if "sh" in c]
    assert check[:6] == [
        "srun",
        "--het-group=1",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--container-image=img.sqsh",
    ]
    assert check[6:8] == ["sh", "-c"]
    assert "test -e /dev/nvidia-caps-imex-channels/channel0" in check[8]


def test_a_channel_missing_in_the_container_fails_the_job_without_draining(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host has the channel (its gate passed) and the container lacks it: the mounts are
    wrong, on every node alike, so no node is drained and a requeue would fail again."""
    run = Run(container_bad=["n4"])
    b, _ = make(tmp_path, run, *HET_OPTS)
    assert b.health_gate([SERVE, LAUNCH]) == 2
    assert not [c for c in run.calls if c[0] == "scontrol"]
    reason = "IMEX channel check inside the container failed on n4: no channel inside the container"
    assert reason in capsys.readouterr().err
    assert (tmp_path / "rt_77.state").read_text().splitlines()[-1].endswith("event=fail " + reason)


def test_a_host_failure_drains_before_any_container_check(tmp_path: Path) -> None:
    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        calls.append(list(argv))
        if "health" in argv and "--het-group=1" in argv:
            return (
                1,
                "slurmfm-health n3 OK\nslurmfm-health n4 FAIL no /dev/nvidia-caps-imex-channels\n",
            )
        return Run()(argv, timeout)

    calls: list[list[str]] = []
    b, _ = make(tmp_path, run, *HET_OPTS)  # type: ignore[arg-type]
    assert b.health_gate([SERVE, LAUNCH]) == 3  # requeued off n4
    assert any(c[:2] == ["scontrol", "requeue"] for c in calls)
    assert any("NodeName=n4" in c for c in calls)
    assert not [c for c in calls if "sh" in c]


def test_container_imex_check_uses_the_launch_image_on_a_plain_job(tmp_path: Path) -> None:
    """One component, a container launch: the check runs in the launch step's image and
    mounts; without a container no check step runs; without IMEX neither."""
    run = Run(container_bad=["n2"])
    b, _ = make(tmp_path, run, "--health", "1", "--gpus", "4", "--imex", "1")
    launch = [w for w in LAUNCH if w != "--het-group=0"]
    assert b.health_gate([[], launch]) == 2
    (check,) = [c for c in run.calls if "sh" in c]
    assert check[:8] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        *LAUNCH[4:7],
        "sh",
    ]
    host_only = [w for w in launch if not w.startswith(("--container", "--no-container"))]
    run = Run(container_bad=["n2"])
    b, _ = make(tmp_path, run, "--health", "1", "--gpus", "4", "--imex", "1")
    assert b.health_gate([[], host_only]) is None
    assert not [c for c in run.calls if "sh" in c]
    run = Run(container_bad=["n2"])
    b, _ = make(tmp_path, run, "--health", "1", "--gpus", "4")
    assert b.health_gate([[], launch]) is None
    assert not [c for c in run.calls if "sh" in c]


def test_a_failed_container_step_without_a_report_fails_the_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image Pyxis cannot start fails before the launch, with Pyxis's own message."""

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        if "sh" in argv:
            return 1, "pyxis: failed to import docker image\n"
        return Run()(argv, timeout)

    b, _ = make(tmp_path, run, "--health", "1", "--gpus", "4", "--imex", "1")  # type: ignore[arg-type]
    assert b.health_gate([[], [w for w in LAUNCH if w != "--het-group=0"]]) == 2
    err = capsys.readouterr().err
    assert "IMEX check in the container failed (exit 1): pyxis: failed to import" in err
    assert "inside the container failed on its nodes (exit 1): the container step failed" in err


def test_component_steps_get_their_own_profile(tmp_path: Path) -> None:
    run = Run()
    b, started = make(tmp_path, run, *HET_OPTS, "--health", "0")
    b.start_server = lambda argv: b.popen(list(argv), env=b.step_env(argv)) and None  # type: ignore[method-assign]
    b.main(SERVE, LAUNCH)
    (serve_env,) = [env for argv, env in started if argv == SERVE]
    # the launch in a container gets its evidence directory mounted (batch.with_evidence_mount)
    (launch_env,) = [env for argv, env in started if argv[:5] == LAUNCH[:5]]
    assert serve_env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert serve_env["NCCL_X"] == "a=b:c"
    assert "NCCL_ONLY_ZERO" not in serve_env
    assert "FI_EFA_USE_DEVICE_RDMA" not in launch_env
    assert launch_env["NCCL_ONLY_ZERO"] == "1"


def test_agents_run_on_every_component(tmp_path: Path) -> None:
    obs = tmp_path / "obs"
    run = Run()
    b, started = make(
        tmp_path,
        run,
        *HET_OPTS,
        "--observe",
        "1",
        SLURMFM_OBS_DIR=str(obs),
        SLURMFM_OBS_STOP=str(obs / "stop-r0"),
        SLURMFM_OBS_GPUS="4",
    )
    for h in ("n1", "n2", "n3", "n4"):  # what each node's agent writes at start
        obs.mkdir(exist_ok=True)
        (obs / f"node_{h}_r0.json").write_text("{}")
    b.observe_start()
    argvs = [argv for argv, _ in started]
    assert [a[:3] for a in argvs] == [
        ["srun", "--het-group=0", "--nodes=2"],
        ["srun", "--het-group=1", "--nodes=2"],
    ]
    assert all(a[-1] == "observe" and "--overlap" in a for a in argvs)
    envs = [env for _, env in started]
    assert [e["SLURMFM_OBS_GPUS"] for e in envs] == ["4", "8"]
    assert envs[1]["FI_EFA_USE_DEVICE_RDMA"] == "1"
    b.observe_stop()
    assert b.observers == []


# --- the rendered scripts under bash, with stub Slurm commands -----------------------------------
SRUN = r'''#!PYTHON
"""Stub srun: records each call; answers the health and container steps per het group."""
import json, os, subprocess, sys
argv = sys.argv[1:]
with open(os.path.join(os.environ["STUB_OUT"], "calls.jsonl"), "a") as fh:
    fh.write(json.dumps({"argv": argv, "env": dict(os.environ)}) + "\n")
group = next((a.split("=", 1)[1] for a in argv if a.startswith("--het-group=")), "0")
hosts = os.environ["STUB_HOSTS_" + group].split()
if "health" in argv:
    for h in hosts:
        print("slurmfm-health %s OK" % h)
elif "sh" in argv:  # the container check: run it on "each node" (here, with no channel)
    i = argv.index("sh")
    rc = 0
    for h in hosts:
        rc |= subprocess.call(argv[i:], env=dict(os.environ, SLURMD_NODENAME=h))
    sys.exit(rc)
elif "--het-group=1" in argv and "node" in argv:  # the server: healthy until stopped
    import signal
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
        def log_message(self, *a):
            pass
    srv = HTTPServer(("127.0.0.1", int(os.environ["SLURMFM_SERVE_PORT"])), H)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    srv.serve_forever(poll_interval=0.1)
'''
SCONTROL = r'''#!PYTHON
"""Stub scontrol: host lists, node addresses (loopback), and success for everything else."""
import re, sys
a = sys.argv[1:]
if a[:2] == ["show", "hostnames"]:
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", a[2]):
        m = re.match(r"(.*)\[(\d+)-(\d+)\]$", part)
        if m:
            w = len(m.group(2))
            for i in range(int(m.group(2)), int(m.group(3)) + 1):
                print("%s%0*d" % (m.group(1), w, i))
        else:
            print(part)
elif a[:3] == ["-o", "show", "node"]:
    for n in a[3].split(","):
        print("NodeName=%s NodeAddr=127.0.0.1 NodeHostName=%s" % (n, n))
elif a[:1] == ["ping"]:
    print("Slurmctld(primary) at c is UP")
'''


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    tools = (
        "base64",
        "mv",
        "sha256sum",
        "tail",
        "cut",
        "mkdir",
        "stat",
        "sh",
        "env",
        "mktemp",
        "rm",
    )
    return stub_bin(tmp_path / "bin", {"srun": SRUN, "scontrol": SCONTROL}, tools)


def run_script(bindir: Path, text: str, tmp: Path, **env: str) -> tuple[int, str, list[Any]]:
    import json

    out = tmp / "out"
    out.mkdir()
    script = tmp / "job.sh"
    script.write_text(text)
    proc = subprocess.run(
        ["/bin/bash", str(script)],
        env={
            "PATH": str(bindir),
            "STUB_OUT": str(out),
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "het",
            "SLURMD_NODENAME": "node001",
            **env,
        },
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls_file = out / "calls.jsonl"
    assert calls_file.exists(), proc.stdout + proc.stderr
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()]
    return proc.returncode, proc.stdout + proc.stderr, calls


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_het_script_checks_and_configures_each_component(stubs: Path, tmp_path: Path) -> None:
    """The rendered hetjob script: the gate runs on component 0's and component 1's nodes
    with each one's expectations, an agent starts on each, and the server step (component 1,
    p5) gets p5's profile difference while the trainer (component 0, p6-b200) does not."""
    recipe = validate(
        {
            "name": "het",
            "cluster": {"instance_type": "p6-b200.48xlarge"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "torchrun", "script": "t.py"},
            "network": {"aws_ofi_nccl": "1.6.0"},  # legacy flags only on p4/p5
            "storage": {"checkpoint_root": str(tmp_path / "ckpt"), "log_dir": str(tmp_path)},
            "resilience": {"nccl_transport_check": "off", "requeue": False},
            "observability": {"textfile_dir": None, "dcgm_job_mapping_dir": None},
            "serve": {
                "nodes": 1,
                "placement": "hetjob",
                "instance_type": "p5.48xlarge",
                "parallelism": {"tp": 8},
                "launcher": {"kind": "vllm", "model": "m", "port": free_port(), "ready_poll_s": 1},
            },
        }
    )
    text = render_script(recipe, Target.for_recipe(recipe, "24.11")).text
    rc, log, calls = run_script(
        stubs,
        text,
        tmp_path,
        SLURM_JOB_NODELIST="node[001-002]",
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_NODELIST_HET_GROUP_1="node003",
        STUB_HOSTS_0="node001 node002",
        STUB_HOSTS_1="node003",
    )
    assert rc == 0, log
    argvs = [c["argv"] for c in calls]
    health = [a for a in argvs if "health" in a]
    assert [(a[0], a[1], a[a.index("--gpus") + 1], a[a.index("--efa") + 1]) for a in health] == [
        ("--het-group=0", "--nodes=2", "8", "8"),
        ("--het-group=1", "--nodes=1", "8", "32"),
    ]
    assert "slurmfm-health node003 OK" in log
    agents = [a for a in argvs if a[-1] == "observe"]
    assert sorted(a[:2] for a in agents) == [
        ["--het-group=0", "--nodes=2"],
        ["--het-group=1", "--nodes=1"],
    ]
    (server,) = [c for c in calls if "--het-group=1" in c["argv"] and "node" in c["argv"]]
    (trainer,) = [c for c in calls if "--het-group=0" in c["argv"] and "node" in c["argv"]]
    assert server["env"]["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert "FI_EFA_USE_DEVICE_RDMA" not in trainer["env"]
    # what both share stays as the batch script exported it
    assert server["env"]["FI_PROVIDER"] == trainer["env"]["FI_PROVIDER"] == "efa"


def test_gb200_container_without_the_channel_fails_the_gate(stubs: Path, tmp_path: Path) -> None:
    """GB200 in a container (the shipped recipe): a container step with the launch's own
    image and mounts looks for the IMEX channel before the launch; here it is missing, so
    the gate fails with the reason on each node and the trainer never starts."""
    recipe = load_recipe(REPO / "recipes" / "gb200-llama3-405b.yaml")
    recipe = recipe.model_copy(
        update={
            "storage": recipe.storage.model_copy(
                update={"checkpoint_root": str(tmp_path / "ckpt"), "log_dir": str(tmp_path)}
            )
        }
    )
    text = render_script(recipe, Target.for_recipe(recipe, "24.11")).text
    rc, log, calls = run_script(
        stubs,
        text,
        tmp_path,
        SLURM_JOB_NODELIST="node[001-018]",
        SLURM_JOB_NUM_NODES="18",
        STUB_HOSTS_0=" ".join(f"node{i:03d}" for i in range(1, 19)),
        HF_TOKEN="t",  # noqa: S106 - the recipe's secret must be set to submit
    )
    argvs = [c["argv"] for c in calls]
    (check,) = [a for a in argvs if "sh" in a]
    # the launch step's own Pyxis options (the rendered launch line), expanded
    container = [
        "--container-image=/fsx/containers/nemo-25.11-arm64.sqsh",
        "--container-mounts=/fsx:/fsx,/dev/nvidia-caps-imex-channels,"
        + "{0}:{0}:ro".format(next(c["env"]["SLURMFM_RUNTIME"] for c in calls)),
        "--container-workdir=/fsx",
        "--no-container-mount-home",
    ]
    env_word = next(w for w in check if w.startswith("--container-env="))
    assert f"{env_word} " in text.replace("'", "")
    assert all(w in text for w in (container[0], *container[2:]))
    # the node entry runs in the image, on the runtime mounted read-only (issue 37)
    assert '--container-mounts=/fsx:/fsx,/dev/nvidia-caps-imex-channels,"$SLURMFM_RUNTIME:' in text
    assert check[: check.index("sh")] == [
        "--nodes=18",
        "--ntasks=18",
        "--ntasks-per-node=1",
        *container,
        env_word,
        "--container-name=slurmfm-4242-0-launch",  # the launch's own container, made here
    ]
    assert any("/dev/nvidia-caps-imex-channels" in w for w in container)
    assert (
        "slurmfm-health node007 FAIL no /dev/nvidia-caps-imex-channels/channel0 inside the "
        "container (mount the directory: container.mounts)"
    ) in log
    assert "IMEX channel check inside the container failed on node001 node002" in log
    assert not [a for a in argvs if "--kill-on-bad-exit=1" in a]  # the trainer never ran
    assert "requeueing job" not in log
    assert "DRAIN" not in log
    assert rc == 2, log


def test_a_components_spec_reads_back_as_written() -> None:
    """The renderer writes ``--component`` with hetjob.component_spec, the reader beside it."""
    for c in (
        hetjob.Component(1, 2, True, 8, 32, False),
        hetjob.Component(3, 1, False, 0, 0, True),
    ):
        assert hetjob.parse_component(hetjob.component_spec(c)) == c
    (c,) = hetjob.components(
        [hetjob.component_spec(hetjob.Component(1, 2, True, 8, 32, False))],
        [hetjob.env_spec(1, "A", "x=y"), hetjob.env_spec(2, "B", "1")],
        [hetjob.unset_spec(1, "D")],
    )
    assert (c.env, c.unset) == ((("A", "x=y"),), ("D",))
