"""The health gate inside the launch step (slurmfm.job.gate): the batch step's side with a
fake srun, each node's side with the real entry on this host."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurmfm.job import batch as bt
from slurmfm.job import gate, install, node
from slurmfm.job.batch import Batch
from slurmfm.job.cli import parser

ENTRY = [*install.argv(), "node", "--prefix", "3", "--forward", "none", "--"]
LAUNCH = ["srun", "--kill-on-bad-exit=1", *ENTRY, "torchrun", "train.py"]


class Launch:
    """The launch srun: its tasks record their verdicts when it starts (``verdicts``); it
    ends when the batch step closes its stdin, 0 after the word "go", else 3."""

    def __init__(self, directory: Callable[[], str], verdicts: dict[str, str]) -> None:
        self.directory = directory
        self.verdicts = verdicts
        self.stdin = io.BytesIO()
        self.stdin.close = lambda: None  # type: ignore[method-assign]
        self.rc: int | None = None
        self.pid = 4242

    def start(self) -> None:
        for name, verdict in self.verdicts.items():
            Path(self.directory(), name + gate.SUFFIX).write_text(verdict + "\n")

    def poll(self) -> int | None:
        return self.rc

    def wait(self, timeout: float | None = None) -> int:
        if self.rc is None:
            self.rc = 0 if self.stdin.getvalue() == gate.GO else gate.NOT_STARTED
        return self.rc

    def terminate(self) -> None:
        self.rc = -15

    def send_signal(self, sig: int) -> None:
        pass


class Slurm:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Any, timeout: float) -> tuple[int, str]:
        self.calls.append(list(argv))
        if argv[:2] == ["scontrol", "ping"]:
            return 0, "Slurmctld(primary) at c is UP"
        return 0, ""


class Agents:
    """The agents' step: it ends when asked to (the stop file)."""

    def poll(self) -> int | None:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def terminate(self) -> None:
        pass


