"""What you inspect is what you submit: the bytes ``submit --dry-run -o DIR`` writes are the
bytes a backend receives from ``submit``, for a recipe, a sweep, a chain and a pipeline."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_backend import RECIPE, VERSION, FakeBackend, write_recipes

from slurmfm import api
from slurmfm.cli import main
from slurmfm.request import ArraySpec, Dependency, SubmitRequest

SWEEP = "sweep: {parameters: {env.LR: ['1e-4', '3e-4', '1e-3']}, max_concurrent: 2}\n"


@pytest.fixture
def recipes(tmp_path: Path) -> Path:
    write_recipes(tmp_path, "a", "b", "c")
    (tmp_path / "sw.yaml").write_text(
        RECIPE.format(name="sw", logs=tmp_path / "logs") + SWEEP, encoding="utf-8"
    )
    (tmp_path / "p.yaml").write_text(
        "name: p\nstages:\n  a: {recipe: a.yaml}\n  sw: {recipe: sw.yaml, after: [a]}\n"
        "  c: {recipe: c.yaml, after: [{stage: sw, condition: afterany}, a]}\n"
    )
    return tmp_path


def cli(*args: str) -> str:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output
    return res.stdout


def sent(req: SubmitRequest) -> tuple[bytes, list[str], dict[str, bytes]]:
    return req.script, list(req.argv()), dict(req.files)


def written(
    directory: Path, stem: str, ids: dict[str, str] | None = None
) -> tuple[bytes, list[str], dict[str, bytes]]:
    """A stem's files in DIR; ``<stage>`` in the argv replaced by the job ids Slurm gave."""
    argv = json.loads((directory / f"{stem}.argv.json").read_text())
    if ids is not None:
        argv = [re.sub(r"<([^>]+)>", lambda m: ids[m.group(1)], a) for a in argv]
    files_dir = directory / f"{stem}.files"
    files = (
        {str(p.relative_to(files_dir)): p.read_bytes() for p in files_dir.rglob("*") if p.is_file()}
        if files_dir.is_dir()
        else {}
    )
    return (directory / f"{stem}.sh").read_bytes(), argv, files


