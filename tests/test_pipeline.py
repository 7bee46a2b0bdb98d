"""Pipelines and chains without a cluster: validation with located errors, graph properties,
dependency options, and submission order / failure handling against a fake backend."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_backend import FakeBackend, write_recipes
from hypothesis import given, settings
from hypothesis import strategies as st
from lab import REPO_ROOT

from slurmfm import api
from slurmfm.backends.base import JobStatus
from slurmfm.cli import main
from slurmfm.errors import BackendError, RecipeError, RenderError
from slurmfm.pipeline import PipelineSubmitError, parse_pipeline
from slurmfm.recipe.loader import validate
from slurmfm.request import Dependency
from slurmfm.run_lock import RunDirInUse


@pytest.fixture
def stage_dir(tmp_path: Path) -> Path:
    write_recipes(tmp_path, "a", "b", "c")
    return tmp_path


def pipe(stage_dir: Path, text: str) -> Path:
    p = stage_dir / "pipeline.yaml"
    p.write_text(text)
    return p


def problems(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as exc:
        api.load_pipeline(path)
    return [str(p) for p in exc.value.problems]


def test_valid_pipeline_order_and_expressions(stage_dir: Path) -> None:
    p = pipe(
        stage_dir,
        "name: demo\n"
        "stages:\n"
        "  eval:\n"
        "    recipe: c.yaml\n"
        "    after: [{stage: train, condition: afterany}, prep]\n"
        "  prep: {recipe: a.yaml}\n"
        "  train:\n"
        "    recipe: b.yaml\n"
        "    set: {resources.singleton: true}\n"
        "    after: [prep]\n"
        "  cleanup:\n"
        "    recipe: a.yaml\n"
        "    set: {name: cleanup}\n"
        "    after: [{stage: train, condition: afternotok}]\n",
    )
    pl = api.load_pipeline(p)
    assert pl.name == "demo"
    assert [s.name for s in pl.stages] == ["prep", "train", "eval", "cleanup"]
    assert pl.dependency_expression(pl.stage("eval")) == "afterany:<train>,afterok:<prep>"
    assert pl.dependency_expression(pl.stage("train")) == "afterok:<prep>,singleton"
    assert pl.dependency_expression(pl.stage("cleanup"), {"train": "12"}) == "afternotok:12"
    assert pl.stage("cleanup").recipe.name == "cleanup"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "stages:\n  a: {recipe: a.yaml, after: [zz]}\n",
            ["{p}:2: stages.a.after.0: unknown stage 'zz' (stages: a)"],
        ),
        (
            "stages:\n  a:\n    recipe: a.yaml\n    after:\n      - a\n",
            ["{p}:5: stages.a.after.0: a stage cannot wait for itself"],
        ),
        (
            "stages:\n  a: {recipe: a.yaml}\n  b:\n    recipe: b.yaml\n    after: [a, a]\n",
            ["{p}:5: stages.b.after.1: 'a' is listed twice"],
        ),
        (
            "stages:\n"
            "  a:\n    recipe: a.yaml\n    after: [c]\n"
            "  b:\n    recipe: b.yaml\n    after:\n      - a\n"
            "  c:\n    recipe: c.yaml\n    after:\n      - b\n",
            [
                "{p}:4: stages.a.after.0: dependency cycle: a -> b -> c -> a",
                "{p}:8: stages.b.after.0: dependency cycle: a -> b -> c -> a",
                "{p}:12: stages.c.after.0: dependency cycle: a -> b -> c -> a",
            ],
        ),
        (
            "stages:\n  a: {recipe: a.yaml, after: [{stage: x, condition: afterwhat}]}\n",
            ["{p}:2: stages.a.after.0.condition: Input should be 'afterok', 'afterany' or"],
        ),
        ("stages:\n  a: {recipe: a.yaml, needs: [b]}\n", ["{p}:2: stages.a.needs: unknown field"]),
        ("stages: {}\n", ["{p}:1: stages: Dictionary should have at least 1 item"]),
        (
            "stages:\n  a: {recipe: nothere.yaml}\n",
            ["{p}:2: stages.a.recipe: {d}/nothere.yaml: no such file"],
        ),
        (
            "stages:\n  a:\n    recipe: a.yaml\n    set:\n      resources.nodes: 0\n",
            ["{p}:5: stages.a.set.resources.nodes: Input should be greater than or equal to 1"],
        ),
    ],
)
def test_problems_are_located(stage_dir: Path, text: str, expected: list[str]) -> None:
    p = pipe(stage_dir, text)
    got = problems(p)
    want = [e.format(p=p, d=stage_dir) for e in expected]
    assert len(got) == len(want), got
    for g, w in zip(sorted(got), sorted(want), strict=True):
        assert g.startswith(w), (g, w)


def test_stage_recipe_problems_keep_their_own_file(stage_dir: Path) -> None:
    (stage_dir / "bad.yaml").write_text("name: bad\nlauncher: {kind: torchrun}\n")
    p = pipe(stage_dir, "stages:\n  a: {recipe: bad.yaml}\n  b: {recipe: zz.yaml}\n")
    got = problems(p)
    assert f"{stage_dir}/bad.yaml:2: launcher.script: required field is missing" in got
    assert any(g.startswith(f"{p}:3: stages.b.recipe:") for g in got)


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[str], dict[str, list[str]]]:
    n = draw(st.integers(1, 7))
    names = [f"s{i}" for i in range(n)]
    edges = {
        names[j]: sorted(draw(st.sets(st.sampled_from(names[:j])))) if j else [] for j in range(n)
    }
    order = draw(st.permutations(names))  # file order differs from the dependency order
    return list(order), edges


def _text(order: list[str], edges: dict[str, list[str]], recipe: str) -> str:
    lines = ["stages:"]
    for name in order:
        lines.append(f"  {name}:")
        lines.append(f"    recipe: {recipe}")
        lines.append(f"    after: [{', '.join(edges[name])}]")
    return "\n".join(lines) + "\n"


@settings(max_examples=60, deadline=None)
@given(graph=dags())
def test_any_dag_is_submitted_in_a_topological_order(
    graph: tuple[list[str], dict[str, list[str]]],
) -> None:
    order, edges = graph
    recipe = REPO_ROOT / "recipes" / "quickstart.yaml"
    pl = parse_pipeline(_text(order, edges, str(recipe)), "p.yaml", REPO_ROOT)
    got = [s.name for s in pl.stages]
    assert sorted(got) == sorted(order)
    for name, ups in edges.items():
        for up in ups:
            assert got.index(up) < got.index(name)
    # among stages that are free at the same time, the file's order wins
    ready = [n for n in order if not edges[n]]
    assert got[0] == ready[0]


@settings(max_examples=40, deadline=None)
@given(graph=dags(), data=st.data())
def test_any_back_edge_is_a_located_cycle(
    graph: tuple[list[str], dict[str, list[str]]], data: st.DataObject
) -> None:
    order, edges = graph
    # a path exists from s0 to some later stage? add the edge back to s0 to close a cycle
    reach = {"s0"}
    for j in range(1, len(order)):
        if reach & set(edges[f"s{j}"]):
            reach.add(f"s{j}")
    target = data.draw(st.sampled_from(sorted(reach)))
    edges = {**edges, "s0": [target]}
    recipe = REPO_ROOT / "recipes" / "quickstart.yaml"
    with pytest.raises(RecipeError) as exc:
        parse_pipeline(_text(order, edges, str(recipe)), "p.yaml", REPO_ROOT)
    msgs = list(exc.value.problems)
    if target == "s0":
        assert msgs[0].message == "a stage cannot wait for itself"
    else:
        assert all("dependency cycle" in p.message for p in msgs)
        assert all(p.line is not None and p.field.startswith("stages.") for p in msgs)
    assert any(p.field.startswith("stages.s0.after") for p in msgs)


def lab_recipe(name: str = "r", singleton: bool = False) -> object:
    return validate(
        {
            "name": name,
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"nodes": 1, "procs_per_node": 1, "singleton": singleton},
            "launcher": {"kind": "torchrun", "script": "t.py"},
        }
    )


def test_dependency_is_an_sbatch_argument_merged_with_singleton_and_gated() -> None:
    r = lab_recipe(singleton=True)
    plain = api.render(r, slurm_version="22.05")
    assert "#SBATCH --dependency=singleton" in plain.text  # the script's own, untouched
    assert plain.argv() == ("sbatch", "--parsable")
    dep = Dependency.of([("afterok", "5"), ("afterany", "6"), ("afterok", "7")])
    out = plain.with_dependency(dep)
    assert out.script == plain.script  # nothing spliced into the script
    assert out.argv() == (
        "sbatch",
        "--parsable",
        "--dependency=afterok:5:7,afterany:6,singleton",
        "--kill-on-invalid-dep=yes",
    )
    old = api.render(r, slurm_version="21.08").with_dependency(Dependency.of([("afterok", "5")]))
    assert "--kill-on-invalid-dep=yes" not in old.argv()
    assert plain.with_dependency(Dependency()) is plain
    with pytest.raises(RenderError, match="not a Slurm job id"):
        Dependency.of([("afterok", "5;rm")])
    pending = plain.with_dependency(Dependency.of([("afterok", "<up>")]))
    assert "--dependency=afterok:<up>,singleton" in pending.argv()
    with pytest.raises(RenderError, match="no job id yet"):
        pending.check_submittable()
    assert "--dependency=afterok:42,singleton" in pending.resolved({"up": "42"}).argv()


def three_stage(stage_dir: Path) -> Path:
    return pipe(
        stage_dir,
        "stages:\n  a: {recipe: a.yaml}\n"
        "  b: {recipe: b.yaml, after: [a]}\n"
        "  c: {recipe: c.yaml, after: [{stage: b, condition: afternotok}, a]}\n",
    )


def test_submit_threads_ids_in_order(stage_dir: Path) -> None:
    be = FakeBackend()
    run = api.submit_pipeline(
        api.load_pipeline(three_stage(stage_dir)), backend=be, preflight=False
    )
    assert run.job_ids == {"a": "101", "b": "102", "c": "103"}
    argv = [r.argv() for r in be.requests]
    assert argv[0] == ("sbatch", "--parsable")
    assert argv[1][2:] == ("--dependency=afterok:101", "--kill-on-invalid-dep=yes")
    assert argv[2][2:] == ("--dependency=afternotok:102,afterok:101", "--kill-on-invalid-dep=yes")
    assert not any("--dependency" in r.text for r in be.requests)  # nothing spliced in
    assert [s.dependency for s in run.stages] == ["", "afterok:101", "afternotok:102,afterok:101"]
    assert (stage_dir / "logs").is_dir()  # sbatch would not create --output's directory
    assert {k: v.state for k, v in run.wait(timeout=5).items()} == dict.fromkeys("abc", "COMPLETED")


def test_failed_submission_cancels_what_was_queued(stage_dir: Path) -> None:
    be = FakeBackend(fail_at=2)
    pl = api.load_pipeline(three_stage(stage_dir))
    with pytest.raises(PipelineSubmitError) as exc:
        api.submit_pipeline(pl, backend=be, preflight=False)
    assert be.cancelled == ["102", "101"]
    assert exc.value.submitted == {"a": "101", "b": "102"}
    assert exc.value.cancelled
    assert "stage c was not submitted: sbatch: error" in str(exc.value)
    assert "cancelled the stages already submitted: a=101, b=102" in str(exc.value)
    be = FakeBackend(fail_at=1)
    with pytest.raises(PipelineSubmitError, match="already submitted and kept"):
        api.submit_pipeline(pl, backend=be, preflight=False, keep_submitted=True)
    assert be.cancelled == []
    be = FakeBackend(fail_at=0)
    with pytest.raises(BackendError, match="QOSMaxSubmitJobs"):  # nothing queued: plain error
        api.submit_pipeline(pl, backend=be, preflight=False)


def test_missing_secret_in_any_stage_queues_nothing(
    stage_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SOME_TOKEN", raising=False)
    p = pipe(
        stage_dir,
        "stages:\n  a: {recipe: a.yaml}\n  b: {recipe: b.yaml, set: {secrets: [SOME_TOKEN]}}\n",
    )
    be = FakeBackend()
    with pytest.raises(RecipeError, match="b: SOME_TOKEN"):
        api.submit_pipeline(api.load_pipeline(p), backend=be, preflight=False)
    assert be.requests == []


def test_chain_names_and_dry_run(stage_dir: Path, tmp_path: Path) -> None:
    a = api.load(stage_dir / "a.yaml")
    pl = api.chain([a, a, api.load(stage_dir / "b.yaml")], "afterany")
    assert [s.name for s in pl.stages] == ["a", "a-2", "b"]
    plan = api.dry_run_pipeline(pl, slurm_version="22.05", output_dir=tmp_path / "plan")
    assert [s.dependency for s in plan.stages] == ["", "afterany:<a>", "afterany:<a-2>"]
    assert [Path(s.script_path or "").name for s in plan.stages] == [
        "01-a.sh",
        "02-a-2.sh",
        "03-b.sh",
    ]
    for s in plan.stages:
        subprocess.run(["bash", "-n", s.script_path or ""], check=True)
    argv = json.loads((tmp_path / "plan" / "02-a-2.argv.json").read_text())
    assert argv == [
        "sbatch",
        "--parsable",
        "--dependency=afterany:<a>",
        "--kill-on-invalid-dep=yes",
    ]


def test_cli_pipeline_validate_and_dry_run(stage_dir: Path) -> None:
    runner = CliRunner()
    good = three_stage(stage_dir)
    res = runner.invoke(main, ["pipeline", "validate", str(good)])
    assert res.exit_code == 0, res.output
    assert "c: c after afternotok:<b>,afterok:<a>" in res.stdout
    res = runner.invoke(
        main, ["pipeline", "submit", str(good), "--dry-run", "-o", str(stage_dir / "out")]
    )
    assert res.exit_code == 0, res.output
    assert "3. c: c, 1 x lab-cpu; dependency afternotok:<b>,afterok:<a>" in res.stdout
    assert (stage_dir / "out" / "03-c.sh").is_file()
    bad = pipe(stage_dir, "stages:\n  a: {recipe: a.yaml, after: [q]}\n")
    res = runner.invoke(main, ["pipeline", "validate", str(bad)])
    assert res.exit_code == 2
    assert res.stderr.startswith(f"{bad}:2: stages.a.after.0: unknown stage 'q'")


def test_cli_submit_then_dry_run(stage_dir: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmfm.cli",
            "submit",
            str(stage_dir / "a.yaml"),
            "--then",
            str(stage_dir / "b.yaml"),
            "--then",
            str(stage_dir / "c.yaml"),
            "--condition",
            "afterany",
            "--dry-run",
            "--slurm-version",
            "22.05",
            "-o",
            str(stage_dir / "chain"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2. b: b, 1 x lab-cpu; dependency afterany:<a>" in proc.stdout
    assert "3. c: c, 1 x lab-cpu; dependency afterany:<b>" in proc.stdout


# ------------------------------------------------------------------ verdicts, records, status
@pytest.mark.parametrize(
    ("state", "reason", "want"),
    [
        ("PENDING", "Dependency", "waiting"),
        ("PENDING", "Resources", "waiting"),
        ("RUNNING", "None", "running"),
        ("COMPLETING", "None", "running"),
        ("COMPLETED", "None", "completed"),
        ("CANCELLED", "DependencyNeverSatisfied", "skipped"),
        ("CANCELLED by 0", "DependencyNeverSatisfied", "skipped"),
        ("CANCELLED", "None", "failed"),  # scancel by a person is not a skipped condition
        ("FAILED", "NonZeroExitCode", "failed"),
        ("TIMEOUT", "TimeLimit", "failed"),
        ("NODE_FAIL", "None", "failed"),
        ("OUT_OF_MEMORY", "None", "failed"),
    ],
)
def test_stage_verdicts(state: str, reason: str, want: str) -> None:
    from slurmfm.pipeline import verdict

    assert verdict(JobStatus("7", state, reason=reason)) == want


def test_a_skipped_condition_is_not_a_failed_pipeline() -> None:
    from slurmfm.pipeline import status_lines, succeeded

    ok = {
        "train": JobStatus("1", "COMPLETED", exit_code="0:0"),
        "cleanup-on-failure": JobStatus("2", "CANCELLED", reason="DependencyNeverSatisfied"),
    }
    assert succeeded(ok)
    assert status_lines(ok)[1] == (
        "cleanup-on-failure 2 CANCELLED (DependencyNeverSatisfied) exit=-: skipped"
    )
    failed = {**ok, "train": JobStatus("1", "FAILED", exit_code="1:0")}
    assert not succeeded(failed)
    assert not succeeded({"train": JobStatus("1", "RUNNING")})


@dataclass
class StatusBackend(FakeBackend):
    states: dict[str, JobStatus] = field(default_factory=dict)

    def status(self, job_id: str) -> JobStatus:
        return self.states.get(job_id, JobStatus(job_id, "PENDING", reason="Dependency"))


def test_submit_writes_a_record_and_status_reads_the_latest(
    stage_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmfm.pipeline import latest_record, read_record

    pipeline = api.load_pipeline(three_stage(stage_dir))
    be = StatusBackend()
    first = api.submit_pipeline(pipeline, backend=be, preflight=False)
    # While the first run's jobs live, a second run into the same run directories is refused
    # (issue 15 item 8); once they have ended it is submitted.
    with pytest.raises(RunDirInUse, match=r"job 10[123] \(PENDING\) already uses"):
        api.submit_pipeline(pipeline, backend=be, preflight=False)
    assert len(be.requests) == 3  # nothing queued by the refused run
    be.states = {j: JobStatus(j, "COMPLETED", exit_code="0:0") for j in ("101", "102", "103")}
    second = api.submit_pipeline(pipeline, backend=be, preflight=False)
    assert first.record_path == stage_dir / "logs" / "pipelines" / "pipeline_101.json"
    assert second.record_path == stage_dir / "logs" / "pipelines" / "pipeline_104.json"
    assert latest_record(pipeline) == second.record_path
    assert read_record(second.record_path) == {"a": "104", "b": "105", "c": "106"}

    be.states = {
        "104": JobStatus("104", "COMPLETED", exit_code="0:0"),
        "105": JobStatus("105", "COMPLETED", exit_code="0:0"),
        "106": JobStatus("106", "CANCELLED", reason="DependencyNeverSatisfied"),
    }
    monkeypatch.setattr(api, "get_backend", lambda *a, **k: be)
    runner = CliRunner()
    res = runner.invoke(main, ["pipeline", "status", str(three_stage(stage_dir))])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[1:] == [
        "a 104 COMPLETED exit=0:0: completed",
        "b 105 COMPLETED exit=0:0: completed",
        "c 106 CANCELLED (DependencyNeverSatisfied) exit=-: skipped",
    ]
    be.states["105"] = JobStatus("105", "FAILED", reason="NonZeroExitCode", exit_code="1:0")
    res = runner.invoke(main, ["pipeline", "status", str(first.record_path), "--json"])
    assert res.exit_code == 0, res.output  # the older record (101..103): waiting, none failed
    assert [s["verdict"] for s in json.loads(res.stdout)["stages"]] == ["waiting"] * 3
    res = runner.invoke(main, ["pipeline", "status", str(second.record_path), "--json"])
    assert res.exit_code == 1
    assert [s["verdict"] for s in json.loads(res.stdout)["stages"]] == [
        "completed",
        "failed",
        "skipped",
    ]


def test_status_without_a_record_is_one_line_and_status_2(stage_dir: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["pipeline", "status", str(three_stage(stage_dir))])
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        f"{stage_dir / 'pipeline.yaml'}: no submission on record "
        f"(looked in {stage_dir / 'logs'}/pipelines)"
    )
    bad = stage_dir / "bad.json"
    bad.write_text('{"stages": [{"name": "a", "job_id": "1;rm -rf /"}]}')
    res = runner.invoke(main, ["pipeline", "status", str(bad)])
    assert res.exit_code == 2
    assert "not a slurmfm pipeline record" in res.stderr


def test_an_unwritable_record_does_not_fail_the_submission(stage_dir: Path) -> None:
    (stage_dir / "logs").mkdir()
    (stage_dir / "logs" / "pipelines").write_text("a file where the directory goes")
    run = api.submit_pipeline(
        api.load_pipeline(three_stage(stage_dir)), backend=FakeBackend(), preflight=False
    )
    assert run.job_ids == {"a": "101", "b": "102", "c": "103"}
    assert run.record_path is None
    assert run.record_error.startswith("pipeline record not written:")
