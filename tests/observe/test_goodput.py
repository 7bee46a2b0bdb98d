"""The goodput ledger's arithmetic (slurmfm/job/goodput.py) on state files and progress
histories as the job writes them, and the checkpoint-interval advice (Young 1974, Daly 2006)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmfm import checkpoint as ck
from slurmfm.job import goodput as gp
from slurmfm.job.state import events, format_line
from slurmfm.observe import goodput as og
from slurmfm.observe.report import build_report, render_text

T0 = 1_800_000_000.0  # a whole second, as state-file times are
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "goodput"


def state(*lines: tuple[float, int, str, str]) -> str:
    return "".join(format_line(T0 + t, r, ev, detail) for t, r, ev, detail in lines)


def prog(t: float, step: int, pid: int = 100, restart: int = 0, **kw: object) -> gp.Progress:
    return gp.Progress(T0 + t, step, pid, "7", restart, **kw)  # type: ignore[arg-type]


def one_job(text: str, submitted: float | None = 0.0, **kw: object) -> list[gp.Job]:
    sub = None if submitted is None else T0 + submitted
    return [gp.Job("7", sub, tuple(gp.attempts("7", events(text))), **kw)]  # type: ignore[arg-type]


def approx(x: float) -> object:
    return pytest.approx(x, abs=1e-6)


def test_a_clean_run_is_queue_start_up_training_saves_and_its_end() -> None:
    text = state((10, 0, "start", "nodes=n[1-2]"), (100, 0, "finished", "exit 0"))
    recs = [
        prog(20, 1),
        prog(40, 10, checkpoint=10, save_s=2.0),
        prog(60, 20, checkpoint=20, save_s=3.0),
        prog(90, 30),
    ]
    led = gp.ledger(one_job(text), recs, now=T0 + 500)
    p = led["parts"]
    assert p["queued"] == approx(10)
    assert p["startup"] == approx(10)
    assert p["checkpoint"] == approx(5)
    assert p["productive"] == approx(70 - 5)
    assert p["other"] == approx(10)
    assert led["wall_s"] == approx(100)
    assert led["ettr"] == approx(0.65)
    assert led["failures"] == []
    assert led["save_s"] == approx(2.5)
    assert led["interval_s"] == approx(20)
    assert led["interval_steps"] == 10
    assert sum(p.values()) == approx(led["wall_s"])


def test_a_killed_worker_relaunched_in_the_allocation_loses_detection_restart_and_recompute() -> (
    None
):
    """Killed after step 13 (last report at 13 s after the save of step 10); the runtime
    relaunched at 40; the new launch resumed from step 10 and reported step 11 at 52."""
    text = state(
        (0, 0, "start", ""),
        (40, 0, "relaunch", "a worker killed by signal 9 on n1 after progress"),
        (90, 0, "finished", ""),
    )
    recs = [
        prog(5, 1),
        prog(20, 10, checkpoint=10, save_s=1.0),
        prog(27, 13),
        prog(52, 11, pid=200),
        prog(80, 20, pid=200, checkpoint=20, save_s=1.0),
        prog(85, 22, pid=200),
    ]
    led = gp.ledger(one_job(text), recs, now=T0 + 1000)
    p = led["parts"]
    (f,) = led["failures"]
    assert "signal 9" in f["reason"]
    assert f["recomputed"] == approx(7)
    assert f["recomputed_steps"] == 3
    assert f["detection"] == approx(13)
    assert f["restart"] == approx(12)
    assert p["startup"] == approx(5)
    assert p["productive"] == approx((20 - 5 - 1) + (85 - 52 - 1))
    assert p["checkpoint"] == approx(2)
    assert sum(p.values()) == approx(90)
    assert led["ettr"] == approx(46 / 90)
    assert led["failure_interval_s"] == approx(90)


def test_a_pre_timeout_save_is_a_planned_requeue_not_a_failure() -> None:
    text = state(
        (5, 0, "start", ""),
        (50, 0, "signal", "USR2 before the time limit"),
        (52, 0, "requeue", "saved before the time limit"),
        (180, 1, "start", ""),
        (230, 1, "finished", ""),
    )
    recs = [
        prog(10, 1),
        prog(51, 30, checkpoint=30, save_s=1.0),
        prog(190, 31, pid=300, restart=1),
        prog(228, 50, pid=300, restart=1),
    ]
    led = gp.ledger(one_job(text), recs, now=T0 + 1000)
    p = led["parts"]
    assert led["failures"] == []
    assert p["requeue_wait"] == approx(180 - 52)
    assert p["startup"] == approx(5 + 10)
    assert p["checkpoint"] == approx(1)
    assert p["productive"] == approx(40 + 38)
    assert sum(p.values()) == approx(230)


def test_a_requeue_slurm_did_alone_counts_to_the_next_start_as_detection() -> None:
    """A node lost: the attempt wrote no end; the next one records ``restart``."""
    text = state(
        (0, 0, "start", ""),
        (100, 1, "start", ""),
        (100, 1, "restart", "requeued by Slurm or an operator (not by slurmfm): NODE_FAIL"),
        (160, 1, "finished", ""),
    )
    recs = [
        prog(10, 1),
        prog(30, 10, checkpoint=10),
        prog(40, 14),
        prog(115, 11, pid=5, restart=1),
        prog(150, 30, pid=5, restart=1),
    ]
    led = gp.ledger(one_job(text), recs, now=T0 + 1000)
    (f,) = led["failures"]
    assert "NODE_FAIL" in f["reason"]
    assert f["recomputed"] == approx(10)
    assert f["detection"] == approx(60)
    assert f["restart"] == approx(15)
    assert f["requeue_wait"] == approx(0)
    assert sum(led["parts"].values()) == approx(160)


def test_a_run_of_two_job_ids_counts_the_gap_between_them_and_each_queue() -> None:
    a = state((10, 0, "start", ""), (50, 0, "fail", "crash loop: ..."))
    b = state((130, 0, "start", ""), (200, 0, "finished", ""))
    jobs = [
        gp.Job("7", T0, tuple(gp.attempts("7", events(a)))),
        gp.Job("9", T0 + 100, tuple(gp.attempts("9", events(b)))),
    ]
    recs = [
        gp.Progress(T0 + 20, 1, 1, "7", 0),
        gp.Progress(T0 + 30, 5, 1, "7", 0, 5, 0.5),
        gp.Progress(T0 + 40, 8, 1, "7", 0),
        gp.Progress(T0 + 140, 6, 2, "9", 0),
        gp.Progress(T0 + 190, 20, 2, "9", 0),
    ]
    led = gp.ledger(jobs, recs, now=T0 + 1000)
    p = led["parts"]
    assert led["jobs"] == ["7", "9"]
    assert p["queued"] == approx(10 + 30)
    assert p["idle"] == approx(50)
    assert p["productive"] == approx(9.5 + 50)
    (f,) = led["failures"]
    assert f["recomputed"] == approx(10)
    assert f["recomputed_steps"] == 3
    assert f["restart"] == approx(10)  # the next first progress, after the queue
    assert sum(p.values()) == approx(200)


def test_a_running_job_is_counted_until_now_and_a_pending_one_waits() -> None:
    text = state((10, 0, "start", ""))
    led = gp.ledger(one_job(text), [prog(20, 1), prog(40, 9)], now=T0 + 45)
    assert led["wall_s"] == approx(45)
    assert led["parts"]["productive"] == approx(20)
    assert led["parts"]["other"] == approx(5)
    requeued = state((10, 0, "start", ""), (30, 0, "requeue", "after progress"))
    led = gp.ledger(one_job(requeued, waiting=True), [prog(15, 1), prog(25, 5)], now=T0 + 90)
    assert led["parts"]["requeue_wait"] == approx(60)
    assert led["failures"][0]["requeue_wait"] == approx(60)


def test_no_progress_history_leaves_etr_unmeasured_but_still_sums() -> None:
    text = state((10, 0, "start", ""), (70, 0, "finished", ""))
    led = gp.ledger(one_job(text), [], now=T0 + 100)
    assert led["ettr"] is None
    assert led["parts"]["startup"] == approx(60)
    assert sum(led["parts"].values()) == approx(led["wall_s"])


# ------------------------------------------------------------------------ invariants

EVENTS = st.sampled_from(["relaunch", "requeue", "fail", "finished", "signal", "stop", "start"])


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[gp.Job], list[gp.Progress], float]:
    """Arbitrary state files and progress histories: events and reports in any order, at
    any times, of one or two job ids (whatever a killed or odd job may leave)."""
    jobs = []
    progress = []
    t = 0.0
    for j, job in enumerate(
        draw(st.lists(st.sampled_from(["7", "8", "9"]), min_size=1, max_size=2, unique=True))
    ):
        lines = []
        submitted = draw(st.one_of(st.none(), st.floats(0, 50)))
        for _ in range(draw(st.integers(1, 8))):
            t += draw(st.floats(0, 30))
            restart = draw(st.integers(0, 2))
            lines.append((round(t), restart, draw(EVENTS), "why"))
            for _ in range(draw(st.integers(0, 3))):
                t += draw(st.floats(0, 10))
                ck_step = draw(st.one_of(st.none(), st.integers(0, 40)))
                progress.append(
                    gp.Progress(
                        T0 + t,
                        draw(st.integers(0, 40)),
                        draw(st.integers(1, 3)),
                        job,
                        restart,
                        ck_step,
                        draw(st.one_of(st.none(), st.floats(0, 20))),
                    )
                )
        text = state(*lines)
        sub = None if submitted is None else T0 + submitted + 100 * j
        jobs.append(
            gp.Job(
                job,
                sub,
                tuple(gp.attempts(job, events(text))),
                draw(st.one_of(st.none(), st.just(T0 + t + 5))),
                draw(st.booleans()),
            )
        )
    return jobs, progress, T0 + t + draw(st.floats(0, 100))


@given(runs())
@settings(max_examples=300, deadline=None)
def test_the_parts_sum_to_the_wall_time_and_ettr_is_a_ratio(
    run: tuple[list[gp.Job], list[gp.Progress], float],
) -> None:
    jobs, progress, now = run
    led = gp.ledger(jobs, progress, now)
    parts = led["parts"]
    assert all(v >= 0 for v in parts.values()), parts
    assert math.isclose(sum(parts.values()), led["wall_s"], abs_tol=1e-6)
    if led["ettr"] is not None:
        assert 0.0 <= led["ettr"] <= 1.0
        assert math.isclose(led["ettr"] * led["wall_s"], parts["productive"], abs_tol=1e-6)
    for part in gp.FAILURE_PARTS:
        assert sum(f[part] for f in led["failures"]) <= parts[part] + 1e-6


# ------------------------------------------------------------------ checkpoint advice


def test_young_daly_optimum_is_sqrt_2cm_for_a_small_save_and_the_least_waste() -> None:
    c, m = 60.0, 6 * 3600.0
    young = math.sqrt(2 * c * m)
    assert gp.optimum(c, m) == pytest.approx(young, rel=0.05)
    best = gp.waste(gp.optimum(c, m), c, m)
    for tau in (young / 3, young / 2, young * 2, young * 3):
        assert gp.waste(tau, c, m) > best


@given(st.floats(0.1, 3600), st.floats(600, 1e6), st.floats(1, 1e6))
@settings(max_examples=200, deadline=None)
def test_no_interval_wastes_less_than_the_young_optimum_to_first_order(
    c: float, m: float, tau: float
) -> None:
    young = math.sqrt(2 * c * m)
    assert gp.waste(tau, c, m) >= gp.waste(young, c, m) - 1e-9


def test_advice_names_the_interval_in_use_the_optimum_and_the_ettr_it_would_gain() -> None:
    """The issue's example: every 4.7 h at one failure per 6 h."""
    a = gp.advice(save_s=10 * 60.0, failure_interval_s=6 * 3600.0, interval_s=4.7 * 3600.0)
    assert a is not None
    assert a["young_s"] == pytest.approx(math.sqrt(2 * 600 * 6 * 3600))
    assert a["ettr_gain"] > 0.1
    line = gp.advice_line(a, interval_steps=500)
    assert line.startswith("saving every 500 steps (4.7 h) at one failure per 6.0 h")
    # Daly's higher-order terms, less the save itself: a little under Young's 85 min
    assert 0.85 * a["young_s"] < a["optimum_s"] < a["young_s"]
    assert f"Young/Daly's optimum sqrt(2*C*M) is about {gp.hours(a['optimum_s'])}" in line
    assert "points of ETTR less" in line
    assert gp.advice(None, 3600.0, 60.0) is None
    assert gp.advice(5.0, None, 60.0) is None


