"""The pre-flight fabric test: nccl-tests' ``all_reduce_perf`` across the allocation.

Before the first launch of an attempt (``resilience.fabric_test``: warn or fail) the batch step
runs ``all_reduce_perf`` (from the image, or the path the recipe names) with one task per GPU
on every node, in the launch's own container and environment, and reads its output:

* the table (NVIDIA/nccl-tests src/util.cu): a header line ``#  size count type redop root
  time algbw busbw #wrong time algbw busbw #wrong`` (out-of-place, then in-place; other layouts
  add columns, so the ``busbw`` columns are found by the header), then one line per size;
  the peak bus bandwidth is the largest ``busbw``, which is what AWS's reference figures are
  (slurmfm/catalog/fabric.py);
* ``# Avg bus bandwidth    : X`` and ``# Out of bounds values : N OK|FAILED`` (data errors with
  ``-c 1``);
* a failure names its host: ``HOST: Test NCCL failure FILE:LINE '...'`` and
  `` .. HOST pid N: Test failure FILE:LINE`` (src/common.h, NCCLCHECK and TESTCHECK), and
  srun's ``srun: error: HOST: task N: ...``. Such a host is the node the test singles out.

:func:`judge` turns that into a verdict; the batch step logs it, records it in the state file
(``event=fabric``, read by ``slurmfm report``) and, with ``fail``, ends the attempt: a singled-out
node is drained and the job requeued off it, as a node failing the health gate is; a fabric
below the floor with no node to blame fails the job with the figures.

Standard library only (Python >= 3.8), as all of slurmfm.job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

_LABEL = re.compile(r"^\s*\d+:\s?")  # srun --label
_FAIL_NCCL = re.compile(r"^\s*(\S+): Test NCCL failure ")
_FAIL_TEST = re.compile(r"^\s*\.\. (\S+) pid \d+: Test failure ")
_SRUN_TASK = re.compile(r"^srun: error: (\S+): tasks? [\d,\-\[\]]+: ")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+\-]+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")


class Figures(NamedTuple):
    """What one run of the test said."""

    peak_busbw: float | None  # GB/s, the largest busbw of the table (None: no table)
    peak_size: int  # bytes at the peak
    avg_busbw: float | None  # nccl-tests' own average line
    wrong: int  # out-of-bounds values (data errors), -1: not reported
    sick: tuple[str, ...]  # hosts a failure line names, in order


def parse(text: str) -> Figures:
    """The figures of ``all_reduce_perf``'s output (see the module docstring)."""
    cols: list[int] = []
    peak: float | None = None
    size = 0
    avg: float | None = None
    wrong = -1
    sick: list[str] = []
    for raw in text.splitlines():
        m = _SRUN_TASK.match(raw)
        host = m.group(1) if m else None
        line = _LABEL.sub("", raw, count=1)
        for pat in (_FAIL_NCCL, _FAIL_TEST):
            f = pat.match(line)
            if f:
                host = f.group(1)
        if host and host not in sick:
            sick.append(host)
        words = line.split()
        if line.startswith("#"):
            head = line.lstrip("#").split()
            if "busbw" in head and "size" in head:
                cols = [i for i, w in enumerate(head) if w == "busbw"]
            a = _AVG.match(line)
            if a:
                avg = _number(a.group(1))
            o = _OOB.match(line)
            if o:
                wrong = int(o.group(1))
            continue
        if not cols or not words or not words[0].isdigit() or len(words) <= max(cols):
            continue
        for i in cols:
            bw = _number(words[i])
            if bw is not None and (peak is None or bw > peak):
                peak, size = bw, int(words[0])
    return Figures(peak, size, avg, wrong, tuple(sick))


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class Verdict(NamedTuple):
    ok: bool
    summary: str  # one line: the figures and the comparison
    sick: tuple[str, ...]  # nodes of the allocation the test singled out


def judge(fig: Figures, floor: float, rc: int, nodes: Sequence[str]) -> Verdict:
    """Compare the figures with ``floor`` GB/s (0: none, the figures are only logged);
    ``rc``: the test step's exit; ``nodes``: the allocation's (only those can be excluded).

    A host is singled out only when the failing hosts are fewer than half the nodes: one
    rank's failure makes its peers' NCCL calls fail too ("remote process exited"), so when
    most nodes report a failure none of them is to blame."""
    named = tuple(h for h in fig.sick if h in nodes)
    sick = named if 2 * len(named) < len(nodes) else ()
    parts = []
    if fig.peak_busbw is not None:
        parts.append("peak busbw %.2f GB/s at %d B" % (fig.peak_busbw, fig.peak_size))
    if fig.avg_busbw is not None:
        parts.append("avg busbw %.2f GB/s" % fig.avg_busbw)
    parts.append("%d node(s)" % len(nodes))
    if floor:
        parts.append("floor %.2f GB/s" % floor)
    bad = []
    if rc != 0:
        bad.append("the test exited %d" % rc)
    if fig.peak_busbw is None:
        bad.append("no all_reduce_perf table in its output")
    elif floor and fig.peak_busbw < floor:
        bad.append("below the floor")
    if fig.wrong > 0:
        bad.append("%d wrong values" % fig.wrong)
    if named:
        bad.append("failed on %s" % " ".join(named))
    return Verdict(not bad, "; ".join(parts + bad), sick)


def container_words(launch_argv: Sequence[str]) -> list[str]:
    """The launch srun's Pyxis options (:func:`.hetjob.container_words`), so the test runs in
    the launch's image with its mounts, but not in its named container: the test must not
    create the attempt's."""
    from .hetjob import container_words as pyxis

    return [w for w in pyxis(launch_argv) if not w.startswith("--container-name")]


def srun_argv(
    nodes: int,
    tasks_per_node: int,
    mpi: str,
    launch_argv: Sequence[str],
    cmd: str,
    args: Sequence[str],
    het: bool = False,
) -> list[str]:
    """The test step: ``tasks_per_node`` ranks on each of ``nodes`` nodes (one per GPU, as
    the AWS sample runs it), every node's verdict wanted (``--kill-on-bad-exit=0``).

    ``--overcommit``: the job's allocation is sized for its launch (one task per node under
    torchrun), not for a rank per GPU, and a job without whole nodes may hold fewer CPUs
    than that; Slurm then refuses the step ("More processors requested than permitted",
    seen on the lab). The ranks wait on the GPUs and the network, and the step is short."""
    argv = ["srun"] + (["--het-group=0"] if het else [])
    argv += [
        "--nodes=%d" % nodes,
        "--ntasks=%d" % (nodes * tasks_per_node),
        "--ntasks-per-node=%d" % tasks_per_node,
        "--overcommit",
        "--kill-on-bad-exit=0",
    ]
    if mpi:
        argv.append("--mpi=%s" % mpi)
    return argv + container_words(launch_argv) + [cmd, *args]
