"""The submitting side on a shared checkpoint root: run-directory records keyed on the
resolved directory (sweep tasks included), another user's directory refused before anything
is queued, carriage returns refused at validation (sbatch would refuse the script)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from slurmfm import run_lock
from slurmfm.errors import RecipeError, SlurmfmError
from slurmfm.recipe.loader import validate
from slurmfm.run_lock import RunDirInUse
from slurmfm.submit import _own_run_dir

NOBODY = 65534


def recipe(root: Path, **extra: Any) -> Any:
    data: dict[str, Any] = {
        "name": "sw",
        "cluster": {"instance_type": "lab-cpu"},
        "resources": {"procs_per_node": 1},
        "launcher": {"kind": "torchrun", "script": "t.py"},
        "storage": {"checkpoint_root": str(root)},
    }
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    return validate(data)


def test_a_plain_job_meets_the_sweep_task_that_trains_in_its_directory(tmp_path: Path) -> None:
    sweep = recipe(tmp_path, sweep={"parameters": {"env.LR": ["1", "2"]}})
    alive = {"70": "RUNNING"}
    paths = run_lock.record_paths(sweep)
    assert [p.name for p in paths] == [".sw-t0.slurmfm-jobs", ".sw-t1.slurmfm-jobs"]
    for p in paths:
        with run_lock.exclusive(sweep, alive.get, path=p) as record:
            record("70")
    plain = recipe(tmp_path, storage={"run_id": "sw-t1"})
    with (
        pytest.raises(RunDirInUse, match=r"job 70 \(RUNNING\).*sw-t1"),
        run_lock.exclusive(plain, alive.get),
    ):
        pass


def test_the_record_is_keyed_on_the_resolved_directory(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    a = run_lock.record_path(recipe(tmp_path / "real"))
    b = run_lock.record_path(recipe(tmp_path / "link"))
    c = run_lock.record_path(recipe(tmp_path / "real" / ".." / "real"))
    assert a == b == c


def test_a_planted_link_as_record_is_refused_never_written_through(tmp_path: Path) -> None:
    r = recipe(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    path = run_lock.record_path(r)
    path.parent.mkdir(parents=True)
    path.symlink_to(victim)
    with (
        pytest.raises(SlurmfmError, match=r"storage.run_id: the run record .* is a symbolic link"),
        run_lock.exclusive(r, {}.get),
    ):
        pass
    assert victim.read_text() == "root only\n"


def test_another_users_record_neither_blocks_nor_is_written(tmp_path: Path) -> None:
    r = recipe(tmp_path)
    path = run_lock.record_path(r)
    path.parent.mkdir(parents=True)
    path.write_text("9\n")
    os.chown(path, NOBODY, NOBODY)
    with run_lock.exclusive(r, {"9": "RUNNING"}.get) as record:
        record("10")
    assert path.read_text() == "10\n"  # ours now, under the same name
    assert path.stat().st_uid == os.geteuid()


def test_another_users_run_directory_is_refused_before_anything_is_queued(
    tmp_path: Path,
) -> None:
    run = tmp_path / "sw" / "sw"
    run.mkdir(parents=True)
    os.chown(run, NOBODY, NOBODY)
    with pytest.raises(
        SlurmfmError, match=r"storage.checkpoint_root: the run directory .* belongs"
    ):
        _own_run_dir(run)


def test_a_run_directory_that_cannot_be_created_says_whose_parent_blocks_it(
    tmp_path: Path,
) -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(dir="/tmp"))  # 0755 below: nobody may look in, not add
    base.chmod(0o755)
    parent = base / "sw"
    parent.mkdir()
    parent.chmod(0o755)
    # as an unprivileged user (root may create anywhere): a first user's 0755 <name>/
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        message = b"no error"
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            _own_run_dir(parent / "sw")
        except SlurmfmError as exc:
            message = str(exc).encode()
        finally:
            os.write(write, message)
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        said = fh.read()
    os.waitpid(pid, 0)
    import shutil

    shutil.rmtree(base)
    assert "storage.checkpoint_root: cannot create the run directory" in said
    assert f"{parent} belongs to user root (mode 0755)" in said


def test_a_new_run_directory_is_ours_and_closed_to_the_group(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        _own_run_dir(tmp_path / "sw" / "sw")
    finally:
        os.umask(old)
    assert (tmp_path / "sw" / "sw").stat().st_mode & 0o022 == 0


@pytest.mark.parametrize(
    "field",
    [{"launcher": {"args": ["--lr", "1e-4\r"]}}, {"env": {"LR": "1e-4\r\n"}}],
)
def test_validate_refuses_a_carriage_return_as_sbatch_would(
    tmp_path: Path, field: dict[str, Any]
) -> None:
    with pytest.raises(RecipeError, match="carriage return"):
        recipe(tmp_path, **field)
