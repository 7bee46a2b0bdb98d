"""slurmfm: recipes to topology-aware Slurm jobs for foundation-model work on AWS GPU clusters.

The package keeps a one-way data flow: recipe -> (topology -> plan) -> script -> backend.
Everything up to the script is a pure function over typed values; only ``backends`` and
``cli`` touch processes and files. Heavy modules are imported lazily so the CLI starts fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``import slurmfm as fm; fm.submit(...)``: the Python API (:mod:`slurmfm.api`) from the
    package root, imported on first use so that ``import slurmfm`` (and each job runtime
    module's parent package) stays free (PEP 562)."""
    import importlib

    api = importlib.import_module("slurmfm.api")
    if name not in api.__all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(api, name)


def __dir__() -> list[str]:
    import importlib

    return sorted({*globals(), *importlib.import_module("slurmfm.api").__all__})


__all__ = ["__version__"]
