"""Access to the real local Slurm lab started by ``scripts/slurm-lab``.

The fixtures in ``conftest.py`` use :func:`find_lab` to locate a running lab:

* ``slurm_lab``: the lab named by ``$SLURMFM_LAB`` (a lab directory), else the
  host lab ``$SLURMFM_LAB_ROOT/host``.
* ``slurm_lab_suite(suite)``: a newer-Slurm chroot lab (``trixie``/``sid``), only
  if ``$SLURMFM_LAB_SUITES`` (comma list) names the suite.

A test uses a lab only when the run asks for one: ``$SLURMFM_LAB`` or ``$SLURMFM_LAB_ROOT`` is
set (``scripts/run-tests`` sets the root of its own labs). Without either, real tests skip
instead of picking up a lab that another checkout started under the default root. A lab that is
not up makes the test skip, or fail when ``SLURMFM_REQUIRE_SLURM=1`` (CI sets it). Client
commands must run with :attr:`SlurmLab.env`: it carries ``SLURM_CONF`` and, for chroot suites,
the wrapper directory first on ``PATH``.

Ports: every lab port here and in ``scripts/slurm-lab`` is below Linux's ephemeral range
(32768-60999, ``/proc/sys/net/ipv4/ip_local_port_range``), where any ``srun`` or torch process
may hold a port at the moment a lab starts. ``$SLURMFM_LAB_PORT_OFFSET`` moves all of a run's
labs together, so that two checkouts can test at the same time (``scripts/README-lab.md``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from slurmfm.job.node import environ, stat_fields

REPO_ROOT = Path(__file__).resolve().parent.parent
LAB_SCRIPT = REPO_ROOT / "scripts" / "slurm-lab"
SUITES = ("host", "trixie", "sid")


DEFAULT_LAB_ROOT = Path("/var/tmp/slurmfm-lab")
# Linux's default net.ipv4.ip_local_port_range: ports the kernel hands out to outgoing
# connections and to bind(port 0) (https://www.kernel.org/doc/Documentation/networking/ip-sysctl.txt).
EPHEMERAL_PORTS = range(32768, 61000)


def lab_root() -> Path:
    return Path(os.environ.get("SLURMFM_LAB_ROOT") or DEFAULT_LAB_ROOT)


# Ports tests give to servers inside jobs (serving stand-ins): below every lab port (10000 and
# up, with any offset run-tests picks), below the rendezvous ports slurmfm's jobs take
# (20000-25999, slurmfm/job/hosts.py choose_port) and the ephemeral range.
APP_PORTS = range(5000, 10000)
# Lab ports stay below these: slurmfm's torch rendezvous ports start here.
RENDEZVOUS_PORTS_START = 20000


def router_ports() -> int:
    """A free port on 127.0.0.1 whose next two are free too (an SGLang prefill/decode job's
    router takes it and its servers the next two), from :data:`APP_PORTS`.

    Why there: below every lab port, the jobs' rendezvous ports and SGLang's dist ports
    (26000-31999). It once drew from 12000-23999, where the labs of a run at offset -3000
    listen: a prefill/decode job held 14713 when the 32-node ``sim-host`` lab came up on
    14701-14732, and every test of that lab failed (CI, stop 50)."""
    import random
    import socket

    def free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    for _ in range(200):
        port = random.randrange(APP_PORTS.start, APP_PORTS.stop - 2)
        if all(free(port + i) for i in (0, 1, 2)):
            return port
    raise AssertionError("no three free ports in a row")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, from APP_PORTS, in random order.

    Why not bind(port 0): the kernel answers from the ephemeral range, which every outgoing
    connection draws from too, so the port may be taken again before the job's server binds it.
    """
    import random
    import socket

    for port in random.sample(APP_PORTS, len(APP_PORTS)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {APP_PORTS}")


def worker_index() -> int:
    """This pytest-xdist worker's number (gw3 -> 3), 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)


def lab_requested() -> bool:
    """Did this run ask for a lab (its own root, or one lab directory)?"""
    return bool(os.environ.get("SLURMFM_LAB_ROOT") or os.environ.get("SLURMFM_LAB"))


def port_offset() -> int:
    """``$SLURMFM_LAB_PORT_OFFSET``: added to every lab port of this run (default 0; run-tests
    picks one of :data:`RUN_TESTS_PORT_OFFSETS`)."""
    raw = os.environ.get("SLURMFM_LAB_PORT_OFFSET", "") or "0"
    return int(raw)


# The shared labs' default ports (scripts/slurm-lab): slurmctld's, and the first slurmd's.
SHARED_LAB_PORTS = {"host": (16817, 17001), "trixie": (16827, 18001), "sid": (16837, 19001)}
# scripts/slurm-lab's largest --nodes: a lab's slurmd ports may reach this far.
MAX_NODES = 72
# tests/observe: Prometheus and node_exporter, 2 ports per xdist worker, up to 8 workers.
OBS_PORTS = range(19190, 19190 + 2 * 8)
# scripts/quickstart's offsets (a multiple of 20 below 1000, from the user name): a user's
# quickstart lab takes the shared labs' ports moved by one of these, so no port below
# QUICKSTART_LOWEST_PORT.
QUICKSTART_PORT_OFFSETS = range(0, 1000, 20)
QUICKSTART_LOWEST_PORT = min(p for pair in SHARED_LAB_PORTS.values() for p in pair)
# The offsets scripts/run-tests tries for a run's labs, in this order (pick_offset). The first
# two put every port of the run below QUICKSTART_LOWEST_PORT, so a run's labs and any user's
# quickstart lab can never meet, whichever of them starts first (README's two commands in
# order: a run at 0 once took topo-host's slurmd port 17241 that a quickstart lab held). 0
# comes last, for a third run at once, and only when none of its ports is taken now.
RUN_TESTS_PORT_OFFSETS = (-3000, -6000, 0)


def register_own_labs() -> None:
    """Import every test module that defines OwnLabs, so that all of them are in OWN_LABS."""
    import importlib.util

    tests = Path(__file__).resolve().parent
    for path in sorted(tests.rglob("test_*.py")):
        if "OwnLab(" in path.read_text():
            spec = importlib.util.spec_from_file_location(f"_ports_{path.stem}", path)
            assert spec is not None
            assert spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(path.parent))
            try:
                spec.loader.exec_module(module)
            finally:
                sys.path.remove(str(path.parent))


# The labs' slurmrestd and sshd (scripts/slurm-lab rest-up, ssh-up: remote_port), and the
# REST port tests/test_slurm_lab.py gives its down-trixie lab (SLURMFM_LAB_REST_PORT).
REMOTE_LAB_PORTS = {
    "host:rest": 19171,
    "host:ssh": 19173,
    "trixie:rest": 19175,
    "sid:rest": 19177,
    "down-trixie:rest": 19179,
}


def run_ports() -> dict[int, str]:
    """Every port a test run's labs may take at offset 0, with the lab that takes it: the shared
    suites (up to MAX_NODES slurmds), every OwnLab, and the observability servers.

    Why all of them: a port check of slurmctld's ports alone let a run start at an offset
    whose slurmd ports a quickstart lab held, and two tests failed on "already in use"."""
    register_own_labs()
    taken: dict[int, str] = {}
    for suite, (ctld, slurmd) in SHARED_LAB_PORTS.items():
        for port in [ctld, *range(slurmd, slurmd + MAX_NODES)]:
            taken[port] = suite
    for lab in OWN_LABS:
        for port in lab.ports:
            taken.setdefault(port, lab.name)
    for port in OBS_PORTS:
        taken.setdefault(port, "observe")
    for name, port in REMOTE_LAB_PORTS.items():
        taken.setdefault(port, name)
    return taken


def listening_ports() -> set[int]:
    """The TCP ports something listens on now, on any address (/proc/net/tcp and tcp6: the
    local address's port in hex, state 0A is LISTEN; proc(5))."""
    ports: set[int] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def pick_offset(
    listening: set[int],
    ports: Iterable[int],
    offsets: Sequence[int] = RUN_TESTS_PORT_OFFSETS,
    own: int | None = None,
) -> int | None:
    """The first of ``offsets`` at which none of ``ports`` is in ``listening``, or ``own`` (the
    offset an earlier run of the same lab root chose: its labs, still up, hold those very
    ports) when it comes first; None when every offset is taken (pure, for tests)."""
    wanted = list(ports)
    for off in offsets:
        if off == own or not any(p + off in listening for p in wanted):
            return off
    return None


def pick_offset_now(own: str = "") -> int | None:
    """:func:`pick_offset` against this machine's listening ports (scripts/run-tests)."""
    return pick_offset(listening_ports(), run_ports(), own=int(own) if own else None)


NOT_REQUESTED = (
    "no Slurm lab requested: set SLURMFM_LAB_ROOT to the root of this run's labs "
    "(scripts/run-tests does) or SLURMFM_LAB to one lab directory"
)


# About how long each lab's group of real tests takes (seconds, CI simulation on 2 cores).
# Only the order matters: with `--dist loadgroup --no-loadscope-reorder` (scripts/run-tests) the
# workers take whole groups in collection order, so the longest start first and no long group
# is left to start last on a worker that is already busy (longest processing time first).
# A group not listed counts as short.
GROUP_SECONDS = {
    # Test-seconds per group (--durations=0), the mean of four CI simulations on one fresh
    # machine (2026-12-07, night: 5 and 6 workers); the comments say what takes them.
    "shared-trixie": 305,
    # torch faults: an ImportError, retries in the job (2), a hang ~80 s, a spare swap ~45 s
    "evidence": 285,
    # torch faults: a failed pre-timeout save ~60 s, Megatron's early exit, a killed runtime;
    # the time limit without the pre-timeout signal ~130 s (stand-in training, a real limit)
    "evidence2": 275,
    "host-b": 275,  # host-only: the README example, owner requeue, reasons, shared FSx
    # real vLLM data-parallel replicas, one per node, on a lab of their own (issue 44)
    "vllm-dp-host": 270,
    "resil": 265,  # a time-limit save cycle ~110 s, a node death ~100 s (real torch)
    "shared-host": 235,
    "shared-sid": 210,
    # restart cap ~30 s, slurmctld away ~50 s, late save ~120 s, the gate in the launch ~25 s
    "resil2": 200,
    # launcher ray's cluster (~45 s) and its killed worker node (~110-150 s)
    "ray-host": 180,
    # real vLLM, tensor parallel 2 across the lab's two nodes (no Ray): waits for its install
    # if need be, ~100-200 s to healthy and through its checks under load (issue 44)
    "vllm-host": 175,
    # real Pyxis: 2 modes x (a 3-node rank check, a Megatron save cycle), the env, NeMo
    "pyxis-host": 120,
    "host-c": 115,  # the 22.05 dependency, pipeline and array tests (pytest.mark.host_c)
    "sim-host": 110,
    "pyxis-trixie": 90,
    "simblock-trixie": 80,  # select_block vs 24.11: 4 fabrics, ~80 picks, lab up and down
    "simblock-sid": 79,  # select_block vs 26.05
    "pyxis-sid": 68,
    "sim72-host": 64,
    # 36 nodes up; the 26.05 rank order under tree and block, with and without TopologyParam
    "newer-sid": 54,
    # + test_gb200_nodelist_across_ultraservers: ~30 s on sid (an 8-node job runs), ~18 s on
    # trixie (submissions only), measured alone on 2026-12-07
    "plan-sid": 47,
    "nudge-host": 45,
    "plan-trixie": 44,
    "topo-host": 36,
    "down-trixie": 35,
    "topo-sid": 31,
    "metrics-sid": 21,
    "topo-trixie": 18,
    "yaml-sid": 17,
    # SGLang prefill/decode behind the real router (issue 44): lab up 6 s and the job 26 s on
    # a quiet machine, 33 s and 42 s on a loaded one (2026-12-07)
    "pd-host": 13,
}


# Directories scripts/slurm-lab refuses to bind into a chroot (chroot_mount): each would give a
# job, or an rm -rf of the chroot, most of the host. tests/test_slurm_lab.py checks that the
# script refuses exactly these.
REFUSED_BINDS = frozenset(
    map(
        Path,
        [
            "/",
            "/root",
            "/tmp",
            "/opt",
            "/home",
            "/usr",
            "/etc",
            "/var",
            "/var/tmp",
            "/proc",
            "/sys",
            "/dev",
        ],
    )
)


def select_binds(
    repo: Path,
    prefix: Path,
    base_prefix: Path,
    path_entries: Sequence[Path],
    interpreter: Sequence[Path],
) -> list[Path]:
    """What a chroot job needs from the host to run this Python (pure: paths in, paths out).

    ``prefix``/``base_prefix`` are the venv's and its base Python's (``sys.prefix``,
    ``sys.base_prefix``), ``path_entries`` the directories on ``sys.path`` and ``interpreter``
    the executable with every symlink on the way to the real binary (:func:`interpreter_files`).
    A prefix is bound whole (pyenv: ``/root/.pyenv/versions/3.11.7``), unless slurm-lab would
    refuse it: Debian's own ``python3`` has ``base_prefix`` ``/usr``. Then only the
    ``sys.path`` directories under it are bound (the stdlib ``/usr/lib/python3.11`` with its
    ``lib-dynload``), and the interpreter files (the venv's ``python3`` points at
    ``/usr/bin/python3``, which points at ``python3.11``): the rest of the host's ``/usr``
    stays out of the chroot. The shared libraries that interpreter links come from the chroot's
    own packages (slurm-lab's ``CHROOT_PKGS``). Paths inside another are dropped.
    """
    wanted: list[Path] = [repo]
    for p in (prefix, base_prefix):
        if p not in REFUSED_BINDS:
            wanted.append(p)
        else:
            wanted += [e for e in path_entries if e.is_relative_to(p) and e not in REFUSED_BINDS]
    wanted += interpreter
    binds: list[Path] = []
    for d in wanted:
        if not any(d == k or d.is_relative_to(k) for k in binds):
            binds = [k for k in binds if not k.is_relative_to(d)] + [d]
    return binds


def interpreter_files(executable: Path) -> list[Path]:
    """``executable`` and each symlink target after it, up to the real file, each with its
    directory resolved but not its own name: a job runs ``venv/bin/python3``, the kernel
    follows it to ``/usr/bin/python3`` and on to ``/usr/bin/python3.11``, so each of these
    names must exist in the chroot."""
    files: list[Path] = []
    p = Path(os.path.realpath(executable.parent)) / executable.name
    for _ in range(40):  # Linux's limit on symlinks in one lookup (MAXSYMLINKS, path_resolution(7))
        files.append(p)
        if not p.is_symlink():
            break
        nxt = p.parent / os.readlink(p)
        p = Path(os.path.realpath(nxt.parent)) / nxt.name
    return files


def job_binds() -> str:
    """What jobs in a chroot lab need from the host, for ``SLURMFM_LAB_BIND`` (read-only).

    This checkout, the venv that runs the tests (``sys.prefix``) and the Python it was made
    from (``sys.base_prefix``: the venv's ``python3`` is a symlink to it), or only that
    Python's own pieces when it is the system's (:func:`select_binds`). Nothing wider, so that
    a job in the chroot sees no more of the host than it needs.
    """
    entries = [Path(e).resolve() for e in sys.path if e and Path(e).is_dir()]
    binds = select_binds(
        REPO_ROOT,
        Path(sys.prefix).resolve(),
        Path(sys.base_prefix).resolve(),
        entries,
        interpreter_files(Path(sys.executable)) if sys.executable else [],
    )
    return ":".join(str(d) for d in binds)


def last_attempt_ranks(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``rank`` events of a job's last attempt, one per rank, by rank.

    Why: a job's log is opened in append mode, so a job that slurmfm requeued (a rank that
    aborted at exit, a lost node) holds the rank lines of every attempt; counting them all
    counts each rank twice. Attempts run one after another, so the last line of each rank is
    from the last attempt.
    """
    last: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "rank":
            last[int(e["rank"])] = e
    return [last[r] for r in sorted(last)]


def read_text(path: Path) -> str:
    """A file's text, or "" while a job has not created it yet."""
    return path.read_text() if path.exists() else ""


def wait_until(
    what: str, check: Callable[[], bool], timeout: float, shown: Callable[[], str] = lambda: ""
) -> None:
    """Poll ``check`` every quarter second until it holds; fail naming ``what`` after ``timeout``.

    Why one helper: real tests wait on what a job writes (a log line, a state-file event, a
    Slurm field), never a fixed sleep; ``shown`` adds what was seen last (a log tail) to the
    failure so a timeout explains itself.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    raise AssertionError(f"not seen within {timeout} s: {what}\n{shown()[-3000:]}")


def live_pids(key: str, value: str) -> list[int]:
    """The live (not zombie) processes on this machine whose environment has ``key=value``.

    Why by environment: every node of a lab runs on this host, so a job's processes (or a
    lab's daemons) are found here by what Slurm or the lab put in their environment, whoever
    their parent is now. The parsing is the runtime's own (:func:`slurmfm.job.node.environ`,
    :func:`slurmfm.job.node.stat_fields`)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and environ(int(name)).get(key) == value:
            state = stat_fields(int(name))[:1]
            if state and state != ["Z"]:
                pids.append(int(name))
    return sorted(pids)


def job_processes(job_id: str) -> list[str]:
    """The processes on this machine that belong to Slurm job ``job_id`` (``SLURM_JOB_ID``),
    as "pid command line".

    Why: Slurm's proctrack/linuxproc signals only what it finds under a step's tasks, and one
    that lost its parent escapes it (it ran on after the job, holding the step's output:
    slurmstepd "Abandoning IO 60 secs after job shutdown initiated").
    """
    found = []
    for pid in live_pids("SLURM_JOB_ID", job_id):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue  # ended meanwhile
        found.append(f"{pid} {cmd.decode(errors='replace').strip()}")
    return found


def wait_for_text(path: Path, text: str, timeout: float) -> str:
    """Wait until ``text`` is in the file at ``path``; return the file's text."""
    wait_until(
        f"{text!r} in {path}", lambda: text in read_text(path), timeout, lambda: read_text(path)
    )
    return read_text(path)


def signal_batch_until_recorded(
    lab: SlurmLab, job_id: str, state_path: Path, timeout: float = 120.0, every: float = 15.0
) -> int:
    """Send the pre-timeout USR2 as Slurm's ``--signal=B:USR2@N`` does (``scancel --batch
    --signal=USR2``, https://slurm.schedmd.com/scancel.html) until the job runtime has recorded
    it (``event=signal`` in the state file); how many were sent.

    Why again: scancel's exit status says slurmctld took the request, not that the batch step
    got the signal. Once, in a CI run on a loaded machine, one never arrived: the job trained
    to its end with no ``event=signal`` and no ``USR2 received`` line. The runtime acts on the
    first USR2 only, so a second one changes nothing once the first has come.
    """
    sent = 0
    deadline = time.monotonic() + timeout
    while True:
        sig = lab.run(["scancel", "--batch", "--signal=USR2", job_id])
        assert sig.returncode == 0, sig.stderr
        sent += 1
        resend = min(deadline, time.monotonic() + every)
        while time.monotonic() < resend:
            if " event=signal " in read_text(state_path):
                return sent
            time.sleep(0.25)
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"job {job_id}: no USR2 recorded after {sent} sent in {timeout} s\n"
                + read_text(state_path)
            )


