"""Worker NUMA binding: the gate for torchrun's --numa-binding runs in the launch's own Python
(slurmfm/job/numa.py), in the per-node entry, which a container launch runs in the image too
(issue 37): tests/render/test_worker_binding.py checks that its words carry the mode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurmfm.job.numa import TORCH_MIN, has_binding, with_binding

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "train.py"]


def fake_env(
    tmp_path: Path, version: str | None, numactl: bool, importable: bool = False
) -> dict[str, str]:
    """An environment whose Python finds a torch of ``version`` (None: a torch without a
    version file) and, with ``numactl``, a numactl on PATH. The fake torchrun prints the words
    it was given; unless ``importable``, importing the fake torch fails."""
    site = tmp_path / "site"
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (site / "torch" / "distributed").mkdir(parents=True, exist_ok=True)
    init = "" if importable else "raise SystemExit('torch imported')\n"
    (site / "torch" / "__init__.py").write_text(init)
    if version is not None:
        (site / "torch" / "version.py").write_text(f"__version__ = '{version}'\n")
    (site / "torch" / "distributed" / "__init__.py").write_text("")
    (site / "torch" / "distributed" / "run.py").write_text(
        "import sys\nprint('ARGV', *sys.argv[1:])\n"
    )
    if numactl:
        tool = bindir / "numactl"
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(0o755)
    # a torch.__init__ that raises proves the gate never imports torch (slow, and may fail)
    return {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "PYTHONPATH": str(site),
        "PYTHONNOUSERSITE": "1",
        "HOME": str(tmp_path),
    }


@pytest.mark.parametrize(
    ("version", "numactl", "ok"),
    [
        ("2.9.0+cu128", True, True),
        ("2.13.0", True, True),
        ("10.0.0", True, True),
        ("2.8.1+cu126", True, False),  # torchrun has no --numa-binding before 2.9
        ("2.9.0", False, False),  # torch's binding of a script entry point needs numactl
        (None, True, False),
    ],
)
def test_the_gate_reads_the_launchs_torch_without_importing_it(
    tmp_path: Path, version: str | None, numactl: bool, ok: bool
) -> None:
    env = fake_env(tmp_path, version, numactl)
    assert has_binding(sys.executable, env) is ok
    words, note = with_binding(TORCHRUN, 3, "node", env)
    if ok:
        assert words == [*TORCHRUN[:3], "--numa-binding=node", *TORCHRUN[3:]]
        assert "--numa-binding=node" in note
    else:
        assert words == TORCHRUN
        assert f"torch >= {TORCH_MIN[0]}.{TORCH_MIN[1]} and numactl" in note


def test_no_mode_or_no_python_leaves_the_command_alone(tmp_path: Path) -> None:
    env = fake_env(tmp_path, "2.9.0", True)
    assert with_binding(TORCHRUN, 3, "", env) == (TORCHRUN, "")
    assert with_binding(TORCHRUN, 0, "node", env) == (TORCHRUN, "")
    assert has_binding(str(tmp_path / "no-such-python"), env) is False


def test_the_node_entry_takes_the_mode_as_an_option() -> None:
    from slurmfm.job.cli import parser
    from slurmfm.job.options import NodeOptions

    a = parser().parse_args(["node", "--prefix", "3", "--numa", "node", "--", "python3"])
    assert NodeOptions.from_namespace(a).numa == "node"
    with pytest.raises(SystemExit):
        parser().parse_args(["node", "--numa", "bogus", "--", "python3"])