def make(
    tmp: Path, verdicts: dict[str, str], *opts: str, launch: list[str] = LAUNCH
) -> tuple[Batch, Launch, Slurm, list[dict[str, Any]]]:
    from slurmfm.job.options import BatchOptions

    a = BatchOptions.from_namespace(
        parser().parse_args(
            ["batch", "--runtime", "rt.pyz", "--drain", "1", "--restart-in-job", "0", *opts]
            + ["--", *launch]
        )
    )
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NAME": "rt",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURMFM_LOG_DIR": str(tmp),
        "SLURMFM_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "SLURMFM_HOST_ORDER": "n1 n2",
        "SLURMFM_OBS_DIR": str(tmp / "obs"),
    }
    (tmp / "ckpt").mkdir(exist_ok=True)
    slurm = Slurm()
    box: list[Batch] = []
    step = Launch(lambda: box[0].evidence_dir, verdicts)
    started: list[dict[str, Any]] = []

    def popen(argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> Any:
        started.append({"argv": argv, "env": env or {}, **kw})
        if "node" in argv or "slurmfm-node" in argv:  # the launch, with or without the entry
            step.start()
            return step
        if argv[-1] == "observe":
            started[-1]["word_sent"] = step.stdin.getvalue()
            return Agents()
        raise AssertionError(f"a step of its own: {argv}")

    ticks = iter(range(10**6))
    b = Batch(
        a, env, run=slurm, popen=popen, clock=lambda: float(next(ticks)), sleep=lambda s: None
    )
    box.append(b)
    return b, step, slurm, started


GPUS = ("--health", "1", "--gpus", "8", "--efa", "32")


def test_healthy_nodes_get_the_word_and_no_step_of_their_own(tmp_path: Path) -> None:
    """Gate on: one step (the launch), told the gate's checks; both nodes pass, the word
    "go" reaches the tasks, the job finishes."""
    b, step, slurm, started = make(tmp_path, {"n1": "OK", "n2": "OK"}, *GPUS)
    assert b.main([], LAUNCH) == 0
    (launch,) = started  # no health step: only the launch
    assert launch["stdin"] == subprocess.PIPE
    want = json.loads(launch["env"][gate.ENV])
    assert (want["gpus"], want["efa"], want["dcgm"], want["imex"]) == (8, 32, 0, False)
    assert launch["env"]["SLURM_STDINMODE"] == "all"
    assert step.stdin.getvalue() == gate.GO
    assert not [c for c in slurm.calls if c[0] == "srun"]


@pytest.mark.parametrize("verdict", ["OK", "FAIL no EFA device"])
def test_each_entry_runs_its_agent_and_the_agents_get_no_step(tmp_path: Path, verdict: str) -> None:
    """Agents on, where the launch runs the node entry: no agents' step (no slurmstepd and no
    interpreter per node); the launch step's entries are told to fork their agents, into the
    observe directory the batch step made ready (job.json, no stop file of an earlier
    attempt). A launch the gate stopped starts no agent: its entries never got the word."""
    obs = tmp_path / "obs"
    obs.mkdir()
    (obs / "STOP").touch()
    b, _step, _, started = make(tmp_path, {"n1": "OK", "n2": verdict}, *GPUS, "--observe", "1")
    b.env["SLURMFM_OBS_STOP"] = str(obs / "STOP")
    b.main([], LAUNCH)
    assert [s["argv"][-1] for s in started] == ["train.py"]  # the launch only
    assert started[0]["env"][node.IN_ENTRY] == "1"
    assert (obs / "job.json").exists()
    assert not (obs / "STOP").exists()


def test_the_agents_keep_their_step_where_no_entry_runs(tmp_path: Path) -> None:
    """A launch in a container runs no entry: the agents' step starts after the launch."""
    container = ["srun", "--container-image=x.sqsh", "sh", "-c", "p", "slurmfm-node", "train"]
    b, _step, _, started = make(tmp_path, {}, "--observe", "1")
    b.main([], container)
    assert [s["argv"][-1] for s in started] == ["train", "observe"]
    assert node.IN_ENTRY not in started[0]["env"]


def test_a_failed_node_is_drained_and_no_task_gets_the_word(tmp_path: Path) -> None:
    b, step, slurm, _ = make(
        tmp_path, {"n1": "OK", "n2": "FAIL 7 GPUs visible, expected 8"}, *GPUS, "--requeue", "1"
    )
    assert b.main([], LAUNCH) == 3  # requeued (the gate's code, as the separate gate's)
    assert step.stdin.getvalue() == b""
    assert [
        "scontrol",
        "update",
        "NodeName=n2",
        "State=DRAIN",
        "Reason=slurmfm: health gate: 7 GPUs visible, expected 8",
    ] in slurm.calls
    text = (tmp_path / "rt_77.state").read_text()
    assert "event=requeue health gate failed on n2" in text


def test_a_node_without_a_verdict_in_time_is_named(tmp_path: Path) -> None:
    """One node's check hangs (nvidia-smi stuck): after health_timeout_s it is the failed
    node, by name, not "unknown nodes"."""
    b, step, slurm, _ = make(tmp_path, {"n1": "OK"}, *GPUS, "--requeue", "0")
    assert b.main([], LAUNCH) != 0
    assert step.stdin.getvalue() == b""
    assert step.rc == gate.NOT_STARTED  # its stdin closed: nothing started
    drains = [c for c in slurm.calls if "NodeName=n2" in c]
    assert drains, slurm.calls
    assert drains[0][-1].startswith("Reason=slurmfm: health gate: no health verdict within")
    assert "health gate failed on n2" in (tmp_path / "rt_77.state").read_text()


def test_no_gate_no_pipe(tmp_path: Path) -> None:
    """Health off: the launch's stdin stays the batch step's, and nobody waits for a word."""
    b, step, _, started = make(tmp_path, {}, "--health", "0")
    step.rc = 0
    assert b.main([], LAUNCH) == 0
    assert "stdin" not in started[0]
    assert gate.ENV not in started[0]["env"]


@pytest.mark.parametrize(
    ("serve", "launch", "het", "hyperpod", "want"),
    [
        ([], LAUNCH, False, False, True),
        (["srun", "vllm", "serve"], LAUNCH, False, False, False),  # a server beside it
        ([], ["srun", "sh", "-c", "prog", "slurmfm-node", "torchrun"], False, False, False),
        ([], LAUNCH, True, False, False),  # heterogeneous: each component its own gate
        ([], LAUNCH, False, True, False),  # HyperPod replays the step
        ([], ["srun", "--auto-resume=1", *LAUNCH[1:]], False, False, False),
    ],
)
def test_which_launches_carry_the_gate(
    serve: list[str], launch: list[str], het: bool, hyperpod: bool, want: bool
) -> None:
    assert bt.in_step(serve, launch, "rt.pyz", het, hyperpod) is want


def test_check_here_records_prints_and_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    value = gate.spec(8, 32, 0, False, 3, 5.0)
    seen: list[tuple[Any, ...]] = []

    def check(*a: Any, **kw: Any) -> str | None:
        seen.append((*a, kw))
        return "7 GPUs visible,\nexpected 8"

    assert gate.check_here(value, "n2", str(tmp_path), "/sysfs", check) is not None
    assert seen == [(8, 32, 0, False, {"sysfs": "/sysfs", "efa_tries": 3, "efa_delay_s": 5.0})]
    assert capsys.readouterr().out == "slurmfm-health n2 FAIL 7 GPUs visible, expected 8\n"
    assert gate.check_here(value, "n1", str(tmp_path), "/sys", lambda *a, **k: None) is None
    assert gate.results(str(tmp_path)) == {"n1": None, "n2": "7 GPUs visible, expected 8"}
    assert gate.check_here("{not json", "n3", str(tmp_path), "/sys", check) is not None
    assert gate.results(str(tmp_path))["n3"].startswith("unreadable")  # type: ignore[union-attr]


def test_wait_go() -> None:
    assert gate.wait_go(io.BytesIO(b"go\n"))
    assert not gate.wait_go(io.BytesIO(b""))
    assert not gate.wait_go(io.BytesIO(b"gone\n"))


def run_entry(
    tmp: Path, stdin: bytes, smi_gpus: int, localid: str = "0", extra: dict[str, str] | None = None
) -> tuple[int, str]:
    """The real node entry on this host: nvidia-smi stands in, the launch is a script that
    records it ran and what its stdin held."""
    proc = start_entry(tmp, smi_gpus, localid, extra)
    out_b, err_b = proc.communicate(stdin, timeout=60)
    ran = tmp / "ran"
    out = out_b.decode() + err_b.decode()
    return proc.returncode, (ran.read_text() if ran.exists() else "") + "|" + out


def start_entry(
    tmp: Path,
    smi_gpus: int,
    localid: str = "0",
    extra: dict[str, str] | None = None,
    launch: list[str] | None = None,
    smi_query: str = "",
    as_task: bool = False,
) -> subprocess.Popen[bytes]:
    """:func:`run_entry`'s process, started with its stdin a pipe the caller holds; ``extra``:
    more environment, ``launch``: another command to launch, ``smi_query``: what nvidia-smi
    does when asked ``--query-gpu``, ``as_task``: the entry is a launch task as slurmstepd
    starts one (``SLURM_TASK_PID`` its own pid, ``SLURMFM_STEP=launch``)."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        + (f'case "$1" in --query-gpu*) {smi_query};; esac\n' if smi_query else "")
        + "".join(f'echo "GPU {i}: NVIDIA H100 (UUID: GPU-{i})"\n' for i in range(smi_gpus))
    )
    smi.chmod(0o755)
    evidence = tmp / "ev"
    evidence.mkdir(mode=0o700, exist_ok=True)
    for dev in ("rdmap0s0", "rdmap1s0"):  # the 2 EFA devices the gate expects
        (tmp / "sys" / "class" / "infiniband" / dev).mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        PATH=f"{bindir}:{os.environ['PATH']}",
        SLURMD_NODENAME="n1",
        SLURM_LOCALID=localid,
        SLURMFM_HOST_ORDER="n1 n2",
        SLURMFM_EVIDENCE_DIR=str(evidence),
        SLURMFM_GATE=gate.spec(8, 2, 0, False, 1, 0.0),
        SLURMFM_SYSFS=str(tmp / "sys"),
        SLURMFM_OBS_DIR=str(tmp / "obs"),
        SLURMFM_OBS_INTERVAL="1",
        PYTHONPATH=str(Path(node.__file__).resolve().parents[2]),
        **(extra or {}),
    )
    (tmp / "obs").mkdir(exist_ok=True)
    ran = tmp / "ran"
    prog = f"import sys; open({str(ran)!r}, 'w').write(repr(sys.stdin.read()))"
    task = ["sh", "-c", 'export SLURM_TASK_PID=$$ SLURMFM_STEP=launch; exec "$@"', "sh"]
    return subprocess.Popen(
        (task if as_task else [])
        + [sys.executable, "-m", "slurmfm.job", "node", "--prefix", "0", "--forward", "none"]
        + ["--", *(launch or [sys.executable, "-c", prog])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def test_the_entry_checks_and_waits_for_the_word(tmp_path: Path) -> None:
    rc, out = run_entry(tmp_path, gate.GO + b"more input\n", 8)
    ran, _, printed = out.partition("|")
    assert rc == 0, out
    assert ran == "''"  # the launch's stdin is not the gate's channel
    assert "slurmfm-health n1 OK" in printed
    assert (tmp_path / "ev" / "n1.gate").read_text() == "OK\n"
    assert not list((tmp_path / "obs").iterdir())  # not told to: no agent


def test_the_entry_forks_its_agent_which_ends_with_the_launch(tmp_path: Path) -> None:
    """Told to (``SLURMFM_OBS_IN_ENTRY``), the node's first task runs the agent beside the
    launch: it maps the job's GPUs (``SLURM_JOB_GPUS``, not the step's), writes its textfile,
    and when the launch ends it writes its end snapshot and removes its files before the
    entry exits. The launch itself never sees the setting."""
    textfiles, mapping = tmp_path / "prom", tmp_path / "map"
    textfiles.mkdir()
    mapping.mkdir()
    seen, found = tmp_path / "seen", tmp_path / "found"
    # The launched worker (LOCAL_RANK, as torchrun's) also asks what the hang watch would
    # take for this node's workers: itself, not the agent, which shares the entry's environ.
    probe = (
        "import os, sys, time\n"
        "from slurmfm.job import hang, node\n"
        f"p, m, out = {str(textfiles)!r}, {str(mapping)!r}, {str(seen)!r}\n"
        "for _ in range(400):\n"
        "    if os.listdir(p) and len(os.listdir(m)) == 2: break\n"
        "    time.sleep(0.05)\n"
        "open(out, 'w').write(repr((sorted(os.listdir(p)), sorted(os.listdir(m)),"
        f" os.environ.get({node.IN_ENTRY!r}))))\n"
        "(entry,) = node.launch_tops('77', 'n1')\n"
        f"open({str(found)!r}, 'w').write(repr((hang.workers('77', 'n1'), os.getpid(),"
        " len(node.children(entry)))))\n"
    )
    extra = {
        node.IN_ENTRY: "1",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_GPUS": "2,5",
        "SLURM_STEP_GPUS": "5",
        "SLURMFM_OBS_GPUS": "8",
        "SLURMFM_OBS_TEXTFILE_DIR": str(textfiles),
        "SLURMFM_OBS_DCGM_DIR": str(mapping),
    }
    launch = ["env", "LOCAL_RANK=0", sys.executable, "-c", probe]
    proc = start_entry(tmp_path, 8, extra=extra, launch=launch, as_task=True)
    out, err = proc.communicate(gate.GO, timeout=60)
    assert proc.returncode == 0, (out, err)
    assert seen.read_text() == repr((["slurmfm_job_77_n1.prom"], ["2", "5"], None))
    workers, me, kids = ast.literal_eval(found.read_text())
    assert kids == 2  # the agent and the launch
    assert workers == [me]
    info = json.loads((tmp_path / "obs" / "node_n1_r0.json").read_text())
    assert (info["node"], info["gpus"], info["dcgm_mapped"]) == ("n1", [2, 5], [2, 5])
    assert info["runs_in"] == "launch entry"
    assert info["end"] >= info["start"]
    assert list(textfiles.iterdir()) == []
    assert list(mapping.iterdir()) == []


def test_an_agent_stuck_on_nvidia_smi_gives_up_when_the_launch_ends(tmp_path: Path) -> None:
    """Without ``SLURM_JOB_GPUS`` the agent asks nvidia-smi for the GPUs; one that hangs is
    given up (its whole process group killed) once the launch ends, and the agent still
    writes its end snapshot: the entry does not wait out its 10 s and then kill the agent
    before it wrote anything, nor leave nvidia-smi behind."""
    extra = {node.IN_ENTRY: "1", "SLURM_JOB_ID": "77", "SLURMFM_OBS_GPUS": "8"}
    proc = start_entry(tmp_path, 8, extra=extra, launch=["true"], smi_query="sleep 1171")
    out, err = proc.communicate(gate.GO, timeout=60)
    assert proc.returncode == 0, (out, err)
    info = json.loads((tmp_path / "obs" / "node_n1_r0.json").read_text())
    assert info["gpus"] == list(range(8))  # the fallback: a whole node's
    assert "end" in info
    left = [p for p in Path("/proc").glob("[0-9]*") if b"1171" in _cmdline(p)]
    assert left == []


def _cmdline(pid_dir: Path) -> bytes:
    try:
        return (pid_dir / "cmdline").read_bytes()
    except OSError:
        return b""


def test_an_agent_of_a_relaunch_keeps_the_first_start(tmp_path: Path) -> None:
    """An in-job relaunch starts the launch step, and so the agent, again in the same
    restart: the node file keeps the first agent's start (the restart's, as the textfile's
    ``job_start_time_seconds`` says) and the EFA counters of that start stay the baseline
    ``slurmfm report`` subtracts from the last end."""
    counter = tmp_path / "sys/class/infiniband/rdmap0s0/ports/1/hw_counters/tx_bytes"
    counter.parent.mkdir(parents=True)
    extra = {node.IN_ENTRY: "1", "SLURM_JOB_ID": "77", "SLURMFM_OBS_EFA": "1"}
    starts, ends = [], []
    for tx in ("100", "250"):
        counter.write_text(tx + "\n")
        proc = start_entry(tmp_path, 8, extra=extra)
        proc.communicate(gate.GO, timeout=60)
        assert proc.returncode == 0
        info = json.loads((tmp_path / "obs" / "node_n1_r0.json").read_text())
        starts.append(info["start"])
        ends.append(info["end"])
    assert starts[1] == starts[0]
    assert ends[1] > ends[0]

    def tx_bytes(kind: str) -> int:
        snap = json.loads((tmp_path / "obs" / f"efa_{kind}_n1_r0.json").read_text())
        return int(snap["devices"]["rdmap0s0"]["1"]["tx_bytes"])

    assert (tx_bytes("start"), tx_bytes("end")) == (100, 250)


def test_the_entry_without_the_word_starts_nothing(tmp_path: Path) -> None:
    rc, out = run_entry(tmp_path, b"", 8)
    assert rc == gate.NOT_STARTED, out
    assert out.startswith("|"), out  # the launch never ran
    assert "did not start the launch" in out


def test_a_sick_node_reports_and_starts_nothing(tmp_path: Path) -> None:
    rc, out = run_entry(tmp_path, gate.GO, 7, extra={node.IN_ENTRY: "1"})
    assert rc == gate.NOT_STARTED, out
    assert out.startswith("|"), out  # the launch never ran
    assert "slurmfm-health n1 FAIL 7 GPUs visible, expected 8" in out
    assert not list((tmp_path / "obs").iterdir())  # nor its agent


def test_a_sick_node_keeps_its_task_until_the_batch_step_decides(tmp_path: Path) -> None:
    """A sick node's entry records its verdict and then waits for end-of-file, not exiting at
    once: the launch runs with --kill-on-bad-exit, so an early exit would end the healthy
    nodes' tasks before their verdicts are written, and the batch step, not knowing every
    node, could not put a spare in (it would requeue instead)."""
    proc = start_entry(tmp_path, 7)
    verdict = tmp_path / "ev" / "n1.gate"
    try:
        for _ in range(600):
            if verdict.exists() and verdict.read_text().endswith("\n"):
                break
            assert proc.poll() is None, "the sick node's entry exited before its verdict"
            time.sleep(0.05)
        assert verdict.read_text().startswith("FAIL")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)  # still there: the batch step has not decided yet
    finally:
        out, _err = proc.communicate(b"", timeout=60)  # the batch step closes stdin: no "go"
    assert proc.returncode == gate.NOT_STARTED
    assert not (tmp_path / "ran").exists()
    assert b"slurmfm-health n1 FAIL" in out


def test_other_tasks_of_a_node_only_wait(tmp_path: Path) -> None:
    """A node's second task (SLURM_LOCALID 1) neither checks the node again nor runs a
    second agent."""
    rc, out = run_entry(tmp_path, gate.GO, 7, localid="1", extra={node.IN_ENTRY: "1"})
    assert rc == 0, out
    assert not (tmp_path / "ev" / "n1.gate").exists()
    assert not list((tmp_path / "obs").iterdir())


def test_every_node_failing_alike_in_the_launch_step_drains_nothing(tmp_path: Path) -> None:
    """Issue 37: the gate inside the launch step finds the same failure on every node (a
    launch template with fewer NICs): the job fails with the reason and the field to fix; no
    node drained, no requeue, no task gets the word."""
    why = "FAIL 16 EFA devices, expected 32 (after 3 tries)"
    b, step, slurm, _ = make(tmp_path, {"n1": why, "n2": why}, *GPUS, "--requeue", "1")
    assert b.main([], LAUNCH) == 2
    assert step.stdin.getvalue() == b""
    assert not [c for c in slurm.calls if any(w.startswith("NodeName=") for w in c)]
    assert not [c for c in slurm.calls if c[:2] == ["scontrol", "requeue"]]
    text = (tmp_path / "rt_77.state").read_text()
    assert "event=fail health gate: 2 of 2 nodes fail the same check (16 EFA devices" in text
