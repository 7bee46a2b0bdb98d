"""Render a sweep as one job-array script, built from the per-task scripts of the pure renderer.

How: every task's recipe is rendered by :func:`slurmfm.render.script.render_script` exactly as
a single job would be, so each task's values went through ``sh_quote`` and every check of the
normal path. The task scripts must then have identical ``#SBATCH`` directives (sbatch applies
one set to every array task) and the same shape (line count). Where they differ, the array
script selects the task's own lines with ``case "$SLURM_ARRAY_TASK_ID"``:

* ``export`` lines (the run id, the checkpoint directory, environment variables, data paths):
  a ``case`` block in place, with each task's own lines;
* launch arguments inside the ``srun`` command: a ``case`` block before the launch fills the
  array ``slurmfm_task_argv`` with each task's words, and the command uses
  ``"${slurmfm_task_argv[@]}"`` (the same words, expanded the same way);
* the NeMo driver heredoc: the whole assignment, per task.

Any other difference is refused (:class:`~slurmfm.errors.RenderError`), so a future change to
the template cannot silently give every task task 0's value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from slurmfm.errors import RenderError
from slurmfm.render.quote import sbatch_value, sh_quote
from slurmfm.render.script import Directive, RenderedScript, render_script

if TYPE_CHECKING:
    from slurmfm.plan.types import Placement
    from slurmfm.recipe.schema import Recipe
    from slurmfm.recipe.sweep import SweepTask
    from slurmfm.render.script import Target

_EXPORT = re.compile(r"^export [A-Za-z_][A-Za-z0-9_]*=\S.*$")
_HEREDOC_START = "SLURMFM_NEMO_DRIVER=$(cat <<"
_ENTRY = 'python3 "$SLURMFM_RUNTIME" node'


def _case(tasks: Sequence[int], bodies: Sequence[list[str]], indent: str = "    ") -> list[str]:
    out = ['case "${SLURM_ARRAY_TASK_ID:?slurmfm: this script is a job array}" in']
    if indent and all(len(b) == 1 for b in bodies):
        # one line per task keeps the launch near the top of the script
        out.extend(f"  {i}) {b[0]} ;;" for i, b in zip(tasks, bodies, strict=True))
        out.append(
            f'  *) echo "slurmfm: array task $SLURM_ARRAY_TASK_ID is not one of the {len(tasks)} '
            'tasks of this sweep" >&2; exit 2 ;;'
        )
        out.append("esac")
        return out
    for i, body in zip(tasks, bodies, strict=True):
        out.append(f"  {i})")
        # Heredoc bodies and their delimiter must stay at column 0.
        out.extend(indent + line if indent else line for line in body)
        out.append("    ;;")
    out.append("  *)")
    out.append(
        f'    echo "slurmfm: array task $SLURM_ARRAY_TASK_ID is not one of the {len(tasks)} '
        'tasks of this sweep" >&2'
    )
    out.append("    exit 2")
    out.append("    ;;")
    out.append("esac")
    return out


def _span(
    lines: list[str], start: str, end: str, *, after: int = 0, exact: bool
) -> tuple[int, int]:
    """(first, last) line index of a block, or (-1, -1); the end line equals (or ends with)
    ``end``."""
    for i in range(after, len(lines)):
        if lines[i].startswith(start):
            for j in range(i, len(lines)):
                if (lines[j] == end) if exact else lines[j].rstrip().endswith(end):
                    return i, j
    return -1, -1


def _words(line: str) -> str:
    text = line.strip()
    for tail in (" \\", " &"):
        if text.endswith(tail):
            text = text[: -len(tail)].rstrip()
    return text


def _contiguous(idx: list[int]) -> list[tuple[int, int]]:
    groups: list[tuple[int, int]] = []
    for j in idx:
        if groups and j == groups[-1][1] + 1:
            groups[-1] = (groups[-1][0], j)
        else:
            groups.append((j, j))
    return groups


def merge_task_scripts(
    scripts: Sequence[RenderedScript], tasks: Sequence[SweepTask], array: str, log_dir: str
) -> str:
    """One array script from per-task scripts that differ only where a task may differ."""
    texts = [s.text.split("\n") for s in scripts]
    base = texts[0]
    for t, lines in zip(tasks, texts, strict=True):
        if len(lines) != len(base):
            raise RenderError(
                f"sweep: array task {t.index} renders a script of another shape than task 0 "
                "(it adds or removes an environment variable or a launch argument); give every "
                "task the same keys"
            )
    for t, s in zip(tasks, scripts, strict=True):
        if s.directives != scripts[0].directives:
            raise RenderError(
                f"sweep: array task {t.index} needs other #SBATCH options than task 0; sbatch "
                "applies one set to every array task"
            )
    differs = [j for j in range(len(base)) if any(lines[j] != base[j] for lines in texts)]
    h0, h1 = _span(base, _HEREDOC_START, ")", exact=True)
    launch_at = next((i for i, line in enumerate(base) if line.startswith("# Launch:")), -1)
    # the launch: `exec python3 RUNTIME batch ... -- srun ... node ... -- ARGV` up to the first
    # line that does not continue
    s0 = next((i for i in range(max(launch_at, 0), len(base)) if base[i].startswith("exec ")), -1)
    s1 = next((i for i in range(s0, len(base)) if not base[i].endswith("\\")), -1)
    entry = next((i for i in range(s0, s1 + 1) if _ENTRY in base[i]), -1) if s0 >= 0 else -1
    indexes = [t.index for t in tasks]

    replace: dict[int, tuple[int, list[str]]] = {}  # start -> (end, new lines)
    insert_before_launch: list[str] = []
    heredoc_done = False
    argv_idx: list[int] = []
    export_idx: list[int] = []
    for j in differs:
        line = base[j]
        if h0 <= j <= h1 and h0 >= 0:
            if not heredoc_done:
                bodies = [lines[h0 : h1 + 1] for lines in texts]
                replace[h0] = (h1, _case(indexes, bodies, indent=""))
                heredoc_done = True
        elif s0 >= 0 and s0 <= j <= s1:
            if entry < 0 or j <= entry:
                raise RenderError(
                    f"sweep: array tasks differ in srun options ({line.strip()!r}); only the "
                    "launched command may differ"
                )
            argv_idx.append(j)
        elif _EXPORT.match(line):
            export_idx.append(j)
        elif line.startswith("#") and not line.startswith("#SBATCH"):
            replace[j] = (j, [f"{line} [array task 0; differs per task]"])
        else:
            raise RenderError(
                f"sweep: array tasks differ in a script line that cannot vary per task: "
                f"{line.strip()!r}"
            )
    for a, b in _contiguous(export_idx):
        bodies = [lines[a : b + 1] for lines in texts]
        if a == min(export_idx):
            # The first block (it holds the run id) also says which task this is.
            bodies = [
                [*body, f"export SLURMFM_SWEEP_OVERRIDES={sh_quote(t.overrides_json)}"]
                for body, t in zip(bodies, tasks, strict=True)
            ]
        replace[a] = (b, _case(indexes, bodies))
    if argv_idx:
        a, b = min(argv_idx), max(argv_idx)
        tail = " \\" if base[b].rstrip().endswith(" \\") else ""
        lead = base[a][: len(base[a]) - len(base[a].lstrip())]
        replace[a] = (b, [f'{lead}"${{slurmfm_task_argv[@]}}"{tail}'])
        bodies = [
            ["slurmfm_task_argv=(" + " ".join(_words(x) for x in lines[a : b + 1]) + ")"]
            for lines in texts
        ]
        insert_before_launch = [
            "# This array task's own launch arguments (the sweep's overrides).",
            *_case(indexes, bodies),
        ]

    out: list[str] = []
    j = 0
    while j < len(base):
        if j == launch_at and insert_before_launch:
            out.extend(insert_before_launch)
        if j in replace:
            end, new = replace[j]
            out.extend(new)
            j = end + 1
            continue
        out.append(base[j])
        j += 1
    return "\n".join(_array_directives(out, array, log_dir))


def _array_directives(lines: list[str], array: str, log_dir: str) -> list[str]:
    """Add ``--array`` and give each task its own log (``%A`` array id, ``%a`` task index)."""
    out_prefix = "#SBATCH --output="
    at = [i for i, line in enumerate(lines) if line.startswith(out_prefix)]
    if len(at) != 1:
        raise RenderError("sweep: expected exactly one #SBATCH --output line")
    i = at[0]
    lines = list(lines)
    lines[i] = f"{out_prefix}{_array_output(log_dir)}"
    lines[i + 1 : i + 1] = [
        "# one array task per sweep point (sbatch(1) --array; %K caps how many run at once)",
        f"#SBATCH --array={sbatch_value(array, what='sweep')}",
    ]
    return lines


def _array_output(log_dir: str) -> str:
    return f"{sbatch_value(log_dir, what='storage.log_dir').rstrip('/')}/%x_%A_%a.out"


def _line_break(value: object, path: str) -> str | None:
    """The dotted path of the first string holding a newline, if any.

    The merge works on physical lines; a quoted value spanning lines could otherwise be split
    between a task-specific and a shared part. Refusing it keeps the merge exact.
    """
    if isinstance(value, str):
        return path or "(value)" if "\n" in value else None
    if isinstance(value, dict):
        items: list[tuple[str, object]] = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return None
    for key, item in items:
        found = _line_break(item, f"{path}.{key}" if path else key)
        if found:
            return found
    return None


def render_array(
    recipe: Recipe, target: Target | None = None, placement: Placement | None = None
) -> RenderedScript:
    """Render a recipe with ``sweep`` as one job-array script (pure, deterministic)."""
    from slurmfm.recipe.sweep import array_spec, expand

    if recipe.sweep is None:
        raise RenderError("sweep: the recipe has no sweep section")
    tasks = expand(recipe)
    for t in tasks:
        where = _line_break(t.recipe.model_dump(mode="json"), "")
        if where:
            raise RenderError(
                f"sweep: array task {t.index}: {where} contains a line break; a sweep's values "
                "must be single lines (the array script selects each task's lines by line)"
            )
    scripts = [render_script(t.recipe, target, placement) for t in tasks]
    array = array_spec(recipe.sweep)
    text = merge_task_scripts(scripts, tasks, array, recipe.storage.log_dir)
    first = scripts[0]
    directives: list[Directive] = []
    for d in first.directives:
        if d.option == "output":
            directives.append(Directive("output", _array_output(recipe.storage.log_dir)))
            directives.append(Directive("array", array))
        else:
            directives.append(d)
    warnings: list[str] = []
    if placement is not None and placement.mode == "pin" and placement.nodes:
        warnings.append(
            "sweep: every array task requests the same pinned nodes (--nodelist), so the tasks "
            "run one after another; use --mode constrain to let them run side by side"
        )
    for s in scripts:
        warnings.extend(w for w in s.warnings if w not in warnings)
    notes = (
        *first.notes,
        f"job array of {len(tasks)} tasks (--array={array})",
        *(f"task {t.index}: {t.checkpoint_dir} {t.overrides_json}" for t in tasks),
    )
    return dataclasses.replace(
        first,
        text=text,
        directives=tuple(directives),
        warnings=tuple(warnings),
        checkpoint_dir=f"{recipe.storage.checkpoint_root.rstrip('/')}/{recipe.name}/"
        f"{recipe.storage.run_id or recipe.name}-t<index>",
        notes=notes,
    )
