"""Parameter sweeps: one recipe, N tasks, run as one Slurm job array.

Why a job array and not N jobs: the scheduler then knows the tasks belong together, limits how
many run at once (``--array=0-N%K``, sbatch(1) ``--array``: "A maximum number of simultaneously
running tasks from the job array may be specified using a "%" separator"), and ``scancel`` of
the array id stops the whole sweep.

The price is that sbatch applies one set of options to every task ("multiple jobs to be
executed with identical parameters", sbatch(1)). So a task may only change what ends up in the
*body* of the script: environment variables, launcher arguments, the model-parallel split and
data paths. Everything that becomes an ``#SBATCH`` line (cluster, resources, resilience, the
name, the log directory) is fixed across the array, and the run id is derived per task
(``<run_id>-t<index>``) so every task has its own checkpoint directory.

This module holds the schema (:class:`Sweep`, imported by ``schema.py``) and the expansion into
validated per-task recipes. It must not import ``schema`` at module level (``schema`` imports it).
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from slurmfm.launchers import SPECS

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Recipe

# Slurm's default MaxArraySize is 1001, so indexes 0..1000 (slurm.conf(5), MaxArraySize; the
# local 22.05 lab reports 1001). 1000 tasks keeps every sweep within that default.
MAX_TASKS = 1000

# Fields a task may change, and why each is safe to vary inside one array: each one only
# changes lines of the script body, which the array script selects per task.
ALLOWED: Mapping[str, str] = {
    "env": "environment variables: export lines in the script body",
    "launcher.args": "torchrun script arguments: the launch command",
    "launcher.script": "the torchrun script: the launch command",
    "launcher.model_args": "Megatron-LM arguments: the launch command",
    "launcher.extra_args": "Megatron-LM extra arguments: the launch command",
    "launcher.overrides": "NeMo recipe attributes: the NeMo driver text",
    "parallelism": "tp/pp/cp/ep: launch arguments only; nodes and processes stay fixed, and each "
    "task's layout is checked against the world size",
    "storage.data": "SLURMFM_DATA_* export lines",
}

# Why the rest is fixed (shown in the error message).
FIXED: Mapping[str, str] = {
    "name": "the job name is one --job-name for the whole array (and names its logs)",
    "cluster": "partition, account, QOS, constraints and instance type are #SBATCH options "
    "that sbatch applies to every array task",
    "resources": "nodes, time limit, exclusive, memory and singleton are #SBATCH options "
    "that sbatch applies to every array task",
    "resilience": "requeue, --signal and --open-mode are #SBATCH options shared by every task",
    "launcher.kind": "the launcher kind decides the launch, the job runtime's options and the "
    "tasks per node, which are one script and one #SBATCH set for every array task",
    "storage.log_dir": "the log directory is on the one --output line",
    "storage.run_id": "each task's run id is derived as <run_id>-t<index>",
    "storage.checkpoint_root": "one root; each task gets <root>/<name>/<run_id>-t<index>",
    "sweep": "sweeps do not nest",
}

_DOTTED = re.compile(r"^[a-z_][a-z0-9_]*(\.[A-Za-z0-9_\-]+)*$")


def allowed_key(key: str) -> bool:
    """True when a task may override ``key`` (itself or below one of :data:`ALLOWED`)."""
    return any(key == p or key.startswith(p + ".") for p in ALLOWED)


def _why_fixed(key: str) -> str:
    for prefix, why in FIXED.items():
        if key == prefix or key.startswith(prefix + "."):
            return why
    return "it is not confined to the script body"


def _check_key(key: str) -> None:
    if not _DOTTED.fullmatch(key):
        raise ValueError(f"{key!r} is not a dotted field path (e.g. env.LR or launcher.args)")
    if not allowed_key(key):
        raise ValueError(
            f"{key!r} cannot vary across a job array: {_why_fixed(key)}. A task may set: "
            + ", ".join(ALLOWED)
        )


def _check_task(task: dict[str, Any]) -> dict[str, Any]:
    for key in task:
        _check_key(key)
    return task


# Checked per item, so an error carries the task's index (and the loader its line).
TaskOverrides = Annotated[dict[str, Any], AfterValidator(_check_task)]


class Sweep(BaseModel):
    """``sweep:`` in a recipe: explicit tasks and/or a grid, run as one job array.

    The tasks are every explicit task combined with every grid point (a cartesian product in
    the order written); with only ``tasks`` or only ``parameters`` it is just that list.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_concurrent: int | None = Field(
        default=None,
        ge=1,
        description="at most this many tasks run at once (--array=...%K); default: no limit",
    )
    parameters: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="grid: dotted field -> list of values; every combination is one task",
    )
    tasks: list[TaskOverrides] = Field(
        default_factory=list, description="explicit tasks, each a dict of dotted overrides"
    )

    @field_validator("parameters")
    @classmethod
    def _grid(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            _check_key(key)
            if not values:
                raise ValueError(f"{key}: give at least one value")
        return v

    @model_validator(mode="after")
    def _size(self) -> Sweep:
        n = self.size
        if n < 1:
            raise ValueError("sweep: give tasks, parameters, or both")
        if n > MAX_TASKS:
            raise ValueError(
                f"sweep: {n} tasks exceed {MAX_TASKS} (Slurm's default MaxArraySize is 1001)"
            )
        clash = {k for t in self.tasks for k in t} & set(self.parameters)
        if clash:
            raise ValueError(
                f"sweep: {sorted(clash)} are set both by tasks and by the parameter grid"
            )
        return self

    @property
    def size(self) -> int:
        grid = 1
        for values in self.parameters.values():
            grid *= len(values)
        explicit = len(self.tasks) if self.tasks else 1
        if not self.tasks and not self.parameters:
            return 0
        return explicit * grid

    def points(self) -> list[tuple[int | None, dict[str, Any]]]:
        """Every task's overrides, with the index of the explicit task it came from."""
        keys = list(self.parameters)
        grid = [
            dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(self.parameters[k] for k in keys))
        ]
        explicit: list[tuple[int | None, dict[str, Any]]] = (
            [(i, t) for i, t in enumerate(self.tasks)] if self.tasks else [(None, {})]
        )
        return [(j, {**t, **g}) for j, t in explicit for g in grid]


