"""The runtime's contract with the nodes: Python 3.8, standard library only, self-contained."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

import slurmfm.job
from slurmfm.render.payload import _zip_bytes, extract, payload_line, runtime_file

JOB = Path(slurmfm.job.__file__).parent


def test_minimum_python_is_38_by_vermin() -> None:
    """vermin (PyPI) finds nothing in slurmfm/job that needs more than Python 3.8."""
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "vermin"),
            "-t=3.8-",
            "--no-tips",
            "--violations",
            str(JOB),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Minimum required versions: 3.8" in proc.stdout or "versions: 3.7" in proc.stdout
    assert slurmfm.job.MIN_PYTHON == (3, 8)


def test_standard_library_and_relative_imports_only() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in JOB.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in stdlib, (path.name, alias.name)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert (node.module or "").split(".")[0] in stdlib | {"__future__"}, (
                    path.name,
                    node.module,
                )


def test_zipapp_is_deterministic_and_runs_alone(tmp_path: Path) -> None:
    assert _zip_bytes() == _zip_bytes()
    rf = runtime_file()
    names = zipfile.ZipFile(BytesIO(rf.data)).namelist()
    assert names == sorted(names)
    assert "__main__.py" in names
    assert "slurmfm_job/agent.py" in names
    line = payload_line(rf)
    assert line.count("\n") == 0
    assert line.startswith(f"# slurmfm-runtime sha256={rf.sha256} ")
    assert extract("#!/bin/bash\n" + line + "\n") == rf.data
    pyz = tmp_path / rf.name
    pyz.write_bytes(rf.data)
    # -I -S, as every step runs it: nothing of this checkout or of site-packages is
    # importable; the zip and the standard library must be enough
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(pyz), "whoami"],
        capture_output=True,
        text=True,
        env={"SLURMD_NODENAME": "n7", "SLURM_TOPOLOGY_ADDR": "s0.s1.n7"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "n7 s0.s1.n7\n"


def test_every_module_imports_under_the_oldest_python_found(tmp_path: Path) -> None:
    """Where Python 3.8 (or 3.9) is installed, the zipapp's modules import and run under it;
    the interpreter running the tests always takes part."""
    pyz = tmp_path / "rt.pyz"
    pyz.write_bytes(runtime_file().data)
    modules = sorted(p.stem for p in JOB.glob("*.py") if p.stem != "__main__")
    check = (
        "import importlib, sys; sys.path.insert(0, sys.argv[1]); "
        "[importlib.import_module('slurmfm_job.' + m) for m in sys.argv[2:]]; "
        "print(sys.version_info[:2])"
    )
    found = [shutil.which(f"python3.{v}") for v in (8, 9)]
    runnable = [
        p
        for p in found
        if p and subprocess.run([p, "-c", "pass"], capture_output=True, check=False).returncode == 0
    ]
    for python in [sys.executable, *runnable]:
        proc = subprocess.run(
            [python, "-I", "-S", "-c", check, str(pyz), *modules],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, (python, proc.stderr)
