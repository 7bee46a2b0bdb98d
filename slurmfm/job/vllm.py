"""vLLM across nodes: each node's own flags, made where the node runs (no Ray by default).

vLLM serves across nodes without Ray since v0.11.1: every node runs ``vllm serve`` with the
same model and sizes plus ``--nnodes N --node-rank R --master-addr H --master-port P``, the
nodes other than 0 with ``--headless`` (no API server; vllm-project/vllm
``docs/serving/parallelism_scaling.md``, "Running vLLM with MultiProcessing"; added by
vllm-project/vllm#23691, "[V1] Support MP Executor for multi node distributed inference",
first released in v0.11.1). Data parallel across nodes runs one engine per replica, each node
with its own local ranks: ``--data-parallel-size D --data-parallel-size-local L
--data-parallel-address H --data-parallel-rpc-port P`` on node 0 (the API server and the DP
coordinator, the one endpoint clients use) and the same plus ``--headless
--data-parallel-start-rank R*L`` on node R (vllm-project/vllm
``docs/serving/data_parallel_deployment.md``, "Multi-node deployment"; ``--headless`` and
``--data-parallel-size-local`` from v0.9.0, vllm-project/vllm#15977).

Which vLLM the job runs is only known where it runs, so the gate is a probe run there, in
the Python of the ``vllm`` executable (its ``#!`` line): it reads vLLM's version from its
installed metadata without importing vLLM (seconds of torch import on every node). An older
vLLM, or one whose Python cannot be found (a wrapper command), takes the Ray path as before;
the recipe's ``launcher.multinode`` (``native``/``ray``) skips the probe.

Standard library only (Python >= 3.8), as all of slurmfm.job.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

NATIVE_MIN = (0, 11, 1)
"""The first vLLM with ``--nnodes/--node-rank/--master-addr`` (see the module docstring)."""

SOURCES = (
    "vllm-project/vllm:docs/serving/parallelism_scaling.md",
    "vllm-project/vllm:docs/serving/data_parallel_deployment.md",
    "https://github.com/vllm-project/vllm/pull/23691",
)
"""Where :data:`NATIVE_MIN` and the flags come from (tests/job/test_vllm_nodes.py checks
that every gate names a source)."""

PROBE = (
    "import importlib.metadata as m,re,sys\n"
    "try:\n"
    ' v=m.version("vllm")\n'
    "except Exception:\n"
    " sys.exit(1)\n"
    'g=re.match("([0-9]+)[.]([0-9]+)(?:[.]([0-9]+))?",v)\n'
    "ok=g is not None and (int(g.group(1)),int(g.group(2)),int(g.group(3) or 0))>=%r\n"
    "print(v)\n"
    "sys.exit(0 if ok else 2)\n" % (NATIVE_MIN,)
)
"""Prints vLLM's version; exit 0 when it is >= :data:`NATIVE_MIN`, 2 when older, 1 when
this Python has no vLLM."""

PROBE_TIMEOUT_S = 60.0


def interpreter(command: str, env: Mapping[str, str]) -> list[str]:
    """The interpreter of the ``command`` script (its ``#!`` line), or [] when it has none.

    Why the ``#!`` line: pip writes console scripts that start with the Python of their
    environment (``#!/venv/bin/python``), and ``/usr/bin/env python3`` names it by PATH.
    """
    path = shutil.which(command, path=env.get("PATH", os.defpath))
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return []
    if not first.startswith(b"#!"):
        return []
    words = first[2:].decode("utf-8", "replace").split()
    return words if words and "python" in os.path.basename(words[-1]) else []


def native_supported(command: str, env: Mapping[str, str]) -> tuple[bool, str]:
    """Whether the vLLM of ``command`` serves across nodes without Ray, and a line saying
    what was found (for the job log)."""
    python = interpreter(command, env)
    if not python:
        return False, "cannot tell the Python of %s (no #! python line)" % command
    try:
        done = subprocess.run(
            [*python, "-c", PROBE],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, "the vLLM version probe failed: %s" % exc
    version = done.stdout.decode("utf-8", "replace").strip() or "?"
    if done.returncode == 0:
        return True, "vLLM %s" % version
    if done.returncode == 2:
        return False, "vLLM %s is older than %s" % (version, ".".join(map(str, NATIVE_MIN)))
    return False, "no vLLM in %s" % " ".join(python)


def node_words(
    argv: Sequence[str],
    rank: int,
    nnodes: int,
    head: str,
    port: int,
    dp: int = 1,
    dp_local: int = 1,
) -> list[str]:
    """``vllm serve ...`` with node ``rank``'s own flags (see the module docstring).

    ``dp`` > 1: data parallel, ``dp_local`` replicas on each node; else one model across
    ``nnodes`` nodes. Node 0 serves the API; the others are ``--headless``.
    """
    words = list(argv)
    if dp > 1:
        words += [
            "--data-parallel-size",
            str(dp),
            "--data-parallel-size-local",
            str(dp_local),
            "--data-parallel-address",
            head,
            "--data-parallel-rpc-port",
            str(port),
        ]
        if rank > 0:
            words += ["--data-parallel-start-rank", str(rank * dp_local), "--headless"]
        return words
    words += [
        "--nnodes",
        str(nnodes),
        "--node-rank",
        str(rank),
        "--master-addr",
        head,
        "--master-port",
        str(port),
    ]
    if rank > 0:
        words.append("--headless")
    return words
