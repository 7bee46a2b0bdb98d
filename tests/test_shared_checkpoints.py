"""Issue 38, the run directory's whole chain, with two real unprivileged users of one group
(tests/team.py): alice trains, mallory attacks through the checkpoint root they share.

Each scenario failed before the chain was checked: submit created ``<run_id>`` inside
mallory's ``<name>``, the runtime and ``fm.checkpoint`` resumed from what a link put where the
run directory was (her checkpoint, or another of alice's runs), counted her ``step_N`` and
believed her ``DONE``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from team import ALICE, MALLORY, Raised, as_user, team_dir, uid

from slurmfm import checkpoint as ck
from slurmfm.errors import SlurmfmError
from slurmfm.job import checkpoint as jck
from slurmfm.job.cli import own_checkpoint_dir
from slurmfm.submit import _own_run_dir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")


@pytest.fixture
def team() -> Iterator[Path]:
    d = team_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _mallory_checkpoint(where: str) -> None:
    """Her run directory with a complete step_7 and a pointer to it (what she wants loaded)."""
    os.makedirs(os.path.join(where, "step_000000007"))
    with open(os.path.join(where, "step_000000007", "model.pt"), "w") as fh:
        fh.write("mallory's pickle\n")
    with open(os.path.join(where, "latest"), "w") as fh:
        fh.write("step_000000007\n")


def _plant_name_dir(root: str, name: str) -> None:
    """mallory pre-creates the predictable <root>/<name>, open to all."""
    os.mkdir(os.path.join(root, name))
    os.chmod(os.path.join(root, name), 0o777)  # noqa: S103 - the attack


def _submit_side(run: str) -> str:
    try:
        _own_run_dir(Path(run))
    except SlurmfmError as exc:
        return str(exc)
    return "submitted"


def test_submit_refuses_a_name_directory_another_user_made(team: Path) -> None:
    root = str(team / "ckpt")
    as_user(MALLORY, _plant_name_dir, root, "llama")
    said = as_user(ALICE, _submit_side, f"{root}/llama/run1")
    assert said.startswith("storage.checkpoint_root: the run directory"), said
    assert f"belongs to uid {uid(MALLORY)}" in said
    assert "\n" not in said
    assert not (team / "ckpt" / "llama" / "run1").exists()


def test_submit_makes_the_name_directory_its_own_and_closed(team: Path) -> None:
    root = str(team / "ckpt")
    assert as_user(ALICE, _submit_side, f"{root}/llama/run1") == "submitted"
    for d in (team / "ckpt" / "llama", team / "ckpt" / "llama" / "run1"):
        st = d.lstat()
        assert st.st_uid == uid(ALICE)
        assert st.st_mode & 0o777 == 0o755  # (the setgid bit comes from the root)

    # and mallory, in the sticky root, can neither rename alice's <name> nor add to it
    def attack() -> list[str]:
        said = []
        for f in (
            lambda: os.rename(f"{root}/llama", f"{root}/gone"),
            lambda: os.mkdir(f"{root}/llama/x"),
        ):
            try:
                f()
                said.append("done")
            except OSError as exc:
                said.append(exc.strerror or "")
        return said

    assert as_user(MALLORY, attack) == ["Operation not permitted", "Permission denied"]


def test_a_checkpoint_root_open_to_renames_is_refused_at_submit() -> None:
    d = team_dir(root_mode=0o2775)  # group-writable, not sticky: anyone may swap <name>
    try:
        said = as_user(ALICE, _submit_side, f"{d}/ckpt/llama/run1")
        assert "is writable by its group without the sticky bit" in said
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _swap_run_dir_for_link(root: str) -> None:
    """After alice's prepare: her <run_id> renamed away, a link to mallory's run put there
    (possible while <name> was mallory's 0777 directory)."""
    os.rename(f"{root}/llama/run1", f"{root}/llama/run1.moved")
    _mallory_checkpoint(f"{root}/mallory-run")
    os.chmod(f"{root}/mallory-run", 0o755)  # noqa: S103 - hers, readable by alice
    os.symlink(f"{root}/mallory-run", f"{root}/llama/run1")


def _alice_prepare(root: str) -> None:
    """What alice's old submit and prepare did in mallory's <name>: <run_id> made, owned."""
    os.mkdir(f"{root}/llama/run1", 0o755)


def _runtime_resume(run: str) -> tuple[str | None, str | None]:
    return own_checkpoint_dir(run), jck.resume_from(run)


def _library_resume(run: str) -> str:
    try:
        return str(ck.latest(Path(run)))
    except OSError as exc:
        return f"refused: {exc}"


def test_another_users_checkpoint_behind_a_link_is_never_resumed(team: Path) -> None:
    root = str(team / "ckpt")
    as_user(MALLORY, _plant_name_dir, root, "llama")
    as_user(ALICE, _alice_prepare, root)
    as_user(MALLORY, _swap_run_dir_for_link, root)
    why, res = as_user(ALICE, _runtime_resume, f"{root}/llama/run1")
    assert res is None, res  # before: .../run1/step_000000007, mallory's pickle
    assert why is not None
    assert "is not safe" in why
    assert "refused:" in as_user(ALICE, _library_resume, f"{root}/llama/run1")


def _link_to_my_other_run(root: str) -> None:
    os.makedirs(f"{root}/gpt/run1")
    _mallory_checkpoint(f"{root}/gpt/run1")  # alice's own checkpoint of another model
    os.makedirs(f"{root}/llama")
    os.symlink(f"{root}/gpt/run1", f"{root}/llama/run1")


def test_a_link_to_another_of_my_runs_is_refused(team: Path) -> None:
    root = str(team / "ckpt")
    as_user(ALICE, _link_to_my_other_run, root)
    said = as_user(ALICE, _submit_side, f"{root}/llama/run1")
    assert "llama/run1: is a symbolic link" in said, said
    why, res = as_user(ALICE, _runtime_resume, f"{root}/llama/run1")
    assert res is None
    assert why is not None
    assert "symbolic link" in why

    def save_through() -> str:
        try:
            ck.save(Path(f"{root}/llama/run1"), 9, lambda p: (p / "w").write_text("x"))
        except OSError as exc:
            return f"refused: {exc}"
        return "saved"

    assert as_user(ALICE, save_through).startswith("refused:")
    assert sorted(os.listdir(f"{root}/gpt/run1")) == ["latest", "step_000000007"]


def test_only_my_own_step_directories_count_and_my_own_done(team: Path) -> None:
    root = str(team / "ckpt")
    run = f"{root}/llama/run1"
    assert as_user(ALICE, _submit_side, run) == "submitted"

    def save_one() -> str:
        ck.save(Path(run), 3, lambda p: (p / "w").write_text("alice"))
        return str(ck.latest(Path(run)))

    assert as_user(ALICE, save_one).endswith("step_000000003")
    # a step_N and a DONE of mallory's inside alice's directory (root puts them there: alice's
    # directory no longer lets her in) are not alice's
    theirs = Path(run) / "step_000000009"
    theirs.mkdir()
    (Path(run) / "DONE").write_text("{}\n")
    for p in (theirs, Path(run) / "DONE"):
        os.chown(p, uid(MALLORY), -1)
    assert as_user(ALICE, _library_resume, run).endswith("step_000000003")
    assert as_user(ALICE, lambda: ck.is_done(Path(run))) is False
    assert as_user(ALICE, lambda: jck.marker_verdict(run, "a", "1", None))[0] == "stale"


def test_the_runtime_refuses_a_run_directory_reached_through_another_users_name_dir(
    team: Path,
) -> None:
    root = str(team / "ckpt")
    as_user(MALLORY, _plant_name_dir, root, "llama")
    why = as_user(ALICE, own_checkpoint_dir, f"{root}/llama/run1")
    assert why is not None
    assert f"belongs to uid {uid(MALLORY)}" in why
    with pytest.raises(Raised, match="Refused"):
        as_user(ALICE, ck.resume_point, Path(f"{root}/llama/run1"))


def _torch_loads(source: str) -> list[str]:
    """How each ``torch.load(...)`` call in ``source`` passes ``weights_only``."""
    import ast

    said = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "load"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
        ):
            kw = {k.arg: k.value for k in node.keywords}
            v = kw.get("weights_only")
            said.append(repr(v.value) if isinstance(v, ast.Constant) else "missing")
    return said


