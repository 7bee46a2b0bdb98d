"""Builders the render tests share: a small valid recipe with dotted overrides, its script,
and the shell checks every rendered script must pass."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from slurmfm.plan.types import Placement
from slurmfm.recipe.loader import validate
from slurmfm.render.script import RenderedScript, Target, render_script


def recipe(**over: Any) -> Any:
    """A 2-node p5 torchrun recipe; ``a__b=v`` sets ``a.b`` (creating ``a`` if needed)."""
    base: dict[str, Any] = {
        "name": "r",
        "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
        "resources": {"nodes": 2},
        "parallelism": {"tp": 8},
        "launcher": {"kind": "torchrun", "script": "/fsx/train.py"},
    }
    for key, value in over.items():
        cur = base
        *parents, leaf = key.split("__")
        for p in parents:
            cur = cur.setdefault(p, {})
        cur[leaf] = value
    return validate(base)


def rendered(r: Any, version: str = "24.11", placement: Placement | None = None) -> RenderedScript:
    """The script for ``r`` on Slurm ``version``, without asking any cluster."""
    return render_script(r, Target.for_recipe(r, version), placement)


def render(r: Any, version: str = "24.11", placement: Placement | None = None) -> str:
    """The script's text (see :func:`rendered`)."""
    return rendered(r, version, placement).text


def shellcheck(text: str, tmp: Path) -> None:
    """``bash -n`` and ``shellcheck -S style`` pass on ``text``."""
    f = tmp / "s.sh"
    f.write_text(text)
    subprocess.run(["bash", "-n", str(f)], check=True)
    proc = subprocess.run(["shellcheck", "-S", "style", str(f)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
