"""HTTP readiness with urllib and the endpoint files."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmfm.job.serve import drop_endpoint, http_ok, wait_ready, write_endpoint


@pytest.fixture
def server() -> Iterator[str]:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_http_ok_against_a_real_server(server: str) -> None:
    assert http_ok(server + "/health")
    assert not http_ok(server + "/other")
    assert not http_ok("http://127.0.0.1:1/health", timeout_s=1)


def test_wait_ready_timeout_and_dead_server_without_sleeping() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    why = wait_ready(
        "u", lambda: True, 60, 5, check=lambda u: False, clock=lambda: now[0], sleep=sleep
    )
    assert why is not None
    assert "within 60 s" in why
    assert now[0] == 60
    why = wait_ready(
        "u", lambda: False, 60, 5, check=lambda u: False, clock=lambda: 0.0, sleep=sleep
    )
    assert why is not None
    assert "ended before" in why
    answers = iter([False, False, True])
    assert (
        wait_ready(
            "u", lambda: True, 60, 5, check=lambda u: next(answers), clock=lambda: 0.0, sleep=sleep
        )
        is None
    )


def test_endpoint_files_written_and_dropped_only_by_their_job(tmp_path: Path) -> None:
    base = str(tmp_path / "endpoints" / "run1")
    write_endpoint(base, {"url": "http://h:8000", "job_id": "12", "model": "m"})
    assert json.loads(Path(base + ".json").read_text())["url"] == "http://h:8000"
    assert Path(base + ".env").read_text() == (
        "SLURMFM_ENDPOINT_URL=http://h:8000\nSLURMFM_ENDPOINT_JOB_ID=12\n"
    )
    drop_endpoint(base, "13")  # a later job's cleanup leaves them alone
    assert Path(base + ".json").exists()
    drop_endpoint(base, "12")
    assert not Path(base + ".json").exists()
    assert not Path(base + ".env").exists()


def test_replica_info_one_server_vllm_dp_and_sglang_dp_attention() -> None:
    """The endpoint file says what answers at its URL and where each replica runs."""
    from slurmfm.job.serve import replica_info

    assert replica_info("dp-coordinator", 1, ["a", "b"]) == {
        "front": "server",
        "replicas": 1,
        "replica_nodes": [{"replica": 0, "nodes": ["a", "b"]}],
    }
    # vLLM data parallel: 4 engines, 2 whole ones on each of 2 nodes, behind node 0's API
    dp = replica_info("dp-coordinator", 4, ["a", "b"])
    assert dp["front"] == "dp-coordinator"
    assert dp["replicas"] == 4
    assert [r["nodes"] for r in dp["replica_nodes"]] == [["a"], ["a"], ["b"], ["b"]]
    # SGLang DP attention: 2 ranks of a --tp 16 group over 4 nodes, 2 nodes each
    sg = replica_info("dp-attention", 2, ["a", "b", "c", "d"])
    assert sg["front"] == "dp-attention"
    assert [r["nodes"] for r in sg["replica_nodes"]] == [["a", "b"], ["c", "d"]]


def test_replica_info_prefill_decode_lists_each_server_behind_the_router() -> None:
    from slurmfm.job.pd import Server
    from slurmfm.job.serve import replica_info

    servers = [
        Server("prefill", ("a",), "10.0.0.1", 30001, 27000, 27014),
        Server("decode", ("b", "c"), "10.0.0.2", 30002, 27007),
    ]
    info = replica_info("server", 1, ["a", "b", "c"], ("http://10.0.0.1:30000", servers))
    assert info == {
        "front": "router",
        "replicas": 2,
        "replica_nodes": [
            {"replica": 0, "role": "prefill", "url": "http://10.0.0.1:30001", "nodes": ["a"]},
            {"replica": 1, "role": "decode", "url": "http://10.0.0.2:30002", "nodes": ["b", "c"]},
        ],
    }
