"""Avoiding nodes that failed the health gate recently: records, Slurm reasons, plan, CLI."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmfm.cli.plan import plan_command
from slurmfm.plan import failed
from slurmfm.plan.cost import JobShape
from slurmfm.plan.planner import plan
from slurmfm.topology.model import Topology

NOW = datetime.fromisoformat("2026-12-01T12:00:00+00:00").timestamp()
STATE = """\
2026-11-29T08:00:00Z restart=0 event=start
2026-11-29T08:01:00Z restart=0 event=requeue health gate failed on n01
2026-12-01T10:00:00Z restart=1 event=start
2026-12-01T10:02:00Z restart=1 event=requeue health gate failed on n02 n05 \n2026-12-01T10:05:00Z restart=2 event=requeue preempted
"""


def test_durations() -> None:
    assert failed.parse_duration("24h") == 86400
    assert failed.parse_duration("90m") == 5400
    assert failed.parse_duration("2d") == 172800
    assert failed.parse_duration("6") == 6 * 3600
    with pytest.raises(failed.FailedNodesError, match="duration"):
        failed.parse_duration("yesterday")


def test_state_records_in_the_window_only(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train_42.state").write_text(STATE)
    got = failed.recent_failures(86400, [tmp_path], ask_slurm=False, now=NOW)
    # n01 failed 52 h ago: outside 24 h; "preempted" is not a health failure.
    assert sorted(got) == ["n02", "n05"]
    assert "2026-12-01T10:02:00Z" in got["n02"]
    assert sorted(failed.recent_failures(3 * 86400, [tmp_path], ask_slurm=False, now=NOW)) == [
        "n01",
        "n02",
        "n05",
    ]


def test_slurm_reasons_count_only_slurmfm_drains() -> None:
    text = (
        "2026-12-01T11:00:00|n[03-04]|slurmfm: health gate: 7/8 GPUs\n"
        "2026-12-01T11:00:00|n07|maintenance\n"
        "2026-11-01T11:00:00|n08|slurmfm: health gate: EFA\n"
    )
    since = datetime.fromisoformat("2026-12-01T00:00:00").timestamp()
    assert sorted(failed.from_sinfo_reasons(text, since)) == ["n03", "n04"]


def tree() -> Topology:
    return Topology.from_paths({f"n{i:02d}": ("core", f"leaf{i // 4}") for i in range(8)})


def test_plan_leaves_failed_nodes_out_and_says_why() -> None:
    p = plan(tree(), JobShape(4, 8, tp=8), avoid={"n01": "health gate failed 10:02"})
    assert "n01" not in p.nodes
    assert any("avoided 1 node(s) that failed recently: n01 (health" in w for w in p.explanation)


def test_cli_avoid_failed_since(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failed, "sinfo_reasons", lambda since: {})
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf0 Nodes=n[00-03]\nSwitchName=leaf1 Nodes=n[04-07]\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    now = datetime.now().astimezone().strftime("%Y-%m-%dT%H:%M:%S%z")
    (logs / "job_7.state").write_text(
        f"{now} restart=0 event=requeue health gate failed on n04 n05\n"
    )
    args = ["--topology", str(conf), "--nodes", "4", "--json"]
    res = CliRunner().invoke(plan_command, args)
    assert res.exit_code == 0, res.output
    # Two equal leaves: Slurm's own choice (the last switch on a tie) is kept.
    assert json.loads(res.stdout)["nodes"] == ["n04", "n05", "n06", "n07"]
    res = CliRunner().invoke(
        plan_command, [*args, "--avoid-failed-since", "1h", "--failed-records", str(logs)]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["nodes"] == ["n00", "n01", "n02", "n03"]
    res = CliRunner().invoke(plan_command, [*args, "--avoid-failed-since", "soon"])
    assert res.exit_code == 2
    assert "expected a duration" in res.stderr


def test_cli_oversubscription_changes_the_prediction(tmp_path: Path) -> None:
    conf = tmp_path / "topology.conf"
    conf.write_text(
        "SwitchName=leaf0 Nodes=n[00-03]\nSwitchName=leaf1 Nodes=n[04-07]\n"
        "SwitchName=core Switches=leaf[0-1]\n"
    )
    base = ["--topology", str(conf), "--nodes", "6", "--tp", "8", "--json"]
    one = json.loads(CliRunner().invoke(plan_command, base).stdout)
    four = json.loads(CliRunner().invoke(plan_command, [*base, "--oversubscription", "4"]).stdout)
    # 6 nodes over two 4-node leaves. At 1 nothing is congested and the fewest-leaves fill
    # (4 + 2) stays; at 4 the 2-node leaf's uplink slows the ring by 4/2, and the plan says
    # which tier bounds the ring and by how much. Balancing 3 + 3 would be predicted faster
    # (4/3) but leaves no leaf with 2 free nodes, less free room than Slurm's own 4 + 2:
    # cluster citizenship keeps 4 + 2 and says what it gave up.
    assert one["nodes"] == ["n00", "n01", "n02", "n03", "n04", "n05"]
    assert one["bound_by"]["dp"] == "spine"
    assert four["nodes"] == one["nodes"]
    assert four["bound_by"]["dp"] == "spine x2.00"
    assert four["predicted"]["dp_s"] > one["predicted"]["dp_s"]
    assert any(
        w.startswith("citizenship: a placement predicted") and "less free room" in w
        for w in four["explanation"]
    )
