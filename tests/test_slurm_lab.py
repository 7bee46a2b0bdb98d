"""Checks that the local Slurm lab (scripts/slurm-lab) is what it claims to be.

Host lab (22.05 on Debian 12):   python -m pytest tests/test_slurm_lab.py -q
Any lab dir (e.g. trixie 24.11): SLURMFM_LAB=/var/tmp/slurmfm-lab/trixie python -m pytest ...
Newer suites via the factory:    SLURMFM_LAB_SUITES=trixie,sid python -m pytest -m slurm_newer ...
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lab import (
    APP_PORTS,
    EPHEMERAL_PORTS,
    LAB_SCRIPT,
    MAX_NODES,
    NOT_REQUESTED,
    OBS_PORTS,
    OWN_LABS,
    QUICKSTART_LOWEST_PORT,
    QUICKSTART_PORT_OFFSETS,
    REFUSED_BINDS,
    REMOTE_LAB_PORTS,
    RENDEZVOUS_PORTS_START,
    RUN_TESTS_PORT_OFFSETS,
    SHARED_LAB_PORTS,
    OwnLab,
    SlurmLab,
    SuiteLabFactory,
    free_port,
    interpreter_files,
    lab_requested,
    listening_ports,
    live_pids,
    own_lab_fixture,
    pick_offset,
    port_offset,
    register_own_labs,
    router_ports,
    run_ports,
    select_binds,
    slurm_required,
)

from slurmfm.job import hosts


def _job_dir(lab: SlurmLab) -> Path:
    d = lab.jobs_dir / f"test-{uuid.uuid4().hex[:10]}"
    d.mkdir(mode=0o777)
    return d


def _sbatch(lab: SlurmLab, workdir: Path, *args: str) -> str:
    proc = lab.run(["sbatch", "--parsable", *args], cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _parse_kv_line(line: str) -> dict[str, str]:
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def _topology_path(lab: SlurmLab, node: str) -> list[str]:
    """Switch names from the top of the tree down to node's leaf, per topology.json."""
    switches = lab.topology["switches"]
    path = [lab.topology["nodes"][node]["leaf"]]
    while switches[path[0]]["parent"] is not None:
        path.insert(0, switches[path[0]]["parent"])
    return path


# ------------------------------------------------------------------ checks
def check_all_nodes_idle(lab: SlurmLab) -> None:
    expected = {f"node{i:03d}" for i in range(1, lab.nodes + 1)}
    states: dict[str, str] = {}
    # Other jobs may still be finishing, and 22.05's backfill can leave "plnd" for a cycle.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        proc = lab.run(["sinfo", "-h", "-N", "-p", "batch", "-o", "%N %t"])
        assert proc.returncode == 0, proc.stderr
        states = dict(line.split() for line in proc.stdout.splitlines())
        if set(states) == expected and set(states.values()) == {"idle"}:
            return
        time.sleep(0.5)
    assert set(states) == expected
    assert set(states.values()) == {"idle"}, states


