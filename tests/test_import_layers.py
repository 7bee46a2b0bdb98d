"""The layers of issue 43 ("resolve once"): no import runs back up, no import cycle spans two
folders, and the walk of a shipped recipe from ``api.dry_run`` climbs back up at most 12
times. The layers, the import reader and the walk are ``scripts/bench_structure.py``'s
(its docstring defines each), so the report and these tests measure the same thing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurmfm import api

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_structure as bs

ROOT = Path(__file__).resolve().parents[1] / "slurmfm"
RECIPES = sorted((ROOT.parent / "recipes").glob("*.yaml"))


def test_every_folder_and_top_module_has_a_layer() -> None:
    assert bs.unplaced(ROOT) == []


def test_no_import_runs_back_up() -> None:
    assert bs.back_up_arrows(ROOT) == []


def test_no_import_cycle_spans_two_folders() -> None:
    assert bs.folder_cycles(ROOT) == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "slurmfm"
    for name, text in {"__init__.py": "", **files}.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_the_check_sees_an_import_that_runs_back_up(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "render/__init__.py": "",
            "render/quote.py": "def q(): ...\n",
            "launchers/__init__.py": "",
            # in a function body: runs when called; under TYPE_CHECKING: never runs
            "launchers/base.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from slurmfm.render.quote import q\n"
                "def f():\n"
                "    from slurmfm.render.quote import q\n"
                "    return q\n"
            ),
            "recipe/__init__.py": "",
            "recipe/x.py": "from slurmfm.launchers import base\n",  # downwards: fine
        },
    )
    assert bs.back_up_arrows(pkg) == [
        "slurmfm/launchers/base.py:5 launchers/ -> render/ (slurmfm.render.quote)"
    ]
    (pkg / "newfolder").mkdir()
    (pkg / "newfolder" / "__init__.py").write_text("")
    assert bs.unplaced(pkg) == ["newfolder/"]


def test_the_check_sees_a_cycle(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "a/__init__.py": "",
            "b/__init__.py": "",
            "a/x.py": "from slurmfm.b.y import Y\n",
            "b/y.py": "from slurmfm.a import x\nY = 1\n",
        },
    )
    assert bs.folder_cycles(pkg) == [["a/", "b/"]]


def test_climbs_count_the_steps_up() -> None:
    assert bs.climbs(["api", "request", "resolve", "render/", "catalog/", "render/"]) == 2
    assert bs.climbs(["api", "request", "render/"]) == 0


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_the_walk_of_a_shipped_recipe_climbs_back_up_at_most_12_times(path: Path) -> None:
    passed, reads, _lookups = bs.walk(api.load(path), ROOT)
    assert passed[:2] == ["api", "request"]  # the walk starts where dry_run does
    assert "render/" in passed
    assert bs.climbs(passed) <= bs.MAX_CLIMBS, passed
    assert bs.climbs(reads) >= bs.climbs(passed)
