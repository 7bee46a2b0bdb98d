"""Files in shared directories: links, FIFOs and other users' files are never trusted.

These run as root here (the lab machines), so "another user" is a file chowned to ``nobody``;
the real-lab tests (tests/e2e/test_real_shared_storage.py) do the same with two unprivileged
users of one group.
"""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as sts

from slurmfm.job import fsafe, install
from slurmfm.job.state import StateFile, find

NOBODY = 65534


def other_users(path: Path) -> Path:
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    return path


# --- writing ------------------------------------------------------------------------------
def test_append_refuses_a_planted_link_and_leaves_its_target_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("private\n")
    victim.chmod(0o600)
    (tmp_path / "job.state").symlink_to(victim)
    with pytest.raises(fsafe.Refused, match="symbolic link"):
        fsafe.append(str(tmp_path / "job.state"), "forged\n")
    assert victim.read_text() == "private\n"


def test_append_to_a_planted_fifo_does_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "job.state")
    with pytest.raises(fsafe.Refused, match="FIFO"):
        fsafe.append(str(tmp_path / "job.state"), "x\n")


def test_append_refuses_another_users_file(tmp_path: Path) -> None:
    theirs = tmp_path / "job.state"
    theirs.write_text("")
    other_users(theirs)
    with pytest.raises(fsafe.Refused, match="belongs to uid 65534"):
        fsafe.append(str(theirs), "x\n")
    assert theirs.read_text() == ""


def test_a_hard_link_to_a_file_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.write_text("")
    os.link(mine, tmp_path / "job.state")
    with pytest.raises(fsafe.Refused, match="2 hard links"):
        fsafe.append(str(tmp_path / "job.state"), "x\n")


@pytest.mark.parametrize("umask", [0o002, 0o000, 0o022, 0o077])
def test_files_written_are_never_group_or_other_writable(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        fsafe.append(str(tmp_path / "a"), "x\n")
        fsafe.replace(str(tmp_path / "b"), "x\n")
        fsafe.touch(str(tmp_path / "c"))
    finally:
        os.umask(old)
    for name in "abc":
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) & 0o022 == 0, name


def test_an_own_file_left_group_writable_is_closed_on_append(tmp_path: Path) -> None:
    f = tmp_path / "job.state"
    f.write_text("")
    f.chmod(0o664)
    fsafe.append(str(f), "x\n")
    assert stat.S_IMODE(f.stat().st_mode) == 0o644


def test_replace_replaces_a_planted_link_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("private\n")
    (tmp_path / "latest").symlink_to(victim)
    fsafe.replace(str(tmp_path / "latest"), "step_5\n")
    assert victim.read_text() == "private\n"
    assert not (tmp_path / "latest").is_symlink()
    assert (tmp_path / "latest").read_text() == "step_5\n"


def test_leftover_temporaries_are_cleaned_but_not_others(tmp_path: Path) -> None:
    target = tmp_path / "latest"
    mine = tmp_path / ".latest.abc123.tmp"
    theirs = tmp_path / ".latest.def456.tmp"
    mine.write_text("")
    theirs.write_text("")
    other_users(theirs)
    assert fsafe.clean_temporaries(str(target)) == [str(mine)]
    assert theirs.exists()
    assert not mine.exists()


