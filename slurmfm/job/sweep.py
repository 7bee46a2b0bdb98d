"""``task``: this array task's own values, from the sweep table the script carries.

Why here: a sweep is rendered once (slurmfm/render/array.py); what differs between its tasks
is a JSON table in the script's next-to-last line, ``# slurmfm-sweep {"tasks": [...]}``. This
step reads the running script (``$0``), selects the row of ``SLURM_ARRAY_TASK_ID`` and prints
it as ``export`` lines and ``slurmfm_task_argv=(...)`` for the script to evaluate. The values
were shell-quoted by the renderer (the path a single job's values take), so nothing is quoted
here; names are checked, and a task index the table lacks stops the job.
"""

from __future__ import annotations

import json
import re

TABLE_MARK = "# slurmfm-sweep "
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class SweepError(Exception):
    """The table is missing or does not hold this task."""


def find_table(text: str) -> dict[str, object]:
    """The sweep table of a script's text (the first line that starts with the marker)."""
    for line in text.splitlines():
        if line.startswith(TABLE_MARK):
            data = json.loads(line[len(TABLE_MARK) :])
            if isinstance(data, dict):
                return data
    raise SweepError("this script carries no sweep table")


def task_lines(table: dict[str, object], task_id: str | None) -> list[str]:
    """The shell lines that set task ``task_id``'s values."""
    rows = table.get("tasks")
    if not isinstance(rows, list):
        raise SweepError("the sweep table has no tasks")
    if task_id is None or task_id == "":
        raise SweepError("this script is a job array (SLURM_ARRAY_TASK_ID is not set)")
    if not task_id.isdigit() or int(task_id) >= len(rows):
        raise SweepError(
            "array task %s is not one of the %d tasks of this sweep" % (task_id, len(rows))
        )
    row = rows[int(task_id)]
    out = []
    for name, value in row.get("exports", []):
        if not _NAME.match(name):
            raise SweepError("the sweep table names an invalid variable %r" % name)
        out.append("export %s=%s" % (name, value))
    if row.get("argv") is not None:
        out.append("slurmfm_task_argv=(%s)" % row["argv"])
    return out


def main(script: str, task_id: str | None) -> list[str]:
    """Read ``script`` and return the lines for ``task_id`` (raises :class:`SweepError`)."""
    try:
        with open(script, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise SweepError("cannot read the script %s: %s" % (script, exc)) from None
    return task_lines(find_table(text), task_id)
