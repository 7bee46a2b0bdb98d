"""Preflight: ask the live cluster whether a job can run before queueing it.

Why: a job that can never be scheduled (too many nodes, a time over the partition limit, a feature
no node has) otherwise sits in the queue, or is rejected only after the user walked away. None of
the peer launchers calls ``sbatch --test-only`` (submitit, TorchX and NeMo-Run's Slurm executors).
The checks here read the partition with ``scontrol show partition -o`` and the node features with
``sinfo``, then run ``sbatch --test-only`` on the exact rendered script, and put Slurm's own reason
into one plain line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slurmfm.backends.slurm_cli import SlurmCLI
from slurmfm.errors import BackendError, SlurmfmError

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Recipe

# Slurm's messages, and what they mean for a slurmfm recipe.
EXPLAIN: tuple[tuple[str, str], ...] = (
    ("Invalid partition name", "the partition does not exist on this cluster"),
    (
        "Requested time limit is invalid",
        "resources.time_limit exceeds the partition's MaxTime (or the QOS/association limit)",
    ),
    ("Node count specification invalid", "more nodes than the partition has (resources.nodes)"),
    (
        "Requested node configuration is not available",
        "no set of nodes in the partition matches the request (node count, GPUs per node, "
        "memory or features)",
    ),
    ("Invalid feature specification", "cluster.constraints names a feature no node has"),
    ("Invalid account", "cluster.account is unknown or not allowed in this partition"),
    ("Invalid qos", "cluster.qos is unknown or not allowed for this account"),
    ("Invalid generic resource", "the partition's nodes do not define GPUs as GRES"),
    ("Reservation", "cluster.reservation is unknown or not usable by this job"),
    ("QOSMax", "a QOS limit forbids this size"),
)


def explain(message: str) -> str:
    """One line: Slurm's reason in recipe terms, then Slurm's own words."""
    text = " ".join(message.split())
    for needle, meaning in EXPLAIN:
        if needle.lower() in text.lower():
            return f"{meaning} (Slurm: {text})"
    return f"Slurm: {text}"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str


@dataclass
class PreflightReport:
    """The outcome of every check; ``ok`` only when all passed.

    ``warnings`` are risks that do not stop the job (for example a pre-timeout window too
    short for one checkpoint save): shown with the checks, never a reason to refuse.
    """

    checks: list[Check] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def lines(self) -> list[str]:
        return [f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.message}" for c in self.checks] + [
            f"warn {w}" for w in self.warnings
        ]


class PreflightError(SlurmfmError):
    """The cluster cannot run this job; nothing was queued."""

    def __init__(self, report: PreflightReport) -> None:
        self.report = report
        super().__init__("\n".join(f"preflight: {c.name}: {c.message}" for c in report.failures()))


def _features(expr: str) -> set[str]:
    """Feature names in a --constraint expression (operators and ``*count`` removed)."""
    words = (re.sub(r"\*\d+$", "", w) for w in re.split(r"[&|!()\[\],]+", expr))
    return {w for w in words if w}


_RELATIVE_HINT = "a recipe file's relative paths are relative to the file"


def file_checks(recipe: Recipe) -> list[Check]:
    """What the login node can check without Slurm: the files the job will need.

    Why here: a training script or an image that is not there otherwise fails on the nodes,
    after queueing, once per restart (a missing script on 2 nodes: 3 restarts; a wrong image
    path: 4 failures, on the lab). The nodes see the login node's shared file system, so
    a path missing here is missing there. Only host paths are checked: a script inside a
    container is the image's, and a registry image (``nvcr.io#...``) is Pyxis' to fetch.
    """
    from slurmfm.launchers import spec
    from slurmfm.recipe.loader import is_image_file

    checks: list[Check] = []
    script = spec(recipe.launcher.kind).host_script(recipe)
    if script is not None and not os.path.isfile(script):
        checks.append(
            Check(
                "launcher.script",
                False,
                f"no such file on this login node: {script} ({_RELATIVE_HINT})",
            )
        )
    if recipe.container is not None and is_image_file(recipe.container.image):
        image = recipe.container.image
        if not os.path.isfile(image):
            checks.append(
                Check(
                    "container.image",
                    False,
                    f"no such image file on this login node: {image} ({_RELATIVE_HINT}; "
                    "a registry image is written REGISTRY#IMAGE:TAG)",
                )
            )
    return checks


def require_files(recipes: Sequence[Recipe]) -> None:
    """Raise :class:`PreflightError` when a recipe's files are missing (:func:`file_checks`);
    called before Slurm is asked anything, so nothing is queued and no time is spent."""
    report = PreflightReport([c for r in recipes for c in file_checks(r)])
    if not report.ok:
        raise PreflightError(report)


def preflight(
    recipe: Recipe,
    script: str,
    cli: SlurmCLI,
    extra_args: Sequence[str] = (),
    *,
    files: bool = True,
) -> PreflightReport:
    """Run every check against the live cluster (read-only: ``--test-only`` queues nothing);
    ``extra_args``: command-line options of the submission that the test must see too.

    The login node's own checks come first (:func:`file_checks`, Pyxis for a container
    recipe); when one fails, Slurm is not asked about a job that could not run anyway."""
    from slurmfm.recipe.schema import parse_time_limit

    report = PreflightReport()
    if files:
        report.checks.extend(file_checks(recipe))
    if recipe.container is not None and not cli.has_pyxis():
        report.checks.append(
            Check(
                "container",
                False,
                "Pyxis is not installed here: `srun --help` lists no --container-image "
                "(install Pyxis, https://github.com/NVIDIA/pyxis, or use python_env instead "
                "of container)",
            )
        )
    if not report.ok:
        return report
    window = recipe.save_window_warning()
    if window:
        report.warnings.append(window)
    part = recipe.cluster.partition
    rec: dict[str, str] = {}
    if part:
        found = cli.partition(part)
        if found is None:
            report.checks.append(
                Check("partition", False, f"partition {part!r} does not exist on this cluster")
            )
        else:
            rec = found
            state = rec.get("State", "UP")
            report.checks.append(Check("partition", state == "UP", f"{part} is {state}"))
    if rec:
        total = int(rec.get("TotalNodes", "0") or 0)
        k = recipe.resources.spare_nodes
        n = recipe.resources.nodes + k  # what #SBATCH --nodes asks for
        report.checks.append(
            Check(
                "nodes",
                n <= total,
                f"{n} requested{f' ({n - k} + {k} spare)' if k else ''}, partition {part} "
                f"has {total}",
            )
        )
        max_time = rec.get("MaxTime", "UNLIMITED")
        want = recipe.resources.time_minutes
        if max_time not in {"UNLIMITED", "INFINITE"}:
            limit = parse_time_limit(max_time)
            report.checks.append(
                Check(
                    "time_limit",
                    want != -1 and want <= limit,
                    f"{recipe.resources.time_limit} requested, partition {part} allows {max_time}",
                )
            )
    from slurmfm.catalog.flavors import constraint_for_flavor

    constraint, _ = constraint_for_flavor(recipe.cluster.constraints, recipe.cluster.flavor)
    if constraint:  # what the script asks for this flavor (render warns about the rest)
        have = cli.node_features(part or None)
        missing = sorted(_features(constraint) - have)
        report.checks.append(
            Check(
                "constraints",
                not missing,
                f"no node has feature(s) {', '.join(missing)}" if missing else "features exist",
            )
        )
    try:
        where = cli.test_only(script, extra_args=extra_args)
        report.checks.append(Check("sbatch --test-only", True, " ".join(where.split())))
    except BackendError as exc:
        msg = str(exc).removeprefix("sbatch:").strip()
        report.checks.append(Check("sbatch --test-only", False, explain(msg)))
    return report
