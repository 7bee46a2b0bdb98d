"""The strict base of every recipe model: unknown keys refused, values frozen, and every leaf
value one the rendered script can carry exactly (``_Strict._exact_values``).

A module of the package root, below both :mod:`slurmfm.launchers` (which define their recipe
sections) and :mod:`slurmfm.recipe` (whose schema holds the launchers' sections): in
``recipe/`` it made the two folders import each other, a cycle across folders (issue 43).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

_NUMBER_TYPES = (int, float, int | None, float | None)
# Fields that hold a path. A newline in one would split the job's state-file records
# (``slurmfm status`` reads them line by line) and the log lines that name it.
_PATH_FIELDS = frozenset(
    {
        "checkpoint_root",
        "log_dir",
        "data",
        "workdir",
        "mounts",
        "activate",
        "script",
        "driver",
        "megatron_path",
        "model_cache",
        "textfile_dir",
        "dcgm_job_mapping_dir",
    }
)


def _strings(v: object) -> list[str]:
    """Every string inside a value (keys and items of dicts and lists too)."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, dict):
        return [s for k, x in v.items() for s in (*_strings(k), *_strings(x))]
    if isinstance(v, list | tuple):
        return [s for x in v for s in _strings(x)]
    return []


# Every field of every model below that is not itself a model (nor a discriminator, which
# pydantic does not let a before-validator touch); tests/recipe check the list is complete.
_LEAF_FIELDS = (
    "account",
    "activate",
    "args",
    "aws_ofi_nccl",
    "checkpoint_arg",
    "checkpoint_bytes_per_param",
    "checkpoint_root",
    "command",
    "conda_env",
    "constraints",
    "cp",
    "cpu_binding",
    "data",
    "dcgm_job_mapping_dir",
    "dcgm_level",
    "decode_nodes",
    "decode_replicas",
    "decode_tp",
    "disaggregation",
    "dist_port",
    "drain_unhealthy",
    "driver",
    "efa_counters",
    "efa_installer",
    "enabled",
    "enroot",
    "entrypoint",
    "env",
    "ep",
    "exclude",
    "exclusive",
    "expected_failure_interval",
    "expedited_requeue",
    "expert_parallel",
    "extra_args",
    "fabric_min_busbw_gbs",
    "fabric_test",
    "fabric_test_command",
    "fabric_timeout_s",
    "flavor",
    "health_gate",
    "hang_timeout",
    "startup_timeout",
    "health_path",
    "image",
    "imex_channel",
    "instance_type",
    "join_timeout_s",
    "interval_s",
    "keep_last",
    "libfabric",
    "log_dir",
    "log_mode",
    "master_port",
    "max_restarts",
    "megatron_path",
    "mem",
    "min_free_gb",
    "model",
    "model_args",
    "model_cache",
    "model_params_b",
    "module",
    "modules",
    "mount_home",
    "mounts",
    "multinode",
    "named",
    "name",
    "nccl",
    "nccl_check_timeout_s",
    "nccl_debug",
    "nccl_transport_check",
    "nodes",
    "overrides",
    "partition",
    "placement",
    "port",
    "pp",
    "prefill_nodes",
    "prefill_replicas",
    "prefill_tp",
    "procs_per_node",
    "python",
    "pyxis",
    "qos",
    "ray",
    "ray_port",
    "ray_timeout_s",
    "rdzv_port",
    "ready_poll_s",
    "ready_timeout_s",
    "replicas",
    "router_args",
    "unhealthy_timeout_s",
    "recipe",
    "requeue",
    "reservation",
    "restart_in_job",
    "retry_exit_codes",
    "run_id",
    "save_before_timeout_s",
    "save_on_signal",
    "script",
    "secrets",
    "segments",
    "served_model_name",
    "singleton",
    "spare_nodes",
    "slurm_version",
    "stripe",
    "task",
    "textfile_dir",
    "time_limit",
    "tp",
    "transfer_backend",
    "workdir",
    "write_mb_s",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

    @field_validator(*_LEAF_FIELDS, mode="before", check_fields=False)
    @classmethod
    def _exact_values(cls, v: object, info: ValidationInfo) -> object:
        """Refuse what the rendered script could not carry exactly, as ``render`` does.

        A NUL byte (bash and the environment cannot hold one), a carriage return (sbatch
        refuses the script) or a lone surrogate anywhere, a line break in a path, and a
        boolean where a number is meant (``nodes: true``).
        Checked here so ``validate`` refuses with the field's line what ``render`` would.
        """
        name = info.field_name or ""
        if isinstance(v, bool) and cls.model_fields[name].annotation in _NUMBER_TYPES:
            raise ValueError(f"{str(v).lower()} is a yes/no value, not a number")
        for text in _strings(v):
            if "\x00" in text:
                raise ValueError(f"{text[:40]!r} contains a NUL byte, which bash cannot carry")
            if "\r" in text:
                raise ValueError(f"{text[:40]!r} contains a carriage return (\\r): {_CR_WHY}")
            if not text.isascii() and any("\ud800" <= c <= "\udfff" for c in text):
                raise ValueError(f"{text[:40]!r} is not valid Unicode text")
            if name in _PATH_FIELDS and ("\n" in text or "\r" in text):
                raise ValueError(f"{text[:40]!r}: a path must not contain a line break")
        return v


# sbatch reads the whole script and refuses one with a carriage return before a line break
# ("Batch script contains DOS line breaks", SchedMD/slurm src/sbatch/sbatch.c); a value that
# carries one is almost always a file saved with DOS line endings.
_CR_WHY = "sbatch refuses a batch script with DOS line breaks; remove it"
