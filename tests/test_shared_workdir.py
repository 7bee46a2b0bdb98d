"""Issue 38, 2: the job's working directory (the submit directory, often a team's 2775
directory) is never on the import path of a Python slurmfm starts, with two real users
(tests/team.py): mallory plants ``torch/``, ``slurmfm/``, ``sglang/``, ``nemo/`` and ``ray/``
there; alice's launches, run there by a real interpreter, import the real packages (here
small stand-ins on alice's own ``PYTHONPATH``, which follows the working directory on
``sys.path`` exactly as site-packages does) and never mallory's.

Before: every launch was ``python3 -m torch.distributed.run`` (a function job's workers
``python -u -m slurmfm.call``, SGLang ``python -m sglang.launch_server``, NeMo and the Ray
count ``python -c``), and ``-m``/``-c`` put the working directory first: mallory's package
ran as alice.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from team import ALICE, MALLORY, as_user, team_dir

from slurmfm.launchers import spec
from slurmfm.recipe.loader import validate

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two users")

PYTHON = "/usr/bin/python3"
EVIL = "open('PWNED', 'a').write(__name__ + '\\n')\n"


@pytest.fixture
def team() -> Iterator[Path]:
    d = team_dir()
    lib = d / "alice-lib"  # alice's own packages (her venv's site-packages, in effect)
    for pkg, body in {
        "torch/__init__.py": "",
        "torch/distributed/__init__.py": "",
        "torch/distributed/run.py": "import sys\nprint('legit torchrun', sys.argv[1:3])\n",
        "sglang/__init__.py": "",
        "sglang/launch_server.py": "print('legit sglang')\n",
        "nemo/__init__.py": "print('legit nemo')\nraise SystemExit(0)\n",
        "ray/__init__.py": "init = lambda address: None\nnodes = lambda: [{'Alive': 1}]\n",
    }.items():
        (lib / pkg).parent.mkdir(parents=True, exist_ok=True)
        (lib / pkg).write_text(body)
    for p in [lib, *lib.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def plant(workdir: str) -> None:
    """mallory's packages in the shared working directory."""
    for pkg in ("torch", "slurmfm", "sglang", "nemo", "ray", "runpy"):
        if pkg == "runpy":
            with open(os.path.join(workdir, "runpy.py"), "w") as fh:
                fh.write(EVIL)
            continue
        os.makedirs(os.path.join(workdir, pkg), exist_ok=True)
        for sub in ("", "distributed", "collections"):
            d = os.path.join(workdir, pkg, sub)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "__init__.py"), "w") as fh:
                fh.write(EVIL)
        with open(os.path.join(workdir, pkg, "call.py"), "w") as fh:
            fh.write(EVIL)