@pytest.mark.parametrize("recipe", ["a.yaml", "sw.yaml"])
def test_recipe_and_sweep_dry_run_bytes_are_the_submitted_bytes(
    recipes: Path, recipe: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    be = FakeBackend()
    monkeypatch.setattr(api, "get_backend", lambda *a, **k: be)
    path = str(recipes / recipe)
    name = recipe.removesuffix(".yaml")
    shown = cli("submit", path, "--dry-run", "--slurm-version", VERSION, "-o", str(recipes / "dry"))
    assert cli("submit", path, "--no-check", "-o", str(recipes / "sent")).strip() == "101"
    (req,) = be.requests
    assert written(recipes / "dry", name) == sent(req)
    assert written(recipes / "sent", name) == sent(req)
    # The printed form is the same request: its command line, then the script.
    header = shown.splitlines()[0]
    assert header.startswith("# dry run: would run sbatch --parsable")
    assert shown.endswith(req.text)
    if recipe == "sw.yaml":
        assert req.array == ArraySpec("0-2%2", 3, 2)
        assert req.test_only_args() == ("--array=0-2%2",)
        assert "--array=0-2%2" in req.argv()
        assert "--array=0-2%2" in header


def test_chain_and_pipeline_dry_run_bytes_are_the_submitted_bytes(
    recipes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    be = FakeBackend()
    monkeypatch.setattr(api, "get_backend", lambda *a, **k: be)
    chain = [str(recipes / "a.yaml"), "--then", str(recipes / "c.yaml")]
    cli("submit", *chain, "--dry-run", "--slurm-version", VERSION, "-o", str(recipes / "dry"))
    cli("submit", *chain, "--no-check", "-o", str(recipes / "sent"))
    ids = {"a": "101", "c": "102"}
    for i, (stem, req) in enumerate(zip(["01-a", "02-c"], be.requests, strict=True)):
        assert written(recipes / "dry", stem, ids) == sent(req), stem
        assert written(recipes / "sent", stem) == sent(req), stem
        assert ("--dependency=afterok:101" in req.argv()) == (i == 1)

    be.requests.clear()
    pipe = str(recipes / "p.yaml")
    cli(
        "pipeline",
        "submit",
        pipe,
        "--dry-run",
        "--slurm-version",
        VERSION,
        "-o",
        str(recipes / "pd"),
    )
    cli("pipeline", "submit", pipe, "--no-check", "-o", str(recipes / "ps"))
    ids = {"a": "101", "sw": "102", "c": "103"}
    for stem, req in zip(["01-a", "02-sw", "03-c"], be.requests, strict=True):
        assert written(recipes / "pd", stem, ids) == sent(req), stem
        assert written(recipes / "ps", stem) == sent(req), stem
    assert be.requests[1].argv()[2:] == (
        "--array=0-2%2",
        "--dependency=afterok:101",
        "--kill-on-invalid-dep=yes",
    )
    assert "--dependency=afterany:102,afterok:101" in be.requests[2].argv()
    assert be.cancelled == []


def test_api_submits_the_object_the_dry_run_returned(recipes: Path) -> None:
    be = FakeBackend()
    req = api.dry_run(api.load(recipes / "sw.yaml"), slurm_version=VERSION)
    job = api.submit_request(req, backend=be, preflight=False)
    assert be.requests == [req]
    assert be.requests[0] is req  # no re-render, no copy
    assert job.request is req
    assert (recipes / "logs").is_dir()  # sbatch would not create --output's directory


def test_dry_run_output_dir_errors_are_one_line(recipes: Path) -> None:
    # issue 15 item 14: `submit --dry-run -o DIR` used to raise IsADirectoryError.
    res = CliRunner().invoke(
        main, ["submit", str(recipes / "a.yaml"), "--dry-run", "-o", str(recipes)]
    )
    assert res.exit_code == 0, res.output
    assert (recipes / "a.sh").read_bytes().startswith(b"#!/bin/bash\n")
    res = CliRunner().invoke(
        main, ["submit", str(recipes / "a.yaml"), "--dry-run", "-o", str(recipes / "a.yaml")]
    )
    assert res.exit_code == 2
    assert res.stderr.strip() == f"-o {recipes / 'a.yaml'}: exists and is not a directory"
    assert res.exception is None or isinstance(res.exception, SystemExit)


def test_runtime_files_are_written_with_the_script(tmp_path: Path) -> None:
    req = SubmitRequest(
        script=b"#!/bin/bash\n",
        files={"job/runtime.py": b"print('x')\n"},
        dependency=Dependency.of([("afterok", "3")]),
    )
    paths = req.write(tmp_path, "job")
    assert [p.name for p in paths] == ["job.sh", "job.argv.json", "runtime.py"]
    assert (tmp_path / "job.files" / "job" / "runtime.py").read_bytes() == b"print('x')\n"
    assert json.loads((tmp_path / "job.argv.json").read_text()) == [
        "sbatch",
        "--parsable",
        "--dependency=afterok:3",
    ]
    assert "# runtime file: job/runtime.py (11 bytes), carried in the script" in str(req)


def test_runtime_files_come_from_the_renderer_in_either_shape() -> None:
    # The renderer may list its files as a mapping or as objects with name and data.
    from slurmfm.request import _runtime_files

    @dataclass(frozen=True)
    class File:
        name: str
        data: bytes

    assert _runtime_files((File("abc.pyz", b"PK"),)) == {"abc.pyz": b"PK"}
    assert _runtime_files({"x.txt": "text"}) == {"x.txt": b"text"}
    assert _runtime_files(None) == {}


def test_recipe_run_id_and_checkpoint_dir_are_one_definition(recipes: Path) -> None:
    r = api.load(recipes / "a.yaml")
    assert r.run_id == "a"
    assert r.checkpoint_dir == f"{recipes / 'logs'}/a/a"
    named = api.override(r, {"storage.run_id": "r1", "storage.checkpoint_root": "/ck/"})
    assert (named.run_id, named.checkpoint_dir) == ("r1", "/ck/a/r1")
    assert api.endpoint_path(named) == recipes / "logs" / "endpoints" / "r1.json"
    tasks = api.sweep_tasks(api.load(recipes / "sw.yaml"))
    assert [t.checkpoint_dir for t in tasks] == [f"{recipes / 'logs'}/sw/sw-t{i}" for i in range(3)]


def test_reprs_are_short_and_say_what_is_sent() -> None:
    """``repr`` of the quickstart's request was 445,117 characters (the embedded runtime): a
    notebook or a log line printed the whole script. Now its sizes stand for the bytes."""
    import slurmfm.api as fm

    req = fm.dry_run(fm.load(Path(__file__).parent.parent / "recipes" / "quickstart.yaml"))
    text = repr(req)
    assert len(text) < 1000, text
    assert text.startswith("SubmitRequest(job_name='quickstart', script=<")
    assert f"<{len(req.script):,} bytes, {req.text.count(chr(10)):,} lines>" in text
    assert "slurmfm-runtime" not in text
    assert req.rendered is not None
    rendered = repr(req.rendered)
    assert len(rendered) < 1000
    assert repr(req.rendered.launch) in rendered
    rf = req.rendered.files[0]
    assert repr(rf) == f"RuntimeFile({rf.name!r}, <{len(rf.data):,} bytes>)"
