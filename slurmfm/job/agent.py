"""The per-node observability agent: one process per node of a job, for the job's whole life.

Why a separate agent, and why standard library only: node_exporter's textfile collector and
DCGM-Exporter's HPC job mapping both read *local* directories of each node, so something must
run on every node of the job; and that node may have no slurmfm installed (the training itself
may run in a container). The job runtime (:mod:`slurmfm.job`) runs it as ``python3 RUNTIME
observe`` with the node's ``python3`` (3.8 or later). Where the launch step runs this runtime's
entry on the host (:func:`slurmfm.job.batch.in_step`), each node's entry starts its node's
agent as a child process (:func:`fork`: no job step, no slurmstepd and no interpreter start
per node, which on a 64-node lab whose nodes share two cores was about 2 s of the job's
start-up); it lives as long as the launch and ends with it, writing its end snapshot and
removing its files before the entry exits. Elsewhere (a launch in a container, where no entry
runs; a server; a heterogeneous job) the agents run in one ``srun --overlap
--ntasks-per-node=1`` step beside the training, until the job ends. The same source is
imported and unit-tested as ``slurmfm.job.agent``.

What it does on its node, configured by environment variables the job script exports:

* **DCGM-Exporter job mapping** (``SLURMFM_OBS_DCGM_DIR``): one file per GPU index, named by
  the index, holding job ids one per line. DCGM-Exporter reads every file in
  ``--hpc-job-mapping-dir`` whose name is a GPU id and adds the label ``hpc_job`` to that GPU's
  metrics (NVIDIA/dcgm-exporter ``internal/pkg/transformation/hpc.go``: ``getGPUFiles`` keeps
  names that parse as integers, ``readFile`` reads one job per line, ``hpcJobAttribute =
  "hpc_job"`` in ``const.go``; README "Enabling HPC Job Mapping"). Another job's ids in the same
  file are kept; at the end only this job's line is removed (the file when it is empty).
* **Textfile metrics** (``SLURMFM_OBS_TEXTFILE_DIR``): ``slurmfm_job_<jobid>_<node>.prom`` in
  the Prometheus text format, written to a temporary name and renamed, as node_exporter's
  README asks ("Textfile Collector": files matching ``*.prom``; atomic ``mv``; timestamps are
  not supported). The node name in the file name keeps nodes that share a host (the local lab)
  apart; on a real cluster each host has its own directory. Removed at the end of the job.
* **EFA counters** (``SLURMFM_OBS_EFA=1``): every file of
  ``/sys/class/infiniband/<dev>/ports/<port>/hw_counters/`` (the EFA kernel driver's hardware
  counters, the same files the EFA node exporter reads for its ``node_amazonefa_*`` metrics:
  awsome-distributed-training ``4.validation_and_observability/3.efa-node-exporter``), saved
  at start and at end as JSON in the job's shared observe directory; ``slurmfm report``
  subtracts them. ``SLURMFM_SYSFS`` replaces ``/sys`` in tests.
* **Progress**: ``SLURMFM_PROGRESS_FILE`` (written by :mod:`slurmfm.checkpoint`) becomes the
  step and checkpoint gauges on the job's first node.

Nothing here may fail the job: a directory that is missing or not writable is reported once
on stderr and that part is skipped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

from . import fsafe

PREFIX = "slurmfm_"
STALE_TEXTFILE_S = 3 * 3600.0
_NAME_OK = re.compile(r"[^A-Za-z0-9_.-]")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

_warned: set[str] = set()


def warn(key: str, message: str) -> None:
    """Print ``message`` once per ``key`` (a directory problem repeats every interval)."""
    if key in _warned:
        return
    _warned.add(key)
    sys.stderr.write("slurmfm: observability: " + message + "\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- Prometheus text format


def escape_label_value(value: str) -> str:
    """Escape a label value for the text exposition format.

    The format allows any UTF-8 in label values with backslash, double quote and line feed
    escaped as ``\\\\``, ``\\"`` and ``\\n`` (prometheus.io "Exposition formats", text format).
    """
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP lines escape only backslash and line feed (same source)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def format_family(
    name: str, help_text: str, kind: str, samples: list[tuple[dict[str, str], float]]
) -> str:
    """One metric family as text: ``# HELP``, ``# TYPE`` and one line per sample.

    ``samples`` is a list of ``(labels, value)`` with ``labels`` a dict of str to str.
    """
    if not _METRIC_NAME.match(name):
        raise ValueError(f"invalid metric name: {name!r}")
    lines = [f"# HELP {name} {escape_help(help_text)}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        parts = []
        for key in sorted(labels):
            if not _LABEL_NAME.match(key) or key.startswith("__"):
                raise ValueError(f"invalid label name: {key!r}")
            parts.append(f'{key}="{escape_label_value(str(labels[key]))}"')
        label_text = "{" + ",".join(parts) + "}" if parts else ""
        lines.append(f"{name}{label_text} {format_value(value)}")
    return "\n".join(lines) + "\n"


def write_atomic(path: str, text: str) -> None:
    """Write to a hidden temporary name in the same directory, then rename over ``path``.

    node_exporter reads only ``*.prom``, so the temporary name is never read half-written.
    The write is slurmfm's one atomic write (:func:`slurmfm.job.fsafe.replace`: an exclusive
    temporary file with a random name, renamed over ``path``, so a planted link is replaced,
    never followed), mode 0644 for the readers (node_exporter, dcgm-exporter).
    """
    fsafe.replace(path, text, mode=0o644)


# ---------------------------------------------------------------- node facts


def safe_name(text: str) -> str:
    return _NAME_OK.sub("_", text) or "unknown"


def gpu_indices(env: dict[str, str], expected: int, cancel_fd: int | None = None) -> list[int]:
    """This node's GPU indices as DCGM numbers them (the physical index, not CUDA's).

    ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS`` hold the global ids Slurm allocated; without them,
    ``nvidia-smi --query-gpu=index`` (at most 30 s; given up at once when ``cancel_fd``
    becomes readable: the launch ended, and the entry waits for its agent); without that,
    0..expected-1 (a whole-node job).
    """
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        raw = env.get(var, "").strip()
        if raw and re.match(r"^\d+(,\d+)*$", raw):
            return sorted({int(x) for x in raw.split(",")})
    if expected <= 0:
        return []
    try:
        smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # its own group: given up, all of it ends (killpg below)
        )
    except OSError:
        return list(range(expected))
    deadline = time.monotonic() + 30.0
    try:
        while cancel_fd is not None and smi.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0 or _readable(cancel_fd, min(left, 0.1)):
                raise subprocess.TimeoutExpired(smi.args, 30.0)
        out, _ = smi.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.SubprocessError:
        with contextlib.suppress(OSError):
            os.killpg(smi.pid, signal.SIGKILL)
        smi.communicate()
        return list(range(expected))
    found = [int(x) for x in out.split() if x.isdigit()]
    return sorted(set(found)) if smi.returncode == 0 and found else list(range(expected))


def _readable(fd: int, seconds: float) -> bool:
    """Whether ``fd`` is readable (end-of-file included) within ``seconds``; True where it
    cannot be waited on (closed): either way the one who holds the other end is gone."""
    import select

    try:
        return bool(select.select([fd], [], [], seconds)[0])
    except (OSError, ValueError):
        return True


def efa_counters(sysfs: str) -> dict[str, dict[str, dict[str, int]]]:
    """``{device: {port: {counter: value}}}`` from ``<sysfs>/class/infiniband``."""
    root = os.path.join(sysfs, "class", "infiniband")
    result: dict[str, dict[str, dict[str, int]]] = {}
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return result
    for dev in devices:
        ports_dir = os.path.join(root, dev, "ports")
        try:
            ports = sorted(os.listdir(ports_dir))
        except OSError:
            result[dev] = {}
            continue
        per_port: dict[str, dict[str, int]] = {}
        for port in ports:
            hw = os.path.join(ports_dir, port, "hw_counters")
            counters: dict[str, int] = {}
            try:
                names = sorted(os.listdir(hw))
            except OSError:
                continue
            for name in names:
                try:
                    with open(os.path.join(hw, name), encoding="utf-8") as fh:
                        counters[name] = int(fh.read().strip())
                except (OSError, ValueError):
                    continue
            per_port[port] = counters
        result[dev] = per_port
    return result


def read_own_json(path: str) -> dict[str, object]:
    """The JSON object in ``path`` ({} when there is none): the progress the training writes,
    an earlier agent's node file. Both are in the shared log directory, where a link, a FIFO
    or another user's file is not ours: read as every shared file is
    (:func:`slurmfm.job.fsafe.read`)."""
    if not path:
        return {}
    try:
        data = json.loads(fsafe.read(path).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------- DCGM mapping


def map_gpus(directory: str, job_id: str, gpus: list[int]) -> list[int]:
    """Add ``job_id`` to the mapping file of each GPU; return the indices it was added to.

    A GPU whose file already names the job (a Slurm prolog that maintains the directory, as
    on HyperPod) is left to its owner: it is not returned, so it is not unmapped at the end.
    """
    if not directory:
        return []
    if not os.path.isdir(directory):
        warn("dcgm", f"DCGM job mapping directory {directory} does not exist; skipped")
        return []
    written = []
    for idx in gpus:
        path = os.path.join(directory, str(idx))
        try:
            jobs = _read_jobs(path)
            if job_id not in jobs:
                write_atomic(path, "".join(j + "\n" for j in [*jobs, job_id]))
                written.append(idx)
        except fsafe.Refused as exc:  # a link, a FIFO, another user's file: never followed
            warn("dcgm " + path, f"ignored DCGM job mapping file {exc}; GPU {idx} not mapped")
            continue
        except OSError as exc:
            warn("dcgm", f"cannot write DCGM job mapping in {directory}: {exc}; skipped")
            break
    return written


def unmap_gpus(directory: str, job_id: str, gpus: list[int]) -> None:
    """Remove ``job_id`` from each GPU's file; delete files left empty."""
    for idx in gpus:
        path = os.path.join(directory, str(idx))
        try:
            jobs = _read_jobs(path)
            rest = [j for j in jobs if j != job_id]
            if rest == jobs:
                continue
            if rest:
                write_atomic(path, "".join(j + "\n" for j in rest))
            elif os.lstat(path).st_uid == os.geteuid():  # still our own file
                os.unlink(path)
        except OSError:
            continue