def run_words(argv: list[str], workdir: str, extra_path: str = "") -> tuple[str, str]:
    """Run ``argv`` as alice in ``workdir`` (her PYTHONPATH: her packages, then slurmfm's
    checkout); what it printed, and what of mallory's ran."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(workdir).parent / "alice-lib"), extra_path) if p
        ),
        "SLURMFM_RDZV_HOST": "127.0.0.1",
        "SLURMFM_RDZV_PORT": "20001",
        "SLURMFM_SERVE_PORT": "20002",
        "SLURMFM_SERVE_HEAD": "127.0.0.1",
        "SLURMFM_SERVE_DIST_PORT": "20003",
    }
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, check=False)
    pwned = Path(workdir, "PWNED")
    return proc.stdout + proc.stderr, pwned.read_text() if pwned.exists() else ""


def bash(line: str) -> list[str]:
    """``line`` run as the batch script runs it: after the script's ``slurmfm_run_module``
    (slurmfm.render.script, ``_with_run_module``)."""
    from slurmfm.job.safepath import RUN_MODULE, SHELL_VAR
    from slurmfm.quote import sh_quote

    return ["bash", "-c", f"{SHELL_VAR}={sh_quote(RUN_MODULE)}\n{line}"]


def recipe(**launcher: Any) -> Any:
    return validate(
        {
            "name": "wd",
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"procs_per_node": 1},
            "launcher": launcher,
        }
    )


def test_torchrun_never_imports_torch_from_the_working_directory(team: Path) -> None:
    logs = str(team / "logs")
    as_user(MALLORY, plant, logs)
    line = spec("torchrun").launch(recipe(kind="torchrun", script="train.py", python=PYTHON), "$D")
    said, pwned = as_user(ALICE, run_words, bash(" ".join(line.lines)), logs)
    assert pwned == "", pwned  # before: mallory's torch/__init__.py ran as alice
    assert "legit torchrun" in said, said
    assert "'--nnodes=1'" in said  # the module got torchrun's own arguments


def torchrun_worker(words: list[str]) -> list[str]:
    """The worker command torchrun builds from its command line (pytorch/pytorch:
    torch/distributed/run.py, config_from_args): ``--no-python``: the script and its
    arguments as given; ``-m``/``--module``: ``python -u -m SCRIPT``; else ``python -u
    SCRIPT``."""
    opts: set[str] = set()
    i = 0
    while i < len(words) and words[i].startswith("-"):
        opts.add(words[i].split("=", 1)[0])
        i += 1
    script, rest = words[i], words[i + 1 :]
    if "--no-python" in opts:
        return [script, *rest]
    if opts & {"-m", "--module"}:
        return [PYTHON, "-u", "-m", script, *rest]
    return [PYTHON, "-u", script, *rest]


def test_a_function_jobs_workers_never_import_slurmfm_from_the_working_directory(
    team: Path,
) -> None:
    import shlex

    logs = str(team / "logs")
    as_user(MALLORY, plant, logs)
    line = spec("torchrun").launch(
        recipe(kind="torchrun", script="slurmfm.call", module=True, python=PYTHON), "$D"
    )
    from slurmfm.job.safepath import RUN_MODULE, SHELL_VAR
    from slurmfm.quote import sh_quote

    # the words as the batch shell passes them (it expands the script's slurmfm_run_module)
    words = shlex.split(" ".join(line.lines[1:]).replace(f'"${SHELL_VAR}"', sh_quote(RUN_MODULE)))
    words = [w for w in words if not w.startswith(("--master", "--nnodes", "--nproc"))]
    repo = str(Path(__file__).resolve().parents[1])
    said, pwned = as_user(ALICE, run_words, torchrun_worker(words), logs, repo)
    assert pwned == "", pwned  # before: `python -u -m slurmfm.call` ran mallory's slurmfm/
    assert "usage: python -m slurmfm.call CALL_DIR" in said, said  # the real one ran


def test_sglang_never_imports_sglang_from_the_working_directory(team: Path) -> None:
    from slurmfm.launchers import SglangLauncher
    from slurmfm.recipe.schema import Parallelism
    from slurmfm.render.serve import serve_launch

    logs = str(team / "logs")
    as_user(MALLORY, plant, logs)
    s = serve_launch(
        SglangLauncher(kind="sglang", model="m", python=PYTHON), Parallelism(), 1, "all"
    )
    said, pwned = as_user(ALICE, run_words, bash(" ".join(s.argv)), logs)
    assert pwned == "", pwned
    assert "legit sglang" in said, said


def test_the_nemo_driver_never_imports_nemo_from_the_working_directory(team: Path) -> None:
    import yaml

    logs = str(team / "logs")
    as_user(MALLORY, plant, logs)
    repo = Path(__file__).resolve().parents[1]
    data = yaml.safe_load((repo / "recipes" / "nemo-llama3-8b-p6-b200.yaml").read_text())
    driver = spec("nemo").driver(validate(data), "$D")
    assert driver is not None
    said, pwned = as_user(ALICE, run_words, [PYTHON, "-c", driver], logs)
    assert pwned == "", pwned
    assert "legit nemo" in said, said


def test_the_ray_count_never_imports_ray_from_the_working_directory(team: Path) -> None:
    from slurmfm.job.serve import ray_alive

    logs = str(team / "logs")
    as_user(MALLORY, plant, logs)

    def count() -> tuple[int, str]:
        def run(argv: list[str], timeout_s: float) -> tuple[int, str]:
            said, _ = run_words(argv, logs)
            return 0, said

        n = ray_alive(PYTHON, "127.0.0.1:1", run)
        return n, Path(logs, "PWNED").read_text() if Path(logs, "PWNED").exists() else ""

    alive, pwned = as_user(ALICE, count)
    assert pwned == "", pwned
    assert alive == 1


def test_the_module_runner_is_python_m_for_the_module() -> None:
    """What ``-c RUN_MODULE M`` gives the module is what ``-m M`` would: ``__main__``, its
    file as ``sys.argv[0]``, the arguments after it; on the interpreter that runs the tests."""
    from slurmfm.job.safepath import RUN_MODULE

    out = subprocess.run(
        [sys.executable, "-c", RUN_MODULE, "json.tool", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        out
        == subprocess.run(
            [sys.executable, "-m", "json.tool", "--help"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )


def _interpreters() -> list[str]:
    """Every CPython 3.8+ on this machine (pyenv's, the system's): the images a job may run."""
    import glob
    import re

    found = {}
    for p in [
        *glob.glob("/root/.pyenv/versions/3.*/bin/python3"),
        *glob.glob("/usr/bin/python3.*"),
        *glob.glob("/usr/local/bin/python3.*"),
    ]:
        m = re.search(r"3\.(\d+)", p)
        if m and int(m.group(1)) >= 8 and os.access(p, os.X_OK) and not p.endswith("-config"):
            found.setdefault(int(m.group(1)), p)
    return [found[k] for k in sorted(found)] or [sys.executable]


@pytest.mark.parametrize("python", _interpreters())
def test_the_module_runner_keeps_the_working_directory_off_the_path_on_every_python(
    tmp_path: Path, python: str
) -> None:
    """Python 3.8 to 3.13: ``-c RUN_MODULE`` runs the module as ``-m`` would (its name, its
    ``sys.argv``), and a package of the same name in the working directory is not imported;
    ``-m`` imports it (what the launch line did before)."""
    from slurmfm.job.safepath import RUN_MODULE

    lib = tmp_path / "lib" / "probe"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "main.py").write_text(
        "import sys\nprint('real', __name__, sys.argv[0].endswith('main.py'), sys.argv[1:])\n"
    )
    work = tmp_path / "work" / "probe"
    work.mkdir(parents=True)
    (work / "__init__.py").write_text("print('PLANTED')\n")
    (work / "main.py").write_text("print('PLANTED')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "lib")}

    def run(*argv: str) -> str:
        return subprocess.run(
            [python, *argv], cwd=work.parent, env=env, capture_output=True, text=True, check=True
        ).stdout

    assert run("-c", RUN_MODULE, "probe.main", "a", "--b") == "real __main__ True ['a', '--b']\n"
    assert "PLANTED" in run("-m", "probe.main", "a")  # the attack, on this interpreter
