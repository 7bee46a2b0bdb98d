"""The job runtime as one line of the batch script: a deterministic zipapp in base64.

Why embedded: a script submitted with plain ``sbatch`` must work where compute nodes do not
have slurmfm installed, and a requeued job must run the runtime it started with. Slurm stores
the batch script and a requeue runs those same bytes, so a runtime carried in the script cannot
change under a requeued job. The zip is deterministic (sorted entries, fixed timestamps and
modes), so the same slurmfm renders the same bytes and the sha256 in the line names them.

The batch script extracts the last line into a private file on the batch host, checks the
sha256, copies it to every node with ``sbcast``, and each step runs it only after checking the
opened file (:mod:`slurmfm.job.install`): the program is a file nobody else can change, never
argv, and never a file on the shared file system.
"""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Protocol

MARK = "# slurmfm-runtime"
PACKAGE = "slurmfm_job"  # the package's name inside the zip (relative imports only)
# The per-node entry ignores the save signal from its first instant: the checked program every
# step runs does that before it reads this file (slurmfm.job.install.CHECKED).
# The agents' step (``observe``, one per node, no options) goes straight to the agent: the
# command line's parser and option types (argparse, typing, a quarter of an agent's start-up
# CPU) are for the steps that have options.
_MAIN = (
    "import sys\n"
    "if sys.version_info < (3, 8):\n"
    "    sys.exit('slurmfm: the job runtime needs python3 >= 3.8, found ' + sys.version)\n"
    "if sys.argv[1:] == ['observe']:\n"
    f"    from {PACKAGE}.agent import main\n"
    "else:\n"
    f"    from {PACKAGE}.cli import main\n"
    "sys.exit(main())\n"
)


@dataclass(frozen=True)
class RuntimeFile:
    """A file the job needs beside its script (here: the runtime zipapp)."""

    name: str
    data: bytes = field(repr=False)
    sha256: str

    def __repr__(self) -> str:
        return f"RuntimeFile({self.name!r}, <{len(self.data):,} bytes>)"


def strip_source(source: str) -> str:
    """``source`` without its comments and docstrings, every statement on its own line number.

    Why: the payload is the script's last line (stored by slurmctld per job, and by slurmdbd
    with ``AccountingStoreFlags=job_script``), and the runtime's prose (docstrings and
    comments are over half of ``slurmfm/job``) is for its readers, who read the repository.
    Line numbers stay those of the repository's files, so a traceback from a job points at
    the reviewed source. A docstring becomes ``""`` on its first line (a body that held only
    a docstring stays a body), its other lines blank; a comment is cut from its line. A
    module that reads its own ``__doc__`` keeps its module docstring.
    """
    import ast  # here: only a build of the runtime needs them
    import tokenize

    lines = source.splitlines(keepends=True)
    cuts: dict[int, int] = {}  # 0-based line -> column where a comment starts
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cuts[tok.start[0] - 1] = tok.start[1]
    blank: set[int] = set()
    keep_module_doc = "__doc__" in source
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Module) and keep_module_doc:
            continue
        first = node.body[0] if node.body else None
        if not (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
            and first.end_lineno is not None
        ):
            continue
        start, end = first.lineno - 1, first.end_lineno - 1
        head = lines[start][: first.col_offset]
        tail = lines[end][first.end_col_offset or 0 :].strip()
        if head.strip() or (tail and not tail.startswith("#")):
            continue  # shares a line with code: left as it is
        lines[start] = f'{head}""\n'
        cuts.pop(start, None)
        blank.update(range(start + 1, end + 1))
    out = []
    for i, line in enumerate(lines):
        if i in blank:
            out.append("\n")
        elif i in cuts:
            code = line[: cuts[i]].rstrip()
            out.append(f"{code}\n" if code else "\n")
        else:
            out.append(line)
    return "".join(out)


