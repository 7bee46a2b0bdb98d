"""The runtime's ``task`` step: selecting an array task's row of the sweep table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmfm.job import cli
from slurmfm.job.sweep import TABLE_MARK, SweepError, find_table, main, task_lines
from slurmfm.render import array

TABLE = {
    "tasks": [
        {"task": 0, "exports": [["SLURMFM_RUN_ID", "r-t0"], ["A", "'x y'"]], "argv": "t.py --lr 1"},
        {"task": 1, "exports": [["SLURMFM_RUN_ID", "r-t1"]], "argv": "t.py --lr 2"},
    ]
}


def script(tmp_path: Path, table: object = TABLE) -> Path:
    p = tmp_path / "job.sh"
    p.write_text(f"#!/bin/bash\necho hi\n{TABLE_MARK}{json.dumps(table)}\n# slurmfm-runtime x\n")
    return p


def test_the_marker_is_the_renderers() -> None:
    assert array.TABLE_MARK == TABLE_MARK


def test_selects_the_row_of_the_task(tmp_path: Path) -> None:
    assert main(str(script(tmp_path)), "1") == [
        "export SLURMFM_RUN_ID=r-t1",
        "slurmfm_task_argv=(t.py --lr 2)",
    ]
    assert task_lines(TABLE, "0")[1] == "export A='x y'"


@pytest.mark.parametrize(
    ("task_id", "message"),
    [
        ("2", "array task 2 is not one of the 2 tasks of this sweep"),
        ("-1", "array task -1 is not one of the 2 tasks"),
        (None, "this script is a job array"),
    ],
)
def test_a_task_the_table_lacks_stops(task_id: str | None, message: str) -> None:
    with pytest.raises(SweepError, match=message):
        task_lines(TABLE, task_id)


def test_invalid_names_and_missing_tables_are_refused(tmp_path: Path) -> None:
    bad = {"tasks": [{"exports": [["A;rm", "1"]]}]}
    with pytest.raises(SweepError, match="invalid variable"):
        task_lines(bad, "0")
    with pytest.raises(SweepError, match="no sweep table"):
        find_table("#!/bin/bash\n")
    with pytest.raises(SweepError, match="cannot read the script"):
        main(str(tmp_path / "missing.sh"), "0")


def test_cli_prints_the_lines_or_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = script(tmp_path)
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    assert cli.main(["task", "--script", str(p)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "export SLURMFM_RUN_ID=r-t0"
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")
    assert cli.main(["task", "--script", str(p)]) == 2
    assert "array task 5 is not one of the 2 tasks" in capsys.readouterr().err
