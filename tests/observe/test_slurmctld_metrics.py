"""slurmctld's own OpenMetrics endpoints as Prometheus scrape targets (Slurm >= 25.11).

A real 26.05.5 slurmctld (our own 4-node sid chroot lab, ``MetricsType=metrics/openmetrics``)
and a real Prometheus (``scripts/obs-stack --slurmctld``, on loopback ports of no other test)
scraping it with the jobs :mod:`slurmfm.observe.prometheus` writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import REPO_ROOT, OwnLab, SlurmLab, free_port, own_lab_fixture, wait_until

from slurmfm.observe.prometheus import SLURMCTLD_ENDPOINTS, slurmctld_scrape_jobs

METRICS_SID = OwnLab("metrics-sid", 16857, 18301, nodes=4, suite="sid")
OBS_STACK = REPO_ROOT / "scripts" / "obs-stack"


def test_scrape_jobs_are_gated_by_version() -> None:
    jobs = slurmctld_scrape_jobs("ctl.example:6817", "25.11")
    for endpoint in SLURMCTLD_ENDPOINTS:
        assert f"- job_name: slurmctld-{endpoint}\n    metrics_path: /metrics/{endpoint}" in jobs
    assert "targets: ['ctl.example:6817']" in jobs
    assert "job_name" not in slurmctld_scrape_jobs("ctl.example:6817", "24.11")
    with pytest.raises(ValueError, match="not HOST:PORT"):
        slurmctld_scrape_jobs("ctl.example", "25.11")


@pytest.fixture(scope="module")
@own_lab_fixture(METRICS_SID)
def metrics_lab() -> SlurmLab:
    lab = METRICS_SID.up()
    conf = lab.slurm_conf
    if "MetricsType=metrics/openmetrics" not in conf.read_text():
        conf.write_text(conf.read_text() + "MetricsType=metrics/openmetrics\n")
        proc = lab.run(["scontrol", "reconfigure"])
        assert proc.returncode == 0, proc.stderr
    return lab


@pytest.fixture
def prometheus(metrics_lab: SlurmLab, tmp_path: Path) -> Iterator[int]:
    ctld = int(metrics_lab.config["CTLD_PORT"])  # the lab's slurmctld (port offset applied)
    prom, node = free_port(), free_port()
    args = [str(OBS_STACK), "--dir", str(tmp_path / "stack"), "--textfile-dir", str(tmp_path)]
    env = {
        **os.environ,
        "SLURMFM_OBS_PROM_PORT": str(prom),
        "SLURMFM_OBS_NODE_PORT": str(node),
        "SLURMFM_PYTHON": sys.executable,
    }
    up = [*args, "--slurmctld", f"127.0.0.1:{ctld}", "--slurm-version", metrics_lab.version, "up"]
    proc = subprocess.run(up, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        yield prom
    finally:
        subprocess.run([*args, "down"], env=env, capture_output=True, timeout=120, check=False)


def query(port: int, expr: str) -> list[Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    result: list[Any] = body["data"]["result"]
    return result


@pytest.mark.slurm_newer
def test_prometheus_scrapes_slurmctld_openmetrics(metrics_lab: SlurmLab, prometheus: int) -> None:
    wait_until(
        "slurmctld node metrics in Prometheus",
        lambda: len(query(prometheus, 'slurm_node_cpus{job="slurmctld-nodes"}')) == 4,
        60,
    )
    nodes = {r["metric"]["node"] for r in query(prometheus, "slurm_node_cpus")}
    assert nodes == {f"node{i:03d}" for i in range(1, 5)}
    want = {f"slurmctld-{e}": "1" for e in SLURMCTLD_ENDPOINTS}

    def up() -> dict[str, str]:
        rows = query(prometheus, 'up{job=~"slurmctld-.*"}')
        return {r["metric"]["job"]: r["value"][1] for r in rows}

    # each endpoint is its own scrape job, scraped on its own schedule
    wait_until("every slurmctld endpoint scraped", lambda: up() == want, 60, lambda: str(up()))
