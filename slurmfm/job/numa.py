"""Worker CPU/NUMA binding for a torchrun launch: ``--numa-binding`` where the image has it.

torchrun binds each worker to the CPUs of its GPU's NUMA node with ``--numa-binding=node``
(pytorch/pytorch torch/distributed/run.py; torch/numa/binding.py), from torch 2.9
(https://docs.pytorch.org/docs/2.9/elastic/numa.html; pytorch/pytorch#149334). An older
torchrun refuses the option ("unrecognized arguments") and the launch would fail, and torch's
binding of a script entry point runs the worker under ``numactl`` and raises without it
(torch/numa/binding.py ``_raise_if_binding_invalid``). Which torch the launch runs is only
known where it runs, so the gate runs there, in the launch's own Python: :data:`PROBE` reads
``torch/version.py`` without importing torch (``find_spec`` of a top-level package only
locates it) and exits 0 when the option may be given. The per-node entry
(:func:`with_binding`) and the container entry (slurmfm/render/container.py) both run it.

Standard library only (Python >= 3.8), as all of slurmfm.job.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

TORCH_MIN = (2, 9)
"""The first torch whose torchrun has ``--numa-binding`` (see the module docstring)."""

PROBE = (
    "import importlib.util as u,os,re,shutil,sys\n"
    's=u.find_spec("torch")\n'
    'f=os.path.join(os.path.dirname(s.origin),"version.py") if s and s.origin else ""\n'
    't=open(f).read() if f else ""\n'
    'm=re.search("__version__ *= *.([0-9]+)[.]([0-9]+)",t)\n'
    'ok=m is not None and (int(m.group(1)),int(m.group(2)))>=%r and shutil.which("numactl")\n'
    "sys.exit(0 if ok else 1)\n" % (TORCH_MIN,)
)
"""Exit 0 when this Python's torch is >= :data:`TORCH_MIN` and ``numactl`` is on PATH."""

PROBE_TIMEOUT_S = 30.0


def has_binding(python: str, env: Mapping[str, str]) -> bool:
    """Whether torchrun under ``python`` may be given ``--numa-binding`` (:data:`PROBE`)."""
    try:
        done = subprocess.run(
            [python, "-c", PROBE],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def with_binding(
    argv: Sequence[str], prefix: int, mode: str, env: Mapping[str, str]
) -> tuple[list[str], str]:
    """``argv`` with ``--numa-binding=<mode>`` after its first ``prefix`` words (torchrun's
    own: python -m torch.distributed.run) where the gate passes, and a line for the log."""
    words = list(argv)
    if not mode or prefix <= 0 or not words:
        return words, ""
    if has_binding(words[0], env):
        return (
            words[:prefix] + ["--numa-binding=%s" % mode] + words[prefix:],
            "slurmfm: workers bound to their GPU's NUMA node (torchrun --numa-binding=%s)" % mode,
        )
    return words, (
        "slurmfm: no NUMA binding: torchrun --numa-binding needs torch >= %d.%d and numactl "
        "in the launch's environment" % TORCH_MIN
    )
