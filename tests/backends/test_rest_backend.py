"""``--backend rest``: slurmrestd with a JWT. Unit tests for what is pure (version choice,
the job description, the answers of both API generations); real tests against Debian's own
slurmrestd on 22.05 (v0.0.38), 24.11 (v0.0.42) and 26.05 (v0.0.44), started by
``scripts/slurm-lab rest-up`` beside each shared lab."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lab import REPO_ROOT, SlurmLab
from remote_lab import RestLab, cmdlines, rest_lab, run_cli

from slurmfm.backends.rest import (
    LOGS_UNSUPPORTED,
    LostAnswer,
    RestBackend,
    array_status,
    choose_version,
    directives,
    job_description,
    parse_job,
    read_token,
    time_minutes,
    token_user,
)
from slurmfm.errors import BackendError
from slurmfm.request import SubmitRequest

QUICK = REPO_ROOT / "recipes" / "quickstart.yaml"


def _jwt(claims: dict[str, object]) -> str:
    def part(d: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")

    return f"{part({'alg': 'HS256'})}.{part(claims)}.sig"


# -- unit ---------------------------------------------------------------------------------------
def test_the_newest_known_version_the_server_offers_is_chosen() -> None:
    v22 = ["/slurm/v0.0.36/ping", "/slurm/v0.0.37/jobs", "/slurm/v0.0.38/job/{job_id}", "/openapi"]
    assert choose_version(v22) == "v0.0.38"
    v24 = [f"/slurm/v0.0.{n}/ping" for n in (40, 41, 42)] + ["/slurmdb/v0.0.42/jobs"]
    assert choose_version(v24) == "v0.0.42"
    v26 = [f"/slurm/v0.0.{n}/ping" for n in (42, 43, 44)]
    assert choose_version(v26) == "v0.0.44"
    with pytest.raises(BackendError, match=r"offers Slurm API versions v0\.0\.36, v0\.0\.37"):
        choose_version(["/slurm/v0.0.36/ping", "/slurm/v0.0.37/ping"])


def test_the_token_is_read_as_scontrol_prints_it_and_names_its_user(tmp_path: Path) -> None:
    tok = _jwt({"sun": "alice", "exp": 1})
    assert read_token({"SLURM_JWT": tok}) == tok
    f = tmp_path / "tok"
    f.write_text(f"SLURM_JWT={tok}\n")
    assert read_token({"SLURMFM_REST_TOKEN_FILE": str(f)}) == tok
    assert token_user(tok) == "alice"
    assert token_user("not-a-jwt") is None
    with pytest.raises(BackendError, match="no token"):
        read_token({})
    with pytest.raises(BackendError, match="not a token"):
        read_token({"SLURM_JWT": "a b"})


def test_the_backend_never_shows_its_token() -> None:
    tok = _jwt({"sun": "alice"})
    be = RestBackend("http://127.0.0.1:1", {"SLURM_JWT": tok})
    assert tok not in repr(be)
    assert be.user == "alice"
    with pytest.raises(BackendError, match="give http"):
        RestBackend("file:///etc/passwd", {"SLURM_JWT": tok})


@given(st.integers(0, 30), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_time_limits_in_every_sbatch_form(d: int, h: int, m: int, s: int) -> None:
    want = d * 1440 + h * 60 + m + (1 if s else 0)
    assert time_minutes(f"{d}-{h:02d}:{m:02d}:{s:02d}") == want
    assert time_minutes(f"{h:02d}:{m:02d}:{s:02d}") == h * 60 + m + (1 if s else 0)
    assert time_minutes(f"{m}:{s:02d}") == m + (1 if s else 0)
    assert time_minutes(str(m)) == m
    assert time_minutes(f"{d}-{h}") == d * 1440 + h * 60


def _rendered(version: str) -> SubmitRequest:
    import slurmfm.api as fm

    return fm.render(fm.load(QUICK), slurm_version=version)


def test_a_rendered_script_becomes_a_job_description_of_each_generation() -> None:
    req = _rendered("24.11.5")
    body = job_description(req, "v0.0.42", {"PATH": "/bin"}, "slurmfm-submit-x")
    job = body["job"]
    assert job["script"] == req.text
    assert "script" not in body
    assert job["name"] == "quickstart"
    assert (job["minimum_nodes"], job["maximum_nodes"]) == (2, 2)
    assert job["time_limit"] == {"set": True, "infinite": False, "number": 10}
    assert job["kill_warning_signal"] == "SIGUSR2"
    assert job["kill_warning_flags"] == ["BATCH_JOB"]  # the batch shell, as B: asks
    assert job["open_mode"] == ["APPEND"]
    assert job["requeue"] is True
    assert job["environment"] == ["PATH=/bin"]
    assert job["comment"] == "slurmfm-submit-x"
    assert job["current_working_directory"] == str(Path(job["standard_output"]).parent)
    # every #SBATCH line became a field (none is dropped without a word)
    assert len(directives(req.text)) >= 10


def test_what_v0_0_38_cannot_carry_is_refused_in_one_line() -> None:
    req = _rendered("22.05.8")  # --signal=B:USR2@300: the batch shell saves before the limit
    with pytest.raises(BackendError) as info:
        job_description(req, "v0.0.38", {"PATH": "/bin"}, "t")
    assert "cannot signal the batch shell" in str(info.value)
    assert "\n" not in str(info.value)
    odd = SubmitRequest.of_script("#!/bin/bash\n#SBATCH --switches=1\ntrue\n")
    with pytest.raises(BackendError, match=r"#SBATCH --switches=1 has no slurmrestd v0.0.42"):
        job_description(odd, "v0.0.42", {}, "t")
    # sbatch stops reading options at the first command, and so does the translation
    plain = SubmitRequest.of_script(
        "#!/bin/bash\n#SBATCH --nodes=2 --time=5\n\ntrue\n#SBATCH -N 1\n"
    )
    body = job_description(plain, "v0.0.38", {"PATH": "/bin"}, "t")
    assert body["job"]["nodes"] == [2, 2]
    assert body["job"]["time_limit"] == 5
    assert body["script"] == plain.text
    assert body["job"]["environment"] == {"PATH": "/bin"}


def test_the_job_gets_a_path_and_its_needed_variables_never_the_token() -> None:
    tok = _jwt({"sun": "alice"})
    be = RestBackend("http://127.0.0.1:1", {"SLURM_JWT": tok})
    req = SubmitRequest(script=b"#!/bin/bash\ntrue\n", env_names=("HF_TOKEN", "SLURM_JWT"))
    env = be.job_environment(req, {"SLURM_JWT": tok, "HF_TOKEN": "h", "HOME": "/root"})
    assert env == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HF_TOKEN": "h",
    }


def test_answers_of_both_generations_read_alike() -> None:
    old = {"job_id": 7, "job_state": "COMPLETED", "exit_code": 256, "nodes": "node001",
           "name": "a", "standard_output": "/l/a_7.out", "user_name": "u", "user_id": 5,
           "restart_cnt": 1, "state_reason": "None"}  # fmt: skip
    new = {"job_id": 7, "job_state": ["COMPLETED"], "nodes": "node001", "name": "a",
           "exit_code": {"status": ["EXITED"], "return_code": {"set": True, "number": 1}},
           "standard_output": "/l/a_7.out", "user_name": "u", "user_id": 5,
           "restart_cnt": 1, "state_reason": "None"}  # fmt: skip
    for rec in (old, new):
        got = parse_job(rec, "7")
        assert (got.state, got.nodes, got.name, got.restarts) == ("COMPLETED", "node001", "a", 1)
        assert got.exit_code == "1:0"
        assert got.raw["UserId"] == "u(5)"
        assert got.done


def test_an_array_reads_as_its_unfinished_task_with_every_tasks_state() -> None:
    def task(i: int, state: str) -> dict[str, object]:
        return {"job_id": 10 + i, "array_job_id": 10, "array_task_id": i, "job_state": [state]}

    tasks = [parse_job(task(i, s), "10") for i, s in enumerate(["COMPLETED", "RUNNING", "FAILED"])]
    got = array_status(tasks)
    assert got.state == "RUNNING"
    assert got.raw["ArrayTasks"] == "0:COMPLETED 1:RUNNING 2:FAILED"
    assert array_status([tasks[0], tasks[2]]).state == "FAILED"  # a failure shows


# -- real slurmrestd ----------------------------------------------------------------------------
SLEEPER = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:05:00
#SBATCH --partition=batch
#SBATCH --output={out}/%x_%j.out
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --wait-all-nodes=1
echo "ran as $(id -un)"
env | sort
sleep {sleep}
"""


