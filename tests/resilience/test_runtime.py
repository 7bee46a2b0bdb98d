"""The job script's runtime logic, run for real under bash against a fake cluster.

Stub ``srun``/``scontrol`` run every "node" of the allocation as a local process (with
``SLURMD_NODENAME`` set), fake ``nvidia-smi`` and a fake sysfs give each node its GPUs and EFA
devices, and a fake torchrun starts one worker. This checks, with fixture outputs for healthy
and unhealthy nodes of every instance type: the health gate (drain + requeue), the NCCL
transport check (EFA vs. a socket fallback), the save signal reaching the workers but not
torchrun, requeue and its cap, and the step-failure path that drains nodes that do not answer.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from slurmfm.catalog.instances import INSTANCES
from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script

FIXTURES = Path(__file__).parent / "fixtures"

SCONTROL = r"""#!/bin/bash
case "$1 $2" in
  "show hostnames") for h in $FAKE_HOSTS; do echo "$h"; done ;;
  "show node"*) echo "NodeName=$3 Arch=x86_64 NodeAddr=127.0.0.1 State=ALLOCATED" ;;
  update*) echo "update $*" >> "$STUB_OUT/scontrol.log"; exit "${FAKE_DRAIN_RC:-0}" ;;
  requeue*) echo "requeue $2" >> "$STUB_OUT/scontrol.log" ;;
  *) echo "scontrol stub: $*" >&2; exit 1 ;;
esac
"""

# srun: the health entry and the launch run once per host; a probe (-w HOST true) answers
# unless the host is listed in FAKE_DEAD_HOSTS. USR2 and TERM reach every process of a task.
SRUN = r"""#!/bin/bash
args=("$@"); probe=""; i=0
for a in "$@"; do
  case "$a" in -w) probe=${args[$((i + 1))]} ;; esac
  i=$((i + 1))
done
if [ -n "$probe" ]; then
  case " $FAKE_DEAD_HOSTS " in *" $probe "*) exit 1 ;; esac
  exit 0
fi
while [ "$1" != bash ]; do shift; done
pids=()
for h in $FAKE_HOSTS; do
  # each "task" in its own process group, so TERM ends its whole tree (as slurmstepd does)
  SLURMD_NODENAME=$h SLURMFM_SYSFS="$FAKE_SYSFS/$h" setsid "$@" &
  pids+=($!)
done
# like slurmstepd (proctrack): a signal sent to srun reaches every process of each task
trap 'for p in "${pids[@]}"; do kill -USR2 -- "-$p" 2>/dev/null; done' USR2
trap 'for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done' TERM
rc=0
for p in "${pids[@]}"; do
  while :; do
    r=0; wait "$p" || r=$?
    if [ "$r" -gt 128 ]; then
      if kill -0 "$p" 2>/dev/null; then continue; fi
      a=0; wait "$p" 2>/dev/null || a=$?
      if [ "$a" -ne 127 ]; then r=$a; fi
    fi
    break
  done
  if [ "$r" -gt "$rc" ]; then rc=$r; fi