@dataclass(frozen=True)
class SweepTask:
    """One array task: its index, its overrides and its own validated recipe."""

    index: int
    overrides: Mapping[str, Any]
    recipe: Recipe

    @property
    def run_id(self) -> str:
        return self.recipe.run_id

    @property
    def checkpoint_dir(self) -> str:
        return self.recipe.checkpoint_dir

    @property
    def overrides_json(self) -> str:
        return json.dumps(dict(self.overrides), sort_keys=True, separators=(",", ":"))


# Fields whose keys are themselves dotted (NeMo recipe attributes): the rest of the path is one
# key, not nested mappings.
_DOTTED_KEY_FIELDS = ("launcher.overrides.",)


def _set(data: dict[str, Any], key: str, value: Any, set_path: Any) -> None:
    for prefix in _DOTTED_KEY_FIELDS:
        if key.startswith(prefix):
            set_path(
                data,
                prefix.rstrip("."),
                {**(_get(data, prefix.rstrip(".")) or {}), key[len(prefix) :]: value},
            )
            return
    set_path(data, key, value)


def _get(data: dict[str, Any], dotted: str) -> Any:
    cur: Any = data
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def task_run_id(base: str, index: int) -> str:
    """``<run_id>-t<index>``: readable, stable across resubmission, distinct per task."""
    return f"{base}-t{index}"