# --- reading ------------------------------------------------------------------------------
def test_read_trusts_only_the_expected_users_regular_files(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("mine")
    assert fsafe.read_text(str(f)) == "mine"
    other_users(f)
    assert fsafe.read_text(str(f)) is None
    assert fsafe.read_text(str(f), uid=NOBODY) == "mine"
    os.mkfifo(tmp_path / "fifo")
    assert fsafe.read_text(str(tmp_path / "fifo")) is None  # and returns at once


# --- the state file -----------------------------------------------------------------------
def test_a_planted_state_file_is_ignored_and_the_job_records_under_a_fresh_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    planted = tmp_path / "train_7.state"
    planted.write_text("2026-01-01T00:00:00Z restart=5 event=requeue forged\n")
    other_users(planted)
    st = StateFile(str(planted), restart=0)
    assert st.path != str(planted)
    assert st.path.endswith(".state")
    assert "ignoring" in capsys.readouterr().err
    assert st.last("requeue") is None  # the forged line is never read back
    st.record("start", "nodes=n1")
    assert "event=start" not in planted.read_text()
    # the next attempt (and slurmfm status) find the job's own record, not the planted one
    again = StateFile(str(planted), restart=1)
    assert again.path == st.path
    found, ignored = find(str(planted))
    assert found == st.path
    assert ignored
    assert "uid 65534" in ignored[0]


@pytest.mark.parametrize("plant", ["link", "fifo"])
def test_a_planted_link_or_fifo_as_state_file_neither_blocks_nor_is_written_through(
    tmp_path: Path, plant: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("")
    victim.chmod(0o600)
    path = tmp_path / "train_7.state"
    if plant == "link":
        path.symlink_to(victim)
    else:
        os.mkfifo(path)
    st = StateFile(str(path), restart=0)
    st.record("start", "x")
    assert st.path != str(path)
    assert victim.read_text() == ""
    assert "event=start" in Path(st.path).read_text()


@settings(max_examples=40, deadline=None)
@given(sts.text(max_size=200))
def test_a_detail_never_forges_a_second_record(detail: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        st = StateFile(os.path.join(d, "j_1.state"), restart=0)
        st.record("fail", detail)
        lines = Path(st.path).read_text(encoding="utf-8").splitlines()
        assert len(lines) == 1
        assert " event=fail " in lines[0] + " "


# --- the runtime's private copy on every node: every step checks it before running it ---
def zipapp(path: Path, body: str = "import sys; print('ran', sys.argv[1:])") -> str:
    """A tiny stand-in for the runtime zipapp; returns its sha256."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__main__.py", body)
    path.chmod(0o600)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_checked(
    path: Path, sha: str, cwd: Path | None = None, sub: str = "node"
) -> subprocess.CompletedProcess[str]:
    """The program exactly as a step runs it: ``python3 -I -S -c CHECKED SUBCOMMAND ...``."""
    return subprocess.run(
        [sys.executable, *install.argv()[1:], sub, "--x"],
        env={"SLURMFM_RUNTIME": str(path), "SLURMFM_RUNTIME_SHA": sha},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def sticky(tmp_path: Path) -> Path:
    d = tmp_path / "tmp"
    d.mkdir()
    d.chmod(0o1777)
    return d


def test_a_private_intact_copy_runs_with_its_subcommand(sticky: Path) -> None:
    rt = sticky / "slurmfm-42-AbCdEfGhIj"
    done = run_checked(rt, zipapp(rt))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran ['node', '--x']"


# The runtime's first statement is a save signal sent to its own process: what a launch task
# gets when srun passes USR2 to the step before the runtime is imported.
EARLY_SIGNAL = "import os, signal; os.kill(os.getpid(), signal.SIGUSR2); print('survived')"


@pytest.mark.parametrize(("sub", "survives"), [("node", True), ("observe", False)])
def test_a_launch_task_ignores_the_save_signal_before_the_runtime_runs(
    sticky: Path, sub: str, survives: bool
) -> None:
    """A launch task still starting (importing the runtime, slow on a loaded node) must not
    die of the save signal meant for its training processes; other steps keep the default
    (none of them is the launch step srun signals)."""
    rt = sticky / "slurmfm-42-AbCdEfGhIj"
    done = run_checked(rt, zipapp(rt, EARLY_SIGNAL), sub=sub)
    if survives:
        assert (done.returncode, done.stdout) == (0, "survived\n"), done.stderr
    else:
        assert done.returncode == -signal.SIGUSR2


@pytest.mark.parametrize("spoil", ["sha", "owner", "mode", "link", "hardlink"])
def test_a_copy_that_is_not_the_users_own_intact_file_is_never_run(
    sticky: Path, spoil: str
) -> None:
    rt = sticky / "slurmfm-42-AbCdEfGhIj"
    sha = zipapp(rt, "print('PWNED')")
    path = rt
    if spoil == "sha":
        sha = "0" * 64
    elif spoil == "owner":
        other_users(rt)
    elif spoil == "mode":
        rt.chmod(0o644)
    elif spoil == "link":
        path = sticky / "link"
        path.symlink_to(rt)
    else:
        os.link(rt, sticky / "second")
    done = run_checked(path, sha)
    assert done.returncode == 1
    assert "PWNED" not in done.stdout
    assert "not the intact job runtime of this user" in done.stderr or spoil == "link"


@pytest.mark.parametrize(
    ("mode", "owner", "problem"),
    [
        (0o1777, 0, None),
        (0o755, None, None),
        (0o777, None, "writable by others without the sticky bit"),
        (0o775, None, "writable by its group without the sticky bit"),
        (0o755, NOBODY, "belongs to uid 65534"),
    ],
)
def test_the_runtimes_directory_must_be_sticky_or_closed(
    tmp_path: Path, mode: int, owner: int | None, problem: str | None
) -> None:
    d = tmp_path / "d"
    d.mkdir()
    rt = d / "slurmfm-1-AbCdEfGhIj"
    sha = zipapp(rt)
    d.chmod(mode)
    if owner is not None:
        os.chown(d, owner, owner)
    why = install.dir_problem(str(d))
    if problem is None:
        assert why is None
        assert run_checked(rt, sha).returncode == 0
    else:
        assert problem in (why or "")
        assert run_checked(rt, sha).returncode == 1


def test_a_module_planted_in_the_working_directory_is_not_imported(
    sticky: Path, tmp_path: Path
) -> None:
    rt = sticky / "slurmfm-42-AbCdEfGhIj"
    sha = zipapp(rt)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hashlib.py").write_text("print('PWNED')\n")
    done = run_checked(rt, sha, cwd=shared)
    assert done.returncode == 0, done.stderr
    assert "PWNED" not in done.stdout


def test_one_cleanup_step_per_component() -> None:
    assert install.cleanup_steps({"SLURM_JOB_NUM_NODES": "3"}, "/tmp/x") == [
        [
            "srun",
            "--nodes=3",
            "--ntasks=3",
            "--ntasks-per-node=1",
            "--overlap",
            "--mem=0",
            "rm",
            "-f",
            "/tmp/x",
        ]
    ]
    het = {"SLURM_HET_SIZE": "2", "SLURM_JOB_NUM_NODES_HET_GROUP_0": "2"}
    het["SLURM_JOB_NUM_NODES_HET_GROUP_1"] = "4"
    assert [s[1:3] for s in install.cleanup_steps(het, "/tmp/x")] == [
        ["--het-group=0", "--nodes=2"],
        ["--het-group=1", "--nodes=4"],
    ]


@pytest.mark.parametrize("missing", [(), ("_sha2",), ("_sha2", "_sha256")])
@pytest.mark.parametrize("intact", [True, False])
def test_the_check_holds_whichever_sha256_the_interpreter_has(
    sticky: Path, missing: tuple[str, ...], intact: bool
) -> None:
    """The check takes the built-in sha256 of Python 3.12+ (``_sha2``) or 3.8-3.11
    (``_sha256``), else hashlib's: each runs an intact copy and refuses a spoiled one."""
    rt = sticky / "slurmfm-42-AbCdEfGhIj"
    sha = zipapp(rt, "print('ran')" if intact else "print('PWNED')")
    if not intact:
        sha = "0" * 64
    block = "".join(f"sys.modules[{m!r}] = None\n" for m in missing)  # import then fails
    done = subprocess.run(
        [sys.executable, "-I", "-c", "import sys\n" + block + install.CHECKED, "observe"],
        env={"SLURMFM_RUNTIME": str(rt), "SLURMFM_RUNTIME_SHA": sha},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if intact:
        assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
    else:
        assert done.returncode == 1
        assert "PWNED" not in done.stdout
        assert "not the intact job runtime of this user" in done.stderr


def test_a_node_entry_starts_without_site_openssl_or_sockets(sticky: Path) -> None:
    """What every node's launch task imports before the launch: not ``site`` (which runs the
    environment's ``.pth`` files), not ``hashlib`` (it loads OpenSSL's libcrypto), ``socket``
    nor the failure rules; only the paths that need them import them."""
    rt, sha = runtime_copy(sticky)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *install.argv()[1:], "node", "--prefix", "0"]
        + ["--forward", "none", "--", "true"],
        env={"SLURMFM_RUNTIME": str(rt), "SLURMFM_RUNTIME_SHA": sha, "PATH": os.defpath},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert {"slurmfm_job.node", "slurmfm_job.gate", "subprocess"} <= imported, done.stderr
    # nor the failure judging (slurmfm_job.classify): a finished launch's report needs it;
    # nor the agent: only a launch with metrics forks one
    refused = {"site", "hashlib", "_hashlib", "socket", "runpy", "slurmfm_job.classify"}
    assert not imported & (refused | {"slurmfm_job.agent"})
    # nor what only other paths use: argparse (the options are read without it; with its
    # subcommands it imported shutil, bz2 and lzma), json, tempfile, the checkpoint rules,
    # fsafe (the evidence a finished launch writes), the server checks
    later = {"argparse", "shutil", "bz2", "lzma", "json", "tempfile", "glob"}
    later |= {"slurmfm_job.checkpoint", "slurmfm_job.fsafe", "slurmfm_job.serve"}
    assert not imported & later, sorted(imported & later)


def test_the_agents_entry_goes_straight_to_the_agent(sticky: Path, tmp_path: Path) -> None:
    """The agents' step (``observe``, one per node) runs the agent without the command line's
    parser: no ``argparse``, no option types; the agent still writes its snapshot."""
    rt, sha = runtime_copy(sticky)
    obs = tmp_path / "obs"
    obs.mkdir()
    (obs / "STOP").touch()  # the agent writes its start snapshot, then stops
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *install.argv()[1:], "observe"],
        env={
            "SLURMFM_RUNTIME": str(rt),
            "SLURMFM_RUNTIME_SHA": sha,
            "PATH": os.defpath,
            "SLURMD_NODENAME": "n1",
            "SLURM_JOB_ID": "42",
            "SLURMFM_OBS_DIR": str(obs),
            "SLURMFM_OBS_STOP": str(obs / "STOP"),
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "slurmfm_job.agent" in imported, done.stderr
    assert not imported & {"slurmfm_job.cli", "slurmfm_job.options", "argparse", "site"}
    assert [f.name for f in obs.glob("node_n1_*.json")], sorted(obs.iterdir())


def test_the_cleanup_removes_the_copy_with_bytecode_and_the_one_it_was_made_from() -> None:
    env = {"SLURM_JOB_NUM_NODES": "2", install.PLAIN_ENV: "/tmp/plain"}
    (step,) = install.cleanup_steps(env, "/tmp/x")
    assert step[-4:] == ["rm", "-f", "/tmp/x", "/tmp/plain"]


def runtime_copy(sticky: Path) -> tuple[Path, str]:
    """The real runtime zipapp as the batch script leaves it on a node: (path, sha256)."""
    from slurmfm.render.payload import runtime_file

    rf = runtime_file()
    rt = sticky / "slurmfm-42-AbCdEfGhIj"
    rt.write_bytes(rf.data)
    rt.chmod(0o600)
    return rt, rf.sha256


def test_the_copy_with_bytecode_runs_each_module_from_its_bytecode(sticky: Path) -> None:
    """The copy ``prepare`` makes: private files beside the first, every module's bytecode
    used (its code names the final path, where zipimport compiling the source would name
    the file it runs from), and it passes the check every step makes."""
    rt, _ = runtime_copy(sticky)
    made = install.with_bytecode(str(rt), "42")
    assert made is not None
    staging, final, sha = made
    assert {Path(staging).parent, Path(final).parent} == {sticky}
    for p in (staging, final):
        st = os.stat(p)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, os.geteuid())
        assert Path(p).name.startswith("slurmfm-42-")
    assert hashlib.sha256(Path(staging).read_bytes()).hexdigest() == sha
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import slurmfm_job.node as n, "
        "slurmfm_job.batch as b; print(n.main.__code__.co_filename); print(b.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, staging], capture_output=True, text=True, check=True
    )
    code_file, module_file = done.stdout.split()
    assert code_file == final + "/slurmfm_job/node.py"  # from the bytecode
    assert module_file == staging + "/slurmfm_job/batch.pyc"  # zipimport names the file read
    # the staging bytes at the final path: what sbcast leaves on every node
    Path(final).write_bytes(Path(staging).read_bytes())
    whoami = subprocess.run(
        [sys.executable, *install.argv()[1:], "whoami"],
        env={"SLURMFM_RUNTIME": final, "SLURMFM_RUNTIME_SHA": sha, "SLURMD_NODENAME": "n7"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (whoami.returncode, whoami.stdout.split()) == (0, ["n7"]), whoami.stderr


def test_another_interpreters_bytecode_is_compiled_from_source(sticky: Path) -> None:
    """A node whose python3 is not the batch host's: a bytecode version it cannot read is
    passed over, and the module is compiled from its source (zipimport's rule)."""
    import importlib.util
    import zipfile

    rt, _ = runtime_copy(sticky)
    made = install.with_bytecode(str(rt), "42")
    assert made is not None
    staging = Path(made[0])
    other = sticky / "other.pyz"
    with zipfile.ZipFile(staging) as zin, zipfile.ZipFile(other, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(".pyc"):
                data = b"\x00\x00\r\n" + data[4:]  # another version's magic number
                assert data[:4] != importlib.util.MAGIC_NUMBER
            zout.writestr(info, data)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import slurmfm_job.node as n; "
        "print(n.main.__code__.co_filename)"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(other)], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == f"{other}/slurmfm_job/node.py"


def test_a_runtime_that_cannot_be_read_gets_no_copy_and_leaves_nothing(sticky: Path) -> None:
    bad = sticky / "slurmfm-42-notazipfile"
    bad.write_bytes(b"not a zip")
    assert install.with_bytecode(str(bad), "42") is None
    assert install.with_bytecode(str(sticky / "missing"), "42") is None
    assert sorted(p.name for p in sticky.iterdir()) == [bad.name]


def fake_sbcast(bin_dir: Path, rc: int) -> None:
    """``sbcast --force SRC DST`` on a one-node job: a copy (or a failure with ``rc``)."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "sbcast"
    body = 'cp "$2" "$3"' if rc == 0 else f'echo "sbcast: error: no job credential" >&2; exit {rc}'
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


@pytest.mark.parametrize("rc", [0, 1])
def test_prepare_exports_the_copy_with_bytecode_once_slurm_copied_it(
    sticky: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, rc: int
) -> None:
    from slurmfm.job import cli

    rt, _ = runtime_copy(sticky)
    fake_sbcast(tmp_path / "bin", rc)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    env = {"SLURM_JOB_ID": "42"}
    out = cli.bytecode_copy(str(rt), env)
    left = sorted(p.name for p in sticky.iterdir() if p != rt)
    if rc == 0:
        final = out["SLURMFM_RUNTIME"]
        assert left == [Path(final).name]  # the staging copy is gone
        assert out[install.PLAIN_ENV] == str(rt)
        assert hashlib.sha256(Path(final).read_bytes()).hexdigest() == out["SLURMFM_RUNTIME_SHA"]
    else:
        assert (out, left) == ({}, [])
        assert "without bytecode (sbcast: sbcast: error: no job credential)" in (
            capsys.readouterr().err
        )


@pytest.mark.parametrize("opts", [[], ["--spare-nodes", "5"]])
def test_prepare_sends_the_copy_while_it_works_and_exports_it_with_the_rest(
    sticky: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, opts: list[str]
) -> None:
    """The whole prepare step: its exports name the copy with bytecode once Slurm copied it;
    a prepare that fails (more spares than nodes) leaves no copy of its own on this host."""
    import shutil

    from slurmfm.job import cli, health, slurm

    def run(argv: list[str], timeout: float) -> tuple[int, str]:
        if argv[0] == "sbcast":
            shutil.copyfile(argv[2], argv[3])
            return 0, ""
        return 0, "NodeName=n1 NodeAddr=10.0.0.1\nNodeName=n2 NodeAddr=10.0.0.2\n"

    monkeypatch.setattr(health, "run_command", run)
    monkeypatch.setattr(slurm, "hostnames", lambda text: ["n1", "n2"])
    rt, _ = runtime_copy(sticky)
    env = {
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_ID": "42",
        "SLURMFM_LOG_DIR": str(tmp_path),
        "SLURMFM_RUNTIME": str(rt),
    }
    out: list[str] = []
    rc = cli.prepare(cli.parser().parse_args(["prepare", *opts]), env, out)
    left = [p for p in sticky.iterdir() if p != rt]
    if opts:
        assert (rc, out, left) == (2, [], [])
        return
    assert rc == 0
    got = dict(line[len("export ") :].split("=", 1) for line in out)
    assert [str(p) for p in left] == [got["SLURMFM_RUNTIME"]]
    assert got[install.PLAIN_ENV] == str(rt)
    assert got["SLURMFM_HOST_ORDER"] == "'n1 n2'"
    sha = hashlib.sha256(left[0].read_bytes()).hexdigest()
    assert got["SLURMFM_RUNTIME_SHA"] == sha


def test_a_directory_planted_under_the_jobs_name_is_left_alone_for_a_fresh_one(
    tmp_path: Path,
) -> None:
    planted = tmp_path / "train_7.observe"
    planted.mkdir()
    planted.chmod(0o755)
    other_users(planted)
    got = fsafe.claim_dir(str(planted))
    assert got != str(planted)
    assert Path(got).parent == tmp_path
    assert Path(got).stat().st_uid == os.geteuid()
    assert stat.S_IMODE(Path(got).stat().st_mode) == 0o755
    # readers (report, logs --rank) and the next attempt find the job's own one
    assert fsafe.find_dir(str(planted)) == got
    assert fsafe.claim_dir(str(planted)) == got
    # and an own directory made group-writable by umask 002 is closed
    mine = tmp_path / "mine.observe"
    mine.mkdir()
    mine.chmod(0o2775)
    assert fsafe.claim_dir(str(mine)) == str(mine)
    assert stat.S_IMODE(mine.stat().st_mode) & 0o022 == 0


def test_the_submitting_sides_atomic_write_is_the_runtimes(tmp_path: Path) -> None:
    """slurmfm.fsutil.write_atomic writes through fsafe.replace (one atomic write): an
    existing file keeps its mode, a refused target is one line, nothing is left beside it."""
    from slurmfm import fsutil

    out = tmp_path / "job.sh"
    out.write_text("old")
    out.chmod(0o600)
    fsutil.write_atomic(out, "new")
    assert (out.read_text(), out.stat().st_mode & 0o777) == ("new", 0o600)
    os.symlink(out, tmp_path / "link")
    with pytest.raises(fsutil.OutputError, match="is a symbolic link"):
        fsutil.write_atomic(tmp_path / "link", "x")
    fsutil.write_atomic(tmp_path / "sub" / "new.sh", b"x", mode=0o755)
    assert (tmp_path / "sub" / "new.sh").stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh", "link", "sub"]


# --- owner-only files (issue 43: one definition of the rule, here) ------------------------
def test_create_is_exclusive_owner_only_and_never_writes_through_a_link(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        fsafe.create(str(tmp_path / "call.pkl"), b"x" * 70000)
    finally:
        os.umask(old)
    assert (tmp_path / "call.pkl").read_bytes() == b"x" * 70000
    assert stat.S_IMODE((tmp_path / "call.pkl").stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        fsafe.create(str(tmp_path / "call.pkl"), b"y")
    victim = tmp_path / "victim"
    victim.write_text("private\n")
    (tmp_path / "planted").symlink_to(victim)
    with pytest.raises(FileExistsError):
        fsafe.create(str(tmp_path / "planted"), b"forged")
    assert victim.read_text() == "private\n"


def test_a_private_read_refuses_a_file_others_may_read(tmp_path: Path) -> None:
    path = tmp_path / "result.pkl"
    path.write_bytes(b"data")
    path.chmod(0o640)
    assert fsafe.read(str(path)) == b"data"  # the team may read a job's files
    with pytest.raises(fsafe.Refused, match="not owner-only"):
        fsafe.read(str(path), private=True)
    path.chmod(0o600)
    assert fsafe.read(str(path), private=True) == b"data"


def test_a_cut_read_returns_the_first_bytes_of_a_longer_file(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_bytes(b"0123456789")
    with pytest.raises(fsafe.Refused, match="more than 4 bytes"):
        fsafe.read(str(path), limit=4)
    assert fsafe.read(str(path), limit=4, cut=True) == b"0123"
    assert fsafe.read(str(path), limit=10, cut=True) == b"0123456789"


def test_an_owner_only_append_closes_an_older_open_file(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text("a\n")
    path.chmod(0o644)
    fsafe.append(str(path), "b\n", mode=fsafe.PRIVATE_MODE)
    assert path.read_text() == "a\nb\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    shared = tmp_path / "job.state"
    shared.write_text("")
    shared.chmod(0o664)
    fsafe.append(str(shared), "x\n")  # the team's file: only group/other write is dropped
    assert stat.S_IMODE(shared.stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("make", "owner_only", "why"),
    [
        (lambda p: p.mkdir(mode=0o700), True, None),
        (lambda p: p.mkdir(mode=0o755), False, None),
        (lambda p: p.mkdir(mode=0o755), True, "is not owner-only (mode 0755)"),
        (lambda p: p.mkdir(mode=0o775), False, "is writable by others"),
        (lambda p: p.write_text(""), False, "is a file, not a directory"),
        (lambda p: p.symlink_to(p.parent), False, "is a symbolic link, not a directory"),
        (lambda p: other_users(p.mkdir(mode=0o700) or p), False, "belongs to another user"),
    ],
)
def test_own_dir_problem(tmp_path: Path, make: Any, owner_only: bool, why: str | None) -> None:
    path = tmp_path / "d"
    old = os.umask(0)
    try:
        make(path)
    finally:
        os.umask(old)
    got = fsafe.own_dir_problem(os.lstat(path), owner_only=owner_only)
    assert got == why if why is None else (got is not None and got.startswith(why))


def test_private_dir_makes_closes_or_refuses(tmp_path: Path) -> None:
    made = tmp_path / "cache"
    assert fsafe.private_dir(str(made)) is False  # made 0700: nothing to close
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o755)
    assert fsafe.private_dir(str(made)) is True  # our own, left open: closed
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(fsafe.Refused, match="symbolic link"):
        fsafe.private_dir(str(tmp_path / "link"))
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    other_users(theirs)
    with pytest.raises(fsafe.Refused, match="belongs to another user"):
        fsafe.private_dir(str(theirs))
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o755  # never changed