def test_the_shipped_trainer_and_the_readme_example_load_tensors_only() -> None:
    """The template users copy: a checkpoint that is not theirs must never run code as them
    (torch.load with weights_only=False unpickles anything)."""
    import re

    repo = Path(__file__).resolve().parents[1]
    tiny = (repo / "recipes" / "scripts" / "train_tiny.py").read_text()
    readme = (repo / "README.md").read_text()
    blocks = re.findall(r"```python\n(# myproj/train.py\n.*?)```", readme, re.S)
    assert blocks
    for source in (tiny, *blocks):
        loads = _torch_loads(source)
        assert loads
        assert set(loads) == {"True"}, loads


# The run lock (issue 38, 3): mallory plants in a <name> directory the admin made for the team
# (root's, 3775: the chain allows it, and she may add entries but never rename alice's).


def _admin_name_dir(team: Path) -> Path:
    from team import gid

    d = team / "ckpt" / "sw"
    d.mkdir()
    os.chown(d, 0, gid())
    d.chmod(0o3775)
    return d


def _lock_as_alice(r: object, alive: dict[str, str]) -> str:
    from slurmfm import run_lock

    try:
        with run_lock.exclusive(r, alive.get) as record:  # type: ignore[arg-type]
            record("77")
    except SlurmfmError as exc:
        return str(exc)
    return "submitted"


