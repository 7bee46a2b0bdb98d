"""Issue 38, 6: a token put under ``env:`` (instead of ``secrets:``) is not readable by another
user from slurmfm's render cache, ``validate`` says to move it, and the runtime's launch lines
never print it; the cache with two real users of one group (tests/team.py).

Before: the cache was ``~/.cache/slurmfm/render`` 0755 (0775 under umask 002) with 0644
entries holding the script and its ``HF_TOKEN=hf_...``; nothing warned; the batch step
masked only ``secrets:`` names and the node entry's "node 0 runs" line masked nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from team import ALICE, MALLORY, as_user, team_dir

TOKEN = "hf_" + "s3cr3t" * 4


@pytest.fixture
def team() -> Iterator[Path]:
    d = team_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")
def test_the_render_cache_is_private_to_its_user(
    team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmfm.cli import cache

    home = team / "alice-home"
    home.mkdir()
    os.chown(home, int(os.popen(f"id -u {ALICE}").read()), -1)  # noqa: S605 - a fixed name
    home.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.delenv("SLURMFM_CACHE_DIR", raising=False)

    def render() -> str:
        cache.put("k" * 64, f"export HF_TOKEN={TOKEN}\n", ())
        got = cache.get("k" * 64)
        return got.text if got else ""

    assert TOKEN in as_user(ALICE, render)  # alice's own cache still works
    d = home / ".cache" / "slurmfm" / "render"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / ("k" * 64 + ".json")).stat().st_mode) == 0o600

    def steal() -> str:
        try:
            return (d / ("k" * 64 + ".json")).read_text()
        except OSError as exc:
            return exc.strerror or ""

    assert as_user(MALLORY, steal) == "Permission denied"  # before: the script, token and all


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")
def test_an_older_open_cache_is_closed_on_first_use(
    team: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmfm.cli import cache

    d = team / "cache"
    d.mkdir(mode=0o755)
    (d / "old.json").write_text("{}")
    (d / "old.json").chmod(0o644)
    monkeypatch.setenv("SLURMFM_CACHE_DIR", str(d))
    cache.put("k" * 64, "x", ())
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE((d / "old.json").stat().st_mode) == 0o600


def test_validate_warns_about_a_secret_looking_env_name(tmp_path: Path) -> None:
    from slurmfm.cli import main

    recipe = tmp_path / "r.yaml"
    repo = Path(__file__).resolve().parents[1]
    text = (repo / "recipes" / "quickstart.yaml").read_text()
    recipe.write_text(
        text.replace("env:\n", f"env:\n  HF_TOKEN: {TOKEN}\n  WANDB_API_KEY: abcdef\n  LR: '0.1'\n")
    )
    res = CliRunner().invoke(
        main, ["validate", str(recipe), "--set", f"storage.log_dir={tmp_path}"]
    )
    assert res.exit_code == 0, res.output
    said = res.stderr if hasattr(res, "stderr") else res.output
    assert "env.HF_TOKEN: looks like a secret" in said
    assert "secrets:" in said
    assert "env.WANDB_API_KEY: looks like a secret" in said
    assert "env.LR" not in said
    assert TOKEN not in said


def test_every_launch_line_the_runtime_prints_is_masked() -> None:
    from slurmfm.job import masking
    from slurmfm.job.batch import masked

    env = {"HF_TOKEN": TOKEN, "MY_PASSWORD": "hunter22", "LR": "1", "GITHUB_SECRET": "ab"}
    argv = ["python3", "train.py", f"--token={TOKEN}", "--pw", "hunter22", "--lr", "1"]
    # the batch step's "launch:" line: an env: token, not listed under secrets:
    shown = masked(argv, (), env)
    assert TOKEN not in shown
    assert "hunter22" not in shown
    assert "--token=<secret>" in shown
    assert "--lr 1" in shown
    # the node entry's "node 0 runs:" line
    assert TOKEN not in masking.line(argv, env)
    assert masking.line(["a", "b"], {"X_TOKEN": "b"}) == "a b"  # too short to mask


def test_the_printed_launch_names_the_scripts_programs_and_masks_secrets() -> None:
    """The job log's launch lines show the working-directory guard as the script writes it
    (``"$slurmfm_run_module"``), not the line of Python the shell expanded it to, and still
    mask a token in an argument."""
    from slurmfm.job import batch, masking
    from slurmfm.job.install import CHECKED
    from slurmfm.job.safepath import RUN_MODULE

    argv = ["python3", "-c", RUN_MODULE, "torch.distributed.run", "--token=hf_abcdefgh"]
    env = {"HF_TOKEN": "hf_abcdefgh"}
    named = {RUN_MODULE: '"$slurmfm_run_module"'}
    assert masking.line(argv, env, named=named) == (
        "python3 -c \"$slurmfm_run_module\" torch.distributed.run '--token=<secret>'"
    )
    shown = batch.masked(["srun", "python3", "-c", CHECKED, "node", "--", *argv], [], env)
    assert shown.startswith(
        'srun python3 -c $slurmfm_checked node -- python3 -c "$slurmfm_run_module" '
    )
    assert "hf_abcdefgh" not in shown
