"""Prometheus scrape jobs for slurmctld's own OpenMetrics endpoints (Slurm >= 25.11).

Why: from 25.11 slurmctld exports OpenMetrics (Prometheus) telemetry itself, on SlurmctldPort of
SlurmctldHost (SchedMD/slurm:RELEASE_NOTES.md, 25.11 Highlights), once slurm.conf sets
``MetricsType=metrics/openmetrics`` (slurm.conf(5) of 26.05.5; https://slurm.schedmd.com/metrics.html;
without it the endpoints answer 200 with an empty body, as the 26.05 lab showed). ``GET
/metrics`` lists the endpoints: jobs, nodes, partitions, scheduler and jobs-users-accts. With
them the cluster's Prometheus sees queue, node and scheduler state next to the per-job metrics
slurmfm's agent writes, with no separate exporter. One scrape job per endpoint, since each has
its own ``metrics_path``; a backup controller answers 303 (26.05.0), so only the primary is a
target. Slurm older than 25.11 gets no slurmctld jobs (slurmfm/catalog/slurm_features.py,
``slurmctld_openmetrics``).

``python -m slurmfm.observe.prometheus --slurmctld HOST:PORT --slurm-version V`` prints the
jobs as a ``scrape_configs`` list fragment (``scripts/obs-stack --slurmctld`` appends it).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

__all__ = ["SLURMCTLD_ENDPOINTS", "slurmctld_scrape_jobs"]

SLURMCTLD_ENDPOINTS = ("jobs", "nodes", "partitions", "scheduler", "jobs-users-accts")
"""What 26.05.5's ``GET /metrics`` index lists (the lab's slurmctld)."""

_TARGET = re.compile(r"^[A-Za-z0-9_.\-]+:\d{1,5}$")


def slurmctld_scrape_jobs(target: str, slurm_version: str, *, interval: str = "") -> str:
    """Scrape jobs (YAML list items, two-space indent) for slurmctld at ``target``.

    Empty (with a comment) when ``slurm_version`` has no OpenMetrics endpoint.
    """
    from slurmfm.catalog.slurm_features import SlurmVersion, supports

    if not _TARGET.match(target):
        raise ValueError(f"--slurmctld: {target!r} is not HOST:PORT")
    v = SlurmVersion.parse(slurm_version)
    if not supports("slurmctld_openmetrics", v):
        return f"  # slurmctld {v} has no OpenMetrics endpoint (Slurm >= 25.11): no scrape job\n"
    out = ["  # slurmctld's OpenMetrics (Slurm >= 25.11; MetricsType=metrics/openmetrics)"]
    for endpoint in SLURMCTLD_ENDPOINTS:
        out.append(f"  - job_name: slurmctld-{endpoint}")
        out.append(f"    metrics_path: /metrics/{endpoint}")
        if interval:
            out.append(f"    scrape_interval: {interval}")
        out.append("    static_configs:")
        out.append(f"      - targets: ['{target}']")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slurmfm.observe.prometheus")
    p.add_argument("--slurmctld", required=True, help="HOST:PORT of the primary slurmctld")
    p.add_argument("--slurm-version", required=True)
    p.add_argument("--interval", default="", help="scrape_interval for these jobs")
    a = p.parse_args(argv)
    try:
        sys.stdout.write(slurmctld_scrape_jobs(a.slurmctld, a.slurm_version, interval=a.interval))
    except ValueError as exc:
        print(f"slurmfm: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through scripts/obs-stack
    raise SystemExit(main())
