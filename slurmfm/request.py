"""The submit request: one typed value that is both what a dry run shows and what is submitted.

Why one object: a dry run that renders, then a submit that renders again, can differ (another
Slurm version asked, a recipe file edited in between, a dependency added as text). Like TorchX's
``dryrun`` info and NeMo-Run's dry run, :func:`slurmfm.api.dry_run` returns a
:class:`SubmitRequest`, its printed form (``slurmfm submit --dry-run``) is built from the same
fields a backend reads, and :func:`slurmfm.api.submit` hands that very object to the backend.
``submit --dry-run -o DIR`` writes its bytes (script, runtime files, argv) with :meth:`write`.

Dependencies and the job array are structured fields that become sbatch command-line options
(``--dependency``, ``--kill-on-invalid-dep``, ``--array``), never lines edited into the script:
the script is exactly what the renderer produced. sbatch(1): options on the command line take
precedence over ``#SBATCH`` lines in the script.

Semantics of ``--dependency`` (sbatch(1), https://slurm.schedmd.com/sbatch.html#OPT_dependency):
``afterok:ID`` starts after ID "successfully executed (ran to completion with an exit code of
zero)"; ``afternotok:ID`` after it "terminated in some failed state"; ``afterany:ID`` after it
terminated in any state; ``singleton`` once no other job of the same name and user runs. Terms
joined with ``,`` must all hold (only one separator kind may be used, so slurmfm only uses
``,``). On an array job, ``afterok`` waits for every task. "Once a job dependency fails due to
the termination state of a preceding job, the dependent job will never be run": by default it
then pends forever with reason ``DependencyNeverSatisfied``; ``--kill-on-invalid-dep=yes`` ends
it instead (state CANCELLED), so a failed pipeline leaves nothing behind in the queue.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal, get_args

from slurmfm.errors import RenderError

if TYPE_CHECKING:
    from slurmfm.plan.types import Placement
    from slurmfm.recipe.schema import Recipe
    from slurmfm.recipe.sweep import SweepTask
    from slurmfm.render.script import RenderedScript
    from slurmfm.resolve import ResolvedJob
    from slurmfm.target import Target

Condition = Literal["afterok", "afterany", "afternotok"]
CONDITIONS: tuple[str, ...] = get_args(Condition)

_ID = re.compile(r"^\d+$")
# A pipeline stage not submitted yet: its name in angle brackets, replaced by its job id at
# submit time (see SubmitRequest.resolved).
_PLACEHOLDER = re.compile(r"^<[A-Za-z0-9][A-Za-z0-9_.-]{0,63}>$")

SBATCH = ("sbatch", "--parsable")


def placeholder(stage: str) -> str:
    """How a dry run names the job id of a stage that is not submitted yet: ``<stage>``."""
    return f"<{stage}>"


@dataclass(frozen=True)
class Dependency:
    """``terms``: (condition, job ids) pairs, all of which must hold (Slurm's ``,``);
    ``singleton``: the recipe's ``resources.singleton``, which sbatch would otherwise lose (the
    command line's ``--dependency`` replaces the script's ``--dependency=singleton``)."""

    terms: tuple[tuple[Condition, tuple[str, ...]], ...] = ()
    singleton: bool = False

    @classmethod
    def of(cls, pairs: list[tuple[Condition, str]], *, singleton: bool = False) -> Dependency:
        """Group ``[(condition, id), ...]`` by condition, in first-seen order."""
        grouped: dict[Condition, list[str]] = {}
        for cond, job_id in pairs:
            if cond not in CONDITIONS:
                raise RenderError(f"dependency: unknown condition {cond!r}")
            if not (_ID.fullmatch(job_id) or _PLACEHOLDER.fullmatch(job_id)):
                raise RenderError(f"dependency: {job_id!r} is not a Slurm job id")
            ids = grouped.setdefault(cond, [])
            if job_id not in ids:
                ids.append(job_id)
        return cls(tuple((c, tuple(ids)) for c, ids in grouped.items()), singleton)

    @property
    def has_jobs(self) -> bool:
        """True when it waits for other jobs (not only for ``singleton``)."""
        return any(ids for _, ids in self.terms)

    @property
    def pending_stages(self) -> tuple[str, ...]:
        """Placeholders not yet replaced by job ids (a pipeline dry run)."""
        return tuple(i for _, ids in self.terms for i in ids if _PLACEHOLDER.fullmatch(i))

    def expression(self) -> str:
        """The ``--dependency`` value: ``afterok:1:2,afterany:3,singleton``."""
        parts = [f"{cond}:{':'.join(ids)}" for cond, ids in self.terms if ids]
        if self.singleton:
            parts.append("singleton")
        return ",".join(parts)

    def resolved(self, ids: Mapping[str, str]) -> Dependency:
        """Placeholders ``<stage>`` replaced by ``ids[stage]``."""
        terms = tuple(
            (cond, tuple(ids.get(i[1:-1], i) if _PLACEHOLDER.fullmatch(i) else i for i in js))
            for cond, js in self.terms
        )
        return replace(self, terms=terms)

    def __bool__(self) -> bool:
        return self.has_jobs


@dataclass(frozen=True)
class ArraySpec:
    """A job array (sbatch ``--array``): ``indices`` such as ``0-7%2``, one task per sweep
    point; ``tasks`` is how many there are, ``max_concurrent`` the ``%K`` cap if any."""

    indices: str
    tasks: int
    max_concurrent: int | None = None


NEWLINE = b"\n"


def _blob(data: bytes, *, text: bool) -> str:
    """A short stand-in for a script or file in a repr: its size (and lines), not its bytes."""
    lines = f", {data.count(NEWLINE):,} lines" if text else ""
    return f"<{len(data):,} bytes{lines}>"


@dataclass(frozen=True, repr=False)
class SubmitRequest:
    """Everything one ``sbatch`` call sends, and the context it was made from.

    Sent (compared for equality): ``script`` (stdin of sbatch); ``files``, the runtime files the
    job uses (name -> bytes; the script carries them itself, so sbatch receives nothing else;
    listed so a dry run can show and write them); ``sbatch_args`` (extra options);
    ``dependency``, ``kill_on_invalid_dep`` and ``array`` (sbatch options); ``job_name``;
    ``env_names``, the variables the job needs from the submitting environment (exported by
    sbatch's default ``--export=ALL``; names only, never values); and ``target``.

    Context (not compared): the recipe, the rendered parts (directives, warnings, notes), sweep
    tasks and the directories a submission creates.
    """

    script: bytes
    job_name: str = ""
    target: Target | None = None  # None: a hand-written script, Slurm version unknown
    files: Mapping[str, bytes] = field(default_factory=dict)
    sbatch_args: tuple[str, ...] = ()
    dependency: Dependency | None = None
    kill_on_invalid_dep: bool = False
    array: ArraySpec | None = None
    env_names: tuple[str, ...] = ()
    recipe: Recipe | None = field(default=None, compare=False, repr=False)
    rendered: RenderedScript | None = field(default=None, compare=False, repr=False)
    tasks: tuple[SweepTask, ...] = field(default=(), compare=False, repr=False)
    creates_dirs: tuple[str, ...] = field(default=(), compare=False)

    def __repr__(self) -> str:
        """Short: what is sent, with the script and files as their sizes (the embedded runtime
        made the generated repr of the quickstart's request 445,117 characters)."""
        parts = [f"job_name={self.job_name!r}", f"script={_blob(self.script, text=True)}"]
        if self.files:
            files = ", ".join(f"{k!r}: {_blob(v, text=False)}" for k, v in self.files.items())
            parts.append(f"files={{{files}}}")
        for name in ("sbatch_args", "dependency", "kill_on_invalid_dep", "array", "env_names"):
            value = getattr(self, name)
            if value:
                parts.append(f"{name}={value!r}")
        parts.append(f"target={self.target!r}")
        if self.creates_dirs:
            parts.append(f"creates_dirs={self.creates_dirs!r}")
        return f"SubmitRequest({', '.join(parts)})"

    @classmethod
    def of_script(cls, text: str) -> SubmitRequest:
        """A request for a script written elsewhere (no recipe): sent as is."""
        return cls(script=text.encode("utf-8"))

    # -- what is sent ------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """The script as text (it is rendered as UTF-8)."""
        return self.script.decode("utf-8")

    @property
    def resolved_job(self) -> ResolvedJob | None:
        """What the script was rendered from (:mod:`slurmfm.resolve`: instance types, the
        launcher's spec, Slurm's feature gates), None for a hand-written script."""
        return self.rendered.resolved if self.rendered is not None else None

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the renderer warned about (printed by the CLI; not sent)."""
        return self.rendered.warnings if self.rendered is not None else ()

    def argv(self) -> tuple[str, ...]:
        """The exact sbatch command line; the script goes to its stdin."""
        out = [*SBATCH, *self.sbatch_args]
        if self.array is not None:
            out.append(f"--array={self.array.indices}")
        if self.dependency is not None and self.dependency.has_jobs:
            out.append(f"--dependency={self.dependency.expression()}")
        if self.kill_on_invalid_dep:
            out.append("--kill-on-invalid-dep=yes")
        return tuple(out)

    def test_only_args(self) -> tuple[str, ...]:
        """The options a preflight's ``sbatch --test-only`` must see as well: the array (not
        a dependency: its jobs may not exist yet)."""
        return (f"--array={self.array.indices}",) if self.array is not None else ()

    def with_dependency(self, dep: Dependency) -> SubmitRequest:
        """This request after the jobs of ``dep``; ``--kill-on-invalid-dep=yes`` where the
        target Slurm has it (slurmfm.catalog.slurm_features: ``kill_on_invalid_dep``)."""
        from slurmfm.catalog.slurm_features import supports

        if not dep.has_jobs:
            return self
        singleton = self.dependency.singleton if self.dependency is not None else False
        # Safe without quoting: Dependency.of admits only known conditions, digits and <stage>.
        merged = replace(dep, singleton=dep.singleton or singleton)
        kill = self.target is not None and supports(
            "kill_on_invalid_dep", self.target.slurm_version
        )
        return replace(self, dependency=merged, kill_on_invalid_dep=kill)

    def resolved(self, ids: Mapping[str, str]) -> SubmitRequest:
        """Stage placeholders in the dependency replaced by the job ids in ``ids``."""
        if self.dependency is None:
            return self
        return replace(self, dependency=self.dependency.resolved(ids))

    def check_submittable(self) -> None:
        """Refuse a request that still names a stage instead of a job id."""
        if self.dependency is not None and self.dependency.pending_stages:
            raise RenderError(
                "dependency: stage(s) "
                + ", ".join(self.dependency.pending_stages)
                + " have no job id yet (submit the pipeline, not one stage)"
            )

    # -- what is shown -----------------------------------------------------------------------
    def header(self) -> list[str]:
        """The ``# dry run`` lines printed before the script."""
        from slurmfm.quote import sh_join

        out = [f"# dry run: would run {sh_join(list(self.argv()))} with this script on stdin"]
        for name, data in sorted(self.files.items()):
            out.append(f"# runtime file: {name} ({len(data)} bytes), carried in the script")
        return out

    def __str__(self) -> str:
        return "\n".join(self.header()) + "\n" + self.text

    # -- what is written ---------------------------------------------------------------------
    def write(self, directory: str | Path, stem: str) -> list[Path]:
        """Write the exact bytes a submission sends: ``<stem>.sh`` (the script),
        ``<stem>.argv.json`` (the sbatch command line as a JSON list) and each runtime file as
        ``<stem>.files/<name>``. Returns the paths written."""
        from slurmfm.fsutil import write_atomic

        out = Path(directory)
        written = [out / f"{stem}.sh", out / f"{stem}.argv.json"]
        write_atomic(written[0], self.script, mode=0o755)
        write_atomic(written[1], json.dumps(list(self.argv())) + "\n")
        for name, data in sorted(self.files.items()):
            path = out / f"{stem}.files" / _relative(name)
            write_atomic(path, data)
            written.append(path)
        return written


def _relative(name: str) -> PurePosixPath:
    """``name`` as a path inside a dry-run directory (no ``..``, no leading ``/``)."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("/", "", ".")]
    if not parts or ".." in parts:
        raise RenderError(f"runtime file name {name!r} cannot be written under a directory")
    return PurePosixPath(*parts)


def build(
    recipe: Recipe, *, slurm_version: str | None = None, placement: Placement | None = None
) -> SubmitRequest:
    """Render ``recipe`` (a sweep as one job array) into its request; pure. The one place that
    turns a recipe into what is submitted, for a lone job, a chain, a pipeline and a sweep."""
    from slurmfm.render.script import render_resolved
    from slurmfm.resolve import resolve
    from slurmfm.target import Target

    target = Target.for_recipe(recipe, slurm_version)
    if recipe.sweep is not None:
        from slurmfm.recipe.sweep import expand
        from slurmfm.render.array import render_array

        return from_rendered(recipe, render_array(recipe, target, placement), tuple(expand(recipe)))
    return from_rendered(recipe, render_resolved(resolve(recipe, target, placement)))


def from_rendered(
    recipe: Recipe, rendered: RenderedScript, tasks: tuple[SweepTask, ...] = ()
) -> SubmitRequest:
    """The request for one rendered recipe (no dependency yet; a sweep becomes ``--array``)."""
    array = None
    if recipe.sweep is not None:
        from slurmfm.recipe.sweep import array_spec

        array = ArraySpec(array_spec(recipe.sweep), recipe.sweep.size, recipe.sweep.max_concurrent)
    return SubmitRequest(
        script=rendered.text.encode("utf-8"),
        job_name=recipe.name,
        target=rendered.target,
        files=_runtime_files(getattr(rendered, "files", None)),
        dependency=Dependency(singleton=True) if recipe.resources.singleton else None,
        array=array,
        env_names=tuple(recipe.secrets),
        recipe=recipe,
        rendered=rendered,
        tasks=tasks,
        creates_dirs=(recipe.storage.log_dir,),
    )


def _runtime_files(found: object) -> dict[str, bytes]:
    """The renderer's runtime files as name -> bytes: a mapping, or objects with ``name`` and
    ``data`` (the job runtime that the script carries; see the job runtime's docs)."""
    if isinstance(found, Mapping):
        pairs = list(found.items())
    elif isinstance(found, Iterable):
        pairs = [(getattr(f, "name", ""), getattr(f, "data", b"")) for f in found]
    else:
        return {}
    return {str(k): v.encode("utf-8") if isinstance(v, str) else bytes(v) for k, v in pairs}
