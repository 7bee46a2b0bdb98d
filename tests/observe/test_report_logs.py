"""``slurmfm report`` and ``slurmfm logs`` from the files a job leaves (no Slurm needed)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from slurmfm.observe import logs as lg
from slurmfm.observe.report import (
    build_report,
    nccl_transport,
    parse_runs,
    render_text,
    topology_summary,
)

NCCL_FIXTURES = Path(__file__).parent.parent / "resilience" / "fixtures"

STATE = """\
2026-05-01T10:00:00Z restart=0 event=start nodes=p5-[1-2]
2026-05-01T10:00:00Z restart=0 event=checkpoint-dir {ckpt}
2026-05-01T10:00:01Z restart=0 event=hosts p5-2 p5-1
2026-05-01T10:30:00Z restart=0 event=requeue step failed with exit 1; unresponsive: p5-1
2026-05-01T10:35:00Z restart=1 event=start nodes=p5-[2-3]
2026-05-01T10:35:00Z restart=1 event=checkpoint-dir {ckpt}
2026-05-01T10:35:01Z restart=1 event=hosts p5-3 p5-2
2026-05-01T10:35:01Z restart=1 event=order by leaf: s1.l2[0] s1.l1[1]; topology order: yes (2 leaves, from SLURM_TOPOLOGY_ADDR)
2026-05-01T11:00:00Z restart=1 event=signal USR2 before the time limit
2026-05-01T11:05:00Z restart=1 event=finished exit 0
"""


def make_job(tmp: Path) -> Path:
    logs = tmp / "logs"
    obs = logs / "llama_99.observe"
    obs.mkdir(parents=True)
    ckpt = tmp / "ckpt"
    for step in (100, 200):
        (ckpt / f"step_{step:09d}").mkdir(parents=True)
    (ckpt / "latest").write_text("step_000000200\n")
    (logs / "llama_99.state").write_text(STATE.format(ckpt=ckpt))
    for node, addr in (("p5-3", "s1.l2.p5-3"), ("p5-2", "s1.l1.p5-2")):
        (obs / f"node_{node}_r1.json").write_text(
            json.dumps({"node": node, "topology_addr": addr, "restart": 1})
        )
    for node in ("p5-2", "p5-3"):
        dev = {"rdmap0s0": {"1": {"tx_bytes": 1000, "rx_bytes": 10, "rx_drops": 0}}}
        (obs / f"efa_start_{node}_r1.json").write_text(json.dumps({"devices": dev}))
        dev["rdmap0s0"]["1"] = {"tx_bytes": 1000 + 2**30, "rx_bytes": 2010, "rx_drops": 3}
        (obs / f"efa_end_{node}_r1.json").write_text(json.dumps({"devices": dev}))
    (obs / "progress.json").write_text(json.dumps({"step": 250, "checkpoint_step": 200}))
    (obs / "job.json").write_text(
        json.dumps({"launcher": "torchrun", "procs_per_node": 8, "tasks_per_node": 1})
    )
    (logs / "nccl-99-r0-p5-2-11.log").write_text((NCCL_FIXTURES / "nccl-socket.log").read_text())
    (logs / "nccl-99-r1-p5-3-12.log").write_text((NCCL_FIXTURES / "nccl-efa.log").read_text())
    (logs / "llama_99.out").write_text(
        "slurmfm: job 99 start 0 (at most 3 restarts)\n"
        "0: first run task 0\n"
        "1: first run task 1\n"
        "slurmfm: job 99 start 1 (at most 3 restarts); last requeue: step failed\n"
        "0: second run task 0\n"
        "1: second run task 1\n"
    )
    return logs


def test_report_from_the_job_files(tmp_path: Path) -> None:
    logs = make_job(tmp_path)
    # checkpoints older than the job's start are not "written by this job"
    old = tmp_path / "ckpt" / "step_000000100"
    os.utime(old, (time.time(), 0))
    rep = build_report(
        "99",
        record={"JobState": "COMPLETED", "Restarts": "1", "NodeList": "p5-[2-3]"},
        log_dir=logs,
        name="llama",
    )
    assert rep.nodes == ["p5-3", "p5-2"]
    assert rep.restarts == 1
    assert [(r.restart, r.outcome) for r in rep.runs] == [(0, "requeue"), (1, "finished")]
    assert rep.runs[0].reason == "step failed with exit 1; unresponsive: p5-1"
    assert rep.runs[0].hosts == ["p5-2", "p5-1"]
    assert rep.runs[1].signals == ["USR2 before the time limit"]
    assert rep.wall_time_s == 30 * 60 + 30 * 60
    assert [c.step for c in rep.checkpoints] == [200]
    assert rep.latest_checkpoint.endswith("step_000000200")
    assert [(n.restart, n.transport) for n in rep.nccl] == [(0, "socket"), (1, "efa")]
    assert rep.efa_totals["p5-2"]["tx_bytes"] == 2**30
    assert rep.efa_totals["p5-3"]["rx_drops"] == 3
    assert rep.efa_delta["p5-3"]["r1:rdmap0s0:1"]["rx_bytes"] == 2000
    assert rep.topology_summary == "2 nodes under 2 leaf switches (s1.l1: 1, s1.l2: 1)"
    assert rep.progress["step"] == 250
    text = render_text(rep)
    assert "nodes (rank order): p5-3 p5-2" in text
    assert "run 0: 2026-05-01T10:00:00Z -> requeue: step failed with exit 1" in text
    assert "run 1: efa" in text
    # the order line prepare recorded (slurmfm/job/rankorder.py), under its run
    assert rep.runs[0].order == ""
    assert (
        "  run 1: 2026-05-01T10:35:00Z -> finished: exit 0 (0:30:00)\n"
        "    rank order by leaf: s1.l2[0] s1.l1[1]; topology order: yes (2 leaves, from "
        "SLURM_TOPOLOGY_ADDR)\n"
    ) in text
    assert "p5-2: tx_bytes 1.0 GiB" in text
    assert "step_000000200 (step 200" in text
    assert json.loads(rep.to_json())["nodes"] == ["p5-3", "p5-2"]


def test_report_without_state_file_says_so(tmp_path: Path) -> None:
    rep = build_report("5", record={}, log_dir=tmp_path, name="x")
    assert "no state file" in rep.notes[0]
    assert "EFA counters: none recorded" in render_text(rep)


def test_parse_runs_of_a_running_job() -> None:
    from datetime import datetime, timezone

    text = "2026-05-01T10:00:00Z restart=0 event=start nodes=a\n"
    [run] = parse_runs(text)
    assert run.outcome == "running"
    assert run.seconds is None
    [run] = parse_runs(text, datetime(2026, 5, 1, 10, 1, tzinfo=timezone.utc))
    assert run.seconds == 60


def test_topology_summary_without_addresses() -> None:
    assert "no topology" in topology_summary({"a": ""})
    assert topology_summary({"a": "s.l1.a"}) == "1 node under 1 leaf switch (s.l1: 1)"


def test_logs_per_restart_and_per_rank(tmp_path: Path) -> None:
    logs = make_job(tmp_path)
    (logs / "llama_99_r1.out").write_text("0: from the per-restart log\n")
    files = lg.log_files(logs, "llama", "99")
    assert [n for n, _ in files] == [-1, 1]
    parts = dict(lg.select(files, "99", None))
    assert parts[0][1] == "0: first run task 0\n"
    assert parts[1][-1] == "0: from the per-restart log\n"
    only1 = lg.select(files, "99", 1)
    assert [n for n, _ in only1] == [1]
    assert list(lg.filter_task(parts[1], 1)) == ["second run task 1\n"]
    assert list(lg.filter_task([" 12: padded\n"], 12)) == ["padded\n"]


def test_rank_to_task() -> None:
    hosts = ["n3", "n1"]  # host order: node rank 0 is n3
    alloc = ["n1", "n3"]  # Slurm numbers tasks in allocation order
    kw = {"procs_per_node": 4, "hosts": hosts, "allocation": alloc}
    assert lg.task_for_rank(0, launcher="torchrun", **kw) == 1  # type: ignore[arg-type]
    assert lg.task_for_rank(5, launcher="torchrun", **kw) == 0  # type: ignore[arg-type]
    assert lg.task_for_rank(5, launcher="nemo", **kw) == 5  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in this job"):
        lg.task_for_rank(8, launcher="torchrun", **kw)  # type: ignore[arg-type]


@pytest.fixture
def stub_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    logs = make_job(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(
        "#!/bin/sh\n"
        f"echo 'JobId=99 JobName=llama JobState=COMPLETED Restarts=1 ExitCode=0:0 "
        f"NodeList=p5-[2-3] RunTime=00:55:00 StdOut={logs}/llama_99.out'\n"
    )
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    return logs


def test_cli_report_and_logs(stub_scontrol: Path) -> None:
    from click.testing import CliRunner

    from slurmfm.cli import main

    runner = CliRunner()
    res = runner.invoke(main, ["report", "99"])
    assert res.exit_code == 0, res.output
    assert "nodes (rank order): p5-3 p5-2" in res.output
    assert "restarts: 1" in res.output
    res = runner.invoke(main, ["report", "99", "--json"])
    assert json.loads(res.output)["checkpoint_dir"].endswith("ckpt")
    res = runner.invoke(main, ["logs", "99", "--restart", "1", "--rank", "0"])
    assert res.exit_code == 0, res.output
    # rank 0 is on p5-3 (host order), which is task 1 in the allocation order p5-2, p5-3
    assert res.output == "== restart 1 ==\nsecond run task 1\n"
    res = runner.invoke(main, ["logs", "99"])
    assert "== restart 0 ==" in res.output
    assert "== restart 1 ==" in res.output


def test_cli_logs_rank_needs_observability(stub_scontrol: Path) -> None:
    from click.testing import CliRunner

    from slurmfm.cli import main

    (stub_scontrol / "llama_99.observe" / "job.json").unlink()
    res = CliRunner().invoke(main, ["logs", "99", "--rank", "0"])
    assert res.exit_code == 2
    assert "a rank's output needs a job run with observability on" in res.output
    assert "observability.enabled: on" in res.output


def test_cli_logs_of_a_restart_that_never_happened_exits_2(stub_scontrol: Path) -> None:
    from click.testing import CliRunner

    from slurmfm.cli import main

    res = CliRunner().invoke(main, ["logs", "99", "--restart", "5"])
    assert res.exit_code == 2
    assert res.output == "job 99: restart 5 never happened; its log holds restarts 0, 1\n"


def test_parse_runs_marks_a_run_requeued_by_slurm_or_an_operator() -> None:
    """15.16a: the `restart` record of run 1 tells how run 0 ended; `stop` ends a run."""
    text = (
        "2026-05-01T10:00:00Z restart=0 event=start nodes=a\n"
        "2026-05-01T10:05:00Z restart=0 event=stop requeued by Slurm or an operator (...)\n"
        "2026-05-01T10:07:00Z restart=1 event=start nodes=a\n"
        "2026-05-01T10:07:01Z restart=1 event=restart requeued by Slurm or an operator "
        "(not by slurmfm): scontrol: requeued at 2026-05-01T10:05:00, Restarts=1\n"
        "2026-05-01T10:08:00Z restart=1 event=stop cancelled (scancel by the owner or an admin)\n"
    )
    first, second = parse_runs(text)
    assert first.outcome == "requeue"
    assert first.reason.startswith("requeued by Slurm or an operator (not by slurmfm)")
    assert first.seconds == 300
    assert (second.outcome, second.reason) == (
        "stop",
        "cancelled (scancel by the owner or an admin)",
    )


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("NCCL INFO NET/OFI Selected provider is efa, fabric is efa", "efa"),  # aws-ofi-nccl 1.14+
        ("NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)", "efa"),  # <= 1.13
        ("NCCL INFO Selected Provider is efa", "efa"),
        ("NCCL INFO Using network AWS Libfabric", "efa"),
        ("NCCL INFO Using network Libfabric", "efa"),
        ("NCCL INFO Using network OFI", "efa"),
        ("NCCL INFO Using network Socket", "socket"),
        ("NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>", "socket"),
        ("NCCL INFO Bootstrap : Using eth0", "unknown"),
    ],
)
def test_report_reads_every_transport_line_the_runtime_reads(
    tmp_path: Path, line: str, want: str
) -> None:
    """`slurmfm report` and the job's own NCCL check (slurmfm.job.nccl) share one set of
    patterns. Before, the report's narrower pattern called an EFA job "unknown" when the
    plugin printed `Selected Provider is efa` (<= 1.13) or NCCL `Using network Libfabric`."""
    (tmp_path / "nccl-7-r0-p5-1.log").write_text("NCCL INFO Bootstrap : Using eth0\n" + line + "\n")
    [seen] = nccl_transport(tmp_path, "7")
    assert (seen.restart, seen.transport) == (0, want)
    assert seen.evidence == (line if want != "unknown" else "")


def test_report_names_the_cause_of_missing_topology_addresses() -> None:
    from slurmfm.observe.report import topology_summary

    assert topology_summary({}).startswith("not recorded: no node agent ran")
    assert "no topology plugin" not in topology_summary({})
    assert topology_summary({"a": "", "b": ""}) == (
        "no topology addresses: Slurm set no SLURM_TOPOLOGY_ADDR (no topology plugin)"
    )


def test_the_fabric_test_is_in_the_report(tmp_path: Path) -> None:
    """The batch step records the fabric test's figures (event=fabric); report shows them."""
    logs = make_job(tmp_path)
    state = logs / "llama_99.state"
    lines = state.read_text().splitlines()
    lines.insert(
        2,
        "2026-05-01T10:00:01Z restart=0 event=fabric failed: peak busbw 300.00 GB/s at "
        "17179869184 B; 2 node(s); floor 389.60 GB/s; below the floor",
    )
    state.write_text("\n".join(lines) + "\n")
    rep = build_report("99", record={"JobState": "FAILED"}, log_dir=logs, name="llama")
    assert rep.fabric == [
        (
            0,
            "failed: peak busbw 300.00 GB/s at 17179869184 B; 2 node(s); "
            "floor 389.60 GB/s; below the floor",
        )
    ]
    text = render_text(rep)
    assert "fabric test (nccl-tests all_reduce_perf):" in text
    assert "  run 0: failed: peak busbw 300.00 GB/s" in text
