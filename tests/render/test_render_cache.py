"""The CLI's render cache: same inputs give the same text without rendering; any input change
renders afresh; warnings are replayed; failures are never stored."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmfm.cli import cache as render_cache

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "llama3-70b-p5en-megatron.yaml"


def cli(
    tmp: Path, *args: str, importtime: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "SLURMFM_CACHE_DIR": str(tmp / "cache"), **env}
    e.pop("SLURMFM_NO_CACHE", None)
    e.update(env)
    pre = ["-X", "importtime"] if importtime else []
    return subprocess.run(
        [sys.executable, *pre, "-m", "slurmfm.cli", "render", *args],
        env=e,
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )


def imported(stderr: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if "import time:" in line}


def test_second_render_comes_from_the_cache(tmp_path: Path) -> None:
    first = cli(tmp_path, str(RECIPE), importtime=True)
    assert first.returncode == 0, first.stderr
    assert "pydantic" in imported(first.stderr)
    second = cli(tmp_path, str(RECIPE), importtime=True)
    assert second.returncode == 0
    assert second.stdout == first.stdout
    mods = imported(second.stderr)
    assert "pydantic" not in mods
    assert "jinja2" not in mods
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1


def test_every_input_is_part_of_the_key(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(RECIPE.read_bytes())
    base = render_cache.key(str(recipe), (), None)
    assert base is not None
    assert render_cache.key(str(recipe), ("resources.nodes=8",), None) != base
    assert render_cache.key(str(recipe), (), "22.05") != base
    recipe.write_bytes(RECIPE.read_bytes() + b"\n# edited\n")
    assert render_cache.key(str(recipe), (), None) != base
    assert render_cache.key(str(tmp_path / "missing.yaml"), (), None) is None


def test_a_changed_package_file_changes_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copy of the package stands in for it: a test never touches a tracked file, not even
    # its mtime (a parallel run would render with a key that is briefly wrong).
    package = tmp_path / "pkg" / "slurmfm"
    original = Path(render_cache.__file__).resolve()
    root = original.parent.parent  # the slurmfm package (the cache is slurmfm/cli/cache.py)
    shutil.copytree(root, package)
    monkeypatch.setattr(render_cache, "__file__", str(package / original.relative_to(root)))
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(RECIPE.read_bytes())
    before = render_cache.key(str(recipe), (), None)
    template = package / "render" / "templates" / "sbatch.sh.j2"
    st = template.stat()
    os.utime(template, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert render_cache.key(str(recipe), (), None) != before
    os.utime(template, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert render_cache.key(str(recipe), (), None) == before


def test_overrides_and_warnings_replayed(tmp_path: Path) -> None:
    args = (str(RECIPE), "--set", "resilience.save_before_timeout_s=3600")
    first = cli(tmp_path, *args, "--set", "resources.time_limit=10")
    assert first.returncode == 0, first.stderr
    assert "warning: resilience.save_before_timeout_s" in first.stderr
    second = cli(tmp_path, *args, "--set", "resources.time_limit=10", importtime=True)
    assert second.stdout == first.stdout
    assert "pydantic" not in imported(second.stderr)
    assert "warning: resilience.save_before_timeout_s" in second.stderr
    other = cli(tmp_path, *args, "--set", "resources.time_limit=20")
    assert "#SBATCH --time=20" in other.stdout


def test_errors_are_not_cached(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(RECIPE.read_text().replace("nodes: 16", "nodes: -1"))
    for _ in range(2):
        proc = cli(tmp_path, str(bad))
        assert proc.returncode == 2
        assert "resources.nodes" in proc.stderr
    assert not list((tmp_path / "cache").glob("*.json"))


def test_no_cache_switches(tmp_path: Path) -> None:
    cli(tmp_path, str(RECIPE))
    flag = cli(tmp_path, "--no-cache", str(RECIPE), importtime=True)
    assert "pydantic" in imported(flag.stderr)
    env = cli(tmp_path, str(RECIPE), importtime=True, SLURMFM_NO_CACHE="1")
    assert "pydantic" in imported(env.stderr)


def test_unwritable_cache_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file where the directory should be")
    proc = cli(tmp_path, str(RECIPE))
    assert proc.returncode == 0
    assert proc.stdout.startswith("#!/bin/bash")


def test_compiled_templates_are_kept_and_change_nothing(tmp_path: Path) -> None:
    """Jinja bytecode lands in <cache>/templates; a render from it equals one without it."""
    fresh = cli(tmp_path, "--no-cache", str(RECIPE))
    assert fresh.returncode == 0, fresh.stderr
    compiled = sorted((tmp_path / "cache" / "templates").glob("__jinja2_*.cache"))
    assert compiled
    assert (tmp_path / "cache" / "templates").stat().st_mode & 0o777 == 0o700
    from_bytecode = cli(tmp_path, "--no-cache", str(RECIPE))
    assert from_bytecode.stdout == fresh.stdout
    off = tmp_path / "off"
    without = cli(off, str(RECIPE), SLURMFM_NO_CACHE="1")
    assert without.stdout == fresh.stdout
    assert not (off / "cache").exists()


def test_corrupt_compiled_templates_are_recompiled(tmp_path: Path) -> None:
    """Jinja checks each entry's magic and source checksum; garbage is compiled over."""
    good = cli(tmp_path, "--no-cache", str(RECIPE))
    for f in (tmp_path / "cache" / "templates").glob("__jinja2_*.cache"):
        f.write_bytes(b"not bytecode")
    again = cli(tmp_path, "--no-cache", str(RECIPE))
    assert again.returncode == 0, again.stderr
    assert again.stdout == good.stdout


