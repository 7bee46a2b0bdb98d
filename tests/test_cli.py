"""The command line: one clear line per problem, exit status 2, nothing half-written."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lab import REPO_ROOT, SlurmLab

from slurmfm.cli import main

QUICK = str(REPO_ROOT / "recipes" / "quickstart.yaml")


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_help_lists_commands() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "--help"], capture_output=True, text=True, check=True
    )
    for cmd in ("submit", "render", "validate", "status", "cancel"):
        assert cmd in proc.stdout


def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys; from slurmfm.cli import main\n"
        "heavy = [m for m in ('pydantic', 'jinja2', 'rich', 'networkx', 'ruamel', 'boto3')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_validate_ok() -> None:
    code, out, _ = run("validate", QUICK)
    assert code == 0
    assert "ok: quickstart, 2 x lab-cpu, world size 4" in out


def test_validate_error_is_one_located_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nlauncher:\n  kind: torchrun\n  script: t.py\n  nproc: 3\n")
    code, out, err = run("validate", str(bad))
    assert code == 2
    assert out == ""
    assert (
        err.strip()
        == f"{bad}:5: launcher.nproc: unknown field (check the spelling; see docs/recipe-reference.md)"
    )


@pytest.mark.parametrize("cmd", ["validate", "render"])
def test_a_pipeline_file_is_read_once_and_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cmd: str
) -> None:
    """The recipe loader spots a pipeline file (top-level ``stages:``) in the data it parsed;
    no second read of the file to look for it (slurmfm.recipe.loader.load_recipe)."""
    import slurmfm.fsutil

    reads: list[object] = []
    real = slurmfm.fsutil.read_bounded

    def counting(path: str | Path, limit: int = slurmfm.fsutil.MAX_INPUT_BYTES) -> bytes:
        reads.append(path)
        return real(path, limit)

    monkeypatch.setattr(slurmfm.fsutil, "read_bounded", counting)
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text("name: p\nstages:\n  a: {recipe: a.yaml}\n")
    code, out, err = run(cmd, str(pipe))
    assert (code, out) == (2, "")
    assert err == (
        f"{pipe}:2: stages: this is a pipeline file, not a recipe; "
        f"check it with: slurmfm pipeline validate {pipe}\n"
    )
    if cmd == "validate":  # render also hashes the bytes for its cache key (slurmfm.cli.cache)
        assert reads == [pipe]


def test_render_to_file_is_atomic_and_bad_input_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    code, _, _ = run("render", QUICK, "-o", str(out))
    assert code == 0
    assert out.read_text().startswith("#!/bin/bash\n")
    assert out.stat().st_mode & 0o111
    # A failing render must leave the previous file untouched and no temp files behind.
    before = out.read_text()
    code, _, err = run("render", QUICK, "--set", "resources.nodes=0", "-o", str(out))
    assert code == 2
    assert err.startswith("<override>: resources.nodes: Input should be greater than or equal to 1")
    assert out.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]
    fresh = tmp_path / "new" / "job.sh"
    code, _, _ = run("render", QUICK, "--set", "parallelism.tp=3", "-o", str(fresh))
    assert code == 2
    assert not fresh.exists()


def test_render_refuses_unsafe_values_with_exit_2(tmp_path: Path) -> None:
    code, _, err = run("render", QUICK, "--set", "storage.log_dir=/fsx/my logs")
    assert code == 2
    assert "storage.log_dir" in err
    assert "cannot carry safely" in err


def test_render_for_versions_and_flavors() -> None:
    code, out, _ = run("render", QUICK, "--slurm-version", "24.11")
    assert code == 0
    assert "# Slurm target 24.11;" in out
    code, out, _ = run("render", QUICK, "--set", "cluster.flavor=hyperpod")
    assert code == 0
    sbatch = [line for line in out.splitlines() if line.startswith("#SBATCH")]
    assert not any("auto-resume" in line for line in sbatch)
    assert "--auto-resume=1" in out


def test_dry_run_shows_command_and_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    code, out, _ = run("submit", QUICK, "--dry-run", "--set", "secrets=[HF_TOKEN]")
    assert code == 0
    assert out.startswith("# dry run: would run sbatch --parsable with this script on stdin")
    assert "# needs from the environment: HF_TOKEN; missing now: HF_TOKEN" in out


def test_submit_without_secret_fails_before_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # nothing could be submitted anyway
    code, _, err = run("submit", QUICK, "--set", "secrets=[HF_TOKEN]")
    assert code == 2
    # Checked before Slurm is asked anything: sbatch is not even on PATH here.
    assert "<environment>: secrets: not set in the submitting environment: HF_TOKEN" in err


def test_status_of_bad_id_exits_2() -> None:
    code, _, err = run("status", "12;rm")
    assert code == 2
    assert "is not a Slurm job id" in err


def test_version_option() -> None:
    code, out, _ = run("--version")
    assert code == 0
    assert "0.1.0" in out


@pytest.mark.slurm
def test_submit_status_cancel_via_cli(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    env = dict(slurm_lab.env)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "slurmfm.cli", *args],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )

    sets = [
        "--set",
        f"storage.log_dir={tmp_path}/logs",
        "--set",
        f"storage.checkpoint_root={tmp_path}/ckpt",
        "--set",
        "launcher.args=[--steps, '1000', --sleep, '1']",
    ]
    sub = cli("submit", "recipes/quickstart.yaml", *sets)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    assert (tmp_path / "logs").is_dir()  # created before sbatch (sbatch would not)
    st = cli("status", job_id)
    assert st.returncode == 0
    assert "quickstart" in st.stdout
    cancel = cli("cancel", job_id)
    assert cancel.returncode == 0
    assert cancel.stdout.strip() == f"cancelled {job_id}"
    bad = cli("submit", "recipes/quickstart.yaml", *sets, "--set", "cluster.partition=nosuch")
    assert bad.returncode == 2
    assert "invalid partition" in bad.stderr.lower()
    pys = cli("submit", "recipes/quickstart.yaml", *sets, "--backend", "pyslurm")
    assert pys.returncode == 2
    assert "pyslurm backend unavailable" in pys.stderr


def test_plan_does_not_import_the_renderer(tmp_path: Path) -> None:
    # Version policy lives in slurmfm.target: planning a recipe needs no templates or jinja2.
    conf = tmp_path / "topology.conf"
    conf.write_text("SwitchName=leaf1 Nodes=node[001-004]\n")
    code = (
        "import sys\nfrom slurmfm.cli import main\n"
        "try:\n"
        f"    main(['plan', {QUICK!r}, '--topology', {str(conf)!r}, '--json'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print(sorted(m for m in sys.modules if m.startswith('slurmfm.render') or m == 'jinja2'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_the_renderer_writes_no_files(tmp_path: Path) -> None:
    # A library caller of api.render gets no template cache written anywhere; only the CLI
    # (slurmfm.cli.cache) keeps one.
    code = f"from slurmfm import api\nprint(len(api.render(api.load({QUICK!r})).script))"
    env = {**os.environ, "SLURMFM_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    env.pop("XDG_CACHE_HOME", None)
    env.pop("SLURMFM_NO_CACHE", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "render", QUICK, "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "cache" / "templates").iterdir())  # the CLI's own cache


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI as a user runs it (bytes: some inputs below are not UTF-8)."""
    return subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", *args], capture_output=True, cwd=REPO_ROOT
    )


