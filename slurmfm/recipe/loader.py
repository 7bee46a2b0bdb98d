"""Load recipes from YAML files or dicts, with every error located as ``FILE:LINE: field: message``.

Why ruamel.yaml: its composed nodes keep the line of every key and list item, so a schema
error deep in ``launcher.model_args`` still points at the line the user must edit, and it reads
YAML 1.2 (``on`` and ``no`` stay strings, ``1:30:00`` is not sexagesimal). Why
overrides act on the raw data: an override is then validated exactly like a value in the file,
and its errors name the override instead of a line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from slurmfm.errors import Problem, RecipeError
from slurmfm.launchers import SPECS
from slurmfm.recipe.schema import Recipe

Path_ = tuple[str | int, ...]
LineMap = dict[Path_, int]

_FIELD_PREFIX = re.compile(r"^(?P<field>[a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*): (?P<msg>.*)$", re.S)


_MERGE_TAG = "tag:yaml.org,2002:merge"
# A recipe is a few hundred nodes; aliases could expand a small file exponentially ("billion
# laughs"), so the walk stops long before that.
_MAX_NODES = 200_000
# The deepest field of the schema is four levels down; 64 leaves room for odd data and stops
# a file nested hundreds deep long before Python's recursion limit.
_MAX_DEPTH = 64


class _Walk:
    """Turn a composed YAML node tree into plain dicts/lists, recording each key's line.

    Why compose, then walk: ruamel.yaml's ``safe`` composer runs in C (libyaml through
    ruamel.yaml.clib) where the round-trip loader is pure Python: about 4 ms instead of ~27 ms
    for the largest recipe. Nodes still carry their marks, so every key and list item keeps its
    line, and scalars are typed by ruamel's YAML 1.2 resolver exactly as before (``on`` and
    ``1:30`` stay strings). Without the C extension ruamel falls back to the same Python code.
    """

    def __init__(self, constructor: Any, source: str) -> None:
        self.constructor = constructor
        self.source = source
        self.lines: LineMap = {(): 1}
        self.count = 0
        self.active: set[int] = set()

    def fail(self, node: Any, msg: str) -> RecipeError:
        return RecipeError(
            [Problem(self.source, node.start_mark.line + 1, "(yaml)", f"invalid YAML: {msg}")]
        )

    def pairs(self, node: Any) -> list[tuple[Any, Any]]:
        """A mapping's (key node, value node) pairs with ``<<`` merges resolved.

        As in YAML's merge-key spec: explicit keys win over merged ones, and among merged
        mappings the first listed wins.
        """
        explicit: list[tuple[Any, Any]] = []
        merged: list[tuple[Any, Any]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                explicit.append((key_node, value_node))
                continue
            sources = value_node.value if value_node.id == "sequence" else [value_node]
            for src in sources:
                if src.id != "mapping":
                    raise self.fail(src, "a merge key (<<) takes a mapping or a list of them")
                merged.extend(self.pairs(src))
        return explicit + merged

    def walk(self, node: Any, path: Path_) -> Any:
        self.count += 1
        if self.count > _MAX_NODES:
            raise self.fail(node, f"more than {_MAX_NODES} values (alias expansion?)")
        if node.id == "scalar":
            value = self.constructor.construct_object(node, deep=True)
            if _is_env_value(path) and not isinstance(value, str) and value is not None:
                return node.value  # as written: 3.10, 0123, 0x1F, 1e400, true
            return value
        if len(path) >= _MAX_DEPTH:
            raise self.fail(node, f"nested more than {_MAX_DEPTH} levels deep")
        if id(node) in self.active:
            raise self.fail(node, "an alias refers to a value that contains it")
        self.active.add(id(node))
        try:
            if node.id == "sequence":
                items: list[Any] = []
                for i, item in enumerate(node.value):
                    self.lines[path + (i,)] = item.start_mark.line + 1
                    items.append(self.walk(item, path + (i,)))
                return items
            out: dict[Any, Any] = {}
            first_line: dict[str, int] = {}
            explicit = {id(k) for k, _ in node.value}
            for key_node, value_node in self.pairs(node):
                if key_node.id != "scalar":
                    raise self.fail(key_node, "a key must be a plain value, not a list or mapping")
                raw = self.constructor.construct_object(key_node, deep=True)
                key = raw if isinstance(raw, str) else str(raw)
                line = key_node.start_mark.line + 1
                if key in first_line:
                    if id(key_node) not in explicit:
                        continue  # a merged key under an explicit one (or an earlier merge)
                    raise self.fail(
                        key_node, f"duplicate key {key!r} (first at line {first_line[key]})"
                    )
                first_line[key] = line
                self.lines[path + (key,)] = line
                out[key] = self.walk(value_node, path + (key,))
            return out
        finally:
            self.active.discard(id(node))


def _is_env_value(path: Path_) -> bool:
    """Whether ``path`` leads to an environment variable's value.

    ``env.NAME`` in a recipe, or a dotted ``env.NAME`` key (a sweep task or grid, a pipeline
    stage's overrides). Why such values keep their source text: YAML would read ``3.10`` as
    3.1, ``0123`` as 123, ``0x1F`` as 31, ``1e400`` as inf and ``true`` as a boolean, and the
    job would see something other than what the user wrote.
    """
    if len(path) == 2 and path[0] == "env":
        return True
    keys = [p for p in path if isinstance(p, str)]
    return bool(keys) and keys[-1].startswith("env.")


def parse_yaml(text: str, source: str) -> tuple[Any, LineMap]:
    """Parse YAML text into plain data and a map of field path -> line (1-based)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    yaml = YAML(typ="safe")
    try:
        root = yaml.compose(text)
        if root is None:
            return None, {(): 1}
        walker = _Walk(yaml.constructor, source)
        data = walker.walk(root, ())
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        msg = (exc.problem or str(exc)).strip()
        if exc.context and msg.startswith("but "):  # "... in the stream but found another ..."
            msg = f"{exc.context.strip()} {msg}"
        raise RecipeError([Problem(source, line, "(yaml)", f"invalid YAML: {msg}")]) from None
    except YAMLError as exc:
        raise RecipeError([Problem(source, None, "(yaml)", f"invalid YAML: {exc}")]) from None
    except RecursionError:  # the composer itself, on thousands of nested brackets
        raise RecipeError(
            [Problem(source, 1, "(yaml)", f"invalid YAML: nested more than {_MAX_DEPTH} levels")]
        ) from None
    return data, walker.lines


def _locate(loc: Sequence[str | int], data: Any, lines: LineMap) -> tuple[str, int | None]:
    """Map a pydantic error location onto the data path and the nearest known line.

    Discriminated unions add their tag (``launcher.torchrun.script``) and function validators
    add their own names; elements that are not keys of the data are skipped.
    """
    path: list[str | int] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:  # noqa: SIM114 - different types
            path.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            path.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, str) and part.isdigit():
            # "sweep.tasks.2: ..." from a model validator's message names a list item.
            idx = int(part)
            path.append(idx)
            cur = cur[idx] if idx < len(cur) else None
        elif isinstance(part, str) and (part in SPECS or "[" in part or "function-" in part):
            continue  # a launcher's tag (the registry's kinds), a union member, a validator
        else:
            path.append(part)
            cur = None
    line = None
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in lines:
            line = lines[tuple(path[:n])]
            break
    field = ".".join(str(p) for p in path)
    return field, line