def _overlaps(a: str, b: str) -> bool:
    """Whether setting dotted ``a`` and ``b`` touches the same value (equal, or one inside
    the other: ``launcher`` and ``launcher.args``)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def shadowed_overrides(sweep: Sweep, overrides: Mapping[str, Any]) -> list[str]:
    """Warnings for the user's overrides that array tasks replace.

    Why: an override (``--set launcher.args=[...]``) is applied to the recipe, and each task's
    own values are applied after it, so a task that sets the same field silently discards
    the user's value. Reported, not refused: a user may mean the recipe default.
    """
    points = sweep.points()
    out: list[str] = []
    for key in overrides:
        if key == "sweep" or key.startswith("sweep."):
            continue
        hits = sum(1 for _, task in points if any(_overlaps(key, k) for k in task))
        if hits:
            fields = sorted({k for _, t in points for k in t if _overlaps(key, k)})
            out.append(
                f"override {key}: the sweep sets {', '.join(fields)} in {hits} of "
                f"{len(points)} array tasks, whose value replaces the override there "
                "(put the value in sweep.tasks or sweep.parameters instead)"
            )
    return out


def expand(recipe: Recipe) -> list[SweepTask]:
    """The recipe's array tasks, each validated as a recipe of its own (without ``sweep``).

    Raises ``ValueError`` whose message starts with the sweep field to blame (``sweep.tasks.2:``
    or ``sweep.parameters:``), which the loader turns into ``FILE:LINE: field: message``.
    """
    from pydantic import ValidationError

    from slurmfm.recipe.loader import set_path
    from slurmfm.recipe.schema import Recipe

    sweep = recipe.sweep
    if sweep is None:
        return []
    serve = getattr(recipe, "serve", None)
    if serve is not None and serve.placement == "hetjob":
        # sbatch on the 22.05 lab: "allocation failure: Invalid job array specification".
        raise ValueError(
            "sweep: a heterogeneous job (serve.placement: hetjob) cannot be a job array; "
            "Slurm refuses --array with hetjob components"
        )
    base = recipe.model_dump(mode="json", exclude={"sweep"})
    base_run = recipe.run_id
    out: list[SweepTask] = []
    for i, (origin, overrides) in enumerate(sweep.points()):
        data = copy.deepcopy(base)
        for key, value in overrides.items():
            _set(data, key, value, set_path)
        set_path(data, "storage.run_id", task_run_id(base_run, i))
        try:
            task_recipe = Recipe.model_validate(data)
        except ValidationError as exc:
            where = f"sweep.tasks.{origin}" if origin is not None else "sweep.parameters"
            msgs: list[str] = []
            seen: set[str] = set()
            for err in exc.errors(include_url=False):
                parts = [str(p) for p in err["loc"] if str(p) not in SPECS]  # launcher tags
                loc = ".".join(p for p in parts if not p.startswith("function-"))
                if loc.rsplit(".", 1)[0] in seen:
                    continue  # one message per field, not one per member of a type union
                seen.add(loc.rsplit(".", 1)[0])
                msg = str(err["msg"]).removeprefix("Value error, ")
                msgs.append(f"{loc}: {msg}" if loc else msg)
            raise ValueError(
                f"{where}: array task {i} ({json.dumps(overrides, sort_keys=True)}): "
                + "; ".join(msgs)
            ) from None
        if _done_check(task_recipe) != _done_check(out[0].recipe if out else task_recipe):
            where = f"sweep.tasks.{origin}" if origin is not None else "sweep.parameters"
            raise ValueError(
                f"{where}: array task {i} ({json.dumps(overrides, sort_keys=True)}): "
                "launcher.model_args.train-iters cannot vary across a job array: the job "
                "runtime's completion check, one option for every task, follows it"
            )
        out.append(SweepTask(i, overrides, task_recipe))
    return out


def _done_check(recipe: Recipe) -> object:
    """What of a task decides the runtime's ``--done-check`` (Megatron-LM's train-iters): one
    batch option shared by every array task, so it must not vary."""
    args = getattr(recipe.launcher, "model_args", None)
    return args.get("train-iters") if isinstance(args, dict) else None


def array_spec(sweep: Sweep) -> str:
    """The ``--array`` value: ``0-(N-1)`` and ``%K`` when a concurrency limit is set."""
    n = sweep.size
    spec = "0" if n == 1 else f"0-{n - 1}"
    if sweep.max_concurrent is not None:
        spec += f"%{sweep.max_concurrent}"
    return spec


__all__ = [
    "ALLOWED",
    "FIXED",
    "MAX_TASKS",
    "Sweep",
    "SweepTask",
    "allowed_key",
    "array_spec",
    "expand",
    "task_run_id",
]
