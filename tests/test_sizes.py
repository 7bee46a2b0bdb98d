"""No function in ``slurmfm/`` over 100 lines (issue 43, "sizes kept by a tool"), and no
class in the job runtime over 500 (issue 37, item 7).

Why a test beside ruff's PLR0915 (``ruff.toml``): ruff counts statements, and a function can
stay under that count while it grows long (big f-string blocks, long literals, comments); the
line count is what a reader pays. The job runtime (``slurmfm/job``) was left to its own issue
until its batch step, one class of 1,245 lines, was taken apart by phase; its classes are
held to 500 lines so that it stays apart.
"""

from __future__ import annotations

import ast
import textwrap
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "slurmfm"
MAX_LINES = 100
EXEMPT_DIRS: tuple[str, ...] = ()  # none now (the job runtime was split: issue 37, item 7)
MAX_CLASS_LINES = 500
CLASS_DIRS = ("job",)  # where the class limit holds: the job runtime

# (file under slurmfm/, qualified name) of functions allowed over MAX_LINES: none since
# issue 43 split the last (render/script.py:render_script, 163 lines). An entry that is no
# longer over the limit fails test_allowlist_is_not_stale: delete it then.
ALLOWED: set[tuple[str, str]] = set()


def class_lengths(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every class in ``source``, nested ones
    included, measured as functions are (``class`` line to last line)."""
    out: list[tuple[str, int, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            end = node.end_lineno if node.end_lineno is not None else node.lineno
            out.append((node.name, node.lineno, end - node.lineno + 1))
    return out


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function and method in ``source``,
    nested ones included; a function's lines run from ``def`` to its last line
    (``end_lineno - lineno + 1``, decorators left out)."""
    out: list[tuple[str, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                end = child.end_lineno if child.end_lineno is not None else child.lineno
                out.append((name, child.lineno, end - child.lineno + 1))
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


@cache
def _package_functions() -> list[tuple[str, str, int, int]]:
    """(file under slurmfm/, qualified name, line, lines) outside the exempt folders (parsed
    once per session)."""
    found: list[tuple[str, str, int, int]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in EXEMPT_DIRS:
            continue
        for name, line, length in function_lengths(path.read_text(encoding="utf-8")):
            found.append((rel.as_posix(), name, line, length))
    return found


def test_no_function_over_the_limit() -> None:
    too_long = [
        f"slurmfm/{file}:{line}: {name} is {length} lines (at most {MAX_LINES})"
        for file, name, line, length in _package_functions()
        if length > MAX_LINES and (file, name) not in ALLOWED
    ]
    assert not too_long, "split these functions:\n" + "\n".join(too_long)


def test_no_job_runtime_class_over_the_limit() -> None:
    too_long = [
        f"slurmfm/{path.relative_to(PACKAGE).as_posix()}:{line}: class {name} is {length} "
        f"lines (at most {MAX_CLASS_LINES})"
        for folder in CLASS_DIRS
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for name, line, length in class_lengths(path.read_text(encoding="utf-8"))
        if length > MAX_CLASS_LINES
    ]
    assert not too_long, "split these classes:\n" + "\n".join(too_long)


def test_the_job_runtime_is_measured() -> None:
    """The job runtime is under both rules: its functions are in what the function rule
    reads, and the class rule finds its classes (a rule reading nothing passes anything)."""
    files = {file for file, _, _, _ in _package_functions()}
    assert "job/batch.py" in files
    assert "job/batch_launch.py" in files
    batch = (PACKAGE / "job" / "batch.py").read_text(encoding="utf-8")
    assert any(name == "Batch" for name, _, _ in class_lengths(batch))


@pytest.mark.parametrize(
    ("body_lines", "flagged"), [(MAX_CLASS_LINES - 2, False), (MAX_CLASS_LINES - 1, True)]
)
def test_the_class_measure_counts_class_to_last_line(body_lines: int, flagged: bool) -> None:
    """``class`` line, docstring line and the body: 498 body lines make 500 (allowed), 499
    make 501 (flagged)."""
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    source = 'class Big:\n    """Doc."""\n' + body
    ((name, _, length),) = class_lengths(source)
    assert name == "Big"
    assert length == body_lines + 2
    assert (length > MAX_CLASS_LINES) is flagged


def test_allowlist_is_not_stale() -> None:
    longest: dict[tuple[str, str], int] = {}
    for file, name, _, length in _package_functions():
        longest[(file, name)] = max(length, longest.get((file, name), 0))
    stale = [
        f"slurmfm/{file}: {name} "
        + (
            f"is {longest[(file, name)]} lines now: remove it from ALLOWED"
            if (file, name) in longest
            else "no longer exists: remove it from ALLOWED"
        )
        for file, name in sorted(ALLOWED)
        if longest.get((file, name), 0) <= MAX_LINES
    ]
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize(("body_lines", "flagged"), [(MAX_LINES - 1, False), (MAX_LINES, True)])
def test_the_measure_counts_def_to_last_line(body_lines: int, flagged: bool) -> None:
    """The boundary the rule enforces: a ``def`` line plus 99 body lines is 100 (allowed), plus
    100 is 101 (flagged); methods and nested functions are measured under their qualified
    names."""
    body = "".join(f"    x{i} = {i}\n" for i in range(body_lines))
    source = textwrap.dedent(
        """
        class Holder:
            def method(self) -> None:
                def inner() -> None:
                    pass
        """
    ) + ("def long_one() -> None:\n" + body)
    lengths = {name: length for name, _, length in function_lengths(source)}
    assert lengths["Holder.method"] == 3
    assert lengths["Holder.method.inner"] == 2
    assert lengths["long_one"] == body_lines + 1
    assert (lengths["long_one"] > MAX_LINES) is flagged