def _script(rest: RestLab, name: str, sleep: int) -> tuple[SubmitRequest, Path]:
    out = rest.job_dir()
    return SubmitRequest.of_script(SLEEPER.format(name=name, out=out, sleep=sleep)), out


def _rest(every_lab: SlurmLab) -> tuple[RestLab, RestBackend, str]:
    rest = rest_lab(every_lab)
    token = rest.token()
    return rest, RestBackend(env=rest.env(token)), token


def test_rest_submit_status_wait_cancel(every_lab: SlurmLab) -> None:
    """22.05, 24.11, 26.05: the version the server speaks, then a job's whole life."""
    rest, be, token = _rest(every_lab)
    assert be.version() == every_lab.version
    assert be.api() == {"host": "v0.0.38", "trixie": "v0.0.42", "sid": "v0.0.44"}[every_lab.suite]
    req, out = _script(rest, "rest-life", 60)
    job = be.submit(req)
    deadline = time.monotonic() + 30
    st_ = be.status(job.job_id)
    while st_.state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
        st_ = be.status(job.job_id)
    assert st_.state == "RUNNING"
    assert st_.name == "rest-life"
    assert st_.nodes
    scontrol = every_lab.run(["scontrol", "show", "job", "-o", job.job_id], cwd="/").stdout
    assert "Requeue=1" in scontrol
    assert "TimeLimit=00:05:00" in scontrol
    assert f"UserId={rest.user}(" in scontrol
    be.cancel(job.job_id)
    final = be.wait(job.job_id, timeout=30, interval=0.2)
    assert final.state.startswith("CANCELLED")
    assert final.done
    assert not final.ok
    quick, out = _script(rest, "rest-quick", 0)
    done = be.wait(be.submit(quick).job_id, timeout=60, interval=0.2)
    assert done.ok, done
    text = next(out.glob("rest-quick_*.out")).read_text()
    assert f"ran as {rest.user}" in text
    assert token.removeprefix("SLURM_JWT=") not in text  # not in the job's environment
    with pytest.raises(BackendError, match=r"Invalid job id|not found|2017"):
        be.cancel("999999")