def _recipe(team: Path) -> object:
    from slurmfm.recipe.loader import validate

    return validate(
        {
            "name": "sw",
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"procs_per_node": 1},
            "launcher": {"kind": "torchrun", "script": "t.py"},
            "storage": {"checkpoint_root": str(team / "ckpt")},
        }
    )


def test_another_users_planted_record_does_not_block_my_submit(team: Path) -> None:
    d = _admin_name_dir(team)
    r = _recipe(team)

    def plant() -> None:
        with open(d / ".sw.slurmfm-jobs", "w") as fh:
            fh.write("9\n")  # her own live job, which trains elsewhere

    as_user(MALLORY, plant)
    said = as_user(ALICE, _lock_as_alice, r, {"9": "RUNNING"})
    assert said == "submitted"  # before: RunDirInUse: job 9 (RUNNING) already uses ...
    assert (d / ".sw.slurmfm-jobs").read_text() == "9\n"  # hers: never written


@pytest.mark.parametrize("what", ["link", "fifo"])
def test_a_planted_link_or_fifo_as_record_is_refused_not_silently_skipped(
    team: Path, what: str
) -> None:
    d = _admin_name_dir(team)
    r = _recipe(team)
    secret = team / "alice-secret"

    def plant() -> None:
        p = str(d / ".sw.slurmfm-jobs")
        os.symlink(str(secret), p) if what == "link" else os.mkfifo(p)

    as_user(MALLORY, plant)
    said = as_user(ALICE, _lock_as_alice, r, {})
    # before: "submitted", with the one-job check silently off
    assert said.startswith("storage.run_id: the run record"), said
    assert ("symbolic link" if what == "link" else "a FIFO") in said
    assert "\n" not in said


@pytest.mark.parametrize("what", ["file", "fifo"])
def test_a_file_or_fifo_where_a_directory_of_the_chain_belongs_is_named(
    team: Path, what: str
) -> None:
    root = team / "ckpt"
    (root / "llama").mkdir()
    if what == "file":
        (root / "llama" / "run1").write_text("")
    else:
        os.mkfifo(root / "llama" / "run1")
    why = own_checkpoint_dir(f"{root}/llama/run1")
    assert why is not None
    assert ("a file, not a directory" if what == "file" else "a FIFO") in why
