"""Pipelines: named stages, each a recipe, submitted in dependency order with real job ids.

A pipeline file::

    name: llama3-8b-pretrain-eval
    stages:
      pretrain:
        recipe: ../llama3-8b-p5-fsdp.yaml       # relative to this file
        set: {resources.nodes: 8}               # overrides, like --set
      convert:
        recipe: convert.yaml
        after: [pretrain]                       # afterok by default
      eval:
        recipe: eval.yaml
        after:
          - {stage: convert, condition: afterok}

Why its own loader: it keeps the recipe loader's discipline (every problem as
``FILE:LINE: field: message``, exit 2) for the graph too: unknown stages, self-dependencies and
cycles are reported at the ``after`` entry that creates them, and an override's problem at its
line in the pipeline file.

Submission: every stage is rendered once into a :class:`~slurmfm.request.SubmitRequest` whose
dependency names its upstream stages (``afterok:<pretrain>``); the dry run shows exactly these
requests. Submitting hands them to :func:`slurmfm.submit.submit_all` (the path a lone recipe
takes too): everything is preflighted before anything is queued, then stages are submitted in
topological order (file order among independent stages), each with sbatch
``--dependency=<condition>:<ids of its upstream stages>`` and ``--kill-on-invalid-dep=yes`` on
its command line (see :mod:`slurmfm.request`). If a submission fails part-way, the stages
already queued are cancelled (unless asked to keep them), and the error says which were queued
and what happened to them: a half-submitted pipeline would otherwise run stages whose
downstream never comes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from slurmfm.errors import BackendError, Problem, RecipeError, SlurmfmError
from slurmfm.request import Condition, Dependency, placeholder
from slurmfm.submit import PipelineSubmitError as PipelineSubmitError  # noqa: PLC0414

if TYPE_CHECKING:
    from slurmfm.backends.base import Backend, JobStatus
    from slurmfm.recipe.loader import LineMap
    from slurmfm.recipe.schema import Recipe
    from slurmfm.request import SubmitRequest

StageName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class After(_Strict):
    """One upstream stage and the condition on its end state."""

    stage: StageName
    condition: Condition = "afterok"

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        # `after: [pretrain]` is short for `after: [{stage: pretrain, condition: afterok}]`.
        return {"stage": data} if isinstance(data, str) else data


class StageSpec(_Strict):
    """A stage: a recipe file, overrides, and the stages it waits for."""

    recipe: str = Field(min_length=1, description="recipe path, relative to the pipeline file")
    set: dict[str, Any] = Field(default_factory=dict, description="dotted overrides, like --set")
    after: list[After] = Field(default_factory=list)


class PipelineSpec(_Strict):
    """The whole pipeline file."""

    name: StageName | None = None
    stages: dict[StageName, StageSpec] = Field(min_length=1)


@dataclass(frozen=True)
class Stage:
    """A validated stage: its recipe and its upstream stages with conditions."""

    name: str
    recipe: Recipe
    after: tuple[tuple[str, Condition], ...] = ()
    source: str = ""


@dataclass(frozen=True)
class Pipeline:
    """Stages in submission (topological) order."""

    name: str
    stages: tuple[Stage, ...]
    source: str = "<pipeline>"

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def dependency_expression(self, stage: Stage, ids: Mapping[str, str] | None = None) -> str:
        """``afterok:<pretrain>`` (names as placeholders) or, with ``ids``, the real one."""
        pairs = [(cond, (ids or {}).get(up, placeholder(up))) for up, cond in stage.after]
        dep = Dependency.of(pairs, singleton=stage.recipe.resources.singleton)
        return dep.expression()


def _line(lines: LineMap, *path: str | int) -> int | None:
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in lines:
            return lines[tuple(path[:n])]
    return None


def _graph_problems(spec: PipelineSpec, source: str, lines: LineMap) -> list[Problem]:
    """Unknown stages, self-dependencies, duplicates and cycles, each at its ``after`` line."""
    import networkx as nx

    problems: list[Problem] = []
    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_nodes_from(spec.stages)
    where: dict[tuple[str, str], tuple[str, int | None]] = {}
    for name, st in spec.stages.items():
        seen: set[str] = set()
        for k, item in enumerate(st.after):
            up = item.stage
            fld = f"stages.{name}.after.{k}"
            line = _line(lines, "stages", name, "after", k)
            if up not in spec.stages:
                known = ", ".join(spec.stages)
                problems.append(
                    Problem(source, line, fld, f"unknown stage {up!r} (stages: {known})")
                )
            elif up == name:
                problems.append(Problem(source, line, fld, "a stage cannot wait for itself"))
            elif up in seen:
                problems.append(Problem(source, line, fld, f"{up!r} is listed twice"))
            else:
                graph.add_edge(up, name)
                where[(up, name)] = (fld, line)
            seen.add(up)
    if not problems and not nx.is_directed_acyclic_graph(graph):
        edges = nx.find_cycle(graph)
        cycle = [u for u, _ in edges]
        # start the text at the cycle's first stage in file order (stable messages)
        first = min(range(len(cycle)), key=lambda i: list(spec.stages).index(cycle[i]))
        cycle = cycle[first:] + cycle[:first]
        text = " -> ".join([*cycle, cycle[0]])
        for u, v in edges:
            fld, line = where[(u, v)]
            problems.append(Problem(source, line, fld, f"dependency cycle: {text}"))
    return problems


def _order(spec: PipelineSpec) -> list[str]:
    """Topological order; among stages free at the same time, the order of the file."""
    import networkx as nx

    graph: nx.DiGraph[str] = nx.DiGraph()
    index = {name: i for i, name in enumerate(spec.stages)}
    graph.add_nodes_from(spec.stages)
    for name, st in spec.stages.items():
        for item in st.after:
            graph.add_edge(item.stage, name)
    return list(nx.lexicographical_topological_sort(graph, key=lambda n: index[n]))


def parse_pipeline(text: str, source: str, base_dir: Path) -> Pipeline:
    """Validate pipeline YAML text; stage recipes are loaded relative to ``base_dir``."""
    from slurmfm.recipe.loader import _problems, load_recipe, parse_yaml

    data, lines = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise RecipeError([Problem(source, 1, "(pipeline)", "a pipeline file is a YAML mapping")])
    try:
        spec = PipelineSpec.model_validate(data)
    except ValidationError as exc:
        problems = _problems(exc, data, lines, source)
        for p in problems:
            if p.field == "(recipe)":
                p.field = "(pipeline)"
            p.message = p.message.replace("see the recipe reference", "see the pipeline reference")
        raise RecipeError(problems) from None
    problems = _graph_problems(spec, source, lines)
    stages: dict[str, Stage] = {}
    for name, st in spec.stages.items():
        path = Path(st.recipe)
        if not path.is_absolute():
            path = base_dir / path
        try:
            recipe = load_recipe(path, st.set)
        except RecipeError as exc:
            for p in exc.problems:
                if p.file == "<override>":
                    key = (
                        p.field
                        if p.field in st.set
                        else next((k for k in st.set if p.field.startswith(k + ".")), p.field)
                    )
                    p.file = source
                    p.line = _line(lines, "stages", name, "set", key)
                    p.field = f"stages.{name}.set.{key}"
                elif p.field == "(file)":
                    p.file = source
                    p.line = _line(lines, "stages", name, "recipe")
                    p.field = f"stages.{name}.recipe"
                    p.message = f"{path}: {p.message}"
                problems.append(p)
            continue
        after: list[tuple[str, Condition]] = [(item.stage, item.condition) for item in st.after]
        stages[name] = Stage(name, recipe, tuple(after), str(path))
    if problems:
        raise RecipeError(problems)
    order = _order(spec)
    name = spec.name or Path(source).stem
    return Pipeline(name, tuple(stages[n] for n in order), source)


def load_pipeline(path: str | Path) -> Pipeline:
    """Read and validate a pipeline file (``FILE:LINE: field: message`` problems)."""
    from slurmfm.recipe.loader import read_source

    p = Path(path)
    return parse_pipeline(read_source(p), str(p), p.parent)


def chain(recipes: Sequence[Recipe], condition: Condition = "afterok") -> Pipeline:
    """A linear pipeline: each recipe waits for the one before it (``submit a --then b``)."""
    stages: list[Stage] = []
    used: set[str] = set()
    for r in recipes:
        name, n = r.name, 1
        while name in used:
            n += 1
            name = f"{r.name}-{n}"
        used.add(name)
        after = ((stages[-1].name, condition),) if stages else ()
        stages.append(Stage(name, r, after))
    return Pipeline("chain", tuple(stages), "<chain>")


@dataclass(frozen=True)
class StagePlan:
    """What submitting one stage would send."""

    name: str
    info: SubmitRequest  # its dependency names upstream stages: afterok:<pretrain>
    dependency: str  # with upstream stage names as placeholders: "afterok:<pretrain>"
    script_path: str | None = None


@dataclass(frozen=True)
class PipelineDryRun:
    """The whole plan: stages in submission order, nothing submitted."""

    pipeline: Pipeline
    stages: tuple[StagePlan, ...]

    def lines(self) -> list[str]:
        out = []
        for i, s in enumerate(self.stages, 1):
            dep = s.dependency or "(none: starts when scheduled)"
            tasks = f", array of {len(s.info.tasks)} tasks" if s.info.tasks else ""
            recipe = self.pipeline.stage(s.name).recipe
            out.append(
                f"{i}. {s.name}: {recipe.name}, {recipe.resources.nodes} x "
                f"{recipe.cluster.instance_type}{tasks}; dependency {dep}"
                + (f"; script {s.script_path}" if s.script_path else "")
            )
        return out


def requests(pipeline: Pipeline, *, slurm_version: str | None = None) -> list[SubmitRequest]:
    """Every stage's request, in submission order, its dependency on upstream stages as
    ``<stage>`` placeholders; the same objects the dry run shows and ``submit`` sends."""
    from slurmfm.request import build

    out = []
    for stage in pipeline.stages:
        req = build(stage.recipe, slurm_version=slurm_version)
        dep = Dependency.of(
            [(cond, placeholder(up)) for up, cond in stage.after],
            singleton=stage.recipe.resources.singleton,
        )
        out.append(req.with_dependency(dep))
    return out


def stem(index: int, stage: str) -> str:
    """``NN-STAGE``: how a stage's files are named in an output directory."""
    return f"{index:02d}-{stage}"


