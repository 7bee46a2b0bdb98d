"""The research-script API: Job.from_id, logs per rank/restart/follow, result() raising a
typed error with the log tail, fm.report, the history of submissions, public types."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fake_backend import FakeBackend, write_recipes

from slurmfm import api as fm
from slurmfm.backends.base import JobStatus
from slurmfm.errors import JobFailed, SlurmfmError
from slurmfm.history import HistoryError, Submission, read, record

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class LogBackend:
    """Answers for one job whose log lies in ``logs``; ``states`` are returned in turn."""

    logs: Path
    states: list[str] = field(default_factory=lambda: ["FAILED"])
    name: str = "fake"
    asked: int = 0

    def status(self, job_id: str) -> JobStatus:
        state = self.states[min(self.asked, len(self.states) - 1)]
        self.asked += 1
        return JobStatus(
            job_id,
            state,
            reason="NonZeroExitCode",
            exit_code="1:0",
            name="llama",
            nodes="p5-[2-3]",
            stdout=str(self.logs / f"llama_{job_id}.out"),
        )

    def version(self) -> str:
        return "22.05.8"

    def cancel(self, job_id: str) -> None:
        pass


LOG = (
    "slurmfm: job 99 start 0 (at most 3 restarts)\n"
    "0: first run task 0\n"
    "1: first run task 1\n"
    "slurmfm: job 99 start 1 (at most 3 restarts); last requeue: step failed\n"
    "0: second run task 0\n"
    "1: Traceback: CUDA out of memory\n"
)


@pytest.fixture
def job_logs(tmp_path: Path) -> Path:
    logs = tmp_path / "logs"
    (logs / "llama_99.observe").mkdir(parents=True)
    (logs / "llama_99.out").write_text(LOG)
    (logs / "llama_99.observe" / "job.json").write_text(
        json.dumps({"launcher": "torchrun", "procs_per_node": 8})
    )
    (logs / "llama_99.state").write_text(
        "2026-05-01T10:00:00Z restart=0 event=start nodes=p5-[2-3]\n"
        "2026-05-01T10:00:01Z restart=0 event=hosts p5-3 p5-2\n"
        "2026-05-01T10:07:00Z restart=1 event=start nodes=p5-[2-3]\n"
        "2026-05-01T10:07:01Z restart=1 event=hosts p5-3 p5-2\n"
        "2026-05-01T10:08:00Z restart=1 event=stop step failed (exit 1): not retryable\n"
    )
    return logs


def test_job_from_id_reads_logs_per_restart_and_rank(job_logs: Path) -> None:
    job = fm.Job.from_id("99", backend=LogBackend(job_logs))
    assert job.logs() == LOG
    assert job.logs(restart=0).splitlines()[1:] == ["0: first run task 0", "1: first run task 1"]
    # rank 0 lives on p5-3 (host order), which is task 1 of the allocation p5-2, p5-3
    assert job.logs(restart=1, rank=0) == "Traceback: CUDA out of memory\n"
    with pytest.raises(SlurmfmError, match="restart 4 never happened; its log holds restarts 0, 1"):
        job.logs(restart=4)
    with pytest.raises(SlurmfmError, match="not a Slurm job id"):
        fm.Job.from_id("9;rm", backend=LogBackend(job_logs))


def test_follow_yields_lines_until_the_job_ends(job_logs: Path) -> None:
    be = LogBackend(job_logs, states=["RUNNING", "RUNNING", "COMPLETED"])
    lines = fm.Job("99", be).logs(follow=True, interval=0)
    first = next(lines)
    assert first.startswith("slurmfm: job 99 start 0")
    with (job_logs / "llama_99.out").open("a") as f:
        f.write("0: written later\n")
    rest = list(lines)
    assert rest[-1] == "0: written later\n"
    assert len([first, *rest]) == len(LOG.splitlines()) + 1  # nothing twice


def test_result_raises_a_typed_error_with_the_reason_and_log_tail(job_logs: Path) -> None:
    job = fm.Job.from_id("99", backend=LogBackend(job_logs))
    with pytest.raises(JobFailed) as err:
        job.result(timeout=5, interval=0, tail=2)
    e = err.value
    assert (e.job_id, e.state, e.job_exit_code) == ("99", "FAILED", "1:0")
    assert e.reason == "step failed (exit 1): not retryable"
    assert e.log_tail == "0: second run task 0\n1: Traceback: CUDA out of memory"
    assert str(e).splitlines()[0] == (
        "job 99 ended FAILED (exit 1:0): step failed (exit 1): not retryable"
    )
    ok = fm.Job("99", LogBackend(job_logs, states=["COMPLETED"]))
    assert ok.result(timeout=5, interval=0).state == "COMPLETED"


def test_report_from_python(job_logs: Path) -> None:
    rep = fm.report("99", backend=LogBackend(job_logs))
    assert rep.nodes == ["p5-3", "p5-2"]
    assert rep.restarts == 1
    assert fm.Job("99", LogBackend(job_logs)).report().runs[-1].outcome == "stop"


def test_history_records_what_was_submitted_from_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURMFM_HISTORY", str(tmp_path / "state" / "history.jsonl"))
    monkeypatch.chdir(tmp_path)
    write_recipes(tmp_path, "a", "b")
    be = FakeBackend()
    exp = fm.Experiment("lr")
    first = exp.submit(fm.load(tmp_path / "a.yaml"), backend=be, preflight=False)
    fm.submit(fm.load(tmp_path / "b.yaml"), backend=be, preflight=False)
    runs = fm.history()
    assert [(s.job_id, s.name, s.experiment) for s in runs] == [
        ("101", "a", "lr"),
        ("102", "b", ""),
    ]
    assert runs[0].cwd == str(tmp_path)
    assert runs[0].log_dir == str(tmp_path / "logs")
    assert runs[0].argv == tuple(sys.argv)
    again = fm.Experiment.from_id("lr")
    assert [j.job_id for j in again.jobs(backend=be)] == [first.job_id]
    with pytest.raises(SlurmfmError, match="experiment 'none': no submissions recorded"):
        fm.Experiment.from_id("none")
    path = tmp_path / "state" / "history.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_history_is_owner_only_under_any_umask_and_follows_no_link(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = tmp_path / "h" / "history.jsonl"
        record(Submission("1", "x"), path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        os.umask(old)
    victim = tmp_path / "victim"
    victim.write_text("")
    link = tmp_path / "h" / "link.jsonl"
    link.symlink_to(victim)
    with pytest.raises(HistoryError, match=r"link\.jsonl: is a symbolic link"):
        record(Submission("2", "x"), link)
    with pytest.raises(HistoryError):
        read(link)
    hard = tmp_path / "h" / "hard.jsonl"
    os.link(victim, hard)
    with pytest.raises(HistoryError, match="has 2 hard links"):
        record(Submission("3", "x"), hard)
    assert victim.read_text() == ""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(HistoryError, match="writable by others"):
        record(Submission("4", "x"), shared / "history.jsonl")
    assert [s.job_id for s in read(path)] == ["1"]


def test_a_history_that_cannot_be_written_warns_and_keeps_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SLURMFM_HISTORY", str(tmp_path / "file" / "history.jsonl"))
    write_recipes(tmp_path, "a")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        job = fm.submit(fm.load(tmp_path / "a.yaml"), backend=FakeBackend(), preflight=False)
    assert job.job_id == "101"
    assert "job 101 was submitted but not recorded: history: cannot make" in str(seen[0].message)


def test_public_types_are_importable_at_run_time_and_listed_in_all() -> None:
    code = (
        "import sys\n"
        "import slurmfm.api as fm\n"
        "assert 'slurmfm.request' not in sys.modules, 'imported eagerly'\n"
        "from slurmfm.api import SubmitRequest, Recipe, JobStatus\n"
        "missing = [n for n in fm.__all__ if not hasattr(fm, n)]\n"
        "assert not missing, missing\n"
        "assert fm.SubmitRequest is SubmitRequest and fm.Recipe is Recipe\n"
        "print(fm.DEFAULT_BACKEND)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert out.stdout.strip() == "cli"


def test_one_default_backend_everywhere() -> None:
    import inspect

    from slurmfm.cli.common import backend_option

    defaults = {
        name: p.default
        for fn in (fm.get_backend, fm.submit, fm.submit_request, fm.status, fm.cancel, fm.report)
        for name, p in inspect.signature(fn).parameters.items()
        if name in {"kind", "backend"}
    }
    assert set(defaults.values()) == {"cli"}
    assert inspect.signature(fm.Job.from_id).parameters["backend"].default == "cli"

    @backend_option
    def cmd(backend: str) -> None: ...

    assert cmd.__click_params__[0].default == "cli"  # type: ignore[attr-defined]


def test_every_user_facing_error_is_in_the_api() -> None:
    """A script catches slurmfm's errors by name from one place (``fm.PlanError``, ...): every
    subclass of SlurmfmError that the non-runtime modules define is exported by slurmfm.api
    and by the package root, as the very class that is raised."""
    import importlib
    import pkgutil

    import slurmfm
    from slurmfm import api
    from slurmfm.errors import SlurmfmError

    for mod in pkgutil.walk_packages(slurmfm.__path__, "slurmfm."):
        if not mod.name.startswith("slurmfm.job") and not mod.name.endswith("__main__"):
            importlib.import_module(mod.name)

    def subclasses(cls: type) -> set[type]:
        out = set(cls.__subclasses__())
        for sub in list(out):
            out |= subclasses(sub)
        return out

    for cls in subclasses(SlurmfmError) | {SlurmfmError}:
        if not cls.__module__.startswith("slurmfm."):
            continue  # a test's own subclass
        assert cls.__name__ in api.__all__, cls
        assert getattr(api, cls.__name__) is cls
        assert getattr(slurmfm, cls.__name__) is cls


def test_the_package_root_is_the_api_and_stays_lazy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, slurmfm\n"
        "assert 'slurmfm.api' not in sys.modules\n"
        "assert slurmfm.load is __import__('slurmfm.api').api.load\n"
        "assert 'submit' in dir(slurmfm)\n"
        "try:\n"
        "    slurmfm.nothing\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "has no attribute 'nothing'" in out.stdout
