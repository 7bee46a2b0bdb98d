"""The Grafana dashboard for one slurmfm job, built with grafana-foundation-sdk.

Why a builder and a shipped file: Grafana is not installable on the machines this project is
built on, so the dashboard is not hand-written JSON but the output of Grafana's own maintained
builder library (grafana-foundation-sdk, generated from Grafana's schemas), and the generated
JSON is shipped in ``slurmfm/observe/dashboards/slurmfm-job.json`` for import into Grafana. A
test checks that the shipped file is exactly what :func:`build` produces, and the Prometheus
test runs every panel's PromQL against a real Prometheus for a real job.
Regenerate with ``python -m slurmfm.observe.dashboard --write``.

Every query is filtered by the ``$jobid`` variable:

* GPU panels use DCGM-Exporter's metrics, labelled ``hpc_job`` by its HPC job mapping
  (the files the job's agent writes; dcgm-exporter ``internal/pkg/transformation/const.go``)
  and its default counters (``etc/default-counters.csv``: ``DCGM_FI_DEV_GPU_UTIL``,
  ``DCGM_FI_DEV_FB_USED``, ``DCGM_FI_DEV_POWER_USAGE``, ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL``).
* EFA panels use the EFA node exporter's ``node_amazonefa_tx_bytes``/``rx_bytes`` counters
  (labels ``device``, ``port``), which know no job: they are joined with the job's own
  ``slurmfm_job_info`` series on the host part of ``instance``, so they need both exporters
  scraped under the same host name (as the HyperPod and ParallelCluster samples do). On a
  node shared by several jobs the EFA traffic is the node's, not the job's.
* Progress, restarts and goodput come from the textfile metrics the job's agent writes.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "dashboards" / "slurmfm-job.json"
UID = "slurmfm-job"

# The job's hosts, keyed by the host part of `instance` (drops a ":port").
_JOB_HOSTS = (
    'max by (host) (label_replace(slurmfm_job_info{jobid="$jobid"}, '
    '"host", "$1", "instance", "([^:]+).*"))'
)


def _efa(counter: str) -> str:
    return (
        f'sum by (host) (label_replace(rate(node_amazonefa_{counter}[$__rate_interval]), "host", '
        f'"$1", "instance", "([^:]+).*") * on (host) group_left () {_JOB_HOSTS})'
    )


@dataclass(frozen=True)
class PanelSpec:
    """One panel: title, unit, and (PromQL, legend) per series."""

    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]
    kind: str = "timeseries"
    description: str = ""


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec(
        "Training step",
        "none",
        (
            ('max by (jobid) (slurmfm_train_step{jobid="$jobid"})', "step"),
            ('max by (jobid) (slurmfm_checkpoint_step{jobid="$jobid"})', "last checkpoint"),
        ),
        description="Reported by the training script (slurmfm.checkpoint.report_progress).",
    ),
    PanelSpec(
        "Restarts",
        "none",
        (('max by (jobid) (slurmfm_job_restarts{jobid="$jobid"})', "restarts"),),
        kind="stat",
        description="Requeues of the job; the reasons are in `slurmfm report`.",
    ),
    PanelSpec(
        "Nodes",
        "none",
        (('count by (jobid) (slurmfm_job_running{jobid="$jobid"})', "nodes"),),
        kind="stat",
    ),
    PanelSpec(
        "GPU utilisation",
        "percent",
        (('DCGM_FI_DEV_GPU_UTIL{hpc_job="$jobid"}', "{{Hostname}} GPU {{gpu}}"),),
    ),
    PanelSpec(
        "GPU memory used",
        "decmbytes",
        (('DCGM_FI_DEV_FB_USED{hpc_job="$jobid"}', "{{Hostname}} GPU {{gpu}}"),),
    ),
    PanelSpec(
        "GPU power",
        "watt",
        (('DCGM_FI_DEV_POWER_USAGE{hpc_job="$jobid"}', "{{Hostname}} GPU {{gpu}}"),),
    ),
    PanelSpec(
        "NVLink throughput",
        "KBs",
        (
            (
                'rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{hpc_job="$jobid"}[$__rate_interval])',
                "{{Hostname}} GPU {{gpu}}",
            ),
        ),
    ),
    PanelSpec(
        "EFA throughput",
        "Bps",
        ((_efa("tx_bytes"), "{{host}} tx"), (_efa("rx_bytes"), "{{host}} rx")),
        description="Node EFA traffic (EFA node exporter) on the job's nodes.",
    ),
    PanelSpec(
        "Goodput (ETTR)",
        "percentunit",
        (('max by (jobid) (slurmfm_goodput_ratio{jobid="$jobid"})', "ETTR"),),
        kind="stat",
        description=(
            "Productive training time over wall time since the job's first start (the goodput "
            "ledger, slurmfm/job/goodput.py); `slurmfm report` adds the time queued."
        ),
    ),
    PanelSpec(
        "Where the time went",
        "s",
        (('max by (jobid, part) (slurmfm_goodput_seconds{jobid="$jobid"})', "{{part}}"),),
        description=(
            "The goodput ledger's parts: start-up, productive training, checkpoint saves, "
            "failure detection, restart, recomputed steps, requeue waits."
        ),
    ),
)


def build() -> dict[str, object]:
    """The dashboard as a JSON-ready dict (grafana-foundation-sdk's own encoding)."""
    from grafana_foundation_sdk.builders import common as gc
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders import prometheus, stat, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.common import (
        LegendDisplayMode,
        LegendPlacement,
        SortOrder,
        TooltipDisplayMode,
    )
    from grafana_foundation_sdk.models.dashboard import (
        DataSourceRef,
        VariableRefresh,
        VariableSort,
    )

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (
        gd.Dashboard("slurmfm job")
        .uid(UID)
        .tags(["slurmfm", "slurm", "gpu", "efa"])
        .description(
            "One slurmfm job: GPUs (DCGM-Exporter hpc_job), EFA, progress and restarts. "
            "Generated by slurmfm.observe.dashboard."
        )
        .time("now-6h", "now")
        .refresh("30s")
        .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            gd.QueryVariable("jobid")
            .label("Slurm job id")
            .datasource(ds)
            .query("label_values(slurmfm_job_info, jobid)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.NUMERICAL_DESC)
        )
    )
    for i, spec in enumerate(PANELS):
        targets = [
            prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + j))
            for j, (expr, legend) in enumerate(spec.queries)
        ]
        panel: timeseries.Panel | stat.Panel
        if spec.kind == "stat":
            panel = (
                stat.Panel()
                .title(spec.title)
                .datasource(ds)
                .unit(spec.unit)
                .reduce_options(gc.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            )
            width = 6
        else:
            panel = (
                timeseries.Panel()
                .title(spec.title)
                .datasource(ds)
                .unit(spec.unit)
                .legend(
                    gc.VizLegendOptions()
                    .show_legend(True)
                    .display_mode(LegendDisplayMode.LIST)
                    .placement(LegendPlacement.BOTTOM)
                    .calcs([])
                )
                # the SDK's enums are enum.StrEnum (3.11); mypy checks for 3.10
                .tooltip(
                    gc.VizTooltipOptions()
                    .mode(TooltipDisplayMode.MULTI)  # type: ignore[arg-type]
                    .sort(SortOrder.NONE)
                )
            )
            width = 12
        if spec.description:
            panel = panel.description(spec.description)
        panel = panel.id(i + 1).height(4 if spec.kind == "stat" else 8).span(width)
        for t in targets:
            panel = panel.with_target(t)
        board = board.with_panel(panel)
    encoded: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return encoded


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def queries(board: dict[str, object]) -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every target in a dashboard dict."""
    out: list[tuple[str, str]] = []
    panels = board.get("panels", [])
    for p in panels if isinstance(panels, list) else []:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if "--write" in args:
        SHIPPED.parent.mkdir(parents=True, exist_ok=True)
        SHIPPED.write_text(text, encoding="utf-8")
        print(f"wrote {SHIPPED}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