def dry_run(
    pipeline: Pipeline, *, slurm_version: str | None = None, output_dir: str | Path | None = None
) -> PipelineDryRun:
    """Render every stage; with ``output_dir``, write each stage's exact bytes there
    (``NN-STAGE.sh``, ``NN-STAGE.argv.json``, runtime files; see SubmitRequest.write)."""
    plans = []
    for i, (stage, req) in enumerate(
        zip(pipeline.stages, requests(pipeline, slurm_version=slurm_version), strict=True), 1
    ):
        path = None
        if output_dir is not None:
            path = str(req.write(output_dir, stem(i, stage.name))[0])
        plans.append(StagePlan(stage.name, req, pipeline.dependency_expression(stage), path))
    return PipelineDryRun(pipeline, tuple(plans))


@dataclass
class SubmittedStage:
    name: str
    job_id: str
    dependency: str
    request: SubmitRequest  # exactly what was sent, job ids in its dependency


@dataclass
class PipelineRun:
    """Submitted stages (in order) and the backend that can ask about them."""

    pipeline: Pipeline
    backend: Backend
    stages: list[SubmittedStage] = field(default_factory=list)
    record_path: Path | None = None  # written after the last stage was queued
    record_error: str = ""

    @property
    def job_ids(self) -> dict[str, str]:
        return {s.name: s.job_id for s in self.stages}

    def status(self) -> dict[str, JobStatus]:
        return {s.name: self.backend.status(s.job_id) for s in self.stages}

    def wait(
        self, timeout: float = 3600.0, interval: float = 1.0, max_interval: float = 60.0
    ) -> dict[str, JobStatus]:
        """Until every stage ended (a stage cancelled by an unmet dependency counts as ended);
        polls with backoff, as ``Job.wait`` does (:mod:`slurmfm.polling`)."""
        from slurmfm.polling import poll_until

        def late(states: dict[str, JobStatus]) -> Exception:
            pending = [n for n, st in states.items() if not st.done]
            return BackendError(f"pipeline: {', '.join(pending)} not done after {timeout:.0f} s")

        return poll_until(
            self.status,
            lambda states: all(st.done for st in states.values()),
            timeout=timeout,
            first=interval,
            most=max_interval,
            on_timeout=late,
        )

    def cancel(self) -> None:
        for s in reversed(self.stages):
            self.backend.cancel(s.job_id)

    def record(self) -> dict[str, Any]:
        """What ``slurmfm pipeline status`` needs later: stage names, job ids, conditions."""
        import datetime

        return {
            "format": RECORD_FORMAT,
            "pipeline": self.pipeline.name,
            "source": self.pipeline.source,
            "submitted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"
            ),
            "stages": [
                {
                    "name": s.name,
                    "job_id": s.job_id,
                    "dependency": s.dependency,
                    "after": [list(a) for a in self.pipeline.stage(s.name).after],
                }
                for s in self.stages
            ],
        }