# --------------------------------------------------------------- the history's writer


def test_report_progress_and_save_write_the_history_the_ledger_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "progress.json"
    monkeypatch.setenv("SLURMFM_PROGRESS_FILE", str(target))
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURMFM_RESTART", "2")
    monkeypatch.setattr(ck, "_last_write", [0.0])
    assert ck.report_progress(1)
    assert not ck.report_progress(2)  # throttled: neither file changes
    ck.save(tmp_path / "ckpt", 3, lambda d: (d / "x").write_text("x"))
    recs = gp.parse_history((tmp_path / "progress.jsonl").read_text() + "not json\n{}\n")
    assert [(r.step, r.checkpoint, r.job, r.restart, r.pid) for r in recs] == [
        (1, None, "41", 2, os.getpid()),
        (3, 3, "41", 2, os.getpid()),
    ]
    assert recs[1].save_s is not None
    assert recs[1].save_s >= 0
    assert json.loads(target.read_text())["checkpoint_step"] == 3


# ------------------------------------------------------------ slurmfm report, recorded


def _recorded_run(tmp_path: Path) -> Path:
    """A log directory as a lab run of the kill fault left it (fixtures/goodput)."""
    logs = tmp_path / "logs"
    (logs / "quickstart_7.evidence").mkdir(parents=True)
    text = state(
        (3, 0, "start", "nodes=node[001-004]"),
        (40, 0, "relaunch", "a worker killed by signal 9 on node001 after progress"),
        (90, 0, "finished", "exit 0"),
    )
    (logs / "quickstart_7.state").write_text(text)
    hist = "".join(
        gp.history_line(T0 + t, s, {"SLURM_JOB_ID": "7"}, pid, c, v)
        for t, s, pid, c, v in [
            (5, 1, 10, None, None),
            (20, 10, 10, 10, 1.0),
            (27, 13, 10, None, None),
            (52, 11, 20, None, None),
            (80, 20, 20, 20, 1.0),
            (85, 22, 20, None, None),
        ]
    )
    (logs / "quickstart_7.evidence" / "progress.jsonl").write_text(hist)
    return logs


