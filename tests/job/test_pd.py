"""SGLang prefill/decode disaggregation in the runtime (slurmfm/job/pd.py): the split of the host
order, each node's flags, the router's line, the ports, and node 0's router beside its server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurmfm.job import pd
from slurmfm.job.hosts import SGLANG_HTTP_BAND
from slurmfm.job.node import pd_node, run_with_router
from slurmfm.job.options import NodeOptions
from slurmfm.job.safepath import RUN_MODULE

ORDER = [f"n{i}" for i in range(6)]
ADDRS = {h: f"10.0.0.{i}" for i, h in enumerate(ORDER)}


def test_the_order_splits_prefill_first_then_decode_in_servers_of_span_nodes() -> None:
    servers = pd.layout(ORDER, ADDRS, prefill=2, decode=4, span=2, router=30000, base=26000)
    assert [(s.role, s.nodes, s.head, s.port) for s in servers] == [
        ("prefill", ("n0", "n1"), "10.0.0.0", 30001),
        ("decode", ("n2", "n3"), "10.0.0.2", 30002),
        ("decode", ("n4", "n5"), "10.0.0.4", 30003),
    ]
    # dist ports: one SGLang block each (D .. D+6), then the prefill servers' bootstrap ports
    assert [s.dist_port for s in servers] == [26000, 26007, 26014]
    assert [s.bootstrap_port for s in servers] == [26021, 0, 0]
    assert servers[0].url == "http://10.0.0.0:30001"
    one = pd.layout(ORDER[:3], ADDRS, prefill=1, decode=2, span=1, router=8000, base=26000, dp=4)
    assert [s.dist_port for s in one] == [26000, 26010, 26020]
    assert [s.bootstrap_port for s in one] == [26030, 0, 0]
    with pytest.raises(ValueError, match="do not split"):
        pd.layout(ORDER, ADDRS, prefill=3, decode=3, span=2, router=30000, base=26000)


def test_the_layout_travels_as_json() -> None:
    servers = pd.layout(ORDER, ADDRS, prefill=2, decode=4, span=2, router=30000, base=26000)
    url, back = pd.from_json(pd.to_json("http://10.0.0.0:30000", servers))
    assert (url, back) == ("http://10.0.0.0:30000", servers)
    info = pd.endpoint_info(url, servers)
    assert info["prefill"] == [
        {
            "url": "http://10.0.0.0:30001",
            "bootstrap_port": 26021,
            "nodes": ["n0", "n1"],
            "tp": 0,
            "dp": 1,
        }
    ]
    assert [d["url"] for d in info["decode"]] == ["http://10.0.0.2:30002", "http://10.0.0.4:30003"]


def test_each_node_gets_its_servers_flags() -> None:
    """SGLang's documented flags (docs/advanced_features/pd_disaggregation.md, "DeepSeek
    Multi-Node"; server_arguments.md, "PD disaggregation")."""
    servers = pd.layout(ORDER, ADDRS, prefill=2, decode=4, span=2, router=30000, base=26000)
    argv = ["python3", "-m", "sglang.launch_server", "--tp", "16"]
    s, rank = pd.mine(servers, "n1") or (None, -1)
    assert s is servers[0]
    assert rank == 1
    assert pd.server_words(argv, s, rank, "mooncake")[5:] == [
        "--port", "30001",
        "--disaggregation-mode", "prefill",
        "--disaggregation-transfer-backend", "mooncake",
        "--disaggregation-bootstrap-port", "26021",
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.0:26000",
    ]  # fmt: skip
    s, rank = pd.mine(servers, "n4") or (None, -1)
    words = pd.server_words(argv, s, rank, "nixl")[5:]
    assert "--disaggregation-bootstrap-port" not in words  # a decode server has none
    assert words[:6] == [
        "--port", "30003", "--disaggregation-mode", "decode",
        "--disaggregation-transfer-backend", "nixl",
    ]  # fmt: skip
    assert words[-2:] == ["--dist-init-addr", "10.0.0.4:26014"]
    single = pd.layout(ORDER[:2], ADDRS, prefill=1, decode=1, span=1, router=30000, base=26000)
    assert "--nnodes" not in pd.server_words(argv, single[1], 0, "nixl")
    assert pd.mine(single, "n5") is None


def test_prefill_and_decode_servers_of_their_own_tp_and_dp() -> None:
    """Roles of different sizes: prefill servers of 1 node (--tp 8, --dp-size 8), decode
    servers of 2 (--tp 16); each node's entry adds its role's --tp and --dp-size."""
    roles = (pd.Role(1, 8, 8), pd.Role(2, 16, 1))
    servers = pd.layout(ORDER, ADDRS, 2, 4, 1, 30000, 26000, dp=8, roles=roles)
    assert [(s.role, s.nodes, s.tp, s.dp) for s in servers] == [
        ("prefill", ("n0",), 8, 8),
        ("prefill", ("n1",), 8, 8),
        ("decode", ("n2", "n3"), 16, 1),
        ("decode", ("n4", "n5"), 16, 1),
    ]
    assert [s.dist_port for s in servers] == [26000, 26014, 26028, 26042]  # 6 + 8 each
    assert pd.from_json(pd.to_json("u", servers))[1] == servers
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "m"]
    words = pd.server_words(argv, servers[0], 0, "mooncake")
    assert words[5:11] == ["--tp", "8", "--dp-size", "8", "--enable-dp-attention", "--port"]
    words = pd.server_words(argv, servers[3], 1, "mooncake")
    assert words[5:8] == ["--tp", "16", "--port"]
    assert words[-6:] == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.4:26042"]
    assert "tp 8; dp 8; bootstrap" in pd.describe("u", servers)
    with pytest.raises(ValueError, match="servers of 1 and 2"):
        pd.layout(ORDER, ADDRS, 3, 3, 1, 30000, 26000, roles=roles)


