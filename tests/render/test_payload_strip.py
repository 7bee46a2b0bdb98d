"""The runtime payload carries ``slurmfm/job`` without its prose (slurmfm.render.payload,
``strip_source``): the same program, every statement on the line it has in the repository."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import slurmfm.job
from slurmfm.render.payload import strip_source

JOB = Path(slurmfm.job.__file__).parent
DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _without_docstrings(tree: ast.Module, *, keep_module: bool = False) -> str:
    """The tree's dump with every docstring's text made empty (what stripping leaves)."""
    for node in ast.walk(tree):
        if keep_module and isinstance(node, ast.Module):
            continue
        if isinstance(node, DOC_OWNERS) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                first.value.value = ""
    return ast.dump(tree)


def _statement_lines(tree: ast.Module) -> list[tuple[str, int]]:
    return [(type(n).__name__, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.stmt)]


@pytest.mark.parametrize("path", sorted(JOB.glob("*.py")), ids=lambda p: p.name)
def test_each_runtime_module_is_the_same_program_on_the_same_lines(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    stripped = strip_source(source)
    assert len(stripped.splitlines()) == len(source.splitlines())
    before, after = ast.parse(source), ast.parse(stripped)
    assert _statement_lines(after) == _statement_lines(before)
    keep = "__doc__" in source  # the runtime's --help reads its module docstring
    assert _without_docstrings(after, keep_module=keep) == _without_docstrings(
        before, keep_module=keep
    )
    assert "#" not in "".join(
        line for line in stripped.splitlines() if line.lstrip().startswith("#")
    )


def test_what_is_cut_and_what_is_kept() -> None:
    source = (
        '"""Module doc,\n'
        'two lines."""\n'
        "import os  # why os\n"
        "# a whole-line comment\n"
        "def f():\n"
        '    """Only a docstring."""\n'
        "\n"
        "class C:\n"
        "    '''Doc.\n"
        "\n"
        "    More.'''  # after the doc\n"
        "    x = '# not a comment'  # a comment\n"
        '    y = """a string\n'
        '# inside a string"""\n'
        'z = 1; """not a docstring"""\n'
    )
    assert strip_source(source) == (
        '""\n'
        "\n"
        "import os\n"
        "\n"
        "def f():\n"
        '    ""\n'
        "\n"
        "class C:\n"
        '    ""\n'
        "\n"
        "\n"
        "    x = '# not a comment'\n"
        '    y = """a string\n'
        '# inside a string"""\n'
        'z = 1; """not a docstring"""\n'
    )


def test_a_module_that_reads_its_docstring_keeps_it() -> None:
    source = '"""Help text."""\nimport argparse\np = argparse.ArgumentParser(description=__doc__)\n'
    assert strip_source(source) == source


def test_the_payload_is_smaller_than_the_sources() -> None:
    """Why strip at all: the prose is over a third of the runtime's bytes."""
    from slurmfm.render.payload import runtime_file

    total = sum(len(p.read_bytes()) for p in JOB.glob("*.py"))
    assert len(runtime_file().data) < total / 4
