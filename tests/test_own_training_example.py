"""The README's "Run your own training" example, as written, from a directory outside the
checkout: the files it shows, then its shell commands (the CLI) and its launch script (the API),
on the real lab. What the README promises is what runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from lab import REPO_ROOT, SlurmLab

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

SECTION = "## Run your own training"


def example() -> tuple[dict[str, str], list[str]]:
    """The section's files (a block whose first line is ``# myproj/...``) and its shell
    blocks, in order."""
    text = (REPO_ROOT / "README.md").read_text()
    body = text[text.index(SECTION) :]
    body = body[: body.index("\n## ", len(SECTION))]
    files: dict[str, str] = {}
    shell: list[str] = []
    for lang, code in re.findall(r"```(\w+)\n(.*?)```", body, re.S):
        first = code.splitlines()[0]
        if first.startswith("# myproj/"):
            files[first.removeprefix("# ")] = code
        elif lang == "sh":
            shell.append(code)
    return files, shell


def test_the_readme_example_has_its_files_and_commands() -> None:
    files, shell = example()
    assert set(files) == {
        "myproj/train.py",
        "myproj/data/train.csv",
        "myproj/recipe.yaml",
        "myproj/launch.py",
    }
    assert len(shell) == 2
    assert shell[1].strip() == "python myproj/launch.py"


def test_the_readme_example_runs_from_a_fresh_directory(
    host_b_lab: SlurmLab, tmp_path: Path
) -> None:
    files, shell = example()
    for rel, code in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    assert not tmp_path.is_relative_to(REPO_ROOT)
    env = {
        **host_b_lab.env,
        "PATH": f"{Path(sys.executable).parent}:{host_b_lab.env['PATH']}",
        "SLURMFM_HISTORY": str(tmp_path / "history" / "history.jsonl"),
        "PYTHONPATH": "",  # slurmfm as installed, not from a checkout on the path
    }

    def run(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    cli = run(shell[0])
    assert cli.returncode == 0, f"{cli.stdout}\n{cli.stderr}"
    proj = tmp_path / "myproj"
    assert f"{proj}/train.py" in cli.stdout  # the dry run carries the resolved path
    assert "trained steps 1-20 on 2 ranks" in cli.stdout
    m = re.search(r"job (\d+) \(myproj\): COMPLETED", cli.stdout)
    assert m, cli.stdout
    cli_id = m.group(1)
    assert (proj / "runs" / "ckpt" / "myproj" / "myproj" / "model.pt").is_file()
    logs = list((proj / "runs" / "logs").glob("myproj_*.out"))
    assert len(logs) == 1

    api = run(shell[1])
    assert api.returncode == 0, f"{api.stdout}\n{api.stderr}"
    lines = api.stdout.splitlines()
    assert lines[0].startswith("trained steps 21-30 on 2 ranks")  # resumed from the CLI's run
    first_id, second_id = re.findall(r"'(\d+)'", lines[1])
    assert first_id == cli_id  # the CLI's job, recorded under --experiment myproj
    assert lines[1] == f"runs of myproj: ['{cli_id}', '{second_id}']"
    assert len(list((proj / "runs" / "logs").glob("myproj_*.out"))) == 2
