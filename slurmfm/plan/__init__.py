"""Placement: which nodes a job gets, in which rank order, and what to ask Slurm for."""

from slurmfm.plan.types import Placement

__all__ = ["Placement"]