def check_topology(lab: SlurmLab) -> None:
    proc = lab.run(["scontrol", "show", "topology"])
    assert proc.returncode == 0, proc.stderr
    lines = [_parse_kv_line(line) for line in proc.stdout.splitlines() if line.strip()]
    truth = lab.topology
    if truth["plugin"] == "block":
        blocks = {d["BlockName"]: d for d in lines if "BlockName" in d}
        assert set(blocks) == set(truth["blocks"])
        for name, info in truth["blocks"].items():
            assert set(lab.hostnames(blocks[name]["Nodes"])) == set(info["nodes"]), name
        return
    assert truth["plugin"] == "tree"
    switches = {d["SwitchName"]: d for d in lines if "SwitchName" in d}
    assert set(switches) == set(truth["switches"])
    assert {int(d["Level"]) for d in switches.values()} == {0, 1, 2}
    assert truth["levels"] == 3
    for name, info in truth["switches"].items():
        got = switches[name]
        assert int(got["Level"]) == info["level"], name
        assert set(lab.hostnames(got["Nodes"])) == set(info["nodes"]), name
        children = lab.hostnames(got["Switches"]) if "Switches" in got else []
        assert set(children) == set(info["children"]), name
    # every node sits under exactly the leaf topology.json says
    for node, info in truth["nodes"].items():
        assert node in truth["switches"][info["leaf"]]["nodes"]
        assert info["addr"] == "127.0.0.1"
    # names under leaf1 are not one consecutive range (EC2-like launch order)
    leaves = sorted(n for n, info in truth["switches"].items() if info["level"] == 0)
    first = "leaf1" if "leaf1" in leaves else leaves[0]
    leaf1 = sorted(int(n.removeprefix("node")) for n in lab.hostnames(switches[first]["Nodes"]))
    if truth["source"] == "generated" and lab.nodes > len(leaf1):
        assert leaf1 != list(range(leaf1[0], leaf1[0] + len(leaf1))), leaf1


def check_two_node_job(lab: SlurmLab) -> None:
    workdir = _job_dir(lab)
    script = workdir / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH -N 2\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH -t 5\n"
        "#SBATCH -o out-%j.txt\n"
        "srun bash -c 'echo \"$SLURMD_NODENAME $SLURM_PROCID $SLURM_TOPOLOGY_ADDR\"'\n"
    )
    job_id = _sbatch(lab, workdir, str(script))
    fields = lab.wait_job(job_id)
    assert fields["JobState"] == "COMPLETED", fields
    nodes = lab.hostnames(fields["NodeList"])
    assert len(nodes) == 2
    lines = sorted((workdir / f"out-{job_id}.txt").read_text().split("\n"))
    rows = [line.split() for line in lines if line.strip()]
    assert len(rows) == 2, rows
    assert {r[0] for r in rows} == set(nodes)
    assert sorted(r[1] for r in rows) == ["0", "1"]
    for node, _procid, addr in rows:
        if lab.topology["plugin"] == "tree":
            assert addr == ".".join([*_topology_path(lab, node), node])
        else:  # topology/block: "<block>.<node>"
            assert addr == f"{lab.topology['nodes'][node]['block']}.{node}"


def check_gpus(lab: SlurmLab) -> None:
    workdir = _job_dir(lab)
    gpus = lab.gpus_per_node
    job_id = _sbatch(
        lab,
        workdir,
        "-N",
        "1",
        f"--gres=gpu:{gpus}",
        "-t",
        "5",
        "-o",
        "out-%j.txt",
        "--wrap",
        "echo CVD=$CUDA_VISIBLE_DEVICES",
    )
    fields = lab.wait_job(job_id)
    assert fields["JobState"] == "COMPLETED", fields
    out = (workdir / f"out-{job_id}.txt").read_text()
    assert f"CVD={','.join(str(i) for i in range(gpus))}" in out.split()