# A stage's fate once it ended. "skipped": Slurm ended it because its dependency can never be
# satisfied (with --kill-on-invalid-dep=yes; 22.05: state CANCELLED, reason
# DependencyNeverSatisfied, checked in tests/e2e/test_dependencies.py). That is the designed
# outcome of a condition that did not hold (an afternotok stage after a success), not a failure
# of its own: when it follows from an upstream failure, the upstream stage already failed.
Verdict = Literal["waiting", "running", "completed", "skipped", "failed"]
SKIP_REASON = "DependencyNeverSatisfied"


def verdict(st: JobStatus) -> Verdict:
    """One stage's fate from Slurm's state and reason."""
    from slurmfm.backends.base import base_state

    state = base_state(st.state)
    if not st.done:
        return "running" if state in ("RUNNING", "COMPLETING", "SUSPENDED") else "waiting"
    if state == "COMPLETED":
        return "completed"
    if state == "CANCELLED" and st.reason == SKIP_REASON:
        return "skipped"
    return "failed"


def succeeded(states: Mapping[str, JobStatus]) -> bool:
    """A pipeline succeeded when every stage ended and none failed (skipped ones are fine)."""
    return all(verdict(st) in ("completed", "skipped") for st in states.values())


def status_lines(states: Mapping[str, JobStatus]) -> list[str]:
    """``STAGE JOBID STATE (reason) exit=X: verdict``, one per stage, in submission order."""
    out = []
    for name, st in states.items():
        why = f" ({st.reason})" if st.reason and st.reason != "None" else ""
        out.append(f"{name} {st.job_id} {st.state}{why} exit={st.exit_code or '-'}: {verdict(st)}")
    return out


