"""slurmfm.call, the program of a job that runs a Python call (fm.Executor): the call, its
result, its traceback, and the refusals that keep a pickle on shared storage the user's own."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from slurmfm.call import CALL, META, RESULT, CallDirError, check_dir, main, read_owned, write_new

REPO_ROOT = Path(__file__).resolve().parent.parent


def call_dir(tmp: Path, fn: object, *args: object, main_file: str = "") -> Path:
    d = tmp / "call"
    d.mkdir(mode=0o700)
    write_new(d / CALL, pickle.dumps((fn, args, {})))
    write_new(d / META, json.dumps({"main": main_file, "sys_path": []}).encode())
    return d


def test_rank_0_writes_the_result_and_other_ranks_do_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = call_dir(tmp_path, divmod, 7, 2)
    monkeypatch.setenv("RANK", "1")
    assert main([str(d)]) == 0
    assert not (d / RESULT).exists()
    monkeypatch.setenv("RANK", "0")
    assert main([str(d)]) == 0
    assert pickle.loads(read_owned(d / RESULT)) == (3, 1)  # noqa: S301 - written just now
    assert (os.stat(d / RESULT).st_mode & 0o777) == 0o600


def test_a_finished_call_marks_the_run_done_for_this_job_only_on_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result is the call's completion: the marker lets an exit 0 that came after the
    pre-timeout signal end the job finished (not "requeue, no checkpoint to confirm")."""
    from slurmfm.job.checkpoint import DONE, marker_stamp, marker_verdict

    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("SLURMFM_CHECKPOINT_DIR", str(ckpt))
    monkeypatch.setenv("SLURMFM_ASK", "ask-1")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    before = marker_stamp(str(ckpt))
    (tmp_path / "failing").mkdir()
    monkeypatch.setenv("RANK", "0")
    assert main([str(call_dir(tmp_path / "failing", int, "x"))]) == 1
    assert not (ckpt / DONE).exists()
    d = call_dir(tmp_path, divmod, 7, 2)
    monkeypatch.setenv("RANK", "1")
    assert main([str(d)]) == 0
    assert not (ckpt / DONE).exists()
    monkeypatch.setenv("RANK", "0")
    assert main([str(d)]) == 0
    assert marker_verdict(str(ckpt), "ask-1", "77", before)[0] == "done"
    assert marker_verdict(str(ckpt), "ask-2", "78", before)[0] != "done"


def test_a_raising_call_leaves_its_traceback_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = call_dir(tmp_path, int, "not a number")
    monkeypatch.setenv("RANK", "0")
    assert main([str(d)]) == 1
    text = (d / "error-r0.txt").read_text()
    assert text.startswith("Traceback")
    assert text.strip().splitlines()[-1].startswith("ValueError: invalid literal for int()")
    assert main([str(d)]) == 1  # a restart's traceback replaces the last


def test_a_call_dir_others_could_write_or_a_linked_pickle_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    d = call_dir(tmp_path, divmod, 1, 1)
    d.chmod(0o755)
    with pytest.raises(CallDirError, match="not owner-only"):
        check_dir(d)
    with pytest.raises(CallDirError):
        main([str(d)])
    d.chmod(0o700)
    (d / CALL).unlink()
    other = tmp_path / "other.pkl"
    other.write_bytes(pickle.dumps((divmod, (1, 1), {})))
    (d / CALL).symlink_to(other)
    assert main([str(d)]) == 1  # O_NOFOLLOW: the call fails, its reason recorded
    assert "is a symbolic link" in (d / "error-r0.txt").read_text()
    with pytest.raises(FileExistsError):
        write_new(d / META, b"{}")  # never written over


def test_a_function_of_the_submitting_script_is_found_without_rerunning_it(
    tmp_path: Path,
) -> None:
    script = tmp_path / "exp.py"
    script.write_text(
        "def f(x):\n    return x + 1\n\n"
        "if __name__ == '__main__':\n    raise SystemExit('the script ran again')\n"
    )
    # Pickled as __main__.f, as a research script's own function is.
    code = (
        "import pickle, runpy, sys\n"
        f"sys.argv = [{str(script)!r}]\n"
        f"ns = runpy.run_path({str(script)!r}, run_name='not_main')\n"
        "f = ns['f']; f.__module__ = '__main__'; f.__qualname__ = 'f'\n"
        "import __main__; __main__.f = f\n"
        "sys.stdout.buffer.write(pickle.dumps((f, (41,), {})))\n"
    )
    data = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout
    d = tmp_path / "call"
    d.mkdir(mode=0o700)
    write_new(d / CALL, data)
    write_new(d / META, json.dumps({"main": str(script), "sys_path": []}).encode())
    proc = subprocess.run(
        [sys.executable, "-m", "slurmfm.call", str(d)],
        env={**os.environ, "RANK": "0", "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert pickle.loads((d / RESULT).read_bytes()) == 42  # noqa: S301 - written just now