def check_idempotent_up_and_status(lab: SlurmLab) -> None:
    pid_file = lab.lab_dir / "run" / "slurmctld.pid"
    before = pid_file.read_text().strip()
    up = lab.lab_command("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "already up and healthy" in up.stdout
    assert pid_file.read_text().strip() == before
    status = lab.lab_command("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "healthy" in status.stdout
    assert lab.version in status.stdout


# The stdlib modules whose extension links a library the chroot gets from CHROOT_PKGS
# (scripts/slurm-lab), and zlib/pyexpat, which Debian's interpreter links itself.
JOB_PYTHON_MODULES = ("ctypes", "ssl", "hashlib", "bz2", "lzma", "zlib", "pyexpat", "torch")


def check_job_python(lab: SlurmLab) -> None:
    """A job runs the tests' own Python and imports what torch and the job runtime need.

    In a chroot lab that Python is the host's, bind-mounted through SLURMFM_LAB_BIND
    (tests/lab.py, job_binds): whole for a pyenv Python, only its stdlib and interpreter files
    for Debian's /usr/bin/python3, with the shared libraries from the chroot's own packages.
    """
    workdir = _job_dir(lab)
    code = f"import sys, {', '.join(JOB_PYTHON_MODULES)}; print('job-python', sys.base_prefix)"
    wrap = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    job_id = _sbatch(lab, workdir, "-N", "1", "-t", "5", "-o", "out-%j.txt", "--wrap", wrap)
    fields = lab.wait_job(job_id, timeout=120)
    out = (workdir / f"out-{job_id}.txt").read_text()
    assert fields["JobState"] == "COMPLETED", out
    assert f"job-python {sys.base_prefix}" in out.splitlines(), out


CHECKS: list[Callable[[SlurmLab], None]] = [
    check_all_nodes_idle,
    check_topology,
    check_two_node_job,
    check_gpus,
    check_idempotent_up_and_status,
    check_job_python,
]


# ------------------------------------------------------------------ the lab ($SLURMFM_LAB or host)
@pytest.mark.slurm
def test_version_matches_lab(slurm_lab: SlurmLab) -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", slurm_lab.version)
    assert slurm_lab.version == slurm_lab.config["VERSION"]


@pytest.mark.slurm
def test_the_runs_labs_schedule_as_often_as_it_asks(slurm_lab: SlurmLab) -> None:
    """run-tests asks for a scheduling pass every second (SLURMFM_LAB_SCHED_INTERVAL): the
    lab's running slurmctld says so; without the variable Slurm's default stays."""
    params = slurm_lab.run(["scontrol", "show", "config"]).stdout
    line = next(x for x in params.splitlines() if x.startswith("SchedulerParameters"))
    want = os.environ.get("SLURMFM_LAB_SCHED_INTERVAL", "")
    assert ("sched_interval=" + want in line) if want else ("sched_interval" not in line), line


@pytest.mark.parametrize("value", ["0", "x", "1.5", "-3"])
def test_a_bad_scheduling_interval_is_refused(value: str) -> None:
    proc = subprocess.run(
        [str(LAB_SCRIPT), "list-debs"],
        env={**os.environ, "SLURMFM_LAB_SCHED_INTERVAL": value},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "SLURMFM_LAB_SCHED_INTERVAL must be a whole number of seconds" in proc.stderr


def _lab_root_cmd(root: Path, command: str = "root") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", 'umask 0; exec "$0" "$1"', str(LAB_SCRIPT), command],
        env={**os.environ, "SLURMFM_LAB_ROOT": str(root)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_lab_root_is_made_private_under_any_umask(tmp_path: Path) -> None:
    """The lab root (by default in /var/tmp) is made 0755 even under umask 0: the labs run as
    root and users source its env.sh, so no one else may add to it."""
    root = tmp_path / "labs"
    proc = _lab_root_cmd(root)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    assert _lab_root_cmd(root).returncode == 0  # an existing root of root's is used
    assert _lab_root_cmd(tmp_path / "absent", "status").returncode == 1  # not up: no lab
    assert not (tmp_path / "absent").exists()  # status made nothing


@pytest.mark.parametrize("plant", ["link", "foreign", "writable", "open-parent"])
def test_a_lab_root_another_user_could_change_is_refused(tmp_path: Path, plant: str) -> None:
    """A root another user made first (or a link by its name, or one anyone may write, or one
    in a directory anyone may change) is refused with one line, by every command that would
    use it, before anything is written."""
    parent = tmp_path / "shared"
    parent.mkdir()
    root, target = parent / "labs", tmp_path / "elsewhere"
    target.mkdir()
    if plant == "link":
        root.symlink_to(target)
    elif plant == "foreign":
        root.mkdir()
        os.chown(root, 65534, 65534)
    elif plant == "writable":
        root.mkdir()
        root.chmod(0o777)
    else:
        parent.chmod(0o777)  # no sticky bit: anyone may rename the root away and put another
    for command in ("root", "up", "status"):
        proc = _lab_root_cmd(root, command)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"slurm-lab: error: {root if plant != 'open-parent' else parent}")
    assert list(target.iterdir()) == []  # nothing written through the link
    if plant != "link" and root.exists():
        assert list(root.iterdir()) == []
    parent.chmod(0o1777)  # sticky, like /var/tmp: the root in it is ours
    if plant == "open-parent":
        assert _lab_root_cmd(root).returncode == 0


@pytest.mark.slurm
def test_all_nodes_idle(slurm_lab: SlurmLab) -> None:
    check_all_nodes_idle(slurm_lab)


@pytest.mark.slurm
def test_topology_matches_truth(slurm_lab: SlurmLab) -> None:
    check_topology(slurm_lab)


@pytest.mark.slurm
def test_two_node_job(slurm_lab: SlurmLab) -> None:
    check_two_node_job(slurm_lab)


@pytest.mark.slurm
def test_gres_gpus(slurm_lab: SlurmLab) -> None:
    check_gpus(slurm_lab)


@pytest.mark.slurm
def test_up_is_idempotent_and_status_ok(slurm_lab: SlurmLab) -> None:
    check_idempotent_up_and_status(slurm_lab)


@pytest.mark.slurm
def test_job_runs_the_tests_python(slurm_lab: SlurmLab) -> None:
    check_job_python(slurm_lab)


# ------------------------------------------------------------------ newer suites via the factory
@pytest.mark.slurm_newer
@pytest.mark.parametrize("suite", ["trixie", "sid"])
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_newer_suite(
    slurm_lab_suite: SuiteLabFactory, suite: str, check: Callable[[SlurmLab], None]
) -> None:
    check(slurm_lab_suite(suite))


# ------------------------------------------------------------------ recovery of a lost registration
NUDGE = OwnLab(
    "nudge-host",
    ctld_port=16977,
    slurmd_port=17801,
    nodes=3,
    extra_env=(("SLURMFM_LAB_HOLD_SLURMD", "node002"), ("SLURMFM_LAB_NUDGE_AFTER", "3")),
)
# A lab of the trixie chroot that the down test starts and stops, and its slurmrestd's port.
DOWN = OwnLab("down-trixie", ctld_port=16987, slurmd_port=17901, nodes=2, suite="trixie")
DOWN_REST_PORT = REMOTE_LAB_PORTS["down-trixie:rest"]


@pytest.fixture
@own_lab_fixture(NUDGE)
def nudge_lab() -> Iterator[OwnLab]:
    """NUDGE, down before and after the test (the test brings it up itself)."""
    if not lab_requested():
        (pytest.fail if slurm_required() else pytest.skip)(NOT_REQUESTED)
    if os.geteuid() != 0:
        (pytest.fail if slurm_required() else pytest.skip)("the Slurm lab needs root")
    NUDGE.command("down")
    yield NUDGE
    NUDGE.command("down")


@pytest.mark.slurm
def test_up_restarts_a_slurmd_whose_registration_was_lost(nudge_lab: OwnLab) -> None:
    """A slurmd that never registers is restarted by `up` instead of timing out.

    The hold hook leaves node002's slurmd unstarted, which slurmctld sees exactly like
    a lost start-up registration (state unk*). CI once waited 180 s on such a node.
    """
    up = nudge_lab.command("--nodes", "3", "--timeout", "90", "up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "slurmd node002 has not registered yet; restarting it" in up.stderr
    assert "node001 has not registered" not in up.stderr
    status = nudge_lab.command("status")
    assert status.returncode == 0, status.stdout + status.stderr


# ------------------------------------------------------------------ a lab cannot hurt the host
def _marked_pids(lab_dir: Path) -> list[int]:
    """Processes whose environment carries the lab's daemon marker (scripts/slurm-lab)."""
    return live_pids("SLURMFM_LAB_DAEMON", str(lab_dir))


def _mounts_naming(path: Path) -> list[str]:
    """Mount points (host side, chroot side) at or below any path that ends with ``path``."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(path) or f"{path}/" in point + "/":
            out.append(point)
    return out


@pytest.fixture
@own_lab_fixture(DOWN)
def down_lab() -> Iterator[SlurmLab]:
    lab = DOWN.up()
    yield lab
    DOWN.command("down")


@pytest.mark.slurm_newer
def test_down_leaves_no_daemon_and_no_mount_of_the_lab(down_lab: SlurmLab) -> None:
    """After `down`, nothing of the lab runs and nothing of it is mounted, not even in the
    chroot that other labs of the suite still use; and `purge` refuses while anything is."""
    job = down_lab.run(
        ["sbatch", "--parsable", "-N", "2", "-o", "/dev/null", "--wrap", "srun sleep 300"]
    )
    assert job.returncode == 0, job.stderr
    assert _marked_pids(down_lab.lab_dir)
    assert _mounts_naming(down_lab.lab_dir), "up mounts the lab dir into the chroot"
    # `build` (run-tests builds the chroots while pip installs) leaves a running lab as it is
    built = DOWN.command("build")
    assert built.returncode == 0, built.stdout + built.stderr
    assert _mounts_naming(down_lab.lab_dir), built.stdout + built.stderr
    assert down_lab.run(["squeue", "-h", "-j", job.stdout.strip()]).stdout.strip()
    # its slurmrestd (rest-up) goes down with it
    rest = subprocess.run(
        [str(LAB_SCRIPT), "--lab", str(DOWN.dir), "rest-up"],
        env={**DOWN.env(), "SLURMFM_LAB_REST_PORT": str(DOWN_REST_PORT + port_offset())},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert rest.returncode == 0, rest.stdout + rest.stderr
    restd = int((down_lab.lab_dir / "run" / "slurmrestd.pid").read_text())
    assert restd in _marked_pids(down_lab.lab_dir)
    down = DOWN.command("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert _marked_pids(down_lab.lab_dir) == []
    assert _mounts_naming(down_lab.lab_dir) == []
    # and of a stopped lab, it mounts what the chroot's apt needs, then nothing is left
    built = DOWN.command("build")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "nothing started, nothing mounted" in built.stdout
    assert _marked_pids(down_lab.lab_dir) == []
    assert _mounts_naming(down_lab.lab_dir) == []


def test_purge_refuses_while_something_is_mounted(tmp_path: Path) -> None:
    """`down --purge` must not rm -rf through a bind mount into host data."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount")  # only the real-lab CI runs as root
    lab_dir = tmp_path / "root" / "purge-host"
    (lab_dir / "etc").mkdir(parents=True)
    (lab_dir / "lab.conf").write_text("SUITE=host\nNODES=1\n")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep me")
    (lab_dir / "mnt").mkdir()
    subprocess.run(["mount", "--bind", str(precious), str(lab_dir / "mnt")], check=True)
    try:
        env = {**os.environ, "SLURMFM_LAB_ROOT": str(tmp_path / "root")}
        proc = subprocess.run(
            [str(LAB_SCRIPT), "--lab", str(lab_dir), "down", "--purge"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    finally:
        subprocess.run(["umount", str(lab_dir / "mnt")], check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "still has mounts" in proc.stderr
    assert (precious / "data").read_text() == "keep me"
    assert lab_dir.is_dir()


# ------------------------------------------------------------------ ports
def test_lab_ports_stay_out_of_the_ephemeral_range_and_apart() -> None:
    """Every lab's ports (tests' own and the shared suites') lie below the ports jobs take
    (rendezvous from 20000; the ephemeral range from 32768), above the servers' APP_PORTS, and
    no two labs share one, with every offset that scripts/run-tests picks."""
    register_own_labs()
    labs = {lab.name: lab for lab in OWN_LABS}
    assert {"resil", "topo-host", "plan-sid", "sim-host", "nudge-host", "down-trixie"} <= set(labs)
    taken: dict[int, str] = {}
    for suite, (ctld, slurmd) in SHARED_LAB_PORTS.items():
        for port in [ctld, *range(slurmd, slurmd + MAX_NODES)]:
            taken[port] = suite
    # the shared labs' slurmrestd and sshd (slurm-lab rest-up, ssh-up: remote_port)
    script = LAB_SCRIPT.read_text()
    remote = {k: p for k, p in REMOTE_LAB_PORTS.items() if not k.startswith("down-")}
    for key, port in remote.items():
        assert f"{key}) base={port} ;;" in script, key
    for key, port in REMOTE_LAB_PORTS.items():
        assert port not in taken, f"{key} and {taken[port]} share port {port}"
        taken[port] = key
    for lab in labs.values():
        for port in lab.ports:
            assert port not in taken, f"{lab.name} and {taken[port]} share port {port}"
            taken[port] = lab.name
    obs = OBS_PORTS
    assert not set(obs) & set(taken)
    assert set(run_ports()) == set(taken) | set(obs)  # what run-tests checks is all of it
    span = range(min(taken), max(*taken, obs.stop) + 1)
    for offset in RUN_TESTS_PORT_OFFSETS:
        assert span.stop + offset <= RENDEZVOUS_PORTS_START < EPHEMERAL_PORTS.start, offset
        assert span.start + offset >= APP_PORTS.stop, offset
    for a, b in itertools.combinations(RUN_TESTS_PORT_OFFSETS, 2):
        assert abs(a - b) >= len(span), (a, b)  # two runs' labs never overlap
    # Each lab numbers its jobs from its own block of 200 ids, from its slurmctld port
    # (slurm-lab's first_job_id), and a job's rendezvous port is 20000 + (7 x id + 131 x
    # restart) mod 6000 (slurmfm.job.hosts.choose_port): the blocks of the labs of a run, at
    # each of run-tests' offsets, must be different modulo 6000, or two labs' jobs (host-b's
    # 3002 and resil's 27002 under the old blocks) take the same port at once.
    ctlds = [16817, 16827, 16837, *(lab.ctld_port for lab in labs.values())]
    assert "first_job_id() { echo $(( 1 + (CTLD_PORT / 10 % 30) * 200 )); }" in script
    for off in RUN_TESTS_PORT_OFFSETS:
        ids = [1 + (c + off) // 10 % 30 * 200 + i for c in ctlds for i in range(200)]
        assert len({j % 6000 for j in ids}) == len(ids), off
        ports = {hosts.choose_port(j, 0, 20000, 6000, (32768, 60999), lambda p: True) for j in ids}
        assert len(ports) == len(ids), off


def quickstart_lab_ports(offset: int) -> set[int]:
    """Every port a user's quickstart lab may take at ``offset``: any suite's lab of up to
    MAX_NODES (scripts/quickstart starts the host's; its user may start the others)."""
    return {
        p + offset
        for ctld, slurmd in SHARED_LAB_PORTS.values()
        for p in [ctld, *range(slurmd, slurmd + MAX_NODES)]
    }


def test_the_ports_tests_give_servers_are_below_every_lab() -> None:
    """The serving tests' ports (free_port, and router_ports for a prefill/decode job's router
    and its two servers) come from APP_PORTS, which every lab port lies above at every offset
    (the test above). router_ports once drew from 12000-23999: a job held a port of the
    32-node sim-host lab when that lab came up, and all its tests failed."""
    for _ in range(50):
        port = router_ports()
        assert {port, port + 1, port + 2} <= set(APP_PORTS), port
    assert free_port() in APP_PORTS


def test_a_run_and_a_quickstart_lab_never_share_a_port() -> None:
    """The README's two commands in order: a quickstart lab left up, then run-tests. The
    offsets run-tests tries first keep every port of its labs below any quickstart lab's, so
    neither can take the other's port, whichever starts first."""
    assert set(QUICKSTART_PORT_OFFSETS) == set(range(0, 1000, 20))  # scripts/quickstart
    quickstart = set().union(*(quickstart_lab_ports(q) for q in QUICKSTART_PORT_OFFSETS))
    assert min(quickstart) == QUICKSTART_LOWEST_PORT
    ports = run_ports()
    first, second, *_ = RUN_TESTS_PORT_OFFSETS
    for off in (first, second):
        assert max(ports) + off < QUICKSTART_LOWEST_PORT, off
    # what went wrong at offset 0: the quickstart lab's slurmd held topo-host's 17241
    assert 17241 in ports
    assert 17241 in quickstart


def test_pick_offset_checks_every_port_of_the_run() -> None:
    ports = run_ports()
    # a quickstart lab at 400 (slurmctld 17217, slurmd 17401-17416): offset 0 is taken even
    # though no slurmctld port of the run's labs is held
    held = quickstart_lab_ports(400)
    assert pick_offset(held, ports, offsets=(0, -3000)) == -3000
    assert pick_offset(held, ports) == RUN_TESTS_PORT_OFFSETS[0]
    # another run's labs (any one port of them) hold the first offset: the next one
    for port, lab in sorted(ports.items())[:: max(1, len(ports) // 7)]:
        busy = {port + RUN_TESTS_PORT_OFFSETS[0]}
        assert pick_offset(busy, ports) == RUN_TESTS_PORT_OFFSETS[1], lab
    # this root's own labs of an earlier run hold the ports of its offset: that one is fine
    busy = {p + RUN_TESTS_PORT_OFFSETS[0] for p in ports}
    assert pick_offset(busy, ports, own=RUN_TESTS_PORT_OFFSETS[0]) == RUN_TESTS_PORT_OFFSETS[0]
    everything = {p + off for p in ports for off in RUN_TESTS_PORT_OFFSETS}
    assert pick_offset(everything, ports) is None
    assert pick_offset(everything, ports, own=-6000) == -6000


def test_pick_offset_sees_a_real_listening_socket() -> None:
    """What run-tests reads (/proc/net/tcp) shows a socket that listens on one slurmd port of
    the first offset, and that offset is ruled out (which one is taken instead depends on what
    else listens on this machine)."""
    import socket

    ports = run_ports()
    first, second, *_ = RUN_TESTS_PORT_OFFSETS
    port = first + min(p for p, lab in ports.items() if lab == "topo-host" and p > 17201)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:  # held already (another run's topo-host lab): the same for the check
            pass
        else:
            s.listen()
        listening = listening_ports()
        assert port in listening
        assert pick_offset(listening, ports, offsets=(first,)) is None
        assert pick_offset(listening, ports, offsets=(first, second)) != first


# ------------------------------------------------------------------ what a chroot gets of the host
REPO = Path("/work/slurmfm")


def test_a_pyenv_python_is_bound_whole() -> None:
    """A venv inside the checkout on a pyenv Python: the checkout and that Python's prefix,
    nothing inside them again (the interpreter's files and stdlib lie within)."""
    base = Path("/root/.pyenv/versions/3.11.7")
    venv = REPO / ".venv"
    binds = select_binds(
        REPO,
        venv,
        base,
        [base / "lib/python3.11", base / "lib/python3.11/lib-dynload", venv / "lib/python3.11"],
        [venv / "bin/python", venv / "bin/python3", base / "bin/python3", base / "bin/python3.11"],
    )
    assert binds == [REPO, base]


def test_debians_python_binds_its_own_pieces_not_usr() -> None:
    """A venv made from Debian's /usr/bin/python3 (base_prefix /usr, which slurm-lab refuses):
    the stdlib dir (with lib-dynload inside it) and each name on the way from the venv's
    python to the binary, and nothing else of /usr."""
    venv = Path("/var/tmp/venv")
    usr = Path("/usr")
    binds = select_binds(
        REPO,
        venv,
        usr,
        [usr / "lib/python3.11", usr / "lib/python3.11/lib-dynload", venv / "lib/python3.11"],
        [venv / "bin/python", venv / "bin/python3", usr / "bin/python3", usr / "bin/python3.11"],
    )
    assert binds == [
        REPO,
        venv,
        usr / "lib/python3.11",
        usr / "bin/python3",
        usr / "bin/python3.11",
    ]


def test_the_system_python_without_a_venv_binds_its_site_packages_too() -> None:
    """No venv (prefix = base_prefix = /usr): the packages come from sys.path's directories
    under /usr, so those are bound; the refused prefix itself never is."""
    usr = Path("/usr")
    entries = [
        usr / "lib/python3.11",
        usr / "local/lib/python3.11/dist-packages",
        usr / "lib/python3/dist-packages",
        REPO / "tests",
    ]
    binds = select_binds(REPO, usr, usr, entries, [usr / "bin/python3.11"])
    assert binds == [REPO, *entries[:3], usr / "bin/python3.11"]
    assert not set(binds) & REFUSED_BINDS


@pytest.mark.parametrize("prefix", ["/opt", "/usr", "/home", "/"])
def test_no_refused_directory_is_ever_named(prefix: str) -> None:
    p = Path(prefix)
    binds = select_binds(REPO, p, p, [p, p / "lib/python3.11"], [p / "bin/python3"])
    assert not set(binds) & REFUSED_BINDS, binds
    assert p / "lib/python3.11" in binds


def test_refused_binds_are_what_slurm_lab_refuses() -> None:
    """tests/lab.py picks what to bind by the list that scripts/slurm-lab enforces: a prefix
    the script would refuse is split into its pieces instead of failing the lab's start."""
    text = LAB_SCRIPT.read_text()
    m = re.search(r"^\s*(/\|[^)\s]*)\)\n\s*die \"SLURMFM_LAB_BIND: refusing", text, re.M)
    assert m is not None
    assert set(map(Path, m.group(1).split("|"))) == REFUSED_BINDS


def test_interpreter_files_follow_each_symlink_to_the_binary(tmp_path: Path) -> None:
    """venv/bin/python -> python3 -> /usr/bin/python3 -> python3.11, as `python3 -m venv` on
    Debian makes it: every name on the way must exist in the chroot, each with its directory
    resolved (a symlinked directory is mounted at its target)."""
    usr_bin = tmp_path / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    (usr_bin / "python3.11").write_text("")
    (usr_bin / "python3").symlink_to("python3.11")
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python3").symlink_to(usr_bin / "python3")
    (venv_bin / "python").symlink_to("python3")
    (tmp_path / "link").symlink_to(tmp_path / "venv")
    real = tmp_path.resolve()
    assert interpreter_files(tmp_path / "link" / "bin" / "python") == [
        real / "venv/bin/python",
        real / "venv/bin/python3",
        real / "usr/bin/python3",
        real / "usr/bin/python3.11",
    ]
    assert interpreter_files(usr_bin / "python3.11") == [real / "usr/bin/python3.11"]


def test_the_observability_packages_are_listed_only_when_missing(tmp_path: Path) -> None:
    """run-tests installs what `obs-stack list-debs` prints in its one apt-get: the two Debian
    packages when either program is missing, nothing when both are there."""
    script = LAB_SCRIPT.parent / "obs-stack"

    def listed(prometheus: str, exporter: str) -> str:
        env = {**os.environ, "SLURMFM_PROMETHEUS": prometheus, "SLURMFM_NODE_EXPORTER": exporter}
        proc = subprocess.run(
            [str(script), "list-debs"], env=env, capture_output=True, text=True, check=True
        )
        return proc.stdout.strip()

    gone = str(tmp_path / "gone")
    assert listed(gone, "/bin/true") == "prometheus prometheus-node-exporter"
    assert listed("/bin/true", gone) == "prometheus prometheus-node-exporter"
    assert listed("/bin/true", "/bin/true") == ""