def _read_jobs(path: str) -> list[str]:
    """The job ids in a GPU's mapping file, read as every shared file is (:mod:`.fsafe`: no
    link, no FIFO, this user's own or root's, one link, bounded); raises
    :class:`.fsafe.Refused`.

    Why: the mapping directory is shared by every job of the node (1777, or group-writable).
    A plain ``open()`` followed a planted link to one of our files (its contents were then
    written, with our job id, into a 0644 file the planter reads) and blocked on a FIFO."""
    refused: fsafe.Refused | None = None
    for owner in (None, 0):  # ours, or root's (a Slurm prolog that maintains the directory)
        try:
            data = fsafe.read(path, owner, limit=1 << 16)
            break
        except FileNotFoundError:
            return []
        except fsafe.Refused as exc:
            refused = refused or exc
            if "belongs to uid" not in str(exc):
                raise
    else:
        raise refused or fsafe.Refused(path)
    text = data.decode("utf-8", "replace")
    return [line.strip() for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------- the agent


class Agent:
    """State of one node's agent; :meth:`run` is the whole life cycle."""

    def __init__(self, env: dict[str, str], stop_fd: int | None = None) -> None:
        self.env = env
        # The entry's end of a pipe (:func:`fork`): end-of-file means the launch ended.
        self.stop_fd = stop_fd
        self.job_id = env.get("SLURM_JOB_ID", "0")
        self.node = env.get("SLURMD_NODENAME") or os.uname()[1]
        self.restart = int(env.get("SLURMFM_RESTART", "0") or 0)
        order = env.get("SLURMFM_HOST_ORDER", "").split()
        self.rank = order.index(self.node) if self.node in order else -1
        self.textfile_dir = env.get("SLURMFM_OBS_TEXTFILE_DIR", "")
        self.dcgm_dir = env.get("SLURMFM_OBS_DCGM_DIR", "")
        self.efa = env.get("SLURMFM_OBS_EFA", "0") == "1"
        self.obs_dir = env.get("SLURMFM_OBS_DIR", "")
        self.interval = max(1.0, float(env.get("SLURMFM_OBS_INTERVAL", "15") or 15))
        self.stop_file = env.get("SLURMFM_OBS_STOP", "")
        self.sysfs = env.get("SLURMFM_SYSFS", "/sys")
        self.progress_file = env.get("SLURMFM_PROGRESS_FILE", "")
        self.expected_gpus = int(env.get("SLURMFM_OBS_GPUS", "0") or 0)
        self.labels = {
            "jobid": self.job_id,
            "recipe": env.get("SLURMFM_OBS_RECIPE", ""),
            "run_id": env.get("SLURMFM_RUN_ID", ""),
            "node": self.node,
        }
        self.started = time.time()
        self.gpus: list[int] = []
        self.mapped: list[int] = []
        self.efa_devices: list[str] = []
        self.stopping = False
        self.running = True

    # file names
    def textfile_path(self) -> str:
        name = f"slurmfm_job_{safe_name(self.job_id)}_{safe_name(self.node)}.prom"
        return os.path.join(self.textfile_dir, name)

    def obs_path(self, kind: str) -> str:
        return os.path.join(self.obs_dir, f"{kind}_{safe_name(self.node)}_r{self.restart}.json")

    def metrics_text(self) -> str:
        base = self.labels
        fams = [
            format_family(
                PREFIX + "job_info",
                "A slurmfm job on this node; value always 1.",
                "gauge",
                [
                    (
                        dict(
                            base,
                            job_name=self.env.get("SLURM_JOB_NAME", ""),
                            node_rank=str(self.rank),
                            topology_addr=self.env.get("SLURM_TOPOLOGY_ADDR", ""),
                        ),
                        1,
                    )
                ],
            ),
            format_family(
                PREFIX + "job_restarts",
                "Times the job was requeued and restarted (SLURM_RESTART_COUNT).",
                "gauge",
                [(base, self.restart)],
            ),
            format_family(
                PREFIX + "job_running",
                "1 while the job runs on this node, 0 in its final write.",
                "gauge",
                [(base, 0 if self.stopping else 1)],
            ),
            format_family(
                PREFIX + "job_start_time_seconds",
                "Unix time at which this restart of the job started on this node.",
                "gauge",
                [(base, int(self.started))],
            ),
            format_family(
                PREFIX + "job_update_time_seconds",
                "Unix time of this file's last update.",
                "gauge",
                [(base, int(time.time()))],
            ),
            format_family(
                PREFIX + "job_node_rank",
                "This node's place in the job's host order (rank of its first process / G).",
                "gauge",
                [(base, self.rank)],
            ),
            format_family(
                PREFIX + "job_gpus",
                "GPUs of this node mapped to the job for DCGM-Exporter.",
                "gauge",
                [(base, len(self.gpus))],
            ),
            format_family(
                PREFIX + "job_efa_devices",
                "EFA devices seen on this node.",
                "gauge",
                [(base, len(self.efa_devices))],
            ),
        ]
        progress = read_own_json(self.progress_file) if self.rank == 0 else {}
        for key, name, help_text in (
            ("step", "train_step", "Last training step the launcher reported."),
            ("checkpoint_step", "checkpoint_step", "Step of the last checkpoint published."),
            ("checkpoint_time", "checkpoint_time_seconds", "Unix time of the last checkpoint."),
            ("time", "progress_time_seconds", "Unix time of the last progress report."),
        ):
            value = progress.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                fams.append(format_family(PREFIX + name, help_text, "gauge", [(base, value)]))
        if self.rank == 0:
            fams.extend(self.goodput_families())
        return "".join(fams)

    def goodput_families(self) -> list[str]:
        """The run's goodput ledger (:mod:`.goodput`) as gauges, on the job's first node.

        From this job's state file and progress history, counted from the job's first batch
        start: the time queued before it is Slurm's to tell (``slurmfm report`` adds it), so
        ``slurmfm_goodput_ratio`` here is the ETTR of the allocation so far.
        """
        try:
            from . import goodput
            from .fsafe import read_text
            from .state import events
        except ImportError:  # run alone (python3 -c SOURCE), without the rest of the runtime
            return []

        path = self.env.get("SLURMFM_STATE_FILE", "")
        text = read_text(path, limit=16 << 20) if path else None
        if not text:
            return []
        history = ""
        if self.progress_file:
            history = read_text(goodput.history_path(self.progress_file), limit=64 << 20) or ""
        job = goodput.Job(self.job_id, None, tuple(goodput.attempts(self.job_id, events(text))))
        try:
            led = goodput.ledger([job], goodput.parse_history(history), time.time())
        except (ValueError, ArithmeticError) as exc:
            warn("goodput", "goodput ledger not computed: %s" % exc)
            return []
        base = self.labels
        fams = [
            format_family(
                PREFIX + "goodput_seconds",
                "Where the run's wall time went, per part of the goodput ledger (seconds).",
                "gauge",
                [(dict(base, part=k), round(v, 3)) for k, v in led["parts"].items()],
            ),
            format_family(
                PREFIX + "goodput_wall_seconds",
                "Wall time the goodput ledger covers (from the job's first batch start).",
                "gauge",
                [(base, round(led["wall_s"], 3))],
            ),
            format_family(
                PREFIX + "goodput_failures",
                "Failures the goodput ledger counts (relaunches and requeues after a failure).",
                "gauge",
                [(base, len(led["failures"]))],
            ),
        ]
        if led.get("ettr") is not None:
            fams.append(
                format_family(
                    PREFIX + "goodput_ratio",
                    "ETTR: productive training time over wall time (0 to 1).",
                    "gauge",
                    [(base, round(led["ettr"], 5))],
                )
            )
        return fams

    def remove_stale_textfiles(self, max_age_s: float = STALE_TEXTFILE_S) -> list[str]:
        """Remove this node's textfiles of jobs that stopped updating them long ago.

        A job killed without a chance to clean up (SIGKILL, node reboot) would otherwise be
        exported forever. Every agent rewrites its file at least hourly (``interval_s`` is at
        most 3600), so a file of this node untouched for ``max_age_s`` belongs to no live job.
        """
        if not self.textfile_dir:
            return []
        suffix = f"_{safe_name(self.node)}.prom"
        removed = []
        now = time.time()
        try:
            names = os.listdir(self.textfile_dir)
        except OSError:
            return []
        for name in names:
            if not (name.startswith(PREFIX + "job_") and name.endswith(suffix)):
                continue
            path = os.path.join(self.textfile_dir, name)
            with contextlib.suppress(OSError):
                if now - os.stat(path).st_mtime > max_age_s:
                    os.unlink(path)
                    removed.append(name)
        return removed

    def write_textfile(self) -> None:
        if not self.textfile_dir:
            return
        if not os.path.isdir(self.textfile_dir):
            warn("textfile", f"textfile directory {self.textfile_dir} does not exist; skipped")
            return
        try:
            write_atomic(self.textfile_path(), self.metrics_text())
        except OSError as exc:
            warn("textfile", f"cannot write in {self.textfile_dir}: {exc}; skipped")

    def save_json(self, kind: str, data: dict[str, object]) -> None:
        if not self.obs_dir:
            return
        try:
            write_atomic(self.obs_path(kind), json.dumps(data, sort_keys=True) + "\n")
        except OSError as exc:
            warn("obsdir", f"cannot write in {self.obs_dir}: {exc}; skipped")

    def efa_snapshot(self, when: str, save: bool = True) -> None:
        """Read the EFA counters (the devices seen); with ``save``, keep them as ``when``'s."""
        if not self.efa:
            return
        counters = efa_counters(self.sysfs)
        self.efa_devices = sorted(counters)
        if counters and save:
            self.save_json("efa_" + when, {"time": time.time(), "devices": counters})

    def node_info(self) -> dict[str, object]:
        return {
            "node": self.node,
            "rank": self.rank,
            "restart": self.restart,
            "topology_addr": self.env.get("SLURM_TOPOLOGY_ADDR", ""),
            "gpus": self.gpus,
            "dcgm_mapped": self.mapped,
            "efa_devices": self.efa_devices,
            "start": self.started,
            "textfile": self.textfile_path() if self.textfile_dir else "",
            # forked by the launch step's entry, or its own step (docs/observability.md)
            "runs_in": "launch entry" if self.stop_fd is not None else "agents step",
        }

    def earlier_start(self) -> float | None:
        """When an earlier agent of this node started in this restart of the job (an in-job
        relaunch starts the launch step, and so its agent, again), from its node file."""
        start = read_own_json(self.obs_path("node")).get("start") if self.obs_dir else None
        return float(start) if isinstance(start, (int, float)) else None

    def start(self) -> None:
        want = self.expected_gpus
        self.gpus = gpu_indices(self.env, want, self.stop_fd) if want > 0 else []
        self.mapped = map_gpus(self.dcgm_dir, self.job_id, self.gpus)
        earlier = self.earlier_start()
        # the counters and the start of the restart's first agent stay the baseline
        self.efa_snapshot("start", save=earlier is None)
        if earlier is not None:
            self.started = earlier
        self.remove_stale_textfiles()
        self.write_textfile()
        self.save_json("node", self.node_info())  # last: the job script waits for this file

    def finish(self) -> None:
        self.stopping = True
        self.efa_snapshot("end")
        info = self.node_info()
        info["end"] = time.time()
        self.save_json("node", info)
        if self.mapped:
            unmap_gpus(self.dcgm_dir, self.job_id, self.mapped)
        if self.textfile_dir:
            with contextlib.suppress(OSError):
                os.unlink(self.textfile_path())

    def should_stop(self) -> bool:
        return self.stopping or bool(self.stop_file and os.path.exists(self.stop_file))

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when the entry closes its end of the pipe."""
        if self.stop_fd is None:
            time.sleep(seconds)
        elif _readable(self.stop_fd, seconds):
            self.stopping = True  # end-of-file: the launch ended

    def run(self) -> int:
        def on_term(signum: int, frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        self.start()
        next_write = time.time() + self.interval
        while not self.should_stop():
            self.pause(0.5)
            if self.stopping:
                break
            if time.time() >= next_write:
                self.write_textfile()
                next_write = time.time() + self.interval
        self.finish()
        return 0


def main(env: dict[str, str] | None = None, stop_fd: int | None = None) -> int:
    """The agent's whole life (``stop_fd``: the entry's pipe, :func:`fork`); always 0."""
    try:
        return Agent(dict(os.environ) if env is None else env, stop_fd).run()
    except Exception as exc:  # never fail the job because of metrics
        warn("crash", f"agent stopped: {type(exc).__name__}: {exc}")
        return 0


class Forked:
    """This node's agent as a child of the launch step's entry: :meth:`stop` ends it."""

    def __init__(self, pid: int, stop_fd: int) -> None:
        self.pid = pid
        self.stop_fd = stop_fd

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the pipe (the agent sees end-of-file, writes its end snapshot and removes its
        files) and wait for it, at most ``timeout_s``: the step ends when the entry exits, and
        Slurm then kills what is left of it."""
        with contextlib.suppress(OSError):
            os.close(self.stop_fd)
        if self.reaped(timeout_s):
            return
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        # not waited for without end: a process in uninterruptible sleep (a hung file system
        # under the observe directory) outlives a KILL; Slurm ends it with the step
        self.reaped(1.0)

    def reaped(self, seconds: float) -> bool:
        """Whether the agent ended (and was reaped) within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    return True
            except ChildProcessError:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def fork(env: dict[str, str]) -> Forked | None:
    """Start this node's agent as a child of the calling process (the launch step's entry,
    on the node's first task), or None where it cannot (the launch runs without metrics).

    Why a fork: the process is running already, so the agent costs no job step, no
    ``slurmstepd`` and no interpreter start on any node. It must be called before the entry
    starts a thread. The agent reads the job's GPUs (``SLURM_JOB_GPUS``), not the launch step's
    (``SLURM_STEP_GPUS``, which a step's task binding may narrow), as the agents' step, which
    asks for no GPUs and so gets all of the job's, did. Its standard input is not the gate's
    channel: /dev/null.

    The agent keeps its entry's ``/proc/PID/environ`` (a fork does not exec), so what finds a
    launch's processes by environment must not take it for a worker: ``hang.workers`` wants
    ``LOCAL_RANK``, which no entry carries (tests/job/test_gate_in_launch.py checks it), and
    ``node.forward_to_workers`` runs only for launches in a container, where no entry runs.
    """
    own = {k: v for k, v in env.items() if k != "SLURM_STEP_GPUS"}
    for stream in (sys.stdout, sys.stderr):  # or the child would print what is buffered again
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        r, w = os.pipe()  # not inherited across exec (PEP 446): the launcher never holds it
    except OSError as exc:
        warn("fork", f"agent not started: {exc}")
        return None
    # Held back across the fork: in the child, a KeyboardInterrupt before its ``try`` would
    # return into the entry's code.
    held = {signal.SIGINT, signal.SIGTERM}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        pid = os.fork()
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(r)
        os.close(w)
        warn("fork", f"agent not started: {exc}")
        return None
    if pid == 0:  # the agent: never returns into the entry
        code = 0
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(w)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            code = main(own, r)
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(r)
    return Forked(pid, w)


if __name__ == "__main__":
    sys.exit(main())