def test_built_runtimes_are_kept_and_change_nothing(tmp_path: Path) -> None:
    """The job runtime a cold render builds lands in <cache>/runtime (0700, 0600 files); the
    next cold render takes it from there instead of stripping the sources again, and prints the
    same script as a render with every cache off."""
    fresh = cli(tmp_path, "--no-cache", str(RECIPE))
    assert fresh.returncode == 0, fresh.stderr
    store = tmp_path / "cache" / "runtime"
    kept = list(store.glob("*.pyz"))
    assert len(kept) == 1
    assert store.stat().st_mode & 0o777 == 0o700
    assert kept[0].stat().st_mode & 0o777 == 0o600
    before = kept[0].stat()
    again = cli(tmp_path, "--no-cache", str(RECIPE))
    assert again.stdout == fresh.stdout
    # loaded, not built again: a build would have replaced the file
    after = kept[0].stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    off = tmp_path / "off"
    without = cli(off, str(RECIPE), SLURMFM_NO_CACHE="1")
    assert without.stdout == fresh.stdout
    assert not (off / "cache").exists()


def test_a_damaged_or_foreign_runtime_is_built_again(tmp_path: Path) -> None:
    """A stored runtime that is cut, carries other entries, or is a link is not shipped: the
    render builds the runtime afresh and stores that."""
    import io
    import zipfile

    fresh = cli(tmp_path, "--no-cache", str(RECIPE))
    (kept,) = (tmp_path / "cache" / "runtime").glob("*.pyz")
    good = kept.read_bytes()
    other = io.BytesIO()
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("__main__.py", "print('not the runtime')\n")
    decoy = tmp_path / "decoy.pyz"
    decoy.write_bytes(other.getvalue())
    for plant in ("cut", "foreign", "link"):
        kept.unlink()
        if plant == "cut":
            kept.write_bytes(good[: len(good) // 2])
        elif plant == "foreign":
            kept.write_bytes(other.getvalue())
        else:
            kept.symlink_to(decoy)
        if plant != "link":
            kept.chmod(0o600)
        again = cli(tmp_path, "--no-cache", str(RECIPE))
        assert again.returncode == 0, again.stderr
        assert again.stdout == fresh.stdout, plant
        assert not kept.is_symlink(), plant
        assert kept.read_bytes() == good, plant


def test_the_runtime_store_keeps_the_newest_few(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("SLURMFM_CACHE_DIR", str(tmp_path / "cache"))
    store = render_cache.RuntimeStore()
    for i in range(render_cache.RUNTIMES_KEPT + 3):
        store.save(f"k{i}", b"PK%d" % i)
        os.utime(tmp_path / "cache" / "runtime" / f"k{i}.pyz", ns=(i * 10**9, i * 10**9))
    store.save("last", b"PK")
    names = sorted(p.name for p in (tmp_path / "cache" / "runtime").glob("*.pyz"))
    assert len(names) == render_cache.RUNTIMES_KEPT
    assert "last.pyz" in names
    assert "k0.pyz" not in names
    assert store.load("last") == b"PK"
    assert store.load("k0") is None
