"""Dry-run: everything a submission would do, as an inspectable value, with nothing submitted.

The value is the submit request itself (:class:`slurmfm.request.SubmitRequest`): the exact
script bytes, runtime files and ``sbatch`` command line that ``submit`` sends. ``DryRunInfo`` is
its older name, kept so existing research scripts keep working.
"""

from __future__ import annotations

from slurmfm.request import SubmitRequest

DryRunInfo = SubmitRequest

__all__ = ["DryRunInfo", "SubmitRequest"]