def test_report_shows_the_ledger_and_json_has_goodput_with_ettr(tmp_path: Path) -> None:
    logs = _recorded_run(tmp_path)
    submit = "2027-01-15T08:00:00"  # SubmitTime as scontrol prints it (local time)
    record = {"JobState": "COMPLETED", "Restarts": "0", "SubmitTime": submit}
    led = og.build("7", record=record, log_dir=logs, name="quickstart", uid=None, history=[])
    assert led["ettr"] is not None
    assert 0 < led["ettr"] < 1
    rep = build_report("7", record={"JobState": "COMPLETED"}, log_dir=logs, name="quickstart")
    data = json.loads(rep.to_json())
    # no submission time known: the wall time starts with the first batch start (3 s)
    assert data["goodput"]["ettr"] == pytest.approx(46 / 87)
    assert data["goodput"]["failures"][0]["recomputed_steps"] == 3
    text = render_text(rep)
    assert "goodput (job 7; 1 attempt(s), 1 failure(s)): ETTR 52.9 %" in text
    assert "productive training" in text
    assert "recomputed steps" in text
    assert "failure 1 (job 7, attempt 0," in text
    assert "a save takes 1 s (median of 2)" in text


def test_a_recorded_lab_run_agrees_with_its_own_timeline() -> None:
    """The state file and progress history of a real lab run (fixtures/goodput: a worker
    SIGKILLed at step 12, relaunched in the allocation, resumed from step 10), against the
    training's own unthrottled timeline of the same run."""
    text = (FIXTURES / "quickstart_37754.state").read_text()
    recs = gp.parse_history((FIXTURES / "progress.jsonl").read_text())
    jobs = [gp.Job("37754", None, tuple(gp.attempts("37754", events(text))))]
    led = gp.ledger(jobs, recs, now=0.0)
    assert math.isclose(sum(led["parts"].values()), led["wall_s"], abs_tol=1e-6)
    assert led["wall_s"] == approx(193.0)  # 22:56:23 start .. 22:59:36 finished
    (f,) = led["failures"]
    assert "a worker killed by signal 9 on node001" in f["reason"]
    timeline = [x.split() for x in (FIXTURES / "timeline").read_text().splitlines()]
    pids = list(dict.fromkeys(pid for _, pid, _, _ in timeline))
    first = [(float(t), int(s), c) for t, pid, s, c in timeline if pid == pids[0]]
    second = [(float(t), int(s), c) for t, pid, s, c in timeline if pid == pids[1]]
    kept = next(t for t, s, c in first if s == 10 and c == "10")
    productive = (kept - first[0][0]) + (second[-1][0] - second[0][0])
    # saves (0.16 s in all) are the only difference
    assert led["parts"]["productive"] + led["parts"]["checkpoint"] == pytest.approx(
        productive, abs=0.05
    )
    lost = f["detection"] + f["restart"] + f["recomputed"]
    assert lost == pytest.approx(second[0][0] - kept, abs=0.05)
    assert led["interval_steps"] == 5
    assert led["saves"] == 6


