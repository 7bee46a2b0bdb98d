"""A training launch in a container, on real Slurm, with real Pyxis and Enroot.

On every Slurm of the labs (22.05 on the host, 24.11 and 26.05 in chroots) the container runs
under real Pyxis 0.24.0 and Enroot 4.1.2 (github.com/NVIDIA/pyxis, github.com/NVIDIA/enroot),
built from ../shared/vendor/ by ``scripts/pyxis-lab build`` (and inside each chroot, against
its own Slurm, by ``scripts/pyxis-lab chroot``) and loaded into a lab of this module's own per
suite (``PYXIS``), in Pyxis' default mode (the image unpacked on each node) and with
``use_squashfuse=1`` (mounted with squashfuse; a mode switch rewrites plugstack.conf, which
each step reads when it starts). The image holds python3 and no slurmfm.

What is checked: each node's rank follows the planned host order; the launcher is started by
the runtime's node entry run by the image's python3 on the runtime mounted read-only (issue
37); on the save signal a host step on every node TERMs Megatron's workers, and nothing else
(squashfuse holds the container's root file system).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import (
    REPO_ROOT,
    OwnLab,
    SlurmLab,
    lab_root,
    last_attempt_ranks,
    own_lab_fixture,
    read_text,
    signal_batch_until_recorded,
    slurm_required,
    wait_until,
)
from nemo_order import PER_NODE, run_nemo

from slurmfm import api
from slurmfm.backends.slurm_cli import SlurmCLI, parse_scontrol_record
from slurmfm.plan.types import Placement

pytestmark = [pytest.mark.slurm]

STANDINS = REPO_ROOT / "tests" / "standins"
PYXIS_LAB = REPO_ROOT / "scripts" / "pyxis-lab"
# A lab of its own per suite with Pyxis loaded (slurm-lab up, SLURMFM_LAB_PYXIS), so that the
# mode switches below touch no other test's lab.
PYXIS_ENV = (("SLURMFM_LAB_PYXIS", "default"),)
PYXIS = {
    "host": OwnLab("pyxis-host", ctld_port=19107, slurmd_port=18701, nodes=3, extra_env=PYXIS_ENV),
    "trixie": OwnLab(
        "pyxis-trixie",
        ctld_port=19157,
        slurmd_port=18951,
        nodes=3,
        suite="trixie",
        extra_env=PYXIS_ENV,
    ),
    "sid": OwnLab(
        "pyxis-sid", ctld_port=19167, slurmd_port=18961, nodes=3, suite="sid", extra_env=PYXIS_ENV
    ),
}
SUITES = [
    pytest.param("host", marks=pytest.mark.slurm),
    pytest.param("trixie", marks=pytest.mark.slurm_newer),
    pytest.param("sid", marks=pytest.mark.slurm_newer),
]
MODES = ("default", "squashfuse")
# the line task 0 of a launch prints where the image has no python3 (render/container.py)
NO_PYTHON3 = re.compile(r"^(?:\d+: )?slurmfm: [^:\s]+: no python3 in the container image", re.M)


class Pyxis:
    """The Pyxis lab and the image (a plain class: tests/test_slurm_lab.py imports this module
    on its own to read PYXIS's ports, where a dataclass cannot find its module)."""

    def __init__(self, lab: SlurmLab, image: str, suite: str) -> None:
        self.lab = lab
        self.image = image
        self.suite = suite
        # scripts/pyxis-lab: each suite's Pyxis and Enroot, and where Enroot keeps its containers
        top = lab_root() / "pyxis"
        self.prefix = top / ("prefix" if suite == "host" else f"prefix-{suite}")
        self.state = top / ("state" if suite == "host" else f"state-{suite}")
        # what jobs get: Enroot on PATH, as on a cluster with Pyxis (the runtime runs
        # `enroot` to remove the attempt's named container); in a chroot lab, containers
        # without a user namespace, which the kernel refuses there (scripts/pyxis-lab)
        self.env = dict(lab.env, PATH=f"{self.prefix / 'bin'}:{lab.env['PATH']}")
        if suite != "host":
            self.env["ENROOT_ALLOW_SUPERUSER"] = "yes"

    def mode(self, mode: str) -> None:
        """Pyxis' mode for the steps that start from now on."""
        proc = subprocess.run(
            [str(PYXIS_LAB), "mode", str(self.lab.lab_dir), mode, self.suite],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr

    def assert_mode(self, job_id: str, mode: str, nodes: int) -> None:
        """Pyxis ran the job's launch (step 0) on ``nodes`` nodes the way ``mode`` says, by its
        own log lines (a requeued job's next attempt logs its step 0 again: at least)."""
        logs = "".join(read_text(p) for p in sorted((self.lab.lab_dir / "log").glob("slurmd-*")))
        starts = [x for x in logs.splitlines() if f"[{job_id}.0] pyxis: starting container" in x]
        want = "from squashfs" if mode == "squashfuse" else ": pyxis_slurmfm-"
        assert len(starts) >= nodes, starts
        assert all(want in x for x in starts), starts

    def container(self, mode: str, tmp_path: Path) -> dict[str, Any]:
        """The recipe's ``container:`` for a cluster in Pyxis mode ``mode``: unnamed with
        squashfuse (Pyxis mounts only an unnamed container's image: container.named)."""
        return {"image": self.image, "mounts": self.mounts(tmp_path), "named": mode != "squashfuse"}

    def mounts(self, tmp_path: Path) -> list[str]:
        """What a job of these tests needs in the image: the stand-ins (read-only) and its
        own log and checkpoint directory, at the same paths."""
        return [f"{STANDINS}:{STANDINS}:ro", f"{tmp_path}:{tmp_path}"]


PyxisFactory = Callable[[str], Pyxis]


@pytest.fixture(scope="module")
@own_lab_fixture(*PYXIS.values())
def pyxis_lab() -> Iterator[PyxisFactory]:
    """``pyxis_lab(suite)``: the suite's Pyxis lab; Pyxis and the image come from
    ``scripts/pyxis-lab build`` and ``chroot`` (run-tests runs them in the background)."""
    from lab import await_background

    made: dict[str, Pyxis] = {}

    def get(suite: str) -> Pyxis:
        if suite in made:
            return made[suite]
        await_background("pyxis" if suite == "host" else f"pyxis-{suite}")
        status = [str(PYXIS_LAB), "status", suite]
        if subprocess.run(status, check=False, timeout=60).returncode != 0:
            msg = f"Pyxis and Enroot are not built for {suite}: run scripts/pyxis-lab build"
            if suite != "host":
                msg += f" and scripts/pyxis-lab chroot {suite} DIR"
            if slurm_required():
                pytest.fail(msg)
            pytest.skip(msg)
        lab = PYXIS[suite].up()
        image = subprocess.run(
            [str(PYXIS_LAB), "image"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
        made[suite] = Pyxis(lab, image, suite)
        return made[suite]

    yield get
    for p in made.values():
        p.mode("default")


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(m.group(0)) for m in re.finditer(r'\{"event"[^{}]*\}', text)]


def idle_nodes(lab: SlurmLab, k: int) -> list[str]:
    out = lab.run(["sinfo", "-h", "-N", "-p", "batch", "-t", "idle", "-o", "%N"]).stdout
    nodes = sorted(set(out.split()))
    assert len(nodes) >= k, out
    return nodes[-k:]


def check_ranks_follow_the_planned_order(
    lab: SlurmLab,
    env: dict[str, str],
    image: str,
    mounts: list[str],
    tmp_path: Path,
    named: bool = True,
    overrides: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """A 3-node quickstart pinned to a host order that is not Slurm's own; its rank records."""
    order = tuple(reversed(idle_nodes(lab, 3)))  # not Slurm's own (name) order
    recipe = api.load(
        REPO_ROOT / "recipes" / "quickstart.yaml",
        {
            "resources.nodes": 3,
            "launcher.python": str(STANDINS / "torchrun.py"),
            "launcher.script": str(STANDINS / "report_rank.py"),
            "launcher.args": [],
            "container.image": image,
            "container.mounts": mounts,
            "container.named": named,
            "storage.checkpoint_root": str(tmp_path / "ckpt"),
            "storage.log_dir": str(tmp_path / "logs"),
            **(overrides or {}),
        },
    )
    job = api.submit(
        recipe, backend=SlurmCLI(env), env=env, placement=Placement(mode="pin", nodes=order)
    )
    fields = lab.wait_job(job.job_id, timeout=240)
    log = read_text(tmp_path / "logs" / f"quickstart_{job.job_id}.out")
    assert fields.get("JobState") == "COMPLETED", f"{fields}\n{log[-3000:]}"
    ranks = last_attempt_ranks(events(log))
    assert len(ranks) == 6, log[-3000:]
    for r in ranks:
        assert r["node"] == order[r["node_rank"]], r  # rank i on the i-th planned node
        assert r["rank"] == 2 * r["node_rank"] + r["local_rank"], r
        assert r["host_order"].split() == list(order)
        # torchrun's parent is the runtime's node entry, run by the image's python3 (issue 37)
        assert r["launcher_parent"].startswith("python3 -I -S -c import os, signal"), r
        assert " node --prefix " in r["launcher_parent"], r
    assert "slurmfm: node 0 runs: " in log  # the entry's own line, from inside the container
    assert not NO_PYTHON3.search(log), log[-3000:]
    return ranks


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("suite", SUITES)
def test_ranks_follow_the_planned_order_in_a_real_pyxis_container(
    pyxis_lab: PyxisFactory, suite: str, mode: str, tmp_path: Path
) -> None:
    """Real Pyxis and Enroot: the image's python3 runs the launcher, no slurmfm."""
    pyxis = pyxis_lab(suite)
    pyxis.mode(mode)
    ranks = check_ranks_follow_the_planned_order(
        pyxis.lab,
        pyxis.env,
        pyxis.image,
        pyxis.mounts(tmp_path),
        tmp_path,
        named=pyxis.container(mode, tmp_path)["named"],
    )
    # in the image: its /etc/environment's variable (scripts/pyxis-lab), its own Python
    assert {r["image_var"] for r in ranks} == {"from-image"}, ranks
    # the attempt's named container (Pyxis keeps it) was removed from every node at its end;
    # Enroot keeps containers per lab node and user under the lab root (scripts/pyxis-lab)
    job_id = ranks[0]["job_id"]
    left = sorted((pyxis.state / "data").glob(f"*/*/pyxis_*slurmfm-{job_id}-*"))
    assert left == []
    pyxis.assert_mode(job_id, mode, 3)


@pytest.mark.parametrize(
    ("pyxis_version", "seen"), [("auto", "from-recipe"), ("0.14", "from-image")]
)
@pytest.mark.parametrize("suite", SUITES)
def test_recipe_env_wins_over_the_images_only_where_named_in_real_pyxis(
    pyxis_lab: PyxisFactory, suite: str, pyxis_version: str, seen: str, tmp_path: Path
) -> None:
    """Real Pyxis: a variable the image defines (its /etc/environment) keeps the image's value
    over the host's unless --container-env names it (NVIDIA/pyxis README). slurmfm names
    every recipe variable; with container.pyxis below 0.15 it cannot (and warns)."""
    pyxis = pyxis_lab(suite)
    pyxis.mode("default")
    ranks = check_ranks_follow_the_planned_order(
        pyxis.lab,
        pyxis.env,
        pyxis.image,
        pyxis.mounts(tmp_path),
        tmp_path,
        overrides={
            "env": {"OMP_NUM_THREADS": 1, "SLURMFM_IMAGE_VAR": "from-recipe"},
            "container.pyxis": pyxis_version,
        },
    )
    assert {r["image_var"] for r in ranks} == {seen}, ranks


@pytest.mark.parametrize("suite", SUITES)
def test_nemo_in_a_real_pyxis_container_ranks_follow_the_planned_order(
    pyxis_lab: PyxisFactory, suite: str, tmp_path: Path
) -> None:
    """NeMo in a container: one task per GPU, each running the rendered ``sh`` program (not the
    runtime) with the image's python3, gets its node's rank (task id // tasks per node), and
    the tasks follow the planned host order (tests/nemo_order.py)."""
    pyxis = pyxis_lab(suite)
    pyxis.mode("default")
    container = {"image": pyxis.image, "mounts": pyxis.mounts(tmp_path)}
    log = run_nemo(pyxis.lab, tmp_path, container=container, env=pyxis.env)
    ranks = re.findall(r"LIGHTNING rank=(\d+) .* node_rank=(\d+)", log)
    assert sorted((int(r), int(n)) for r, n in ranks) == [(r, r // PER_NODE) for r in range(6)]
    assert "pyxis: starting container" in "".join(
        read_text(p) for p in (pyxis.lab.lab_dir / "log").glob("slurmd-*")
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("suite", SUITES)
def test_megatron_in_a_real_pyxis_container_saves_on_the_signal_from_the_host(
    pyxis_lab: PyxisFactory, suite: str, mode: str, tmp_path: Path
) -> None:
    """The save signal reaches Megatron's workers in the container, and only them: with
    use_squashfuse=1 a TERM to squashfuse (which carries the launch's environment) removes the
    container's root file system and no checkpoint is written."""
    pyxis = pyxis_lab(suite)
    pyxis.mode(mode)
    slurm_lab = pyxis.lab
    recipe = api.load(
        {
            "name": "mega",
            # the lab's nodes have 8 GPU GRES each; whole nodes, as a p5 job takes them
            "cluster": {"instance_type": "p5.48xlarge", "partition": "batch", "flavor": "generic"},
            "resources": {"nodes": 2, "procs_per_node": 2, "time_limit": "00:10:00"},
            "parallelism": {"tp": 1, "pp": 1},
            "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
            "observability": {"enabled": "off"},
            "launcher": {
                "kind": "megatron",
                "python": str(STANDINS / "torchrun.py"),
                "megatron_path": str(STANDINS),
                "entrypoint": "megatron_pretrain.py",
                "model_args": {"train-iters": 100000},
            },
            "container": pyxis.container(mode, tmp_path),
            "storage": {
                "checkpoint_root": str(tmp_path / "ckpt"),
                "log_dir": str(tmp_path / "logs"),
            },
        }
    )
    env = pyxis.env
    job = api.submit(recipe, backend=SlurmCLI(env), env=env)
    log_path = tmp_path / "logs" / f"mega_{job.job_id}.out"
    state_path = tmp_path / "logs" / f"mega_{job.job_id}.state"
    try:
        wait_until(
            "all 4 workers started",
            lambda: sum(e["event"] == "start" for e in events(read_text(log_path))) == 4,
            120,
            lambda: read_text(log_path),
        )
        # Slurm's own pre-timeout request (--signal=B:USR2@N sends it the same way)
        signal_batch_until_recorded(slurm_lab, job.job_id, state_path)
        wait_until(
            "the requeue after the save",
            lambda: "event=requeue saved before the time limit" in read_text(state_path),
            120,
            lambda: read_text(log_path),
        )
        # one TERM per worker, which saves and exits 0: the launcher itself was not signalled
        assert "saved before the time limit (training exit 0)" in read_text(log_path)
        ev = events(read_text(log_path))
        saved = [e for e in ev if e["event"] == "saved-on-term"]
        assert sorted(e["rank"] for e in saved) == [0, 1, 2, 3], ev  # every worker got TERM
        starts = [e for e in ev if e["event"] == "start"]
        assert all(e["usr2_ignored"] for e in starts), starts  # the launcher's ignore, inherited
        rec = parse_scontrol_record(
            slurm_lab.run(["scontrol", "show", "job", "-o", job.job_id]).stdout
        )
        assert int(rec["Restarts"]) >= 1 or rec["JobState"] in ("PENDING", "REQUEUED"), rec
        done = (tmp_path / "ckpt").rglob("latest_checkpointed_iteration.txt")
        assert next(int(p.read_text()) for p in done) > 0
        # the first attempt's named container went before the requeue (Pyxis keeps it)
        data = pyxis.state / "data"
        assert sorted(data.glob(f"*/*/pyxis_*slurmfm-{job.job_id}-0-*")) == []
        pyxis.assert_mode(job.job_id, mode, 2)
    finally:
        cancel_for_good(slurm_lab, job.job_id)


def cancel_for_good(lab: SlurmLab, job_id: str) -> None:
    """scancel until the job is gone (completing counts as not gone): one sent while the
    runtime's requeue is under way is lost (seen on the lab), and the next attempt (100000
    iterations) would hold the lab's nodes for the next test."""

    def gone() -> bool:
        lab.run(["scancel", job_id])
        return not lab.run(["squeue", "-h", "-j", job_id]).stdout.strip()

    wait_until(f"job {job_id} cancelled", gone, 60, lambda: "")


# --- issue 37: one launch path, judged the same with or without a container -----------------
# On the host suite only: what is checked is the runtime's judgement, the same on every Slurm
# (the tests above run the container launch itself on each suite).
HOST_ONLY = SUITES[:1]


def megatron_in_container(
    pyxis: Pyxis,
    tmp_path: Path,
    name: str,
    env: dict[str, Any] | None = None,
    resilience: dict[str, Any] | None = None,
    iters: int = 60,
    order: tuple[str, ...] = (),
) -> str:
    """Submit an unmodified Megatron-like stand-in (tests/standins/megatron_pretrain.py: its
    own ``iteration N/ M |`` lines, nothing of slurmfm) on 2 nodes in the image; the job id."""
    recipe = api.load(
        {
            "name": name,
            "cluster": {"instance_type": "p5.48xlarge", "partition": "batch", "flavor": "generic"},
            "resources": {"nodes": 2, "procs_per_node": 1, "time_limit": "00:10:00"},
            "parallelism": {"tp": 1, "pp": 1},
            "resilience": {
                "health_gate": "off",
                "nccl_transport_check": "off",
                **(resilience or {}),
            },
            "observability": {"enabled": "off"},
            "launcher": {
                "kind": "megatron",
                "python": str(STANDINS / "torchrun.py"),
                "megatron_path": str(STANDINS),
                "entrypoint": "megatron_pretrain.py",
                "model_args": {"train-iters": iters, "log-interval": 10},
            },
            "container": pyxis.container("default", tmp_path),
            "env": env or {},
            "storage": {
                "checkpoint_root": str(tmp_path / "ckpt"),
                "log_dir": str(tmp_path / "logs"),
            },
        }
    )
    placement = Placement(mode="pin", nodes=order) if order else Placement()
    return api.submit(
        recipe, backend=SlurmCLI(pyxis.env), env=pyxis.env, placement=placement
    ).job_id


def finished(pyxis: Pyxis, tmp_path: Path, name: str, job_id: str) -> tuple[str, str, str]:
    """(JobState, job log, state file) once the job ended."""
    fields = pyxis.lab.wait_job(job_id, timeout=240)
    log = read_text(tmp_path / "logs" / f"{name}_{job_id}.out")
    return fields.get("JobState", ""), log, read_text(tmp_path / "logs" / f"{name}_{job_id}.state")


@pytest.mark.parametrize("suite", HOST_ONLY)
def test_a_rank_dying_after_iterations_in_a_container_is_relaunched(
    pyxis_lab: PyxisFactory, suite: str, tmp_path: Path
) -> None:
    """The NCCL watchdog case: rank 0 dies after 30 iterations (no checkpoint since the
    start); srun TERMs the other node, whose torchrun exits 1 (SignalException), so every
    task exits 1. Megatron's own iteration lines are the progress: relaunched in the
    allocation, and the job completes. Before: 'first failure: no node report; progress:
    unknown; fail'."""
    pyxis = pyxis_lab(suite)
    pyxis.mode("default")
    job_id = megatron_in_container(pyxis, tmp_path, "rankdies", env={"STANDIN_FAIL": "0:30"})
    state, log, events_ = finished(pyxis, tmp_path, "rankdies", job_id)
    assert state == "COMPLETED", log[-4000:]
    assert "first failure: " in log
    assert "DistBackendError" in events_, events_
    (relaunch,) = [x for x in events_.splitlines() if "event=relaunch" in x]
    assert "after progress (last Megatron-LM iteration" in relaunch, relaunch
    assert "launch 1: first progress " in log
    assert "slurmfm: node 0 runs: " in log  # the entry in the container
    assert (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("suite", HOST_ONLY)
def test_an_import_error_on_one_node_in_a_container_fails_at_once(
    pyxis_lab: PyxisFactory, suite: str, tmp_path: Path
) -> None:
    """One node's workers cannot import flash_attn: the job fails at once, naming the node
    and the module (the node entry's report from inside the container). The failing node
    holds rank 0: the stand-in installs Megatron's TERM handler at once, where Megatron does
    so only once training begins, after every rank joined (a rank that failed its import
    never does), so a healthy rank 0 would save on srun's TERM as real Megatron would not."""
    pyxis = pyxis_lab(suite)
    pyxis.mode("default")
    bad, good = idle_nodes(pyxis.lab, 2)
    job_id = megatron_in_container(
        pyxis, tmp_path, "imp", env={"STANDIN_IMPORT_FAIL": bad}, order=(bad, good)
    )
    state, log, events_ = finished(pyxis, tmp_path, "imp", job_id)
    assert state == "FAILED", log[-4000:]
    assert "event=relaunch" not in events_
    assert f"ModuleNotFoundError: No module named 'flash_attn' on {bad}" in events_, events_
    assert "before any progress" in events_


@pytest.mark.parametrize("suite", HOST_ONLY)
def test_a_slow_start_within_the_allowance_completes_in_one_launch(
    pyxis_lab: PyxisFactory, suite: str, tmp_path: Path
) -> None:
    """The first iteration comes after 12 s, longer than hang_timeout (6 s) but within
    startup_timeout: no stop, one launch, and the log says when progress began."""
    pyxis = pyxis_lab(suite)
    pyxis.mode("default")
    job_id = megatron_in_container(
        pyxis,
        tmp_path,
        "slow",
        env={"STANDIN_STARTUP_S": 12},
        resilience={"hang_timeout": "6s", "startup_timeout": "5m"},
        iters=20,
    )
    state, log, events_ = finished(pyxis, tmp_path, "slow", job_id)
    assert state == "COMPLETED", log[-4000:]
    assert "event=relaunch" not in events_, events_
    assert "hang:" not in log
    m = re.search(r"launch 1: first progress (\d+) s after the start", log)
    assert m is not None, log[-3000:]
    assert int(m.group(1)) >= 12


@pytest.mark.parametrize("suite", HOST_ONLY)
def test_every_node_failing_the_gate_alike_fails_the_job_and_drains_none(
    pyxis_lab: PyxisFactory, suite: str, tmp_path: Path
) -> None:
    """Every node shows 7 of a p5's 8 GPUs (an nvidia-smi stand-in on the host, where the
    gate of a container launch runs): a configuration error. The job fails with the reason
    and the recipe field; no node is drained, nothing requeued."""
    pyxis = pyxis_lab(suite)
    pyxis.mode("default")
    bindir = tmp_path / "gpu-bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\nfor i in 0 1 2 3 4 5 6; do echo "GPU $i: NVIDIA H100 80GB HBM3"; done\n'
    )
    smi.chmod(0o755)
    env = dict(pyxis.env, PATH=f"{bindir}:{pyxis.env['PATH']}")
    recipe = api.load(
        REPO_ROOT / "recipes" / "quickstart.yaml",
        {
            "cluster.instance_type": "p5.48xlarge",
            "resources.nodes": 2,
            "resources.procs_per_node": 1,
            "resources.exclusive": True,
            "resilience.health_gate": "on",
            "resilience.nccl_transport_check": "off",
            "launcher.python": str(STANDINS / "torchrun.py"),
            "launcher.script": str(STANDINS / "report_rank.py"),
            "launcher.args": [],
            "container.image": pyxis.image,
            "container.mounts": pyxis.mounts(tmp_path),
            "storage.checkpoint_root": str(tmp_path / "ckpt"),
            "storage.log_dir": str(tmp_path / "logs"),
        },
    )
    job_id = api.submit(recipe, backend=SlurmCLI(env), env=env).job_id
    state, log, events_ = finished(pyxis, tmp_path, "quickstart", job_id)
    assert state == "FAILED", log[-4000:]
    assert "event=fail health gate: 2 of 2 nodes fail the same check (7 GPUs visible" in events_
    assert "Fix cluster.instance_type" in events_
    assert "event=requeue" not in events_
    drained = pyxis.lab.run(["sinfo", "-h", "-R", "-o", "%N %E"]).stdout
    assert "health gate" not in drained, drained


@pytest.mark.parametrize("suite", HOST_ONLY)
def test_an_image_without_python3_runs_with_one_line_in_the_log(
    pyxis_lab: PyxisFactory, suite: str, tmp_path: Path
) -> None:
    """The image has its interpreter only as python3.N: the launch runs as before the entry
    moved into the container (ranks from the host order), and the job log says so once."""
    pyxis = pyxis_lab(suite)
    pyxis.mode("default")
    image = subprocess.run(
        [str(PYXIS_LAB), "image", "nopython3"], capture_output=True, text=True, check=True
    ).stdout.strip()
    py = Path("/usr/bin/python3").resolve().name  # the image's interpreter (scripts/pyxis-lab)
    launcher = tmp_path / "torchrun"
    launcher.write_text(f'#!/bin/sh\nexec /usr/bin/{py} {STANDINS / "torchrun.py"} "$@"\n')
    launcher.chmod(0o755)
    order = tuple(reversed(idle_nodes(pyxis.lab, 2)))
    recipe = api.load(
        REPO_ROOT / "recipes" / "quickstart.yaml",
        {
            "resources.nodes": 2,
            "launcher.python": str(launcher),
            "launcher.script": str(STANDINS / "report_rank.py"),
            "launcher.args": [],
            "container.image": image,
            "container.mounts": pyxis.mounts(tmp_path),
            "storage.checkpoint_root": str(tmp_path / "ckpt"),
            "storage.log_dir": str(tmp_path / "logs"),
        },
    )
    job = api.submit(
        recipe,
        backend=SlurmCLI(pyxis.env),
        env=pyxis.env,
        placement=Placement(mode="pin", nodes=order),
    )
    state, log, _ = finished(pyxis, tmp_path, "quickstart", job.job_id)
    assert state == "COMPLETED", log[-4000:]
    assert len(NO_PYTHON3.findall(log)) == 1, log[-4000:]
    ranks = last_attempt_ranks(events(log))
    assert ranks, log[-3000:]
    for r in ranks:
        assert r["node"] == order[r["node_rank"]], r
