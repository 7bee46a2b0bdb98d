"""A content-addressed cache of rendered scripts for the CLI's ``render``.

Why: rendering is a pure function of the recipe bytes, the ``--set`` overrides, the target
Slurm version and slurmfm's own code and templates, but a cold ``slurmfm render`` spends most
of its ~0.3 s importing and building pydantic models and compiling jinja2 templates. Users and
CI render the same recipe again and again (render, edit elsewhere, re-render, diff), so the
second and later renders of unchanged inputs come from here in a fraction of that, importing
neither pydantic nor jinja2 (``scripts/bench_cli.py`` shows both cold and warm times).

The key covers everything the output depends on: the recipe's path and bytes, overrides, the
requested Slurm version, every file of the slurmfm package (path, size, mtime), the files of
the libraries that shape the output (jinja2, pydantic, pydantic_core, ruamel.yaml) and the
Python version. Only successful renders are stored, with their warnings, which are replayed.
``secrets:`` values are never in a script; ``env:`` values are, so the directory is 0700 and
its entries 0600, as the history is. Disable with ``--no-cache`` or
``SLURMFM_NO_CACHE=1``; the location is ``$SLURMFM_CACHE_DIR`` or
``${XDG_CACHE_HOME:-~/.cache}/slurmfm/render``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import jinja2

FORMAT = "1"
MAX_ENTRIES = 256
_LIBS = ("jinja2", "pydantic", "pydantic_core", "ruamel.yaml")


class Entry(NamedTuple):
    """A stored render (NamedTuple, not a dataclass: dataclasses imports inspect, ~5 ms)."""

    text: str
    warnings: tuple[str, ...]


def enabled() -> bool:
    return os.environ.get("SLURMFM_NO_CACHE", "") not in ("1", "true", "yes")


def cache_dir() -> Path:
    explicit = os.environ.get("SLURMFM_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slurmfm" / "render"


def _package_fingerprint(h: hashlib._Hash) -> None:
    root = Path(__file__).resolve().parent.parent  # the slurmfm package
    stack = [root]
    entries: list[tuple[str, int, int]] = []
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        stack.append(Path(e.path))
                elif e.name.endswith((".py", ".j2", ".json", ".yaml")):
                    st = e.stat()
                    entries.append((os.path.relpath(e.path, root), st.st_size, st.st_mtime_ns))
    for rel, size, mtime in sorted(entries):
        h.update(f"{rel}\0{size}\0{mtime}\n".encode())


def _library_fingerprint(h: hashlib._Hash) -> None:
    """Where each library's package file is and when it changed, without importing it."""
    from importlib.util import find_spec

    for name in _LIBS:
        try:
            spec = find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
        if origin and os.path.exists(origin):
            st = os.stat(origin)
            h.update(f"{name}\0{origin}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        else:
            h.update(f"{name}\0missing\n".encode())


def key(recipe_path: str, overrides: tuple[str, ...], slurm_version: str | None) -> str | None:
    """The cache key for rendering ``recipe_path``; None when the file cannot be read."""
    from slurmfm.errors import SlurmfmError
    from slurmfm.fsutil import read_bounded

    try:
        data = read_bounded(recipe_path)  # never a FIFO's hang or /dev/zero's OOM
    except (OSError, SlurmfmError):
        return None
    h = hashlib.sha256()
    h.update(f"format {FORMAT}\npython {sys.version}\n".encode())
    h.update(b"recipe " + os.fsencode(os.path.abspath(recipe_path)) + b"\n")
    h.update(hashlib.sha256(data).digest())
    h.update(json.dumps([list(overrides), slurm_version]).encode())
    _package_fingerprint(h)
    _library_fingerprint(h)
    return h.hexdigest()


def _private_dir() -> Path:
    """The cache directory, made 0700 (an older one closed): a script holds the recipe's
    ``env:`` values, and a token put there instead of under ``secrets:`` must not be readable
    by the rest of the machine (as the history, slurmfm/history.py). Raises OSError when it
    is a link or another user's."""
    from slurmfm.job import fsafe

    d = cache_dir()
    d.parent.mkdir(parents=True, exist_ok=True)
    if fsafe.private_dir(str(d)):  # it was open: close what an older slurmfm left
        for e in os.scandir(d):  # entries an older slurmfm made 0644
            if e.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.chmod(e.path, 0o600)
    return d


def get(k: str) -> Entry | None:
    from slurmfm.job import fsafe

    try:
        path = _private_dir() / f"{k}.json"
        raw = json.loads(fsafe.read(str(path), limit=64 << 20).decode("utf-8"))
        return Entry(text=str(raw["text"]), warnings=tuple(str(w) for w in raw["warnings"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def put(k: str, text: str, warnings: tuple[str, ...]) -> None:
    """Store an entry atomically; a cache that cannot be written is silently skipped."""
    from slurmfm.job import fsafe

    try:
        d = _private_dir()
        data = json.dumps({"text": text, "warnings": list(warnings)})
        fsafe.replace(str(d / f"{k}.json"), data, mode=0o600)
        _prune(d)
    except OSError:
        return


def _prune(d: Path, suffix: str = ".json", keep: int = MAX_ENTRIES) -> None:
    """Remove all but the newest ``keep`` files of ``d`` named ``*suffix``."""
    files = [e for e in os.scandir(d) if e.name.endswith(suffix)]
    if len(files) <= keep:
        return
    files.sort(key=lambda e: e.stat().st_mtime_ns)
    for e in files[: len(files) - keep]:
        with contextlib.suppress(OSError):
            os.unlink(e.path)


def template_bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept on disk, as Python keeps ``__pycache__``, under
    ``cache_dir()/templates`` (mode 0700); None when caching is off or the directory cannot be
    made.

    Why: compiling the templates to Python and then to bytecode is ~50 ms of every cold
    ``slurmfm render`` (measured with cProfile on the largest recipe); loading the marshalled
    code takes ~1 ms. Jinja keys each entry on the template's name and a checksum of its source,
    and stamps it with jinja's and Python's bytecode versions, so an edited template or a new
    interpreter simply compiles again. Why here and not in the renderer: the renderer writes no
    files; the CLI decides where its cache lives (a library caller gets no cache unless it asks
    with :func:`slurmfm.render.script.use_bytecode_cache`). A write that fails only costs the
    compile time.
    """
    if not enabled():
        return None
    import jinja2

    directory = cache_dir() / "templates"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None

    class _Quiet(jinja2.FileSystemBytecodeCache):
        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    return _Quiet(str(directory))


RUNTIMES_KEPT = 4


class RuntimeStore:
    """Built job runtimes (zipapps) under ``cache_dir()/runtime``, one file per
    :func:`slurmfm.render.payload.sources_key`: a cold render or submit then loads ~100 KB
    instead of stripping and compressing the runtime's sources again (~0.35 s of CPU).

    The directory is private (0700, this user's, not a link) like the render cache, which
    holds whole scripts, runtime included; a file is read only when it is this user's own
    regular file, and the payload checks what it loads (:func:`slurmfm.render.payload
    ._well_formed`). The newest :data:`RUNTIMES_KEPT` stay (one per slurmfm version in use).
    A store that cannot be read or written costs only the build.
    """

    def _dir(self) -> Path:
        from slurmfm.job import fsafe

        d = _private_dir() / "runtime"
        fsafe.private_dir(str(d))
        return d

    def load(self, key: str) -> bytes | None:
        from slurmfm.job import fsafe

        try:
            return fsafe.read(str(self._dir() / f"{key}.pyz"), limit=16 << 20, private=True)
        except OSError:
            return None

    def save(self, key: str, data: bytes) -> None:
        from slurmfm.job import fsafe

        try:
            d = self._dir()
            fsafe.replace(str(d / f"{key}.pyz"), data, mode=0o600)
            _prune(d, ".pyz", RUNTIMES_KEPT)
        except OSError:
            return


def install_template_cache() -> None:
    """Give the renderer the CLI's caches (before the first render of this process): compiled
    templates, and built runtimes (:class:`RuntimeStore`), unless caching is off."""
    from slurmfm.render.payload import use_runtime_store
    from slurmfm.render.script import use_bytecode_cache

    use_bytecode_cache(template_bytecode_cache())
    use_runtime_store(RuntimeStore() if enabled() else None)