# ------------------------------------------------------------------ the node agent


def test_the_first_nodes_agent_exports_the_ledger_to_prometheus(tmp_path: Path) -> None:
    from slurmfm.job import agent

    (tmp_path / "obs").mkdir()
    state_file = tmp_path / "llama_4242.state"
    state_file.write_text(
        state((0, 0, "start", ""), (40, 0, "relaunch", "a worker killed by signal 9 on n1"))
    )
    (tmp_path / "obs" / "progress.jsonl").write_text(
        gp.history_line(T0 + 5, 1, {"SLURM_JOB_ID": "4242"}, 10)
        + gp.history_line(T0 + 20, 10, {"SLURM_JOB_ID": "4242"}, 10, 10, 1.0)
        + gp.history_line(T0 + 52, 11, {"SLURM_JOB_ID": "4242"}, 20)
    )
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURMD_NODENAME": "n1",
        "SLURMFM_HOST_ORDER": "n1 n2",
        "SLURMFM_RUN_ID": "run-1",
        "SLURMFM_STATE_FILE": str(state_file),
        "SLURMFM_PROGRESS_FILE": str(tmp_path / "obs" / "progress.json"),
    }
    text = agent.Agent(env).metrics_text()
    assert "# TYPE slurmfm_goodput_ratio gauge" in text
    assert 'slurmfm_goodput_seconds{jobid="4242",node="n1",part="productive",' in text
    assert 'part="recomputed"' in text
    assert "slurmfm_goodput_failures{" in text
    second = agent.Agent(dict(env, SLURMD_NODENAME="n2")).metrics_text()
    assert "goodput" not in second  # one node exports the run's ledger


