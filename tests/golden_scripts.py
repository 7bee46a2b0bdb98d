"""The generated script of every shipped recipe, kept in ``tests/golden/`` as reviewed files.

Why: what users receive is the generated job script; a change to a template, a catalog fact or
a default changes it, and that change must show up as a diff in review, not only as a green
test. Per recipe ``recipes/NAME.yaml``:

* ``tests/golden/NAME.sh``: the script rendered from the recipe as written;
* ``tests/golden/NAME.variants.diff``: for every cluster flavor and Slurm version that
  ``tests/test_recipes.py`` renders, the unified diff from that script (small, and it shows
  exactly what a flavor or version changes).

``scripts/update-golden`` rewrites them from the current code; ``tests/test_golden.py`` fails
with the diff when they differ. Rendering is a pure function of the recipe and slurmfm's code,
so the files do not depend on the machine; the checkout's path is written ``<checkout>``.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from slurmfm import api

REPO_ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = REPO_ROOT / "tests" / "golden"
RECIPES = sorted((REPO_ROOT / "recipes").glob("*.yaml"))
FLAVORS = ("parallelcluster", "pcs", "hyperpod", "generic")
SLURM_VERSIONS = ("22.05", "24.11", "25.11")


def render(recipe: Path, overrides: dict[str, object] | None = None) -> str:
    """The script, with the checkout's path written ``<checkout>``: a recipe's relative paths
    resolve against its file (slurmfm.recipe.loader.resolve_paths), so the lab recipes' paths
    are absolute and would otherwise name this machine's checkout."""
    text = api.render(api.load(recipe, overrides=overrides or {})).text
    return elide_payload(text.replace(str(REPO_ROOT), "<checkout>"))


RUNTIME_SHA = "<runtime sha256>"


def elide_payload(text: str) -> str:
    """The script with the job runtime's sha256 and its base64 zipapp (the last line) elided.

    Why: the runtime's own sources (``slurmfm/job/``) are reviewed as code and tested in
    ``tests/job``; a base64 blob in a diff shows nothing to a reviewer, and a sha256 that
    changes with every runtime commit rewrote every golden file for a change to none of the
    scripts. ``tests/test_golden.py::test_runtime_sha_and_payload_agree`` checks the elided
    parts separately: the exported sha256 is the payload's, and the payload is the runtime.
    """
    head, sep, last = text.rstrip("\n").rpartition("\n")
    words = last.split(" ")
    if not sep or words[:2] != ["#", "slurmfm-runtime"] or len(words) != 4:
        return text
    sha = words[2].removeprefix("sha256=")
    head = head.replace(
        f"export SLURMFM_RUNTIME_SHA={sha}\n", f"export SLURMFM_RUNTIME_SHA={RUNTIME_SHA}\n"
    )
    return f"{head}\n# slurmfm-runtime sha256={RUNTIME_SHA} <base64 zipapp of slurmfm/job>\n"


def variants(recipe: Path, base: str) -> str:
    """Every flavor x version, as a diff from ``base`` (the recipe as written)."""
    out = [
        f"# {recipe.name}: the generated script per cluster.flavor and cluster.slurm_version,\n",
        f"# as a diff from {recipe.stem}.sh (the recipe as written). scripts/update-golden\n",
        "# writes this file.\n",
    ]
    for flavor in FLAVORS:
        for version in SLURM_VERSIONS:
            text = render(recipe, {"cluster.flavor": flavor, "cluster.slurm_version": version})
            out.append(f"\n### cluster.flavor={flavor} cluster.slurm_version={version}\n")
            diff = list(
                difflib.unified_diff(
                    base.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    f"{recipe.stem}.sh",
                    f"{recipe.stem} {flavor} {version}",
                    n=1,
                )
            )
            if not diff:
                out.append("(same as the recipe as written)\n")
            for line in diff:
                out.append(
                    line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                )
    return "".join(out)


def expected_files() -> dict[Path, str]:
    """Every golden file's path and the text the current code produces for it."""
    files: dict[Path, str] = {}
    for recipe in RECIPES:
        base = render(recipe)
        files[GOLDEN_DIR / f"{recipe.stem}.sh"] = base
        files[GOLDEN_DIR / f"{recipe.stem}.variants.diff"] = variants(recipe, base)
    return files


def update() -> list[str]:
    """Write every golden file, delete those of recipes that are gone; return what changed."""
    GOLDEN_DIR.mkdir(exist_ok=True)
    want = expected_files()
    changed = []
    for path, text in want.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(f"wrote {path.relative_to(REPO_ROOT)}")
    for path in sorted(GOLDEN_DIR.iterdir()):
        if path not in want:
            path.unlink()
            changed.append(f"removed {path.relative_to(REPO_ROOT)}")
    return changed
