"""Backends: the only part of slurmfm that talks to Slurm (dry-run, Slurm CLI, pyslurm)."""

from slurmfm.backends.base import Backend, JobStatus, SubmitResult

__all__ = ["Backend", "JobStatus", "SubmitResult"]
