"""The job runtime: every decision a running job makes, in standard-library Python.

Why a separate package: this code runs on the compute nodes inside the allocation (never inside
the training container), where slurmfm itself may not be installed. The renderer packs this
directory into a deterministic zipapp and embeds it in the batch script's last line
(:mod:`slurmfm.render.payload`); the script extracts it once, checks its sha256, and every step
runs ``python3 "$SLURMFM_RUNTIME" <subcommand>``. Because Slurm stores the batch script and a
requeue re-runs those same bytes, a requeued job runs the runtime it started with.

Rules for this package: standard library only, no import from the rest of slurmfm, relative
imports only (inside the zipapp it is a top-level package called ``slurmfm_job``), and Python
3.8 syntax (the oldest ``python3`` on AWS GPU images: Ubuntu 20.04 ships 3.8, Amazon Linux
2023 ships 3.9); ``tests/job/test_compat.py`` checks the minimum with ``vermin``. Every timing
constant is a parameter, so the unit tests drive the decisions with injected clocks.
"""

MIN_PYTHON = (3, 8)