def test_the_router_takes_every_prefill_with_its_bootstrap_port_and_every_decode() -> None:
    """sglang_router.launch_router's PD flags (sgl-router/py_src/sglang_router/router_args.py:
    ``--prefill URL [BOOTSTRAP_PORT]``, ``--decode URL``; docs/advanced_features/router.md)."""
    servers = pd.layout(ORDER, ADDRS, prefill=2, decode=4, span=2, router=30000, base=26000)
    words = pd.router_words("python3", servers, 30000, 3600, ["--policy", "round_robin"])
    assert words[:4] == ["python3", "-c", RUN_MODULE, "sglang_router.launch_router"]
    assert words[4:] == [
        "--pd-disaggregation",
        "--prefill", "http://10.0.0.0:30001", "26021",
        "--decode", "http://10.0.0.2:30002",
        "--decode", "http://10.0.0.4:30003",
        "--host", "0.0.0.0", "--port", "30000",  # noqa: S104 - the router's words
        "--worker-startup-timeout-secs", "3600",
        "--policy", "round_robin",
    ]  # fmt: skip


def test_ports_stay_apart_and_out_of_the_ephemeral_range() -> None:
    eph = (32768, 60999)
    assert pd.port_clash(30000, 26000, 3, 1, 1, (25000,), eph) is None
    # the block from the base would reach the router's and the servers' HTTP band
    why = pd.port_clash(30000, 29990, 3, 1, 1, (), eph)
    assert why is not None
    assert "meet the HTTP ports 30000-" in why
    assert "hold port 26003" in (pd.port_clash(30000, 26000, 3, 1, 1, (26003,), eph) or "")
    # a router port whose servers' bands reach the ephemeral range: no base helps
    high = 32768 - SGLANG_HTTP_BAND - 2
    assert "reach the ephemeral range" in (pd.http_clash(high, 3, eph) or "")
    assert pd.http_clash(high - 2, 3, eph) is None
    assert "pass 65535" in (pd.http_clash(65000, 2) or "")
    assert "reach the ephemeral range" in (pd.port_clash(8000, 32760, 2, 1, 1, (), eph) or "")


def _env(servers: list[pd.Server]) -> dict[str, str]:
    return {pd.ENV: pd.to_json("http://10.0.0.0:30000", servers)}


def test_the_node_entry_reads_its_part_and_node_0_the_router(
    capsys: pytest.CaptureFixture[str],
) -> None:
    servers = pd.layout(ORDER[:4], ADDRS, prefill=2, decode=2, span=2, router=30000, base=26000)
    o = NodeOptions(pd="mooncake", pd_router_python="/venv/bin/python3", pd_startup_s=900)
    words, router = pd_node(["sglang"], 0, "n0", o, _env(servers)) or ([], [])
    assert words[:5] == ["sglang", "--port", "30001", "--disaggregation-mode", "prefill"]
    assert router[0] == "/venv/bin/python3"
    assert "--worker-startup-timeout-secs" in router
    assert router[router.index("--port") + 1] == "30000"
    words, router = pd_node(["sglang"], 3, "n3", o, _env(servers)) or ([], ["x"])
    assert "decode" in words
    assert "--node-rank" in words
    assert router == []
    assert pd_node(["sglang"], 0, "n9", o, _env(servers)) is None
    assert pd_node(["sglang"], 0, "n0", o, {}) is None
    assert "no prefill/decode layout" in capsys.readouterr().err


def test_a_router_that_dies_stops_node_0s_server(tmp_path: Path) -> None:
    """The router exits; node 0's server is stopped, so that the step ends (kill-on-bad-exit)
    and the job's readiness or health watch sees it; the entry exits non-zero."""
    server = [sys.executable, "-c", "import time; time.sleep(60)"]
    router = [sys.executable, "-c", "import sys; sys.exit(3)"]
    rc = run_with_router(router, server, "none", {"PATH": "/usr/bin:/bin"}, None, None)
    assert rc != 0


def test_the_router_ends_with_the_server(tmp_path: Path) -> None:
    ready, mark = tmp_path / "router-ready", tmp_path / "router-ended"
    router = [
        sys.executable,
        "-c",
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(mark)!r}, 'w').close(), "
        f"sys.exit(0)))\nopen({str(ready)!r}, 'w').close()\ntime.sleep(60)",
    ]
    server = [
        sys.executable,
        "-c",
        f"import os, time\nwhile not os.path.exists({str(ready)!r}): time.sleep(0.05)",
    ]
    rc = run_with_router(router, server, "none", {"PATH": "/usr/bin:/bin"}, None, None)
    assert rc == 0
    assert mark.exists()


def test_the_router_is_ready_by_its_readiness_or_where_it_has_none_its_health(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLang's router answers /health from its start and /readiness (503) until it has
    healthy workers; a router without /readiness (404) is asked its /health."""
    from slurmfm.job import serve

    status = {"http://r:1/readiness": 503, "http://s:2/health": 200}
    monkeypatch.setattr(serve, "http_status", lambda url, timeout_s=5.0: status.get(url, 0))
    monkeypatch.setattr(serve, "http_ok", lambda url, timeout_s=5.0: status.get(url) == 200)
    assert not serve.pd_check("http://r:1/readiness")
    assert serve.pd_check("http://s:2/health")
    status["http://r:1/readiness"] = 200
    assert serve.pd_check("http://r:1/readiness")
    status["http://r:1/readiness"] = 404
    assert not serve.pd_check("http://r:1/readiness")
    status["http://r:1/health"] = 200
    assert serve.pd_check("http://r:1/readiness")