done
exit "$rc"
"""

NVIDIA_SMI = r"""#!/bin/bash
var="FAKE_GPUS_$SLURMD_NODENAME"; n=${!var:-$FAKE_GPUS}
for ((i = 0; i < n; i++)); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
"""

# A torchrun stand-in: starts one worker and waits; dies loudly if it gets USR2 itself.
TORCHRUN = r"""#!/bin/bash
trap 'echo "AGENT-GOT-USR2 $SLURMD_NODENAME" >> "$STUB_OUT/events"; exit 99' USR2
if [ "$SLURMD_NODENAME" = "${FAKE_FAIL_NODE:-}" ]; then exit 1; fi
if [ "$SLURMFM_NODE_RANK" = 0 ] && [ -n "${NCCL_DEBUG_FILE:-}" ]; then
  f=${NCCL_DEBUG_FILE//%h/$SLURMD_NODENAME}; f=${f//%p/$$}
  cat "$FAKE_NCCL_LOG" > "$f"
fi
python3 -c '
import os, signal, sys, time
# A real worker installs its own handler (slurmfm.checkpoint.SaveRequest); that replaces
# the "ignore" it inherits from the per-node entry.
def saved(signum, frame):
    with open(os.environ["STUB_OUT"] + "/events", "a") as fh:
        fh.write("SAVED " + os.environ["SLURMD_NODENAME"] + " " + signal.Signals(signum).name + "\n")
    sys.exit(0)
for name in os.environ.get("FAKE_HANDLES", "USR2 TERM").split():
    signal.signal(getattr(signal, "SIG" + name), saved)
with open(os.environ["STUB_OUT"] + "/events", "a") as fh:
    fh.write("WORKER " + os.environ["SLURMD_NODENAME"] + " " + " ".join(sys.argv[1:]) + "\n")
time.sleep(float(os.environ.get("FAKE_WORK_S", "1")))
' "$@" &
w=$!
while :; do
  r=0; wait "$w" || r=$?
  if [ "$r" -gt 128 ]; then
    if kill -0 "$w" 2>/dev/null; then continue; fi
    a=0; wait "$w" 2>/dev/null || a=$?; if [ "$a" -ne 127 ]; then r=$a; fi
  fi
  exit "$r"
done
"""


def fake_cluster(tmp: Path, **programs: str) -> dict[str, Any]:
    """Stub srun, scontrol and nvidia-smi in ``tmp/bin``, plus ``programs`` (name -> script
    text, ``_`` in a name becomes ``-``), and an empty ``tmp/out`` for what the stubs record."""
    bindir = tmp / "bin"
    bindir.mkdir()
    stubs = {"srun": SRUN, "scontrol": SCONTROL, "nvidia-smi": NVIDIA_SMI}
    for name, body in {**stubs, **{k.replace("_", "-"): v for k, v in programs.items()}}.items():
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    out = tmp / "out"
    out.mkdir()
    return {"tmp": tmp, "bin": bindir, "out": out}


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, Any]:
    return fake_cluster(tmp_path, fake_torchrun=TORCHRUN)


def make_sysfs(root: Path, hosts: list[str], efa: dict[str, int]) -> None:
    for h in hosts:
        d = root / h / "class" / "infiniband"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(efa[h]):
            (d / f"rdmap{i}s0").mkdir()


def script_for(instance: str, tmp: Path, **res: Any) -> str:
    inst = INSTANCES[instance]
    recipe = validate(
        {
            "name": "rt",
            "cluster": {"instance_type": instance},
            "resources": {"nodes": 2},
            "parallelism": {"tp": min(inst.gpus, 4)},
            "launcher": {"kind": "torchrun", "script": "train.py", "python": "fake-torchrun"},
            "storage": {"checkpoint_root": str(tmp / "ckpt"), "log_dir": str(tmp / "logs")},
            "resilience": {"nccl_check_timeout_s": 20, **res},
        }
    )
    (tmp / "logs").mkdir(exist_ok=True)
    return render_script(recipe, Target.for_recipe(recipe, "24.11")).text


def run(
    cluster: dict[str, Any],
    text: str,
    *,
    hosts: tuple[str, ...] = ("n1", "n2"),
    gpus: dict[str, int] | None = None,
    efa: dict[str, int] | None = None,
    usr2_after: float | None = None,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    tmp: Path = cluster["tmp"]
    script = tmp / "job.sh"
    script.write_text(text)
    make_sysfs(tmp / "sys", list(hosts), efa or dict.fromkeys(hosts, 0))
    e = {
        "PATH": f"{cluster['bin']}:/usr/bin:/bin",
        "STUB_OUT": str(cluster["out"]),
        "FAKE_HOSTS": " ".join(hosts),
        "FAKE_SYSFS": str(tmp / "sys"),
        "FAKE_GPUS": "0",
        "FAKE_NCCL_LOG": str(FIXTURES / "nccl-efa.log"),
        "SLURM_JOB_NODELIST": ",".join(hosts),
        "SLURM_JOB_NUM_NODES": str(len(hosts)),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NAME": "rt",
        **{f"FAKE_GPUS_{h}": str(n) for h, n in (gpus or {}).items()},
        **env,
    }
    proc = subprocess.Popen(
        ["bash", str(script)],
        env=e,
        cwd=tmp,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if usr2_after is not None:
        deadline = time.monotonic() + 20
        events = cluster["out"] / "events"
        while time.monotonic() < deadline and "WORKER" not in (
            events.read_text() if events.exists() else ""
        ):
            time.sleep(0.05)
        time.sleep(usr2_after)
        proc.send_signal(signal.SIGUSR2)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def log(cluster: dict[str, Any], name: str) -> str:
    p = cluster["out"] / name
    return p.read_text() if p.exists() else ""


def state(cluster: dict[str, Any]) -> str:
    p = cluster["tmp"] / "logs" / "rt_77.state"
    return p.read_text() if p.exists() else ""


GPU_TYPES = [n for n, i in INSTANCES.items() if i.gpus and not i.virtual]


@pytest.mark.parametrize("instance", GPU_TYPES)
def test_healthy_nodes_of_every_type_pass(cluster: dict[str, Any], instance: str) -> None:
    inst = INSTANCES[instance]
    text = script_for(instance, cluster["tmp"], nccl_transport_check="off")
    proc = run(
        cluster,
        text,
        gpus={"n1": inst.gpus, "n2": inst.gpus},
        efa={"n1": inst.efa_interfaces, "n2": inst.efa_interfaces},
    )
    assert proc.returncode == 0, proc.stderr
    assert "slurmfm-health n1 OK" in proc.stdout
    assert "slurmfm-health n2 OK" in proc.stdout
    assert log(cluster, "scontrol.log") == ""
    assert "event=finished" in state(cluster)


@pytest.mark.parametrize("instance", GPU_TYPES)
@pytest.mark.parametrize("fault", ["gpu", "efa"])
def test_unhealthy_node_is_drained_and_job_requeued(
    cluster: dict[str, Any], instance: str, fault: str
) -> None:
    inst = INSTANCES[instance]
    gpus = {"n1": inst.gpus, "n2": inst.gpus - (1 if fault == "gpu" else 0)}
    efa = {"n1": inst.efa_interfaces, "n2": inst.efa_interfaces - (1 if fault == "efa" else 0)}
    proc = run(cluster, script_for(instance, cluster["tmp"]), gpus=gpus, efa=efa)
    assert proc.returncode == 0, proc.stderr  # requeued: the batch step ends cleanly
    want = (
        f"{inst.gpus - 1} GPUs visible, expected {inst.gpus}"
        if fault == "gpu"
        else f"{inst.efa_interfaces - 1} EFA devices, expected {inst.efa_interfaces}"
    )
    calls = log(cluster, "scontrol.log")
    assert f"update NodeName=n2 State=DRAIN Reason=slurmfm: health gate: {want}" in calls
    assert "NodeName=n1" not in calls
    assert "requeue 77" in calls
    assert "event=requeue health gate failed on n2" in state(cluster)
    assert "WORKER" not in log(cluster, "events")  # training never started


def test_missing_nvidia_smi_fails_the_gate(cluster: dict[str, Any]) -> None:
    (cluster["bin"] / "nvidia-smi").write_text(
        "#!/bin/bash\necho 'NVIDIA-SMI has failed'; exit 9\n"
    )
    proc = run(cluster, script_for("p5.48xlarge", cluster["tmp"]), efa={"n1": 32, "n2": 32})
    assert "nvidia-smi failed: NVIDIA-SMI has failed" in proc.stdout
    assert "requeue 77" in log(cluster, "scontrol.log")


def test_drain_not_permitted_is_reported(cluster: dict[str, Any]) -> None:
    proc = run(
        cluster,
        script_for("p5.48xlarge", cluster["tmp"]),
        gpus={"n1": 8, "n2": 0},
        efa={"n1": 32, "n2": 32},
        FAKE_DRAIN_RC="1",
    )
    assert "could not set n2 DRAIN (not permitted?)" in proc.stderr


def test_health_gate_off_by_default_on_the_cpu_lab() -> None:
    r = validate(
        {
            "name": "c",
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"procs_per_node": 1},
            "launcher": {"kind": "torchrun", "script": "t.py"},
        }
    )
    text = render_script(r, Target.for_recipe(r, "22.05")).text
    assert "SLURMFM_HEALTH_ENTRY" not in text


def test_nccl_on_efa_passes(cluster: dict[str, Any]) -> None:
    proc = run(
        cluster, script_for("p5.48xlarge", cluster["tmp"], health_gate="off"), FAKE_WORK_S="5"
    )
    assert proc.returncode == 0, proc.stderr
    assert "NCCL transport check: EFA (aws-ofi-nccl) in use" in proc.stdout


def test_nccl_socket_fallback_fails_early(cluster: dict[str, Any]) -> None:
    start = time.monotonic()
    proc = run(
        cluster,
        script_for("p5.48xlarge", cluster["tmp"], health_gate="off"),
        FAKE_NCCL_LOG=str(FIXTURES / "nccl-socket.log"),
        FAKE_WORK_S="60",
    )
    assert proc.returncode == 3
    assert "NCCL fell back to TCP sockets instead of EFA" in proc.stderr
    assert "event=fail NCCL fell back to sockets" in state(cluster)
    assert time.monotonic() - start < 30  # failed early, not after the 60 s of "training"


def test_nccl_socket_fallback_can_warn(cluster: dict[str, Any]) -> None:
    proc = run(
        cluster,
        script_for("p5.48xlarge", cluster["tmp"], health_gate="off", nccl_transport_check="warn"),
        FAKE_NCCL_LOG=str(FIXTURES / "nccl-socket.log"),
        FAKE_WORK_S="5",
    )
    assert proc.returncode == 0
    assert "NCCL fell back to TCP sockets" in proc.stderr


def test_save_signal_reaches_workers_not_torchrun_then_requeues(cluster: dict[str, Any]) -> None:
    text = script_for("p5.48xlarge", cluster["tmp"], health_gate="off", nccl_transport_check="off")
    proc = run(cluster, text, usr2_after=0.3, FAKE_WORK_S="30")
    events = log(cluster, "events")
    assert "SAVED n1 SIGUSR2" in events
    assert "SAVED n2 SIGUSR2" in events
    assert "AGENT-GOT-USR2" not in events  # torchrun itself ignores the save signal
    assert "requeue 77" in log(cluster, "scontrol.log")
    st = state(cluster)
    assert "event=signal USR2 before the time limit" in st
    assert "event=requeue saved before the time limit (training exit 0)" in st
    assert proc.returncode == 0


def test_megatron_gets_term_for_its_exit_signal_handler(cluster: dict[str, Any]) -> None:
    r = validate(
        {
            "name": "rt",
            "cluster": {"instance_type": "p5.48xlarge"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "megatron", "python": "fake-torchrun"},
            "storage": {
                "checkpoint_root": str(cluster["tmp"] / "ckpt"),
                "log_dir": str(cluster["tmp"] / "logs"),
            },
            "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
        }
    )
    (cluster["tmp"] / "logs").mkdir(exist_ok=True)
    text = render_script(r, Target.for_recipe(r, "24.11")).text
    assert "--exit-signal-handler" in text
    # Megatron handles TERM only; the USR2 that Slurm delivers to every process is ignored
    run(cluster, text, usr2_after=0.3, FAKE_WORK_S="30", FAKE_HANDLES="TERM")
    events = log(cluster, "events")
    assert "SAVED n1 SIGTERM" in events
    assert "SAVED n2 SIGTERM" in events
    assert "requeue 77" in log(cluster, "scontrol.log")


def test_nemo_requeues_at_the_signal(cluster: dict[str, Any]) -> None:
    r = validate(
        {
            "name": "rt",
            "cluster": {"instance_type": "p5.48xlarge"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "nemo", "recipe": "llama3_8b", "python": "fake-torchrun"},
            "storage": {
                "checkpoint_root": str(cluster["tmp"] / "ckpt"),
                "log_dir": str(cluster["tmp"] / "logs"),
            },
            "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
        }
    )
    (cluster["tmp"] / "logs").mkdir(exist_ok=True)
    text = render_script(r, Target.for_recipe(r, "24.11")).text
    run(cluster, text, usr2_after=0.3, FAKE_WORK_S="30")
    assert "requeue 77" in log(cluster, "scontrol.log")
    assert "event=requeue time limit near (launcher saves periodically)" in state(cluster)


def test_restart_cap(cluster: dict[str, Any]) -> None:
    text = script_for(
        "p5.48xlarge", cluster["tmp"], health_gate="off", nccl_transport_check="off", max_restarts=2
    )
    proc = run(cluster, text, usr2_after=0.3, FAKE_WORK_S="30", SLURM_RESTART_COUNT="2")
    assert "requeue" not in log(cluster, "scontrol.log")
    assert "event=give-up restart cap 2 reached" in state(cluster)
    assert "not requeueing (2 restarts reached)" in proc.stderr


def test_failed_step_drains_unresponsive_nodes_and_requeues(cluster: dict[str, Any]) -> None:
    text = script_for("p5.48xlarge", cluster["tmp"], health_gate="off", nccl_transport_check="off")
    proc = run(cluster, text, FAKE_FAIL_NODE="n2", FAKE_DEAD_HOSTS="n2")
    assert proc.returncode == 0, proc.stderr  # requeued: the batch step ends cleanly
    calls = log(cluster, "scontrol.log")
    assert "update NodeName=n2 State=DOWN Reason=slurmfm: did not answer" in calls
    assert "NodeName=n1" not in calls
    assert calls.index("State=DOWN") < calls.index("requeue 77")
    assert "event=requeue step failed with exit 1; unresponsive: n2" in state(cluster)


def test_requeue_disabled(cluster: dict[str, Any]) -> None:
    text = script_for(
        "p5.48xlarge", cluster["tmp"], health_gate="off", nccl_transport_check="off", requeue=False
    )
    assert "#SBATCH --no-requeue" in text
    proc = run(cluster, text, FAKE_FAIL_NODE="n2")
    assert "requeue" not in log(cluster, "scontrol.log")
    assert "resilience.requeue is off" in proc.stderr


def test_resume_pointer_is_exported(cluster: dict[str, Any]) -> None:
    ckpt = cluster["tmp"] / "ckpt" / "rt" / "rt"
    (ckpt / "step_000000040").mkdir(parents=True)
    (ckpt / "latest").write_text("step_000000040\n")
    text = script_for("p5.48xlarge", cluster["tmp"], health_gate="off", nccl_transport_check="off")
    proc = run(cluster, text)
    assert f"slurmfm: resuming from {ckpt}/step_000000040" in proc.stdout


def test_free_space_check(cluster: dict[str, Any]) -> None:
    r = validate(
        {
            "name": "rt",
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"procs_per_node": 1},
            "launcher": {"kind": "torchrun", "script": "t.py", "python": "fake-torchrun"},
            "storage": {
                "checkpoint_root": str(cluster["tmp"] / "ckpt"),
                "log_dir": str(cluster["tmp"] / "logs"),
                "min_free_gb": 10**9,
            },
        }
    )
    (cluster["tmp"] / "logs").mkdir(exist_ok=True)
    proc = run(cluster, render_script(r, Target.for_recipe(r, "22.05")).text)
    assert proc.returncode == 2
    assert "the recipe needs 1000000000 GiB (storage.min_free_gb)" in proc.stderr
    assert "event=fail not enough free space" in state(cluster)


def test_no_requeue_when_the_work_finished_anyway(cluster: dict[str, Any]) -> None:
    # The signal comes while the last steps run (the workers have no handler yet/anymore);
    # the training finishes and marks the run done: nothing to resume, no requeue.
    ckpt = cluster["tmp"] / "ckpt" / "rt" / "rt"
    ckpt.mkdir(parents=True)
    (ckpt / "DONE").write_text("done\n")
    text = script_for("p5.48xlarge", cluster["tmp"], health_gate="off", nccl_transport_check="off")
    proc = run(cluster, text, usr2_after=0.2, FAKE_WORK_S="2", FAKE_HANDLES="")
    assert proc.returncode == 0, proc.stderr
    assert "requeue" not in log(cluster, "scontrol.log")
    assert "event=finished exit 0 (all work done before the time limit)" in state(cluster)


def test_save_signal_is_repeated_until_the_step_ends(cluster: dict[str, Any]) -> None:
    text = script_for("p5.48xlarge", cluster["tmp"], health_gate="off", nccl_transport_check="off")
    assert 'while kill -USR2 "$slurmfm_srun" 2>/dev/null; do sleep 10; done' in text


LFS = r"""#!/bin/bash
echo "lfs $*" >> "$STUB_OUT/lfs.log"
if [ "$1" = df ]; then
  cat <<'OUT'
UUID                   1K-blocks        Used   Available Use% Mounted on
fsx-MDT0000_UUID        66700000     5000000    61700000   8% /fsx[MDT:0]
fsx-OST0000_UUID      1200000000  1100000000   100000000  92% /fsx[OST:0]
fsx-OST0001_UUID      1200000000   200000000  1000000000  17% /fsx[OST:1]

filesystem_summary:   2400000000  1300000000  1100000000  54% /fsx
OUT
fi
"""
STAT = r"""#!/bin/bash
if [ "$1" = -f ]; then echo lustre; else /usr/bin/stat "$@"; fi
"""


def lustre_script(cluster: dict[str, Any], min_free_gb: float) -> str:
    for name, body in (("lfs", LFS), ("stat", STAT)):
        (cluster["bin"] / name).write_text(body)
        (cluster["bin"] / name).chmod(0o755)
    r = validate(
        {
            "name": "rt",
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"procs_per_node": 1},
            "launcher": {"kind": "torchrun", "script": "t.py", "python": "fake-torchrun"},
            "storage": {
                "checkpoint_root": str(cluster["tmp"] / "ckpt"),
                "log_dir": str(cluster["tmp"] / "logs"),
                "min_free_gb": min_free_gb,
            },
        }
    )
    (cluster["tmp"] / "logs").mkdir(exist_ok=True)
    return render_script(r, Target.for_recipe(r, "22.05")).text


def test_lustre_is_striped_and_checked_per_ost(cluster: dict[str, Any]) -> None:
    # The emptiest OST has 100,000,000 KiB (~95 GiB) free although the file system has ~1 TiB.
    proc = run(cluster, lustre_script(cluster, 50))
    assert proc.returncode == 0, proc.stderr
    calls = log(cluster, "lfs.log")
    ckpt = cluster["tmp"] / "ckpt" / "rt" / "rt"
    assert f"lfs setstripe -c -1 -S 16M {ckpt}" in calls
    assert f"lfs setstripe -c 1 {cluster['tmp'] / 'logs'}" in calls
    assert f"lfs df {ckpt}" in calls


def test_lustre_free_space_is_the_emptiest_ost(cluster: dict[str, Any]) -> None:
    proc = run(cluster, lustre_script(cluster, 200))
    assert proc.returncode == 2
    assert "has 95 GiB free on its emptiest Lustre OST; the recipe needs 200 GiB" in proc.stderr
