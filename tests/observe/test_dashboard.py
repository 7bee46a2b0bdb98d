"""The shipped Grafana dashboard is exactly what grafana-foundation-sdk builds, and every
query is filtered by the job id variable."""

from __future__ import annotations

import json
import sys

import pytest

from slurmfm.observe import dashboard


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="grafana-foundation-sdk needs Python >= 3.11 (enum.StrEnum); the shipped JSON is "
    "still checked below",
)
def test_shipped_json_equals_the_builder_output() -> None:
    shipped = dashboard.SHIPPED.read_text(encoding="utf-8")
    assert shipped == dashboard.render(), "run: python -m slurmfm.observe.dashboard --write"


def test_every_query_is_filtered_by_jobid() -> None:
    board = json.loads(dashboard.SHIPPED.read_text())
    qs = dashboard.queries(board)
    assert len(qs) == sum(len(p.queries) for p in dashboard.PANELS)
    for title, expr in qs:
        assert '"$jobid"' in expr, title
    titles = {t for t, _ in qs}
    for want in (
        "GPU utilisation",
        "GPU memory used",
        "GPU power",
        "NVLink throughput",
        "EFA throughput",
        "Restarts",
    ):
        assert want in titles


def test_variables_and_datasource() -> None:
    board = json.loads(dashboard.SHIPPED.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["jobid"]["type"] == "query"
    assert "slurmfm_job_info" in json.dumps(variables["jobid"]["query"])
    assert board["uid"] == dashboard.UID
    for p in board["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
