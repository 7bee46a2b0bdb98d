"""SGLang prefill/decode disaggregation as a job on a real local Slurm (the host lab, 22.05).

The rendered job on a two-node lab of its own: ``prepare`` splits the allocation into a
prefill server on node 0 and a decode server on node 1 (the SGLang stand-in,
``standins/pylib/sglang``, started with SGLang's documented disaggregation flags, since SGLang
needs GPUs), the real router (sglang-router, which runs on CPU) on node 0 in front of them.
The test checks that the router registered both workers, that a request goes through it to
both servers (SGLang's ``/generate``: the router sends it to the prefill and the decode
server with the prefill's bootstrap address and one room, and answers with the decode
server's reply), and that ``slurmfm cancel`` ends every part: the job, the endpoint files,
and the router's, servers' and bootstrap ports.

Its own lab (group ``pd-host``), two nodes: up in seconds, and the job about 10 s.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from lab import OwnLab, SlurmLab, own_lab_fixture, router_ports, wait_until

from slurmfm.backends.slurm_cli import parse_scontrol_record

pytestmark = [pytest.mark.slurm]

STANDINS = Path(__file__).resolve().parent / "standins"
PD_LAB = OwnLab("pd-host", ctld_port=17097, slurmd_port=18905, nodes=2)
NAME = "serve-pd"


@pytest.fixture(scope="module")
@own_lab_fixture(PD_LAB)
def pd_lab() -> SlurmLab:
    return PD_LAB.up()


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - the lab's own servers
        return json.load(r)


def post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(  # noqa: S310 - the lab's own router
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310
        return json.load(r)


def test_prefill_decode_job_behind_the_real_router(pd_lab: SlurmLab, tmp_path: Path) -> None:
    import sglang_router  # noqa: F401 - a test dependency: the job's node 0 runs it

    started = time.monotonic()
    port = router_ports()
    metrics = router_ports()  # the router's Prometheus port (29000 by default)
    recipe = {
        "name": NAME,
        "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
        "resources": {"nodes": 2, "procs_per_node": 1, "time_limit": "00:05:00"},
        "parallelism": {"tp": 1},
        "launcher": {
            "kind": "sglang",
            "model": "/models/tiny",
            "python": sys.executable,  # has sglang-router; the stand-in sglang comes first
            "port": port,
            "ready_poll_s": 1,
            "ready_timeout_s": 60,
            "extra_args": ["--standin-delay", "0"],
            "disaggregation": {
                "prefill_nodes": 1,
                "decode_nodes": 1,
                "transfer_backend": "nixl",
                "router_args": ["--policy", "round_robin", "--prometheus-port", str(metrics)],
            },
        },
        "env": {"PYTHONPATH": str(STANDINS / "pylib"), "OMP_NUM_THREADS": "1"},
        "storage": {"checkpoint_root": str(tmp_path / "ckpt"), "log_dir": str(tmp_path / "logs")},
        "resilience": {
            "requeue": False,
            "save_before_timeout_s": 0,
            "health_gate": "off",
            "nccl_transport_check": "off",
        },
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    proc = pd_lab.slurmfm("submit", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.split()[0]
    endpoint = tmp_path / "logs" / "endpoints" / f"{NAME}.json"
    log = tmp_path / "logs" / f"{NAME}_{job_id}.out"

    def job_state() -> str:
        out = pd_lab.run(["scontrol", "show", "job", "-o", job_id]).stdout
        return parse_scontrol_record(out).get("JobState", "")

    try:
        deadline = time.monotonic() + 90
        while not endpoint.exists() and time.monotonic() < deadline:
            assert job_state() in {"PENDING", "CONFIGURING", "RUNNING"}, (
                log.read_text() if log.exists() else job_state()
            )
            time.sleep(0.5)
        assert endpoint.exists(), log.read_text() if log.exists() else "no job log"
        ready_s = time.monotonic() - started
        info = json.loads(endpoint.read_text())
        router = f"http://127.0.0.1:{port}"
        assert (info["url"], info["front"], info["replicas"]) == (router, "router", 2)
        (prefill,) = info["disaggregation"]["prefill"]
        (decode,) = info["disaggregation"]["decode"]
        nodes = pd_lab.hostnames(
            parse_scontrol_record(pd_lab.run(["scontrol", "show", "job", "-o", job_id]).stdout)[
                "NodeList"
            ]
        )
        assert [prefill["nodes"], decode["nodes"]] == [[n] for n in info["nodes"].split()]
        assert sorted(info["nodes"].split()) == sorted(nodes)
        # the real router registered both servers (the job said ready once it had)
        assert get(router + "/readiness")["status"] == "ready"
        workers = get(router + "/workers")["workers"]
        assert {(w["url"], w["worker_type"], w.get("bootstrap_port")) for w in workers} == {
            (prefill["url"], "prefill", prefill["bootstrap_port"]),
            (decode["url"], "decode", None),
        }
        # a request through the router reaches both servers, paired by one bootstrap room
        # at the prefill's bootstrap port; the decode server's reply comes back
        reply = post(router + "/generate", {"text": "hello", "sampling_params": {}})
        assert reply["text"] == f"standin decode {decode['nodes'][0]}"
        got = [get(s["url"] + "/standin/requests")["requests"] for s in (prefill, decode)]
        assert [len(r) for r in got] == [1, 1], got
        p, d = (r[0]["body"] for r in got)
        assert p["bootstrap_room"] == d["bootstrap_room"]
        assert p["bootstrap_port"] == d["bootstrap_port"] == prefill["bootstrap_port"]
        ports = [port, int(prefill["url"].rsplit(":", 1)[1]), int(decode["url"].rsplit(":", 1)[1])]
        ports.append(prefill["bootstrap_port"])
        assert all(answers(p) for p in ports)
    finally:
        cancel = pd_lab.slurmfm("cancel", job_id)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    rec = pd_lab.wait_job(job_id, timeout=60)
    assert rec["JobState"] == "CANCELLED", rec
    # everything of the job ends with it: the endpoint files, the router, both servers and
    # the prefill's bootstrap server
    wait_until("the endpoint files removed", lambda: not endpoint.exists(), 30)
    assert not endpoint.with_suffix(".env").exists()
    wait_until("the router and servers gone", lambda: not any(answers(p) for p in ports), 30)
    took = time.monotonic() - started
    print(f"prefill/decode job: ready in {ready_s:.1f} s, submit to cleaned up {took:.1f} s")