def test_a_run_is_the_jobs_of_one_run_id_and_checkpoint_lineage_up_to_this_one() -> None:
    from slurmfm.history import Submission

    def sub(job: str, at: str, run: str = "r", ckpt: str = "/c") -> Submission:
        return Submission(job, "n", run, submitted_at=at, log_dir="/l", checkpoint_dir=ckpt)

    history = [
        sub("1", "2026-01-01T00:00:00Z"),
        sub("2", "2026-01-01T00:00:01Z", ckpt="/other"),
        sub("3", "2026-01-02T00:00:00Z"),
        sub("4", "2026-01-03T00:00:00Z"),
        sub("5", "2026-01-01T00:00:02Z", run=""),
    ]
    assert [s.job_id for s in og.run_jobs("3", history)] == ["1", "3"]
    assert [s.job_id for s in og.run_jobs("5", history)] == ["5"]
    assert og.run_jobs("9", history) == []


def test_a_job_id_numbered_again_is_the_newest_submission_with_it() -> None:
    """Job ids repeat: a cluster (or a lab) brought up afresh numbers from the start again.
    The ledger of job 7 is that of the newest job 7 (in the report's log directory), not of an
    older run that had the same id (seen in a CI simulation: a 56 s run reported 1,764 s)."""
    from slurmfm.history import Submission

    old = Submission("7", "n", "old", submitted_at="2026-01-01T00:00:00Z", log_dir="/a")
    older_same_dir = Submission("6", "n", "new", submitted_at="2026-01-02T00:00:00Z", log_dir="/b")
    new = Submission("7", "n", "new", submitted_at="2026-01-02T00:01:00Z", log_dir="/b")
    other_dir = Submission("7", "n", "x", submitted_at="2026-01-03T00:00:00Z", log_dir="/c")
    history = [old, older_same_dir, new, other_dir]
    assert [s.job_id for s in og.run_jobs("7", history, "/b")] == ["6", "7"]
    assert og.run_jobs("7", history, "/b")[-1] is new
    assert og.run_jobs("7", history)[-1] is other_dir  # no log dir: the newest of them all