def _one_clean_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("kind", ["fifo", "symlink", "chardev", "directory"])
def test_output_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    """Issue 15 item 9: -o replaced a character device and symlinks with 0755 scripts."""
    target = tmp_path / "out"
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(victim)
    elif kind == "chardev":
        if os.geteuid() != 0:
            pytest.skip("mknod of a character device needs root")
        os.mknod(target, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
    else:
        target.mkdir()
    before = os.lstat(target)
    # render's -o is a file; submit's -o is a directory (the request's files, slurmfm.request):
    # each refuses what it would not write into, in one line, touching nothing.
    commands: list[tuple[list[str], str]] = []
    if kind != "directory":
        commands.append((["render", QUICK], f"{target}: (output): exists and is "))
        commands.append((["submit", "--dry-run", QUICK], f"-o {target}: exists and is not a dir"))
    for args, expected in commands:
        err = _one_clean_line(_cli(*args, "-o", str(target)))
        assert err.startswith(expected), err
        after = os.lstat(target)
        assert (after.st_mode, after.st_ino, after.st_rdev) == (
            before.st_mode,
            before.st_ino,
            before.st_rdev,
        )
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim"]


def test_output_keeps_an_existing_files_mode(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    out.write_text("old\n")
    out.chmod(0o600)
    proc = _cli("render", QUICK, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_text().startswith("#!/bin/bash\n")
    fresh = tmp_path / "fresh.sh"
    assert _cli("render", QUICK, "-o", str(fresh)).returncode == 0
    assert fresh.stat().st_mode & 0o100  # a new script is executable


def test_non_utf8_file_names_and_set_values_are_one_line(tmp_path: Path) -> None:
    """Issue 15 item 14: these ended in tracebacks."""
    name = os.fsdecode(bytes(tmp_path) + b"/caf\xe9.yaml")
    Path(name).write_bytes(Path(QUICK).read_bytes())
    for cache in ([], ["--no-cache"]):
        proc = _cli("render", *cache, name)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(b"#!/bin/bash\n")
    bad = Path(name).with_name("bad\udcff.yaml")
    bad.write_text("name: [\n")
    err = _one_clean_line(_cli("render", "--no-cache", str(bad)))
    assert err.startswith(f"{tmp_path}/bad\\xff.yaml:")
    for value in ("env.A=caf\udce9", "resources.nodes=\udcff"):
        for cmd in ("render", "validate"):
            err = _one_clean_line(_cli(cmd, QUICK, "--set", value))
            assert err == f"<override>: {value.split('=')[0]}: not UTF-8 text"


def test_submit_with_an_uncreatable_log_dir_is_one_line(tmp_path: Path) -> None:
    """Issue 15 item 14: the log directory is made before sbatch; failing there was a traceback."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    asked = tmp_path / "asked"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\necho "$@" >> {asked}\necho "slurm 24.11.0"\n')
    sbatch.chmod(0o755)
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.cli", "submit", "--no-check", QUICK, "--set"]
        + [f"storage.log_dir={blocker}/logs"],
        capture_output=True,
        cwd=REPO_ROOT,
        env=env,
    )
    err = _one_clean_line(proc)
    assert err == f"storage.log_dir: cannot create {blocker}/logs: Not a directory"
    assert asked.read_text().split() == ["--version"]  # nothing was submitted


# Values an attacker (or a typo) puts in a recipe: control characters, shell syntax, Slurm
# filename patterns, YAML-typed scalars, huge or nested values.
_HOSTILE_TEXT = st.text(
    alphabet=st.sampled_from(list("a/%$`'\"\\;|&*!\n\r\t\x00 é\u2028{}[]:#-.0")), max_size=12
)
_HOSTILE = st.one_of(
    _HOSTILE_TEXT,
    st.sampled_from(["3.10", "0x1F", "1e400", "true", "~", "-1", "0", "9" * 30, ".nan"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.none(),
    st.lists(_HOSTILE_TEXT, max_size=3),
    st.dictionaries(st.sampled_from(["A", "b-c", "", "1"]), _HOSTILE_TEXT, max_size=2),
)
_FIELDS = [
    "name",
    "env.A",
    "resources.nodes",
    "resources.procs_per_node",
    "resources.time_limit",
    "resources.exclusive",
    "storage.log_dir",
    "storage.checkpoint_root",
    "storage.run_id",
    "storage.data.D",
    "storage.keep_last",
    "launcher.script",
    "launcher.args",
    "launcher.python",
    "cluster.partition",
    "cluster.constraints",
    "container.image",
    "container.mounts",
    "parallelism.tp",
    "resilience.max_restarts",
]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(_FIELDS), value=_HOSTILE, data=st.data())
def test_hostile_values_never_traceback(
    tmp_path_factory: pytest.TempPathFactory, field: str, value: object, data: st.DataObject
) -> None:
    """Issue 15 item 14: exit 0 or 2, one located line per problem, never a traceback; and
    validate refuses what render refuses."""
    import json

    d = tmp_path_factory.mktemp("hostile")
    recipe = d / "r.yaml"
    recipe.write_text(Path(QUICK).read_text())
    as_set = data.draw(st.booleans(), label="as --set")
    if as_set:
        args = ["--set", f"{field}={json.dumps(value)}"]
    else:
        # the same value written into the file, as the last key of its section (YAML allows
        # JSON flow values)
        from ruamel.yaml import YAML

        raw = YAML(typ="safe").load(recipe.read_text())
        cur = raw
        parts = field.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {}) if isinstance(cur.get(p), dict | None) else cur
        cur[parts[-1]] = value
        recipe.write_text(json.dumps(raw, indent=1))
        args = []
    codes = {}
    for cmd in ("validate", "render"):
        extra = ["--no-cache"] if cmd == "render" else []
        res = CliRunner().invoke(main, [cmd, *extra, str(recipe), *args])
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        assert res.exit_code in (0, 2), res.stderr
        if res.exit_code == 2:  # one located line per problem
            lines = res.stderr.strip().splitlines()
            assert lines, "a refusal without a reason"
            for line in lines:
                assert line.startswith((f"{recipe}:", "<override>:")), line
        codes[cmd] = res.exit_code
    assert codes["validate"] == codes["render"], (field, value, codes)


def test_status_shows_the_reasons_of_unasked_restarts_and_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15.16a: the state file's `restart` and `stop` records reach `slurmfm status`."""
    from slurmfm import api
    from slurmfm.backends.base import JobStatus

    (tmp_path / "demo_42.state").write_text(
        "2026-12-01T00:00:00Z restart=0 event=start nodes=n1\n"
        "2026-12-01T00:01:00Z restart=0 event=stop requeued by Slurm or an operator "
        "(scontrol requeue, preemption, a failed node) (Slurm: JobState=COMPLETING "
        "Reason=None Restarts=1)\n"
        "2026-12-01T00:02:00Z restart=1 event=start nodes=n1\n"
        "2026-12-01T00:02:01Z restart=1 event=restart requeued by Slurm or an operator "
        "(not by slurmfm): scontrol: requeued at 2026-12-01T00:01:00, Restarts=1\n"
        "2026-12-01T00:03:00Z restart=1 event=stop cancelled (scancel by the owner or an "
        "admin) (Slurm: JobState=COMPLETING Reason=None Restarts=1)\n"
    )

    class Backend:
        name = "fake"

        def status(self, job_id: str) -> JobStatus:
            return JobStatus(job_id, "CANCELLED", name="demo", stdout=str(tmp_path / "demo_42.out"))

    monkeypatch.setattr(api, "get_backend", lambda *a, **k: Backend())
    code, out, _ = run("status", "42")
    assert code == 0
    flat = " ".join(out.split())
    assert "last requeue requeued by Slurm or an operator (not by slurmfm): scontrol:" in flat
    assert "last stop cancelled (scancel by the owner or an admin)" in flat
    code, out, _ = run("status", "42", "--json")
    info = __import__("json").loads(out)
    assert info["last_stop_reason"].startswith("cancelled (scancel")
    assert info["restarts"] == 1


def test_status_shows_a_long_checkpoint_path_whole_and_says_when_events_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmfm import api
    from slurmfm.backends.base import JobStatus

    ckpt = "/fsx/" + "/".join(["a-rather-long-directory-name"] * 6) + "/step_000100"
    events = tuple(f"2026-12-01T00:00:{i:02d}Z restart=0 event=note {i}" for i in range(14))
    st = JobStatus("42", "RUNNING", name="demo", last_checkpoint=ckpt, events=events)
    monkeypatch.setattr(api, "status", lambda *a, **k: st)
    monkeypatch.setenv("COLUMNS", "60")
    code, out, _ = run("status", "42")
    assert code == 0
    assert f"last checkpoint  {ckpt}" in out.splitlines()
    assert "events: (the last 10; 4 older: --events 0 shows all)" in out
    assert "event=note 3" not in out
    assert "event=note 4" in out
    code, out, _ = run("status", "42", "--events", "0")
    assert "event=note 0" in out
    assert "older" not in out


def test_validate_warns_of_a_c10d_rendezvous_with_the_fix() -> None:
    """Issue 42 item 1: a launcher's own words asking torchrun for a c10d rendezvous (which
    ranks nodes by sorted host name) get a warning at validation and at render, with the fix;
    the recipe stays valid."""
    code, out, err = run(
        "validate", QUICK, "--set", 'launcher.args=["--rdzv_backend", "c10d", "--steps", "1"]'
    )
    assert code == 0, err
    assert "ok: quickstart" in out
    assert (
        "warning: launcher.args: --rdzv_backend c10d makes torchrun rank the nodes by its "
        "rendezvous, which sorts them by host name"
    ) in err
    assert "static rendezvous gives each node --node-rank from the job's host order" in err
    code, _, err = run("render", QUICK, "--set", "launcher.script=wrap.sh --rdzv-backend=c10d")
    assert code == 0, err
    assert "warning: launcher.script: --rdzv-backend=c10d makes torchrun" in err
    code, _, err = run("validate", QUICK)
    assert "rdzv" not in err
