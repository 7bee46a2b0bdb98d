"""slurmfm: recipes to topology-aware Slurm jobs for foundation-model work on AWS GPU clusters.

The package keeps a one-way data flow: recipe -> (topology -> plan) -> script -> backend.
Everything up to the script is a pure function over typed values; only ``backends`` and
``cli`` touch processes and files. Heavy modules are imported lazily so the CLI starts fast.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
