"""The generated scripts match their reviewed copies in tests/golden/ (see golden_scripts.py).

On a difference the failure shows the diff. If the change is intended, run
``scripts/update-golden`` and commit tests/golden/ with the change that caused it.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from golden_scripts import GOLDEN_DIR, REPO_ROOT, expected_files

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