def test_rest_says_it_cannot_read_logs_and_finds_a_lost_submission(slurm_lab: SlurmLab) -> None:
    import slurmfm.api as fm

    rest, be, _ = _rest(slurm_lab)

    class Lossy(RestBackend):
        """The answer to the first submission is lost after slurmctld took the job."""

        sent = 0

        def _submit_once(self, body: dict[str, object]):  # type: ignore[no-untyped-def]
            self.sent += 1
            result = super()._submit_once(body)
            if self.sent == 1:
                raise LostAnswer("rest: connection reset by peer")
            return result

    lossy = Lossy(env=rest.env(rest.token()))
    name = f"rest-lost-{time.monotonic_ns() % 10**9}"
    req, _ = _script(rest, name, 30)
    found = lossy.submit(req)
    assert lossy.sent == 1  # found by its token: nothing was sent twice
    ids = slurm_lab.run(["squeue", "-h", "-t", "all", "-n", name, "-o", "%i"]).stdout.split()
    assert ids == [found.job_id]
    with pytest.raises(BackendError) as info:
        fm.Job.from_id(found.job_id, backend=be).logs()
    assert str(info.value) == LOGS_UNSUPPORTED
    be.cancel(found.job_id)


def test_rest_expired_token_is_one_line_exit_2_nothing_queued(slurm_lab: SlurmLab) -> None:
    """Refused before anything is sent; a token slurmctld does not accept (signed with
    another key) and a server that is not there are one line too."""
    rest = rest_lab(slurm_lab)
    forged = _jwt({"sun": rest.user, "exp": int(time.time()) + 600})
    proc = run_cli(["status", "1", "--backend", "rest"], rest.env(forged))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("rest: "), proc.stderr
    down = run_cli(
        ["status", "1", "--backend", "rest"],
        {**rest.env(forged), "SLURMFM_REST_URL": "http://127.0.0.1:1"},
    )
    assert down.returncode == 2, down.stderr
    assert down.stderr.startswith("rest: cannot reach http://127.0.0.1:1"), down.stderr
    assert down.stderr.count("\n") == 1, down.stderr
    env = rest.env(rest.token(lifespan=1))
    time.sleep(1.2)  # the token's exp has passed
    before = slurm_lab.run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split()
    for args in (["submit", str(QUICK), "--backend", "rest", "--no-check"],):
        proc = run_cli(args, env)
        assert proc.returncode == 2, proc
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert "rest: the token expired at" in lines[0], proc.stderr
    assert slurm_lab.run(["squeue", "-h", "-t", "all", "-o", "%i"]).stdout.split() == before


def test_rest_token_never_in_argv_or_history(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    """A script submits and waits through the API; meanwhile no process's argv holds the
    token, and afterwards neither does the history."""
    rest = rest_lab(slurm_lab)
    token = rest.token().removeprefix("SLURM_JWT=")
    out = rest.job_dir()
    history = tmp_path / "history.jsonl"
    code = (
        "import slurmfm.api as fm\n"
        "from slurmfm.request import SubmitRequest\n"
        f"req = SubmitRequest.of_script({SLEEPER.format(name='rest-argv', out=out, sleep=2)!r})\n"
        "job = fm.submit_request(req, backend='rest', preflight=False)\n"
        "print(job.job_id, flush=True)\n"
        "print(job.wait(timeout=60, interval=0.2).state, flush=True)\n"
    )
    env = {**rest.env("SLURM_JWT=" + token), "SLURMFM_HISTORY": str(history)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    job_id = proc.stdout.readline().strip()
    seen = [c for _ in range(10) for c in cmdlines() if token in c]
    assert proc.wait(timeout=60) == 0
    assert job_id.isdigit()
    assert seen == []
    assert job_id in history.read_text()
    assert token not in history.read_text()
    assert token not in next(out.glob("rest-argv_*.out")).read_text()