def slurm_required() -> bool:
    return os.environ.get("SLURMFM_REQUIRE_SLURM", "") == "1"


def requested_suites() -> set[str]:
    raw = os.environ.get("SLURMFM_LAB_SUITES", "")
    return {s.strip() for s in raw.split(",") if s.strip()}


def _read_kv(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _source_env(env_sh: Path) -> dict[str, str]:
    """The environment after sourcing env.sh into the current one."""
    proc = subprocess.run(
        ["bash", "-c", '. "$1" && env -0', "slurm-lab-env", str(env_sh)],
        capture_output=True,
        check=True,
    )
    env: dict[str, str] = {}
    for item in proc.stdout.split(b"\0"):
        key, sep, value = item.decode().partition("=")
        if sep:
            env[key] = value
    return env


@dataclass(frozen=True)
class SlurmLab:
    """A running lab: where it is, what it is, and how to talk to it."""

    lab_dir: Path
    suite: str
    env: dict[str, str]
    version: str
    topology: dict[str, Any]
    config: dict[str, str]

    @property
    def jobs_dir(self) -> Path:
        return self.lab_dir / "jobs"

    @property
    def slurm_conf(self) -> Path:
        return Path(self.env["SLURM_CONF"])

    @property
    def nodes(self) -> int:
        return int(self.config["NODES"])

    @property
    def gpus_per_node(self) -> int:
        return int(self.config["GPUS"])

    def run(self, args: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        """subprocess.run with the lab's environment, text output captured."""
        kw.setdefault("env", self.env)
        kw.setdefault("text", True)
        kw.setdefault("capture_output", True)
        return subprocess.run(list(args), check=False, **kw)

    @staticmethod
    def slurmfm_argv() -> list[str]:
        """How to run this checkout's ``slurmfm`` CLI."""
        return [sys.executable, "-m", "slurmfm.cli"]

    def slurmfm(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the ``slurmfm`` CLI (this checkout's) from the repository root against the lab."""
        return self.run([*self.slurmfm_argv(), *args], cwd=REPO_ROOT, timeout=timeout)

    def lab_command(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``scripts/slurm-lab --lab <dir> ARGS`` (needs root)."""
        return self.run([str(LAB_SCRIPT), "--lab", str(self.lab_dir), *args], timeout=300)

    def hostnames(self, hostlist: str) -> list[str]:
        """Expand a Slurm hostlist with ``scontrol show hostnames``."""
        proc = self.run(["scontrol", "show", "hostnames", hostlist])
        if proc.returncode != 0:
            raise RuntimeError(f"scontrol show hostnames {hostlist}: {proc.stderr}")
        return proc.stdout.split()

    def wait_job(self, job_id: str, timeout: float = 60.0) -> dict[str, str]:
        """Poll ``scontrol show job`` until the job has finished; return its fields."""
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            proc = self.run(["scontrol", "show", "job", "-o", job_id])
            if proc.returncode == 0:
                fields = dict(tok.split("=", 1) for tok in proc.stdout.split() if "=" in tok)
                state = fields.get("JobState", "")
                # SIGNALING: Slurm is delivering a signal to the running job (not an end)
                running = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", ""}
                if state not in running:
                    return fields
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} not finished after {timeout}s: {fields}")


def _problem(lab_dir: Path) -> str | None:
    """Why the lab at lab_dir cannot be used, or None if it is up and healthy."""
    if not (lab_dir / "lab.conf").is_file() or not (lab_dir / "env.sh").is_file():
        return f"no Slurm lab at {lab_dir} (start one with scripts/slurm-lab up)"
    if os.geteuid() != 0:
        return "the Slurm lab needs root"
    proc = subprocess.run(
        [str(LAB_SCRIPT), "--lab", str(lab_dir), "status"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        return f"Slurm lab at {lab_dir} is not healthy:\n{proc.stdout}{proc.stderr}"
    return None


# scripts/run-tests starts the real tier while the chroot labs and the Pyxis build may still
# be coming up in the background; each writes $SLURMFM_LAB_ROOT/logs/up-<name>.rc when done.
PENDING_ENV = "SLURMFM_LABS_PENDING"


def await_background(name: str, timeout: float = 1200.0) -> None:
    """Wait until run-tests' background ``up`` of ``name`` (a chroot suite, "pyxis", "vllm") ended;
    fail with its log's tail when it failed. Nothing to wait for outside run-tests."""
    if name not in os.environ.get(PENDING_ENV, "").split(","):
        return
    logs = lab_root() / "logs"
    rc_file = logs / f"up-{name}.rc"
    deadline = time.monotonic() + timeout
    while not rc_file.is_file():
        if time.monotonic() > deadline:
            pytest.fail(f"the {name} lab was not up after {timeout:g} s ({logs})")
        time.sleep(1.0)
    rc = rc_file.read_text().strip()
    if rc != "0":
        tail = read_text(logs / f"up-{name}.log")[-3000:]
        pytest.fail(f"the {name} lab did not come up (exit {rc}):\n{tail}")


def find_lab(lab_dir: Path, *, required: bool) -> SlurmLab:
    """Return the lab at lab_dir, or skip (fail if required) when it is not up."""
    problem = _problem(lab_dir) if lab_requested() else NOT_REQUESTED
    if problem is not None:
        if required:
            pytest.fail(problem)
        pytest.skip(problem)
    config = _read_kv(lab_dir / "lab.conf")
    env = _source_env(lab_dir / "env.sh")
    topology: dict[str, Any] = json.loads((lab_dir / "topology.json").read_text())
    version_out = subprocess.run(
        ["sinfo", "--version"], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return SlurmLab(
        lab_dir=lab_dir,
        suite=config.get("SUITE", "host"),
        env=env,
        version=version_out[-1] if version_out else config.get("VERSION", ""),
        topology=topology,
        config=config,
    )


def default_lab_dir() -> Path:
    explicit = os.environ.get("SLURMFM_LAB")
    return Path(explicit) if explicit else lab_root() / "host"


def host_lab() -> SlurmLab:
    return find_lab(default_lab_dir(), required=slurm_required())


SuiteLabFactory = Callable[[str], SlurmLab]


def suite_lab_factory() -> SuiteLabFactory:
    """A cached ``suite -> SlurmLab`` lookup for newer-Slurm chroot labs."""
    cache: dict[str, SlurmLab] = {}

    def get(suite: str) -> SlurmLab:
        if suite not in SUITES:
            raise ValueError(f"unknown suite {suite!r}; expected one of {SUITES}")
        if suite not in requested_suites():
            pytest.skip(f"suite {suite} not in SLURMFM_LAB_SUITES")
        if suite not in cache:
            await_background(suite)
            cache[suite] = find_lab(lab_root() / suite, required=slurm_required())
        return cache[suite]

    return get


def _unavailable(msg: str) -> None:
    """Skip, or fail when the run requires real Slurm (CI)."""
    if slurm_required():
        pytest.fail(msg)
    pytest.skip(msg)


@dataclass(frozen=True)
class OwnLab:
    """A test module's own lab, on ports no other lab uses (``scripts/README-lab.md``, "Ports").

    Tests that change a lab (its topology, node states, killed slurmds) bring up one of these
    so that the shared labs stay as ``scripts/run-tests`` started them, and so that they can
    run beside each other. ``options`` are further ``slurm-lab`` options for ``up``;
    ``extra_env`` goes to every ``slurm-lab`` call (fault hooks, bind mounts).
    """

    name: str
    ctld_port: int
    slurmd_port: int
    nodes: int
    suite: str = "host"
    options: tuple[str, ...] = ()
    extra_env: tuple[tuple[str, str], ...] = ()
    path: Path | None = None  # default: lab_root() / name
    registered: bool = field(default=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Every OwnLab is recorded, so that one test can check that no two of them share a port
        # and that none reaches into the ephemeral range (tests/test_slurm_lab.py).
        if self.registered:
            OWN_LABS.append(self)

    @property
    def ports(self) -> list[int]:
        """slurmctld's port and the slurmd ports, before ``$SLURMFM_LAB_PORT_OFFSET``."""
        return [self.ctld_port, *range(self.slurmd_port, self.slurmd_port + self.nodes)]

    @property
    def dir(self) -> Path:
        return self.path if self.path is not None else lab_root() / self.name

    def env(self) -> dict[str, str]:
        off = port_offset()
        env = {
            **os.environ,
            "SLURMFM_LAB_CTLD_PORT": str(self.ctld_port + off),
            "SLURMFM_LAB_SLURMD_PORT": str(self.slurmd_port + off),
            **dict(self.extra_env),
        }
        if self.suite != "host":  # the chroot must see this checkout at the same path
            env.setdefault("SLURMFM_LAB_BIND", job_binds())
        return env

    def command(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``slurm-lab --suite S --lab DIR ARGS...`` with this lab's ports."""
        return subprocess.run(
            [str(LAB_SCRIPT), "--suite", self.suite, "--lab", str(self.dir), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def healthy(self) -> bool:
        return (self.dir / "lab.conf").is_file() and self.command(
            "status", timeout=120
        ).returncode == 0

    def up(self) -> SlurmLab:
        """Start this lab (or keep it, when healthy and of this size) and return it.

        The host suite always runs, like the host lab; chroot suites only when
        ``SLURMFM_LAB_SUITES`` names them. ``up`` restarts missing daemons of a lab of the
        same size; a lab of another size is taken down first, since ``up`` keeps a lab's saved
        node count.
        """
        if not lab_requested():
            _unavailable(NOT_REQUESTED)
        shared = {(lab_root() / s).resolve() for s in SUITES}
        if self.dir.resolve() in shared:
            pytest.fail(f"{self.dir} is a shared lab (scripts/run-tests starts it); use another")
        if self.suite != "host" and self.suite not in requested_suites():
            pytest.skip(f"suite {self.suite} not in SLURMFM_LAB_SUITES")
        if os.geteuid() != 0:
            _unavailable("the Slurm lab needs root")
        # a chroot lab's first up builds the suite's chroot: never two builds at once
        await_background(self.suite)
        conf = self.dir / "lab.conf"
        same_size = conf.is_file() and f"NODES={self.nodes}\n" in conf.read_text()
        if not (same_size and self.healthy()):
            if conf.is_file() and not same_size:
                self.command("down")
            proc = self.command("--nodes", str(self.nodes), *self.options, "up")
            if proc.returncode != 0:
                _unavailable(
                    f"cannot bring up {self.dir}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
                )
        return find_lab(self.dir, required=slurm_required())


OWN_LABS: list[OwnLab] = []

F = TypeVar("F", bound=Callable[..., Any])


# A second lab like the shared host lab (Slurm 22.05, slurm-lab's default 16 nodes), for tests
# that run on the host only (tests/conftest.py, host_b_lab): the host's tests are the longest
# group of the real tier, and on their own they kept one worker busy minutes after the others
# had finished. Defined here, not in conftest.py, so that run_ports (scripts/run-tests' port
# check, which imports no conftest) counts its ports.
HOST_B = OwnLab("host-b", ctld_port=19127, slurmd_port=18801, nodes=16)

# A third lab like the shared host lab, for the host variants of the tests marked
# ``pytest.mark.host_c`` (tests/conftest.py, host_c_lab; their variants on 24.11 and 26.05
# stay on the shared chroot labs): the shared host lab's group was again the real tier's
# longest (539 test-seconds of 71 tests, 2026-12-07), and a group runs on one worker, so the
# run waited for it. Tests marked so must rely on nothing of the shared lab but its Slurm
# (they get this lab from ``slurm_lab``, ``each_lab`` and ``every_lab``).
HOST_C = OwnLab("host-c", ctld_port=18877, slurmd_port=18971, nodes=16)


def own_lab_fixture(*labs: OwnLab) -> Callable[[F], F]:
    """Declare that a fixture brings up these OwnLabs (put it under ``@pytest.fixture``).

    ``tests/conftest.py`` reads the declaration: a test that uses the fixture is in the ``real``
    tier, and in the xdist group of the lab it drives, so that no two workers ever drive the
    same lab at once. A fixture of several labs (one per suite) must be used by tests with a
    ``suite`` parameter, which names the lab; collection fails otherwise.
    """

    def mark(func: F) -> F:
        func.__dict__["slurmfm_own_labs"] = {lab.suite: lab.name for lab in labs}
        return func

    return mark


def job_record(lab: SlurmLab, job_id: str) -> dict[str, str]:
    """``scontrol show job -o JOB`` as a record."""
    from slurmfm.backends.slurm_cli import parse_scontrol_record

    return parse_scontrol_record(lab.run(["scontrol", "show", "job", "-o", job_id]).stdout)


def wait_job_done(lab: SlurmLab, job_id: str, timeout: float) -> dict[str, str]:
    """The job's record once it ended. Slurm holds a requeued job for about two minutes
    before it is eligible again; releasing it at once fails it ("Job credential revoked": the
    last run is still being cleaned up), so a hold is released only after 20 s, once KillWait
    and the cleanup have passed."""
    deadline = time.monotonic() + timeout
    rec: dict[str, str] = {}
    held_since: float | None = None
    while time.monotonic() < deadline:
        rec = job_record(lab, job_id)
        if rec.get("JobState") in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}:
            return rec
        if rec.get("JobState") == "PENDING" and rec.get("Reason") == "BeginTime":
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since > 20:
                lab.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
                held_since = None
        else:
            held_since = None
        time.sleep(1)
    raise AssertionError(f"job {job_id} not done after {timeout} s: {rec}")