def _problems(exc: ValidationError, data: Any, lines: LineMap, source: str) -> list[Problem]:
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc: list[str | int] = list(err["loc"])
        msg = str(err["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        m = _FIELD_PREFIX.match(msg)
        if m and not loc:
            loc = list(m.group("field").split("."))
            msg = m.group("msg")
        if err["type"] == "extra_forbidden":
            near = _close_fields(loc)
            msg = (
                f"unknown field; did you mean {' or '.join(repr(n) for n in near)}?"
                if near
                else "unknown field (check the spelling; see docs/recipe-reference.md)"
            )
        elif err["type"] == "model_type":
            # pydantic's "or instance of Resources" names a class the user never wrote.
            msg = f"should be a mapping of fields, not {_kind_of(err.get('input'))}"
        elif err["type"] == "dict_type":
            msg = f"should be a mapping, not {_kind_of(err.get('input'))}"
        elif err["type"] == "string_type" and isinstance(err.get("input"), int | float):
            msg = (
                f'should be a string, not {_kind_of(err.get("input"))}; quote it: "{err["input"]}"'
            )
        elif err["type"] == "list_type":
            msg = f"should be a list, not {_kind_of(err.get('input'))}"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "union_tag_invalid":
            ctx = err.get("ctx") or {}
            loc.append(str(ctx.get("discriminator", "kind")).strip("'"))
            msg = (
                f"unknown launcher kind {ctx.get('tag')!r}; expected one of: "
                f"{ctx.get('expected_tags', ', '.join(SPECS))}"
            )
        field, line = _locate(loc, data, lines)
        problems.append(Problem(source, line, field or "(recipe)", msg))
    problems.sort(key=lambda p: (p.line or 0, p.field))
    return problems


def _kind_of(value: Any) -> str:
    """A value's YAML kind in words, for "should be a list, not a number"."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) <= 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "nothing" if value is None else type(value).__name__


def _models_at(loc: Sequence[str | int]) -> list[type[Any]]:
    """The schema models a location's parent could be (several for a union not yet told
    apart), following pydantic's location: field names, and a union's tag (``torchrun``)."""
    import typing

    from pydantic import BaseModel

    def models(annotation: Any) -> list[type[Any]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models(arg)]

    current: list[type[Any]] = [Recipe]
    for part in loc:
        if not isinstance(part, str):
            continue  # a list index: the item's model is the list's
        tagged = [m for m in current if m.model_fields.get("kind") is not None]
        by_tag = [m for m in tagged if part in typing.get_args(m.model_fields["kind"].annotation)]
        if by_tag:
            current = by_tag
            continue
        found = [m.model_fields[part].annotation for m in current if part in m.model_fields]
        if not found:
            return []
        current = [m for a in found for m in models(a)]
    return current


def _close_fields(loc: Sequence[str | int]) -> list[str]:
    """Known field names near the last part of ``loc`` (a misspelt key)."""
    import difflib

    if not loc or not isinstance(loc[-1], str):
        return []
    names = sorted({n for m in _models_at(loc[:-1]) for n in m.model_fields})
    return difflib.get_close_matches(loc[-1], names, n=2, cutoff=0.75)


# How to write a list or a mapping as one --set value (read as YAML, see parse_override).
_SET_HINTS = {
    "should be a list": "write a list as --set '{f}=[a, b]'",
    "should be a mapping": "write a mapping as --set '{f}={{key: value}}', or one key as "
    "--set {f}.key=value",
}


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts, creating the intermediate dicts."""
    parts = dotted.split(".")
    cur = data
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def validate(
    data: Any,
    *,
    source: str = "<dict>",
    lines: LineMap | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Recipe:
    """Validate plain data (already parsed) into a :class:`Recipe`, applying overrides first."""
    import copy

    lines = dict(lines or {(): 1})
    if not isinstance(data, dict):
        raise RecipeError([Problem(source, 1, "(recipe)", "a recipe is a YAML mapping")])
    data = copy.deepcopy(data)
    for key, value in (overrides or {}).items():
        if not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[A-Za-z0-9_\-]+)*", key):
            raise RecipeError([Problem("<override>", None, key, "not a dotted field path")])
        set_path(data, key, value)
        lines.pop(tuple(key.split(".")), None)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        problems = _problems(exc, data, lines, source)
        for p in problems:
            if p.field in (overrides or {}) or any(
                p.field.startswith(k + ".") or k.startswith(p.field + ".")
                for k in (overrides or {})
            ):
                p.file, p.line = "<override>", None
                for start, hint in _SET_HINTS.items():
                    if p.message.startswith(start):
                        p.message = f"{p.message}; {hint.format(f=p.field)}"
        raise RecipeError(problems) from None
    except ValueError as exc:  # raised outside pydantic's wrapping (should not happen)
        raise RecipeError([Problem(source, None, "(recipe)", str(exc))]) from None


def read_source(p: Path) -> str:
    """A recipe or pipeline file's text; a missing, unreadable, non-regular, oversized or
    non-UTF-8 file is one located problem (see :func:`slurmfm.fsutil.read_bounded`)."""
    from slurmfm.fsutil import InputFileError, read_bounded

    where = display_path(p)
    try:
        data = read_bounded(p)
    except FileNotFoundError:
        raise RecipeError([Problem(where, None, "(file)", "no such file")]) from None
    except InputFileError as exc:  # not a regular file, or over MAX_INPUT_BYTES
        raise RecipeError([Problem(where, None, "(file)", str(exc))]) from None
    except OSError as exc:
        raise RecipeError(
            [Problem(where, None, "(file)", f"cannot read: {exc.strerror or exc}")]
        ) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RecipeError(
            [Problem(where, line, "(file)", f"not UTF-8 text (byte {data[exc.start]:#04x})")]
        ) from None


def display_path(p: str | Path) -> str:
    """A path as printed in errors: bytes that are not UTF-8 shown as ``\\xNN``.

    A file name is bytes on Linux; Python carries undecodable ones as surrogates, which
    cannot be printed or encoded and ended in a traceback.
    """
    return os.fsencode(p).decode("utf-8", "backslashreplace")


def load_recipe(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Recipe:
    """Read and validate a recipe file; every problem is reported with its file and line."""
    p = Path(path)
    text = read_source(p)
    where = display_path(p)
    data, lines = parse_yaml(text, where)
    if data is None:
        raise RecipeError([Problem(where, 1, "(recipe)", "the file is empty")])
    if isinstance(data, dict) and "stages" in data:
        # A pipeline file (slurmfm.pipeline): name the command that checks it instead of
        # listing every recipe field it lacks. Checked on the data already parsed, so the
        # file is read once (bounded, see read_source).
        raise RecipeError(
            [
                Problem(
                    where,
                    lines.get(("stages",)),
                    "stages",
                    "this is a pipeline file, not a recipe; "
                    f"check it with: slurmfm pipeline validate {where}",
                )
            ]
        )
    if isinstance(data, dict):
        resolve_paths(data, Path(os.path.abspath(p)).parent)
    return validate(data, source=where, lines=lines, overrides=overrides)


def is_image_file(image: str) -> bool:
    """Whether a container image names a squashfs file rather than a registry reference.

    Pyxis takes ``[USER@][REGISTRY#]IMAGE[:TAG]`` or a squashfs file, which it recognises
    only by a leading ``/`` or ``./`` (https://github.com/NVIDIA/pyxis/issues/127, its
    maintainer's answer). A relative ``x.sqsh`` is taken as a file here too (and made
    absolute), where Pyxis would have tried to pull it from Docker Hub.
    """
    if "://" in image or "#" in image:
        return False
    return image.startswith(("/", "./", "../")) or image.endswith(".sqsh")


def resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Make the relative paths of a recipe file's values absolute, against the file's folder.

    Why: a recipe is read from anywhere (``slurmfm submit ~/proj/recipe.yaml``, a research
    script's ``fm.load(path)``); a path that meant "next to this file" resolved against the
    caller's working directory and the job failed on the nodes after queueing. Pipeline files
    already resolve their recipes this way. Values from ``--set`` and dict recipes stay as
    given: they have no file, so they are relative to the working directory (the job's too,
    sbatch's default).

    Host paths are resolved always: ``storage.checkpoint_root``, ``storage.log_dir``,
    ``python_env.activate``, a container image file and the source of each container mount.
    Paths the training itself opens (``launcher.script``, ``launcher.megatron_path``,
    ``storage.data.*``) are resolved only without a container; in one they are the
    container's paths (relative to ``container.workdir``) and stay as written.
    ``launcher.args`` are the program's own and are never rewritten, nor a ``script`` that
    names a module (``module: true``).
    """

    def fix(value: Any) -> Any:
        if isinstance(value, str) and value and not value.startswith(("/", "~", "$")):
            return os.path.normpath(base / value)
        return value

    def section(name: str) -> dict[str, Any] | None:
        sec = data.get(name)
        return sec if isinstance(sec, dict) else None

    storage = section("storage")
    if storage is not None:
        for key in ("checkpoint_root", "log_dir"):
            if key in storage:
                storage[key] = fix(storage[key])
    env = section("python_env")
    if env is not None and "activate" in env:
        env["activate"] = fix(env["activate"])
    container = section("container")
    if container is not None:
        image = container.get("image")
        if isinstance(image, str) and is_image_file(image):
            container["image"] = fix(image)
        mounts = container.get("mounts")
        if isinstance(mounts, list):
            container["mounts"] = [
                (fix(src) + (":" + rest if sep else "")) if isinstance(m, str) else m
                for m in mounts
                for src, sep, rest in [m.partition(":") if isinstance(m, str) else ("", "", "")]
            ]
        return
    launcher = section("launcher")
    module = isinstance(launcher, dict) and launcher.get("module") is True
    sweep = section("sweep")
    if sweep is not None:
        # A task's (or grid's) dotted key for a training path is a path of this file too.
        def training_path(key: Any) -> bool:
            return isinstance(key, str) and (
                (key == "launcher.script" and not module)
                or key == "launcher.megatron_path"
                or key.startswith("storage.data.")
            )

        for task in sweep.get("tasks") or []:
            if isinstance(task, dict):
                for key in [k for k in task if training_path(k)]:
                    task[key] = fix(task[key])
        grid = sweep.get("parameters")
        if isinstance(grid, dict):
            for key in [k for k in grid if training_path(k)]:
                if isinstance(grid[key], list):
                    grid[key] = [fix(v) for v in grid[key]]
    if launcher is not None:
        for key in ("script", "megatron_path"):
            if key in launcher and not (key == "script" and launcher.get("module") is True):
                launcher[key] = fix(launcher[key])
    if storage is not None and isinstance(storage.get("data"), dict):
        storage["data"] = {k: fix(v) for k, v in storage["data"].items()}


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``--set a.b=VALUE`` where VALUE is read as YAML (so ``4`` is an int)."""
    if "=" not in text:
        raise RecipeError([Problem("<override>", None, text, "expected FIELD=VALUE")])
    key, raw = text.split("=", 1)
    if text != display_path(text):  # bytes the shell passed that are not UTF-8
        where = display_path(key).strip() or display_path(text)
        raise RecipeError([Problem("<override>", None, where, "not UTF-8 text")])
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        value = YAML(typ="safe").load(raw) if raw.strip() else ""
    except YAMLError:
        value = raw
    if key.strip().startswith("env.") and isinstance(value, bool | int | float):
        value = raw.strip()  # an environment value as written (see _is_env_value)
    return key.strip(), value