def _job_sources() -> list[Path]:
    """The runtime's modules that go into the zip (its ``__main__`` is :data:`_MAIN`)."""
    job = Path(__file__).resolve().parent.parent / "job"
    return sorted(p for p in job.glob("*.py") if p.name != "__main__.py")


def _zip_names() -> list[str]:
    return sorted(["__main__.py"] + [f"{PACKAGE}/{p.name}" for p in _job_sources()])


def _zip_bytes() -> bytes:
    entries = {"__main__.py": _MAIN.encode()}
    for path in _job_sources():
        entries[f"{PACKAGE}/{path.name}"] = strip_source(path.read_text("utf-8")).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, entries[name], compresslevel=9)
    return buf.getvalue()


class RuntimeStore(Protocol):
    """Where built runtimes are kept between processes, by :func:`sources_key`."""

    def load(self, key: str) -> bytes | None: ...

    def save(self, key: str, data: bytes) -> None: ...


_store: RuntimeStore | None = None


def use_runtime_store(store: RuntimeStore | None) -> None:
    """Keep built runtimes in ``store`` (the CLI's cache, slurmfm/cli/cache.py), or nowhere.

    Why: stripping the runtime's ~40 modules (tokenize and ast over ~400 KB) and compressing
    them is ~0.35 s of CPU, more than half of a cold ``slurmfm render`` or ``submit``; the
    render cache helps only when the recipe and overrides are unchanged, while the runtime
    changes only with slurmfm. The renderer itself writes no files: the CLI gives it a store,
    as it gives jinja2 its bytecode cache; a library caller builds once per process.
    """
    global _store  # noqa: PLW0603 - one store per process, set by the CLI (as the jinja cache)
    _store = store
    runtime_file.cache_clear()


def sources_key() -> str:
    """What the zip is a function of: this module (the stripping and ``__main__``), the
    runtime's sources, and the Python that strips them (its tokenizer changes between
    versions). Reading and hashing them is ~1 ms."""
    h = hashlib.sha256(b"%d.%d\0" % sys.version_info[:2])
    for path in [Path(__file__).resolve(), *_job_sources()]:
        data = path.read_bytes()
        h.update(b"%s/%s\0%d\0" % (path.parent.name.encode(), path.name.encode(), len(data)))
        h.update(data)
    return h.hexdigest()


def _well_formed(data: bytes) -> bool:
    """A stored zip holds exactly the runtime's entries, each with its CRC intact (a cut or
    damaged file is built again, not shipped)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return zf.namelist() == _zip_names() and zf.testzip() is None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


def _built() -> bytes:
    store = _store
    if store is None:
        return _zip_bytes()
    key = sources_key()
    data = store.load(key)
    if data is None or not _well_formed(data):
        data = _zip_bytes()
        store.save(key, data)
    return data


@lru_cache(maxsize=1)
def runtime_file() -> RuntimeFile:
    data = _built()
    sha = hashlib.sha256(data).hexdigest()
    return RuntimeFile(f"{sha}.pyz", data, sha)


def payload_line(rf: RuntimeFile | None = None) -> str:
    """``# slurmfm-runtime sha256=<hex> <base64>``: the script's last line."""
    rf = rf or runtime_file()
    return f"{MARK} sha256={rf.sha256} {base64.b64encode(rf.data).decode('ascii')}"


def extract(script_text: str) -> bytes:
    """The runtime bytes from a rendered script (checks the sha256), for tests and tools."""
    last = script_text.rstrip("\n").rsplit("\n", 1)[-1]
    mark, sha, data = last.split(" ", 3)[1:] if last.startswith(MARK) else ("", "", "")
    if mark != "slurmfm-runtime" or not sha.startswith("sha256="):
        raise ValueError("no slurmfm runtime line at the end of the script")
    raw = base64.b64decode(data)
    if hashlib.sha256(raw).hexdigest() != sha.removeprefix("sha256="):
        raise ValueError("the runtime line's sha256 does not match its data")
    return raw
