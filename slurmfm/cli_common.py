"""Helpers shared by the CLI modules; imports only click (``slurmfm --help`` stays fast)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def friendly(fn: F) -> F:
    """Turn slurmfm's errors into one clean line each on stderr and exit status 2."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from slurmfm.errors import SlurmfmError

        try:
            return fn(*args, **kwargs)
        except SlurmfmError as exc:
            for line in str(exc).splitlines() or [type(exc).__name__]:
                click.echo(line, err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


def write_atomic(path: str, text: str, mode: int | None = None) -> None:
    """Whole file or nothing (see :func:`slurmfm.fsutil.write_atomic`)."""
    from slurmfm.fsutil import write_atomic as _write

    _write(path, text, mode=mode)