def test_a_job_id_submitted_again_in_the_same_directories_is_taken_once() -> None:
    """The same run started again in the same log and checkpoint directories on a cluster that
    numbers afresh: its job ids repeat in one lineage. Each job's state file is named by its id,
    so taking both submissions of one id read one file twice (seen in CI: a run with one
    failure reported two, because a test's earlier run had used the same directories and ids)."""
    from slurmfm.history import Submission

    def sub(job: str, at: str) -> Submission:
        return Submission(job, "n", "r", submitted_at=at, log_dir="/l", checkpoint_dir="/c")

    first_6, first_7 = sub("6", "2026-01-01T00:00:00Z"), sub("7", "2026-01-01T00:01:00Z")
    again_6, again_7 = sub("6", "2026-01-02T00:00:00Z"), sub("7", "2026-01-02T00:01:00Z")
    history = [first_6, first_7, again_6, again_7]
    assert og.run_jobs("7", history, "/l") == [again_6, again_7]
    # the first 7 came before the second 6: still of its lineage, but only once per id
    assert og.run_jobs("6", history, "/l") == [first_7, again_6]
    # the run up to the first 7: the later 6 is not part of it
    assert og.run_jobs("7", [first_6, first_7, again_6], "/l") == [first_6, first_7]


# ------------------------------------------------------------- slurmfm validate

MEGATRON = Path(__file__).resolve().parents[2] / "recipes" / "llama3-70b-p5en-megatron.yaml"


def _megatron(**sets: object) -> object:
    from slurmfm.recipe.loader import load_recipe

    return load_recipe(MEGATRON, overrides=sets)


def test_validate_gives_megatrons_save_interval_the_young_daly_interval() -> None:
    r = _megatron(**{"resilience.expected_failure_interval": "6h"})
    assert og.save_interval_iters(r) == 500
    (line, per_iter) = og.validate_advice(r)
    c = r.save_estimate_s  # type: ignore[attr-defined]
    best = gp.optimum(c, 6 * 3600.0)
    assert line.startswith("checkpoint interval (--save-interval 500): at one failure per 6.0 h")
    assert f"Young/Daly's optimum sqrt(2*C*M) is about {gp.hours(best)}" in line
    assert "(save time estimated: resilience.model_params_b at storage.write_mb_s)" in line
    assert (
        per_iter
        == f"  --save-interval 500 is that interval when an iteration takes {gp.hours(best / 500)}"
    )


def test_validate_uses_the_last_runs_save_and_iteration_times_and_prices_the_gap() -> None:
    r = _megatron(**{"resilience.expected_failure_interval": "3h"})
    observed = {"save_s": 120.0, "step_s": 30.0, "jobs": ["77"]}
    (line,) = og.validate_advice(r, observed)
    assert line.startswith("checkpoint interval (--save-interval 500): saving every 500 steps")
    assert "(save time measured by job 77)" in line
    assert "points of ETTR less" in line  # 500 x 30 s = 4.2 h against about 27 min


def test_validate_says_nothing_without_a_failure_interval_or_for_other_launchers() -> None:
    assert og.validate_advice(_megatron()) == []
    no_size = _megatron(
        **{"resilience.expected_failure_interval": "6h", "resilience.model_params_b": None}
    )
    (line,) = og.validate_advice(no_size)
    assert "needs the save time C" in line
    from slurmfm.recipe.loader import load_recipe

    quick = load_recipe(
        Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml",
        overrides={"resilience.expected_failure_interval": "6h"},
    )
    assert og.validate_advice(quick) == []


@pytest.mark.parametrize("bad", ["soon", "0", "-1h", "6d"])
def test_a_bad_failure_interval_is_one_located_line(tmp_path: Path, bad: str) -> None:
    from slurmfm.recipe.loader import RecipeError, load_recipe

    text = MEGATRON.read_text().replace(
        "resilience:\n", f"resilience:\n  expected_failure_interval: {bad}\n", 1
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    line = text.splitlines().index(f"  expected_failure_interval: {bad}") + 1
    (problem,) = info.value.problems
    assert str(problem).startswith(
        f"{path}:{line}: resilience.expected_failure_interval: {bad!r} is not a duration"
    )


def test_the_validate_command_prints_the_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from slurmfm.cli import main

    monkeypatch.setenv("SLURMFM_HISTORY", "off")
    res = CliRunner().invoke(
        main,
        ["validate", str(MEGATRON), "--set", "resilience.expected_failure_interval=6h"],
    )
    assert res.exit_code == 0, res.output
    assert "checkpoint interval (--save-interval 500): at one failure per 6.0 h" in res.output
