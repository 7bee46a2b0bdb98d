"""The per-node entry: every launch step runs ``python3 RUNTIME node ... -- COMMAND``.

It finds this node's rank in the host order, inserts ``--node-rank=R`` into the command, and
runs it with USR2 ignored. Why ignored: Slurm delivers a signal sent to ``srun`` to every process
of the step (proctrack), so torchrun itself would die of the pre-timeout USR2; the training
processes install their own USR2 handler (slurmfm.checkpoint.SaveRequest), which replaces the
inherited "ignore". For Megatron-LM (``--forward TERM``) the entry sends TERM to the launcher's
children on USR2: Megatron's ``--exit-signal-handler`` saves on SIGTERM. For NeMo 2.0
(``--forward TERM --forward-tasks``) the launched process is itself the training process (one
task per GPU, no launcher), so it gets the TERM: NeMo's ``PreemptionCallback`` stops the
trainer on it and its ``ModelCheckpoint`` saves the last checkpoint at the end of training
(NVIDIA/NeMo:nemo/lightning/pytorch/callbacks/preemption.py, model_checkpoint.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import gate, masking
from .evidence import LaunchWatch, write_private
from .health import run_command
from .hosts import expand_hostlist, insert_rank, node_rank, replayed_order, with_master

if TYPE_CHECKING:
    from .health import Runner
    from .options import NodeOptions


# Set by the batch step in the launch's environment where each node's entry (:func:`main`, on
# the node's first task) runs the node's observability agent (:func:`.agent.fork`) instead of
# an agents' step; not passed on to the launch.
IN_ENTRY = "SLURMFM_OBS_IN_ENTRY"
# Set by each node's entry in its launcher's environment: the entry's pid. The launch task
# Slurm started is the entry (in a container too), and the launcher its child.
ENTRY_PID = "SLURMFM_ENTRY_PID"


def children(pid: int, proc: str = "/proc") -> list[int]:
    """Direct children of ``pid``: ``/proc/PID/task/*/children`` or, without it, a stat scan."""
    kids: list[int] = []
    task_dir = os.path.join(proc, str(pid), "task")
    try:
        for tid in os.listdir(task_dir):
            with open(os.path.join(task_dir, tid, "children"), encoding="ascii") as fh:
                kids.extend(int(x) for x in fh.read().split())
        return kids
    except (OSError, ValueError):
        pass
    for name in os.listdir(proc) if os.path.isdir(proc) else []:
        if name.isdigit() and parent(int(name), proc) == pid:
            kids.append(int(name))
    return kids


def environ(pid: int, proc: str = "/proc") -> dict[str, str]:
    """The environment ``pid`` was started with (empty when it cannot be read)."""
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def stat_fields(pid: int, proc: str = "/proc") -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's name (``[0]`` the state, ``[1]``
    the parent, ``[19]`` the start time); empty when it cannot be read. The name, in
    parentheses, may itself hold spaces and ")": the fields begin after its last ")"."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return []
    _, paren, rest = text.rpartition(")")
    return rest.split() if paren else []


def parent(pid: int, proc: str = "/proc") -> int:
    """``pid``'s parent (0 when it cannot be read)."""
    try:
        return int(stat_fields(pid, proc)[1])
    except (IndexError, ValueError):
        return 0


def start_time(pid: int, proc: str = "/proc") -> str:
    """``pid``'s start time in clock ticks after boot (field 22 of ``/proc/PID/stat``), "" when
    it cannot be read: with the pid it names one process, though the kernel reuses pids."""
    fields = stat_fields(pid, proc)
    return fields[19] if len(fields) > 19 else ""


def launch_tops(job: str, node: str = "", proc: str = "/proc") -> list[int]:
    """This node's launch tasks of job ``job``: the processes Slurm started for the launch
    step (the launcher: torchrun), found by their environment, not by ancestry.

    Why by environment: in a Pyxis container the launcher is not a child of anything the
    runtime runs on the host, but it still is a host process (Pyxis makes no PID namespace)
    whose environment holds Slurm's ``SLURM_JOB_ID`` and the runtime's ``SLURMFM_STEP=launch``
    (Pyxis passes the host environment into the container). A task is a process whose
    ``SLURM_TASK_PID`` is its own pid: slurmstepd sets it to the pid of each task it starts
    ("SLURM_TASK_PID: The process ID of the task being started", https://slurm.schedmd.com/
    srun.html#OPT_SLURM_TASK_PID), and the container's ``sh`` program ``exec``s the launcher
    in that same process. Other processes carry the step's environment without being a task:
    the launcher's own children, and with Pyxis' ``use_squashfuse=1`` Enroot's ``fuse-shim``
    with its ``squashfuse`` (and ``fuse-overlayfs``) children, which hold the container's root
    file system (github.com/NVIDIA/enroot src/runtime.sh, runtime::_mount_rootfs); a TERM there
    takes the file system away from the training it was meant to save. With ``node``, only the
    tasks Slurm started on that node (``SLURMD_NODENAME``) count, where several nodes share
    one kernel (the test lab).
    """
    tops = []
    for name in os.listdir(proc) if os.path.isdir(proc) else []:
        if name.isdigit() and int(name) != os.getpid():
            env = environ(int(name), proc)
            if (
                env.get("SLURM_JOB_ID") == job
                and env.get("SLURMFM_STEP") == "launch"
                and env.get("SLURM_TASK_PID") == name
                and env.get("SLURMD_NODENAME", "") == (node or env.get("SLURMD_NODENAME", ""))
            ):
                tops.append(int(name))
    return sorted(tops)


def catches(pid: int, sig: int, proc: str = "/proc") -> bool:
    """Whether ``pid`` has a handler for ``sig`` installed (``SigCgt`` of ``/proc/PID/status``,
    proc(5)); True when that cannot be read, so that the signal is sent rather than lost.

    A worker still starting up has none yet: USR2 is still ignored there (the launcher's
    ignore, inherited), so it would be lost, and a TERM would end it unsaved.
    """
    try:
        with open(os.path.join(proc, str(pid), "status"), encoding="ascii") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return True


def started_by(kid: int, task: int, job: str, proc: str = "/proc") -> bool:
    """Whether ``kid``, a child of launch task ``task``, is one the launcher started: it
    carries the task's environment (torchrun hands its own to the workers).

    Not every child of the task is: with ``use_squashfuse=1`` Pyxis starts the container from
    the task, and Enroot's holder (``sh -c "kill -STOP $$ ; exit 0"``, with Enroot's own small
    environment) stays a child of it, holding ``fuse-shim`` and ``squashfuse`` below it
    (github.com/NVIDIA/pyxis pyxis_slurmstepd.c, enroot_container_start). A TERM to the holder
    ends the container's root file system with it.
    """
    env = environ(kid, proc)
    return env.get("SLURM_JOB_ID") == job and env.get("SLURM_TASK_PID") == str(task)


def forward_to_workers(
    job: str,
    sig: int,
    node: str = "",
    proc: str = "/proc",
    sent: set[tuple[int, str]] | None = None,
    tasks: bool = False,
) -> list[int]:
    """Send ``sig`` to the children of this node's launchers (``tasks``: to the launched
    processes themselves, NeMo's training processes); the pids signalled. A launch task is
    the runtime's node entry, whose launcher is its child (:func:`entry_launcher`), or, in
    an image without python3, the launcher itself.

    The host-side half of the save signal for a launch in a container (docs/features.md,
    "Containers"):
    Megatron-LM saves on SIGTERM (``--exit-signal-handler``), which must reach the training
    processes and not torchrun, which would end them (a launcher's TERM stops its workers:
    pytorch/pytorch:torch/distributed/elastic/agent/server/api.py). A process already in
    ``sent`` (pid and start time) is skipped, and the ones signalled now are added: each
    process gets the signal once, however often the runtime asks; one that has no handler
    for it yet (:func:`catches`) gets it in a later round.
    """
    done: set[tuple[int, str]] = set() if sent is None else sent
    out: list[int] = []
    for top in launch_tops(job, node, proc):
        launcher = entry_launcher(top, proc)
        if launcher:  # the task is the runtime's node entry: its launcher is the one meant
            kids = [launcher] if tasks else children(launcher, proc)
        else:
            kids = [top] if tasks else children(top, proc)
        for kid in kids:
            if not tasks and not started_by(kid, top, job, proc):
                continue
            key = (kid, start_time(kid, proc))
            if key in done or not catches(kid, sig, proc):
                continue  # signalled already, or not ready for it yet: the next round
            with contextlib.suppress(OSError):
                os.kill(kid, sig)
                out.append(kid)
                done.add(key)
    return out


def entry_launcher(task: int, proc: str = "/proc") -> int:
    """The launcher the node entry ``task`` started (its child marked with
    :data:`ENTRY_PID`), or 0 where ``task`` is the launcher itself (no entry: an image
    without python3)."""
    for kid in children(task, proc):
        if environ(kid, proc).get(ENTRY_PID) == str(task):
            return kid
    return 0


def forward_until_done(
    job: str,
    sig: int,
    node: str = "",
    proc: str = "/proc",
    poll_s: float = 2.0,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
    sleep: Callable[[float], None] = time.sleep,
    tasks: bool = False,
) -> int:
    """Signal this node's training processes once, then every new one until the launch ends.

    The runtime starts this step once per save signal on every node (one ``srun``, not one
    every ``resignal_s``: on 128+ nodes a new job step each time loads slurmctld and blocks
    the runtime loop). A worker gets it once it has installed its handler: one still starting
    up, or started later (a launcher restarting one), gets it then; none gets it twice. The
    step ends with the launch on this node. Returns how many processes were signalled.
    """
    sent: set[tuple[int, str]] = set()
    name = signal.Signals(sig).name
    while True:
        new = forward_to_workers(job, sig, node, proc, sent, tasks)
        if new:
            say(
                "slurmfm: %s: %s to %d training process(es)%s"
                % (node or "?", name, len(new), " more" if len(sent) > len(new) else "")
            )
        if not launch_tops(job, node, proc):
            return len(sent)
        sleep(poll_s)


def container_remove(
    name: str, run: Runner = run_command, earlier: bool = False
) -> list[str] | None:
    """Remove this node's Enroot containers of the Pyxis container name ``name``; their names
    (None: ``enroot list`` failed, e.g. no ``enroot`` on the job's PATH). ``earlier``: those
    of the job's earlier attempts in the same role instead (``slurmfm-JOB-K-ROLE``, K below
    this attempt's): a scancel past KillWait or a node reboot left them, each with a whole
    unpacked image (render.container.container_name).

    Pyxis keeps a named container after its step: as ``pyxis_NAME``, or ``pyxis_JOBID_NAME``
    where the admin set ``container_scope=job`` (then Pyxis removes it itself at the job's
    end) (github.com/NVIDIA/pyxis pyxis_slurmstepd.c). Enroot keeps each user's containers
    apart (``ENROOT_DATA_PATH``), so a job can only remove its own user's.
    """
    rc, out = run(["enroot", "list"], 60)
    if rc != 0:
        print("slurmfm: enroot list: " + out.strip(), file=sys.stderr, flush=True)
        return None
    scoped = re.compile(r"pyxis_(?:[0-9]+_)?" + re.escape(name))
    mine = [c for c in out.split() if scoped.fullmatch(c)]
    attempt = re.fullmatch(r"(slurmfm-[0-9]+-)([0-9]+)(-.+)", name)
    if earlier:
        if attempt is None:
            return []
        head, now, role = attempt.groups()
        pattern = re.compile(r"pyxis_(?:[0-9]+_)?%s([0-9]+)%s" % (re.escape(head), re.escape(role)))
        found = [(c, pattern.fullmatch(c)) for c in out.split()]
        mine = [c for c, m in found if m is not None and int(m.group(1)) < int(now)]
    return [c for c in mine if run(["enroot", "remove", "--force", c], 120)[0] == 0]


def exit_code(returncode: int) -> int:
    """A shell-style exit code: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def node_addrs(text: str) -> dict[str, str]:
    """``"h1=a1 h2=a2"`` (exported by the batch step) as a dict."""
    out = {}
    for kv in text.split():
        host, _, addr = kv.partition("=")
        if host:
            out[host] = addr or host
    return out


def run_launcher(
    argv: Sequence[str],
    forward: str,
    env: dict[str, str],
    watch: LaunchWatch | None = None,
    stdin: int | None = None,
    forward_tasks: bool = False,
    first_on_term: Callable[[], object] | None = None,
) -> int:
    """Run ``argv`` with USR2 ignored; on USR2 send ``forward`` to its children (with
    ``forward_tasks``: to the launched process itself, NeMo's training process).
    ``first_on_term`` runs at a TERM before the launcher is told (a Ray head's own Ray).

    With ``watch`` its stderr passes through a pipe (copied to ours line by line) so that the
    node's report names the exception and rank (:mod:`.evidence`), and a TERM from srun
    before the launcher ended marks this node as stopped for another's failure. ``stdin``:
    the launcher's standard input (the gate's channel, :mod:`.gate`, is not the training's).
    """
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # inherited by the child across exec
    # the host's `forward` step finds the launcher below this entry by it (forward_to_workers)
    env = dict(env, **{ENTRY_PID: str(os.getpid())})
    if watch is not None:
        env = watch.environ(env)
    child: subprocess.Popen[bytes] | None = None
    early: list[int] = []  # TERMs that came before Popen returned

    def on_term(signum: int, frame: object) -> None:
        # Slurm signals the whole step; the launcher gets TERM itself. Wait for its status.
        if first_on_term is not None:
            first_on_term()
        if child is None:
            early.append(signum)  # passed on once Popen has returned (below)
            return
        if watch is not None and child.poll() is None:
            watch.stopped = True
        with contextlib.suppress(OSError):
            child.send_signal(signum)

    # The TERM handler is in place before the launcher exists. Slurm's proctrack/linuxproc
    # signals the processes it finds under the task when the step is cancelled and never
    # looks again: a TERM that reached this entry between the fork and a handler installed
    # afterwards killed the entry alone, and the launcher, never signalled and now a child of
    # init, outlived the job with the step's output open (seen on the lab: torchrun still
    # running 11 minutes after an scancel 0.2 s into the launch, slurmstepd "Abandoning IO
    # 60 secs after job shutdown initiated"). A TERM that comes while Popen runs is passed on
    # once Popen returns: then the launcher has exec'd (Popen waits for that), so it takes the
    # signal with its own disposition, not with this interpreter's handler copied by fork.
    signal.signal(signal.SIGTERM, on_term)
    child = subprocess.Popen(
        list(argv), env=env, stdin=stdin, stderr=subprocess.PIPE if watch is not None else None
    )
    if early:  # one TERM however many came: a second could cut short the launcher's shutdown
        on_term(early[0], None)
    if watch is not None:
        watch.follow(child.stderr)

    sent: list[int] = []

    def on_usr2(signum: int, frame: object) -> None:
        if forward == "none" or (forward_tasks and sent):
            # The batch step repeats the save signal for workers still starting up; a task
            # that is the training process has had its TERM (NeMo's preemption handler
            # raises on each one, so a second could land in the middle of the save).
            return
        sent.append(signum)
        sig = getattr(signal, "SIG" + forward)
        for kid in [child.pid] if forward_tasks else children(child.pid):
            with contextlib.suppress(OSError):
                os.kill(kid, sig)

    signal.signal(signal.SIGUSR2, on_usr2)
    rc = exit_code(child.wait())
    # Ignored again, not left to Python's handler: at exit the interpreter puts SIG_DFL back
    # for a signal with a Python handler (CPython Modules/signalmodule.c, _PySignal_Fini), so
    # a resent save signal would kill this task while it exits 0, after its workers (seen
    # on the lab: a node whose ranks had finished ended by "User defined signal 2").
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if watch is not None:
        watch.finish(rc)
    return rc


RAY_OWNER = "SLURMFM_RAY_OWNER"


def stop_own_ray(
    owner: str,
    proc: str = "/proc",
    kill: Callable[[int, int], None] = os.kill,
    sleep: Callable[[float], None] = time.sleep,
    wait_s: float = 3.0,
) -> list[int]:
    """Stop this node's own Ray: the processes whose environment carries ``owner`` (TERM,
    then KILL after ``wait_s``, within Slurm's KillWait); the pids found.

    Not ``ray stop``: it stops every Ray of the user on the host (ray/scripts/scripts.py,
    ``stop``: processes found by name), another job's too where jobs share a node. Ray's
    daemons inherit the environment ``ray start`` got (``run_ray_node`` sets ``owner``
    there) and leave its process tree, so they are found by their environment, as the
    launch's processes are (:func:`launch_tops`).
    """

    def mine() -> list[int]:
        found = []
        for name in os.listdir(proc) if os.path.isdir(proc) else []:
            if (
                name.isdigit()
                and int(name) != os.getpid()
                and environ(int(name), proc).get(RAY_OWNER) == owner
            ):
                found.append(int(name))
        return sorted(found)

    pids = mine()
    for sig, pause in ((signal.SIGTERM, wait_s), (signal.SIGKILL, 0.0)):
        left = mine()
        for p in left:
            with contextlib.suppress(OSError):
                kill(p, sig)
        waited = 0.0
        while left and waited < pause:
            sleep(0.25)
            waited += 0.25
            left = mine()
        if not left:
            break
    return pids


# Each node's Ray keeps its sockets, logs and session files in a private directory of its own
# (``--temp-dir``, per node since Ray 2.x: ray/scripts/scripts.py ``start``; inside a
# ``mkdtemp`` directory, 0700, removed at the end), not in ``/tmp/ray``, which every Ray on the
# host shares, and whose ``ray_current_cluster`` names the last head started there. The server
# and the readiness count connect by address (``RAY_ADDRESS``, which ``ray.init`` takes before
# any file: ray/_private/services.py ``get_ray_address_from_environment``), so they join this
# job's cluster, never another one on the host. A Ray cluster for a driver (launcher ray) runs
# the same sequence with its own parameters (:func:`run_ray_driver`).
RAY_PRIVATE_TEMP = "slurmfm-ray-"


def run_ray_node(
    argv: Sequence[str],
    rank: int,
    head: str,
    own_addr: str,
    ray: str,
    python: str,
    port: int,
    nnodes: int,
    timeout_s: float,
    env: dict[str, str],
    run: Runner = run_command,
    call: Callable[[Sequence[str], dict[str, str]], int] = lambda a, e: subprocess.call(
        list(a), env=e
    ),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    retry_s: float = 5.0,
    poll_s: float = 2.0,
    launch: Callable[[Sequence[str], str, dict[str, str]], int] = run_launcher,
    stop: Callable[[str], object] = stop_own_ray,
    make_temp: Callable[[str], str] | None = None,
    what: str = "the server",
    head_args: Sequence[str] = (),
    head_retry: bool = False,
    count: Callable[[str, str, int, float, Runner], int] | None = None,
) -> int:
    """vLLM across nodes (vLLM examples/online_serving/multi-node-serving.sh, run_cluster.sh).

    Node 0 starts the Ray head, waits until every node's Ray worker is alive, then serves; the
    other nodes join as workers, retrying while the head starts. Every node pins Ray and vLLM
    to its own Slurm NodeAddr (``--node-ip-address``, ``VLLM_HOST_IP``): on a multi-NIC host
    (p5: EFA and ENA interfaces) Ray and vLLM would otherwise pick an address themselves, and
    vLLM's run_cluster.sh usage gives each node its own ``VLLM_HOST_IP``. ``call``, ``run``
    and ``launch`` are injectable so tests see what each node was told without Ray. Each
    node stops only its own Ray at the end (:func:`stop_own_ray`), marked in the environment
    of its ``ray start`` with this job, step and node.

    Each node's Ray keeps its files in a private directory (:data:`RAY_PRIVATE_TEMP`).
    """
    import shutil  # here, with tempfile and .serve: only a Ray node needs them

    from .serve import ray_alive

    if make_temp is None:
        import tempfile

        make_temp = lambda prefix: tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # noqa: E731
    deadline = clock() + timeout_s
    job = env.get("SLURM_JOB_ID", "")
    # by Slurm node name: lab nodes share 127.0.0.1 (a stop by address stopped the head's Ray)
    owner = "%s.%s.%s" % (job, env.get("SLURM_STEP_ID", ""), env.get("SLURMD_NODENAME") or own_addr)
    addr = "%s:%d" % (head, port)
    env = dict(env, VLLM_HOST_IP=own_addr, RAY_ADDRESS=addr, **{RAY_OWNER: owner})
    private = make_temp(RAY_PRIVATE_TEMP + "%s-" % job)
    # Ray makes its temp dir writable by everyone (ray/_private/utils.py
    # try_to_create_directory chmods it 0777); inside a 0700 directory nobody else reaches it.
    temp = os.path.join(private, "r")
    try:
        if rank != 0:
            join = [ray, "start", "--address=" + addr, "--node-ip-address=" + own_addr]
            return _ray_worker(
                [*join, "--temp-dir=" + temp, "--block"],
                env,
                call,
                lambda: clock() >= deadline,
                lambda: sleep(retry_s),
                lambda: stop(owner),
                f"slurmfm: Ray worker could not join {addr} within {timeout_s:g} s",
            )
        start = [ray, "start", "--head", "--port=%d" % port, "--node-ip-address=" + own_addr]
        late: Callable[[], bool] = lambda: clock() >= deadline  # noqa: E731
        if not _ray_head(
            [*start, "--temp-dir=" + temp, *head_args],
            env,
            call,
            lambda: not head_retry or late(),
            lambda: sleep(retry_s),
            lambda: stop(owner),
        ):
            return 1
        while True:
            if count is not None:  # one process that waits (run_ray_driver)
                alive = count(python, addr, nnodes, max(deadline - clock(), 1.0), run)
            else:
                alive = ray_alive(python, addr, run)
            if alive >= nnodes:
                break
            if late():
                msg = "slurmfm: only %d of %d Ray nodes joined within %g s"
                print(msg % (alive, nnodes, timeout_s), file=sys.stderr)
                stop(owner)
                return 1
            sleep(poll_s)
        print("slurmfm: Ray cluster has %d nodes; starting %s" % (nnodes, what), flush=True)
        return _ray_launch(launch, argv, env, lambda: stop(owner))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _ray_launch(
    launch: Callable[[Sequence[str], str, dict[str, str]], int],
    argv: Sequence[str],
    env: dict[str, str],
    stop: Callable[[], object],
) -> int:
    """The head's launch once every node joined, its own Ray stopped at the end. Slurm gives
    a cancelled step KillWait (30 s by default; the lab's 5 s) before SIGKILL, and the head's
    launcher may take longer to end: the Ray daemons, which left the step's process tree, go
    at the TERM itself (with the entry's own launcher; an injected one ends them after)."""
    try:
        if launch is run_launcher:
            return run_launcher(argv, "none", env, first_on_term=stop)
        return launch(argv, "none", env)
    finally:
        stop()


def _ray_worker(
    join: Sequence[str],
    env: dict[str, str],
    call: Callable[[Sequence[str], dict[str, str]], int],
    late: Callable[[], bool],
    pause: Callable[[], None],
    stop: Callable[[], object],
    why: str,
) -> int:
    """A worker node of :func:`run_ray_node`: ``ray start --block`` until it joins (tried
    again while the head starts, until ``late()``), its own Ray stopped at the end. Slurm ends
    the step with TERM (scancel, the job's end): this node's Ray is stopped then too, since
    its daemons leave the step's process tree."""
    old = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        while call(join, env) != 0:
            if late():
                print(why, file=sys.stderr)
                return 1
            pause()
        return 0
    finally:
        stop()
        signal.signal(signal.SIGTERM, old)


def _ray_head(
    start: Sequence[str],
    env: dict[str, str],
    call: Callable[[Sequence[str], dict[str, str]], int],
    give_up: Callable[[], bool],
    pause: Callable[[], None],
    stop: Callable[[], object],
) -> bool:
    """The head node's ``ray start --head`` of :func:`run_ray_node`, tried again until
    ``give_up()`` (what a failed start left is stopped first: its GCS holds the port)."""
    while call(start, env) != 0:
        stop()
        if give_up():
            print("slurmfm: ray start --head failed", file=sys.stderr)
            return False
        print("slurmfm: ray start --head failed; starting it again", file=sys.stderr)
        pause()
    return True


def head_listening(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether the Ray head's GCS port takes a connection (one TCP connect, closed at once)."""
    import socket  # here: only a Ray worker's entry asks

    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


# A worker's try to join before the head's GCS port answered (:func:`follow_head`).
HEAD_NOT_UP = 75


def follow_head(
    head: str,
    port: int,
    popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    up: Callable[[str, int], bool] = head_listening,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 2.0,
    misses: int = 2,
    stop: Callable[[str], object] = stop_own_ray,
    ended: Callable[[], bool] = lambda: True,
    ready: Callable[[], bool] = lambda: True,
) -> Callable[[Sequence[str], dict[str, str]], int]:
    """A Ray worker's ``ray start --block`` that ends when the head is gone.

    Why: a served model's step ends by Slurm's TERM, but a driver's step ends when its tasks
    do, and a worker's ``ray start --block`` would outlive the head by the raylet's own wait
    for the GCS (``gcs_rpc_server_reconnect_timeout_s``, 60 s by default: ray-project/ray
    src/ray/common/ray_config_def.h), then exit 1, failing a finished job. The head stops its
    Ray once the driver ended (:func:`run_ray_node`); ``misses`` polls in a row without the
    head's GCS port, once ``ended`` says the driver did, end this worker with 0. Why both: a
    head whose start failed stops its Ray and starts it again (``head_retry``), and its port
    closes then too; ``ended`` is the head's report in the attempt's evidence directory, which
    its entry writes when the driver ends, before it stops its Ray (:func:`run_ray_driver`).
    Meanwhile the worker's raylet, without its GCS, ends ``ray start``, and the worker joins
    the new head. ``ray start`` itself ending gives its exit (non-zero before the head was up:
    :func:`run_ray_node` retries).

    No ``ray start`` before the head's GCS port answers: each try is a Python start that
    imports Ray (seconds of CPU), and on the lab's two cores, where every node runs, the
    workers' tries while the head started made its raylet miss its own start-up timeout.
    Nor before ``ready``: the head's mark in the attempt's evidence directory that its own
    ``ray start --head`` returned (its raylet registered): a worker that joins a GCS whose head
    raylet is still starting fails ("No node info found for head node in GCS") and loads the
    head's cores meanwhile. Until then the answer is :data:`HEAD_NOT_UP`, which
    :func:`run_ray_node` retries until its deadline.
    """

    def call(argv: Sequence[str], env: dict[str, str]) -> int:
        if not ready() or not up(head, port):
            return HEAD_NOT_UP
        child = popen(list(argv), env=env)
        gone = 0
        while True:
            rc = child.poll()
            if rc is not None:
                if rc != 0 and env.get(RAY_OWNER):
                    stop(env[RAY_OWNER])  # a failed join's agents, before the next try
                return int(rc)
            if up(head, port):
                gone = 0
            else:
                gone += 1
                if gone >= misses and ended():
                    print(
                        "slurmfm: the Ray head %s:%d is gone (its driver ended); this worker "
                        "stops" % (head, port),
                        flush=True,
                    )
                    return 0
            sleep(poll_s)

    return call


# One Python that imports Ray and connects once, then counts the alive nodes every second
# until there are enough or its time is up, printing each count (the last is the answer).
RAY_WAIT = (
    "import ray, sys, time\n"
    "ray.init(address=sys.argv[1])\n"
    "n, end = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])\n"
    "while True:\n"
    "    alive = sum(bool(x['Alive']) for x in ray.nodes())\n"
    "    print(alive, flush=True)\n"
    "    if alive >= n or time.monotonic() >= end:\n"
    "        break\n"
    "    time.sleep(1)\n"
)


def ray_wait_alive(python: str, address: str, nnodes: int, wait_s: float, run: Runner) -> int:
    """The Ray nodes alive once ``nnodes`` joined or ``wait_s`` passed: one process that waits,
    where :func:`.serve.ray_alive` (vLLM's count) starts Python and connects at every poll.
    Why: each of those starts imports Ray (seconds of CPU); on the lab's two cores, where
    every node's Ray starts too, the polls slowed the workers' raylets past Ray's own fixed
    start-up windows (:func:`run_ray_node`)."""
    from .safepath import program

    rc, out = run(
        [python, "-c", program(RAY_WAIT), address, str(nnodes), "%g" % wait_s], wait_s + 120
    )
    last = (out.strip().splitlines() or ["0"])[-1].strip()
    return int(last) if rc == 0 and last.isdigit() else 0


# ``--ray-port rdzv``: the Ray head takes the job's rendezvous port (``SLURMFM_RDZV_PORT``).
RDZV = "rdzv"


def run_ray_driver(
    argv: Sequence[str],
    rank: int,
    me: str,
    own_addr: str,
    ray: dict[str, str],
    env: dict[str, str],
    run_node: Callable[..., int] = run_ray_node,
    stop: Callable[[str], object] = stop_own_ray,
) -> int:
    """``launcher.kind: ray`` (slurmfm/launchers/ray.py): the Ray cluster of
    :func:`run_ray_node` on the job's own rendezvous host and port (node 0 of the host order,
    a port picked out of the ephemeral range unless the recipe fixes one), the driver on the
    head, watched like a training launch (its exit and exception are the node's report in the
    attempt's evidence: .evidence), the workers ending with the head (:func:`follow_head`).

    It runs :func:`run_ray_node`'s sequence
    with its own ``call`` on the workers, ``launch`` and ``head_args`` on the head (``what``:
    the log's name of what starts once every node joined), and ``head_retry``: a failed
    ``ray start --head`` is tried again until the deadline, as a worker's join is. Why: the
    raylet gives its dashboard agent a fixed 15 s to write its port files and aborts past
    them ("Timed out waiting for file .../metrics_agent_port_...", ray-project/ray
    src/ray/raylet/node_manager.cc ``WaitForDashboardAgentPorts``; Ray 2.60 does not take
    ``RAY_agent_register_timeout_ms`` there); an agent whose imports are slow (a cold page
    cache, a busy node: the lab's two cores) misses it, and the next try, warm, does not.
    ``count`` replaces the head's poll of :func:`.serve.ray_alive` (a Python start that
    imports Ray and connects, every ``poll_s``) with one call that waits.
    """
    head = env.get("SLURMFM_RDZV_HOST", "")
    port = int(env.get("SLURMFM_RDZV_PORT", "0") if ray["port"] == RDZV else ray["port"])
    evidence = env.get("SLURMFM_EVIDENCE_DIR", "")

    def driver(words: Sequence[str], _forward: str, denv: dict[str, str]) -> int:
        watch = LaunchWatch(evidence, me) if evidence and os.path.isdir(evidence) else None
        return run_launcher(words, "none", denv, watch)

    # No dashboard: the driver runs on the head itself (no `ray job submit`), and the
    # dashboard's fixed ports (8265; its agent's 52365) would be taken by the first of two
    # jobs sharing a node. No usage report: compute nodes often have no way out (Ray's
    # usage-stats page: https://docs.ray.io/en/latest/cluster/usage-stats.html).
    head_args = ["--include-dashboard=false", "--disable-usage-stats"]
    # the head's report (LaunchWatch.finish) is written once the driver ended: the workers'
    # sign that a closed GCS port is the end, not the head starting its Ray again
    order = env.get("SLURMFM_HOST_ORDER", "").split()
    report = os.path.join(evidence, "%s.json" % order[0]) if evidence and order else ""
    # the head's mark that its Ray started (its raylet registered): the workers' go
    started = os.path.join(evidence, "%s.ray-head" % order[0]) if evidence and order else ""

    def count(python: str, addr: str, nnodes: int, wait_s: float, run: Runner) -> int:
        if started and not os.path.exists(started):  # called once `ray start --head` returned
            write_private(started, addr + "\n")
        return ray_wait_alive(python, addr, nnodes, wait_s, run)

    extra: dict[str, Any] = {
        "launch": driver,
        "what": "the driver",
        "head_args": head_args,
        "head_retry": True,
        "count": count,
    }
    if rank != 0:
        extra["call"] = follow_head(
            head,
            port,
            ended=(lambda: os.path.exists(report)) if report else (lambda: True),
            ready=(lambda: os.path.exists(started)) if started else (lambda: True),
        )
    # Slurm ends a cancelled job's step with TERM: the head stops its Ray then too (its
    # daemons leave the step's process tree; a worker's entry does so already, run_ray_node)
    owner = "%s.%s.%s" % (
        env.get("SLURM_JOB_ID", ""),
        env.get("SLURM_STEP_ID", ""),
        env.get("SLURMD_NODENAME") or own_addr,
    )
    old = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return run_node(
            argv,
            rank,
            head,
            own_addr,
            ray["ray"],
            ray["python"],
            port,
            int(ray["nodes"]),
            float(ray["timeout"]),
            env,
            **extra,
        )
    finally:
        stop(owner)
        signal.signal(signal.SIGTERM, old)


def replayed(
    argv: Sequence[str], order: list[str], env: dict[str, str], run: Runner = run_command
) -> tuple[list[str], list[str]]:
    """A launch HyperPod's auto-resume replayed on other nodes: its order and master again.

    The batch step exports the launch's node list (``SLURMFM_LAUNCH_NODELIST``) for a launch
    with ``--auto-resume=1``; a step whose ``SLURM_STEP_NODELIST`` differs ran again after a
    replacement, so the order is recomputed (:func:`hosts.replayed_order`), exported, and the
    rendezvous host moved where node 0 now is.
    """
    words = list(argv)
    was, now = env.get("SLURMFM_LAUNCH_NODELIST", ""), env.get("SLURM_STEP_NODELIST", "")
    if not was or not now or was == now:
        return words, order
    rc, out = run(["scontrol", "show", "hostnames", now], 30.0)
    # in a container there is no scontrol: the host list read here
    nodes = out.split() if rc == 0 else expand_hostlist(now)
    if not nodes:
        return words, order
    new = replayed_order(order, nodes)
    if new and order and new[0] != order[0]:
        words = with_master(words, env.get("SLURMFM_RDZV_HOST", order[0]), new[0])
        env["SLURMFM_RDZV_HOST"] = new[0]
    env["SLURMFM_HOST_ORDER"] = " ".join(new)
    print("slurmfm: replayed on %s: host order %s" % (now, " ".join(new)), flush=True)
    return words, new


def _check_order(
    env: dict[str, str],
    order: list[str],
    rank: int,
    final: Sequence[str],
    prefix: int,
    first_task: bool,
) -> None:
    """Whether the launch's ranks follow the job's order (:mod:`.rankorder`, issue 42 item 1).

    One task per GPU: Slurm's ``SLURM_PROCID`` against the order, at once. A launcher given
    ``--node-rank`` (``prefix``): a c10d rendezvous in its words discards the node rank (said
    on node 0); its workers' ``GROUP_RANK`` is checked on a daemon thread once they start.
    Only a difference is said, so a job whose order held logs nothing more.
    """
    from . import rankorder

    me = env.get("SLURMD_NODENAME", "")
    if first_task:
        line = rankorder.launch_differs(env, order, rank)
        if line:
            print(line, flush=True)
    if prefix <= 0:
        return
    word = rankorder.c10d(final)
    if word and rank == 0:
        print(
            "slurmfm: the launch asks for %s: torchrun then ranks nodes by its rendezvous "
            "(host names sorted as text), not by the job's order; remove it (the static "
            "rendezvous with --node-rank keeps the order)" % word,
            flush=True,
        )
    if first_task:
        import threading

        threading.Thread(
            target=rankorder.check_workers,
            args=(me, rank, children, environ, os.getpid()),
            kwargs={"say": lambda s: print(s, flush=True)},
            daemon=True,
        ).start()


def vllm_node(
    argv: Sequence[str],
    rank: int,
    nnodes: int,
    vllm: tuple[str, int, int],
    env: dict[str, str],
) -> tuple[list[str], bool]:
    """vLLM across nodes: this node's command and whether it goes over Ray.

    ``vllm``: the recipe's mode (``auto``: the installed vLLM's gate, :mod:`.vllm`), the
    data-parallel replicas and those on each node. Without Ray every node gets its own flags
    (:func:`.vllm.node_words`: rank, ``--headless`` off node 0, node 0's address and the
    job's dist port, picked out of the ephemeral range by ``prepare``) and is pinned to its
    own Slurm NodeAddr (``VLLM_HOST_IP``, as the Ray path does); over Ray the server is told
    so (``--distributed-executor-backend ray``) and :func:`run_ray_node` runs it.
    """
    from . import vllm as v

    mode, dp, dp_local = vllm
    if mode == "auto":
        ok, found = v.native_supported(argv[0] if argv else "vllm", env)
        mode = "native" if ok else "ray"
        if rank == 0:
            how = "without Ray" if ok else "over Ray"
            print("slurmfm: vLLM across nodes %s (%s)" % (how, found), flush=True)
    if mode == "ray":
        return [*argv, "--distributed-executor-backend", "ray"], True
    me = env.get("SLURMD_NODENAME", "")
    env["VLLM_HOST_IP"] = node_addrs(env.get("SLURMFM_NODE_ADDRS", "")).get(me, me)
    head = env.get("SLURMFM_SERVE_HEAD", "")
    port = int(env.get("SLURMFM_SERVE_DIST_PORT", "0") or 0)
    return v.node_words(argv, rank, nnodes, head, port, dp, dp_local), False


def pd_node(
    argv: Sequence[str], rank: int, me: str, o: NodeOptions, env: dict[str, str]
) -> tuple[list[str], list[str]] | None:
    """SGLang prefill/decode (:mod:`.pd`): this node's server command from the layout that
    ``prepare`` exported, and on node 0 the router's command too ([] elsewhere); None, said
    on stderr, when the layout does not name this node."""
    from . import pd

    try:
        router_url, servers = pd.from_json(env.get(pd.ENV, ""))
    except (ValueError, KeyError, TypeError) as exc:
        print("slurmfm: no prefill/decode layout (%s): %s" % (pd.ENV, exc), file=sys.stderr)
        return None
    found = pd.mine(servers, me)
    if found is None:
        print("slurmfm: %s is in no prefill or decode server" % me, file=sys.stderr)
        return None
    server, srank = found
    words = pd.server_words(argv, server, srank, o.pd)
    if srank == 0:
        print("slurmfm: %s runs the %s server %s" % (me, server.role, server.url), flush=True)
    if rank != 0:
        return words, []
    port = int(router_url.rpartition(":")[2] or 0)
    router = pd.router_words(o.pd_router_python, servers, port, o.pd_startup_s, o.pd_router_arg)
    return words, router


def run_with_router(
    router: Sequence[str],
    argv: Sequence[str],
    forward: str,
    env: dict[str, str],
    watch: LaunchWatch | None,
    stdin: int | None,
) -> int:
    """Node 0 of SGLang prefill/decode: the router beside this node's server. The router
    ends with the server (a TERM, then a KILL after 10 s); a router that ends first stops the
    server, so that the step, and the job's readiness or health watch, see it (exit 1 at
    least)."""
    import threading

    from .safepath import RUN_MODULE, SHELL_VAR

    shown = masking.line(router, env, named={RUN_MODULE: f'"${SHELL_VAR}"'})
    print("slurmfm: node 0 runs the router: " + shown, flush=True)
    proc = subprocess.Popen(list(router), env=env, stdin=subprocess.DEVNULL)
    stopping: list[bool] = []
    died: list[int] = []

    def stop(wait: bool = True) -> None:
        stopping.append(True)
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.terminate()
        if not wait:
            return  # a TERM: the server is told at once, the router waited for below
        try:
            proc.wait(10.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()

    def follow() -> None:
        rc = proc.wait()
        if not stopping:
            died.append(exit_code(rc))
            print(
                "slurmfm: the SGLang router exited (exit %d); stopping this node's server"
                % exit_code(rc),
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGTERM)  # run_launcher's handler passes it on

    threading.Thread(target=follow, daemon=True).start()
    try:
        rc = run_launcher(argv, forward, env, watch, stdin=stdin, first_on_term=lambda: stop(False))
    finally:
        stop()
    return (rc or 1) if died else rc


def main(
    argv: Sequence[str],
    prefix: int,
    forward: str,
    ray: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    forward_tasks: bool = False,
    numa: str = "",
    vllm: tuple[str, int, int] = ("", 1, 1),
    pd: NodeOptions | None = None,
) -> int:
    env = dict(os.environ if env is None else env)
    me = env.get("SLURMD_NODENAME", "")
    order = env.get("SLURMFM_HOST_ORDER", "").split()
    argv, order = replayed(argv, order, env)
    rank = node_rank(order, me)
    if rank < 0:
        print(f"slurmfm: {me} is not in the host order", file=sys.stderr)
        return 3
    env["SLURMFM_NODE_RANK"] = str(rank)
    if rank == 0 and env.get("SLURMFM_NCCL_LOG"):
        env.update(
            NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=env["SLURMFM_NCCL_LOG"]
        )
    driver = bool(ray and ray.get("driver"))
    if vllm[0]:
        argv, over_ray = vllm_node(argv, rank, len(order), vllm, env)
        ray = ray if over_ray else None
    if ray and not driver:
        addrs = node_addrs(env.get("SLURMFM_NODE_ADDRS", ""))
        return run_ray_node(
            argv,
            rank,
            env.get("SLURMFM_SERVE_HEAD", ""),
            addrs.get(me, me),
            ray["ray"],
            ray["python"],
            int(ray["port"]),
            int(ray["nodes"]),
            float(ray["timeout"]),
            env,
        )
    router: list[str] = []
    if pd is not None:  # SGLang prefill/decode: this node's own server, the router on node 0
        picked = pd_node(argv, rank, me, pd, env)
        if picked is None:
            return 3
        argv, router = picked
    final = insert_rank(argv, prefix, rank)
    if numa:  # torchrun's --numa-binding where this launch's torch has it (.numa)
        from .numa import with_binding

        final, note = with_binding(final, prefix, numa, env)
        if note and rank == 0:
            print(note, flush=True)
    evidence = env.get("SLURMFM_EVIDENCE_DIR", "")
    first_task = env.get("SLURM_LOCALID", "0") in ("", "0")
    value = env.pop(gate.ENV, "")
    sysfs = env.get("SLURMFM_SYSFS", "/sys")
    if value and first_task and gate.check_here(value, me, evidence, sysfs) is not None:
        # Not at once: an exit now makes srun end the other nodes' tasks (the launch runs
        # with --kill-on-bad-exit) before they record their verdicts, and a spare can only
        # stand in once every node is known. The batch step closes stdin when all are in.
        gate.wait_go()
        return gate.NOT_STARTED
    if value and not gate.wait_go():
        print("slurmfm: %s did not start the launch (the health gate did not pass)" % me)
        return gate.NOT_STARTED
    if rank == 0:
        from .safepath import RUN_MODULE, SHELL_VAR

        shown = masking.line(final, env, named={RUN_MODULE: f'"${SHELL_VAR}"'})
        print("slurmfm: node 0 runs: " + shown, flush=True)
    agent = None
    if env.pop(IN_ENTRY, "") == "1" and first_task:
        # this node's observability agent, forked before any thread (batch.Batch.run_step);
        # imported here: a launch without metrics needs none of it
        from .agent import fork

        agent = fork(env)
    # after the agent's fork: its thread must not exist when the agent forks
    _check_order(env, order, rank, final, prefix, first_task)
    try:
        if ray and driver:  # a Ray cluster: after the gate, as any training launch
            addrs = node_addrs(env.get("SLURMFM_NODE_ADDRS", ""))
            return run_ray_driver(final, rank, me, addrs.get(me, me), ray, env)
        watch = LaunchWatch(evidence, me) if evidence and os.path.isdir(evidence) else None
        stdin = subprocess.DEVNULL if value else None
        if router:
            return run_with_router(router, final, forward, env, watch, stdin)
        return run_launcher(final, forward, env, watch, stdin=stdin, forward_tasks=forward_tasks)
    finally:
        if agent is not None:
            agent.stop()
