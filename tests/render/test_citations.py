"""Nothing shipped cites the internal reference sheets (issue 11 item 6, issue 12).

Citations in code, recipes, the README and generated scripts must be primary sources (a URL or
``owner/repo:path``) or a page of this repository: a reader of a job script on a cluster has no
access to the sheets the project was written from. The job templates
(``slurmfm/render/templates/``) are being rewritten into the Python job runtime (issue 11) and are
checked there; every part of a rendered script that ``slurmfm.render.script`` builds is checked
here, for every shipped recipe.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmfm.recipe.loader import load_recipe
from slurmfm.render.script import Target, render_script

REPO = Path(__file__).resolve().parents[2]
SHEETS = re.compile(
    r"aws-launch-facts|peer-launchers|slurm-topology-and-placement|slurm-on-one-host"
    r"|newer-slurm|simgrid\.md|one-host\.md|launchers\.md|placement\.md|facts\.md"
    r"|/work/shared/reference"
)
TEMPLATES = REPO / "slurmfm" / "render" / "templates"


def shipped_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    files += sorted((REPO / "recipes").rglob("*.yaml"))
    files += sorted(
        p
        for p in (REPO / "slurmfm").rglob("*")
        if p.is_file() and p.suffix in {".py", ".json", ".j2"} and TEMPLATES not in p.parents
    )
    return files


@pytest.mark.parametrize("path", shipped_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_file_names_no_sheet(path: Path) -> None:
    hits = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if SHEETS.search(line)
    ]
    assert hits == []


RECIPES = sorted((REPO / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_rendered_parts_name_no_sheet(path: Path) -> None:
    recipe = load_recipe(path)
    out = render_script(recipe, Target.for_recipe(recipe, "24.11"))
    parts = [
        *(d.text for d in out.directives),
        *(d.why or "" for d in out.directives),
        *(e.why for e in out.env),
        *(e.shell_value for e in out.env),
        *out.warnings,
        *out.notes,
        out.launch,
    ]
    assert [p for p in parts if SHEETS.search(p)] == []
