"""SGLang prefill/decode disaggregation, run: the rendered script under bash on the stand-in
cluster (stub ``srun`` that starts the step's task on each "node" of one host, stub
``scontrol``), with the SGLang stand-in (``tests/serve/standins/pylib``), which takes the
flags as SGLang documents them, behind the real router (sglang-router) and behind the router's
stand-in (``tests/serve/standins/router``). The job splits its 4 nodes into a prefill server on the
first 2 and a decode server on the next 2 (``--tp 2`` over 2 nodes of 1 process each), the
router on node 0 in front of them; the endpoint file names the router and lists both servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import router_ports
from stub_bin import stub_bin

from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script

STANDINS = Path(__file__).resolve().parent / "standins"
HOSTS = ["node001", "node002", "node003", "node004"]

# srun: the step's command (after srun's own one-word options) once per node of the job, each
# with that node's Slurm variables; --kill-on-bad-exit ends the others when one fails; a TERM
# is passed on. The runtime's own steps beside the launch (copies removed at the end) run too.
SRUN = r"""#!PYTHON
import json, os, signal, subprocess, sys, time
argv = sys.argv[1:]
with open(os.path.join(os.environ["STUB_OUT"], "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(argv) + "\n")
i = 0
while i < len(argv) and argv[i].startswith("-"):
    i += 1
cmd, hosts = argv[i:], os.environ["STUB_HOSTS"].split()
procs = []
for rank, h in enumerate(hosts):
    env = dict(os.environ, SLURMD_NODENAME=h, SLURM_PROCID=str(rank), SLURM_NODEID=str(rank),
               SLURM_LOCALID="0", SLURM_STEPID="0", SLURM_STEP_NODELIST=",".join(hosts))
    procs.append(subprocess.Popen(cmd, env=env))
signal.signal(signal.SIGTERM, lambda *a: [p.send_signal(signal.SIGTERM) for p in procs])
while any(p.poll() is None for p in procs):
    if "--kill-on-bad-exit=1" in argv and any(p.poll() not in (None, 0) for p in procs):
        for p in procs:
            if p.poll() is None:
                p.terminate()
    time.sleep(0.1)
sys.exit(max(abs(p.returncode) for p in procs))
"""
SCONTROL = r"""#!PYTHON
import re, sys
a = sys.argv[1:]
if a[:2] == ["show", "hostnames"]:
    m = re.match(r"(.*)\[(\d+)-(\d+)\]$", a[2])
    for i in range(int(m.group(2)), int(m.group(3)) + 1):
        print("%s%0*d" % (m.group(1), len(m.group(2)), i))
elif a[:3] == ["-o", "show", "node"]:
    for n in a[3].split(","):
        print("NodeName=%s NodeAddr=127.0.0.1 NodeHostName=%s" % (n, n))
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    """The stand-in cluster's commands (a script-tier fixture: tests/conftest.py)."""
    tools = ("base64", "mv", "sha256sum", "tail", "cut", "mkdir", "stat", "sh", "env", "mktemp")
    return stub_bin(
        tmp_path / "bin", {"srun": SRUN, "scontrol": SCONTROL}, (*tools, "rm", "cat", "date")
    )


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - the test's stand-ins
        return json.loads(resp.read())


@contextlib.contextmanager
def job(bindir: Path, text: str, tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    out = tmp / "out"
    out.mkdir()
    script = tmp / "job.sh"
    script.write_text(text)
    env = {
        "PATH": str(bindir),
        "STUB_OUT": str(out),
        "STUB_HOSTS": " ".join(HOSTS),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "pd",
        "SLURM_JOB_NODELIST": "node[001-004]",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURMD_NODENAME": "node001",
        "SLURMFM_RUNTIME_DIR": str(tmp),
    }
    log = (tmp / "job.log").open("wb")
    proc = subprocess.Popen(
        ["/bin/bash", str(script)],
        env=env,
        cwd=tmp,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        # the whole job at once (its own session): no slurmctld here to answer a TERM's
        # questions, and the servers' own ends are tests/job/test_pd.py's
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def real_router() -> str | None:
    """Where this Python finds the real router (sglang-router, a test dependency), if it
    does: the directory that holds its package."""
    import importlib.util

    spec = importlib.util.find_spec("sglang_router")
    return str(Path(spec.origin).parent.parent) if spec is not None and spec.origin else None


@pytest.mark.parametrize("router_kind", ["standin", "real"])
def test_prefill_decode_split_and_router_on_the_stand_in_cluster(
    sandbox: Path, tmp_path: Path, router_kind: str
) -> None:
    """With the router's stand-in (which checks each worker's role and bootstrap port) and
    with the real router, sglang-router 0.3.2, which runs on CPU: it parses the job's router
    line with its own CLI and registers the stand-in servers as its prefill and decode
    workers."""
    real = real_router()
    # a test dependency: missing, the test fails (scripts/run-tests installs it)
    assert router_kind == "standin" or real is not None, (
        "sglang-router is not installed (pip install '.[test]')"
    )
    port = router_ports()
    # the stand-in router's directory first on the path shadows an installed real one
    path = [str(STANDINS / "pylib"), str(STANDINS / "router") if router_kind == "standin" else real]
    metrics = router_ports()  # the router's Prometheus port (29000 by default)
    while port - 2 <= metrics <= port + 2:
        metrics = router_ports()
    recipe = validate(
        {
            "name": "pd",
            "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
            "resources": {"nodes": 4, "procs_per_node": 1},
            "parallelism": {"tp": 2},
            "launcher": {
                "kind": "sglang",
                "model": "/models/tiny",
                "python": sys.executable,
                "port": port,
                "ready_poll_s": 1,
                "ready_timeout_s": 60,
                "extra_args": ["--standin-delay", "0"],  # healthy once listening
                "disaggregation": {
                    "prefill_nodes": 2,
                    "decode_nodes": 2,
                    "transfer_backend": "nixl",
                    "router_args": [
                        "--policy",
                        "round_robin",
                        "--prometheus-port",
                        str(metrics),
                    ],
                },
            },
            "env": {"PYTHONPATH": os.pathsep.join(path)},
            "storage": {"checkpoint_root": str(tmp_path / "ckpt"), "log_dir": str(tmp_path)},
            "resilience": {"health_gate": "off", "nccl_transport_check": "off", "requeue": False},
        }
    )
    text = render_script(recipe, Target.for_recipe(recipe, "24.11")).text
    endpoint = tmp_path / "endpoints" / "pd.json"
    with job(sandbox, text, tmp_path) as proc:
        deadline = time.monotonic() + 90
        while not endpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        log = (tmp_path / "job.log").read_text(errors="replace")
        assert endpoint.exists(), log[-4000:]
        info = json.loads(endpoint.read_text())
        router = f"http://127.0.0.1:{port}"
        # the router is the one endpoint; the servers are listed beside it
        assert info["url"] == router
        assert (info["front"], info["replicas"]) == ("router", 2)
        assert [r["nodes"] for r in info["replica_nodes"]] == [HOSTS[:2], HOSTS[2:]]
        pd = info["disaggregation"]
        assert pd["router"] == router
        (prefill,) = pd["prefill"]
        (decode,) = pd["decode"]
        assert prefill["nodes"] == HOSTS[:2]
        assert decode["nodes"] == HOSTS[2:]
        assert prefill["url"] == f"http://127.0.0.1:{port + 1}"
        assert decode["url"] == f"http://127.0.0.1:{port + 2}"
        # each server got SGLang's flags: its role, the backend, across its 2 nodes
        p, d = get(prefill["url"] + "/standin/info"), get(decode["url"] + "/standin/info")
        assert (p["disaggregation_mode"], p["transfer_backend"]) == ("prefill", "nixl")
        assert p["bootstrap_port"] == prefill["bootstrap_port"]
        assert (d["disaggregation_mode"], d["transfer_backend"], d["bootstrap_port"]) == (
            "decode",
            "nixl",
            None,
        )
        assert (p["nnodes"], p["ranks"], p["node"]) == (2, [0, 1], "node001")
        assert (d["nnodes"], d["ranks"], d["node"]) == (2, [0, 1], "node003")
        assert p["dist_init_addr"] != d["dist_init_addr"]
        assert "slurmfm: prefill/decode servers: prefill http://127.0.0.1" in log
        assert "slurmfm: node 0 runs the router: " in log
        # the router on node 0, in front of both, with the recipe's router arguments
        if router_kind == "standin":
            r = get(router + "/standin/info")
            assert r["prefill"] == [[prefill["url"], prefill["bootstrap_port"]]]
            assert r["decode"] == [decode["url"]]
            assert (r["node"], r["policy"]) == ("node001", "round_robin")
            return
        # the job said ready once the real router was (its /health answers from its start)
        assert get(router + "/readiness")["status"] == "ready"
        want = {
            (prefill["url"], "prefill", prefill["bootstrap_port"]),
            (decode["url"], "decode", None),
        }
        got: set[tuple[str, str, int | None]] = set()
        deadline = time.monotonic() + 30
        while got != want and time.monotonic() < deadline:
            workers = get(router + "/workers").get("workers", [])
            got = {(w["url"], w["worker_type"], w.get("bootstrap_port")) for w in workers}
            time.sleep(0.2)
        assert got == want, workers
