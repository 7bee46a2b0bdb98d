"""The generated scripts match their reviewed copies in tests/golden/ (see golden_scripts.py).

On a difference the failure shows the diff. If the change is intended, run
``scripts/update-golden`` and commit tests/golden/ with the change that caused it.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from golden_scripts import GOLDEN_DIR, RECIPES, REPO_ROOT, expected_files

from slurmfm import api
from slurmfm.render.payload import extract, runtime_file

EXPECTED = expected_files()
HINT = "if intended: scripts/update-golden, then commit tests/golden/"


@pytest.mark.parametrize("path", sorted(EXPECTED), ids=lambda p: p.name)
def test_generated_script_matches_golden(path: Path) -> None:
    rel = path.relative_to(REPO_ROOT)
    if not path.is_file():
        pytest.fail(f"{rel} is missing; {HINT}")
    have = path.read_text(encoding="utf-8")
    want = EXPECTED[path]
    if have != want:
        diff = "".join(
            difflib.unified_diff(
                have.splitlines(keepends=True),
                want.splitlines(keepends=True),
                f"{rel} (reviewed)",
                f"{rel} (generated now)",
            )
        )
        pytest.fail(f"{rel} differs from what slurmfm generates now; {HINT}\n{diff[:20000]}")


def test_no_stale_golden_files() -> None:
    stale = sorted(p.name for p in GOLDEN_DIR.iterdir() if p not in EXPECTED)
    assert not stale, f"golden files of no recipe: {stale}; {HINT}"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_runtime_sha_and_payload_agree(recipe: Path) -> None:
    """What the goldens elide, checked on its own: the script exports the sha256 of the
    payload it carries, and the payload is this slurmfm's runtime (the batch step refuses a
    runtime whose sha256 differs: the template's ``sha256sum -c``)."""
    text = api.render(api.load(recipe)).text
    rf = runtime_file()
    assert f"\nexport SLURMFM_RUNTIME_SHA={rf.sha256}\n" in text
    assert (
        text.rstrip("\n").rsplit("\n", 1)[-1].startswith(f"# slurmfm-runtime sha256={rf.sha256} ")
    )
    assert extract(text) == rf.data