RECORD_FORMAT = 1


def records_dir(pipeline: Pipeline) -> Path:
    """``<first stage's log_dir>/pipelines``: on the shared log storage, so any login node
    that sees the logs can ask about the pipeline, as with serving endpoints."""
    return Path(pipeline.stages[0].recipe.storage.log_dir) / "pipelines"


def record_path(pipeline: Pipeline, first_job_id: str) -> Path:
    return records_dir(pipeline) / f"{pipeline.name}_{first_job_id}.json"


def write_record(run: PipelineRun) -> Path:
    import json

    from slurmfm.fsutil import write_atomic

    path = record_path(run.pipeline, run.stages[0].job_id)
    write_atomic(path, json.dumps(run.record(), indent=1) + "\n")
    return path


def latest_record(pipeline: Pipeline) -> Path | None:
    """The record of this pipeline's most recent submission (highest first job id)."""
    found = []
    for p in records_dir(pipeline).glob(f"{pipeline.name}_*.json"):
        tail = p.stem[len(pipeline.name) + 1 :]
        if tail.isdigit():
            found.append((int(tail), p))
    return max(found)[1] if found else None


def read_record(path: Path) -> dict[str, str]:
    """``stage -> job id`` from a record, in submission order; one clear error if unreadable."""
    import json

    from slurmfm.backends.slurm_cli import is_job_id
    from slurmfm.job import fsafe

    try:
        raw = json.loads(fsafe.read(str(path), fsafe.ANY_OWNER).decode("utf-8"))
        stages = {str(s["name"]): str(s["job_id"]) for s in raw["stages"]}
    except FileNotFoundError:
        raise SlurmfmError(f"{path}: no such pipeline record") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SlurmfmError(f"{path}: not a slurmfm pipeline record ({exc})") from None
    if not stages or not all(is_job_id(j) for j in stages.values()):
        raise SlurmfmError(f"{path}: not a slurmfm pipeline record (no job ids)")
    return stages


def submit(
    pipeline: Pipeline,
    *,
    backend: Backend,
    env: Mapping[str, str] | None = None,
    preflight: bool = True,
    keep_submitted: bool = False,
    planned: Sequence[SubmitRequest] | None = None,
) -> PipelineRun:
    """Render all stages for the cluster's Slurm (or take ``planned``, the requests a dry run
    showed), then submit them through :func:`slurmfm.submit.submit_all`.

    Nothing is queued when a stage's recipe, secrets or preflight fail. When a later ``sbatch``
    fails, the stages already queued are cancelled unless ``keep_submitted``.
    """
    from slurmfm.submit import submit_all

    reqs = (
        list(planned)
        if planned is not None
        else requests(pipeline, slurm_version=backend.version())
    )
    done = submit_all(
        [(s.name, r) for s, r in zip(pipeline.stages, reqs, strict=True)],
        backend=backend,
        env=env,
        preflight=preflight,
        keep_submitted=keep_submitted,
        shared_run_dir_hint="give the stage its own storage.run_id",
    )
    run = PipelineRun(pipeline, backend)
    for d in done:
        stage = pipeline.stage(d.label)
        run.stages.append(
            SubmittedStage(
                d.label, d.job_id, pipeline.dependency_expression(stage, run.job_ids), d.request
            )
        )
    try:
        run.record_path = write_record(run)
    except OSError as exc:  # the jobs are queued: say so, do not fail the submission
        run.record_error = f"pipeline record not written: {exc}"
    return run
