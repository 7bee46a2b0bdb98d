"""The one function through which every user-supplied value reaches the shell.

Why a single function: shell-quoting bugs in hand-edited sbatch files are one of the problems
slurmfm exists to remove. Keeping one audited, property-tested path (``sh_quote``) for bash, and
one strict validator (``sbatch_value``) for ``#SBATCH`` lines (which sbatch parses itself, not
bash), makes the guarantee checkable: a value is either carried exactly or rejected.

Why at the package's top, beside :mod:`slurmfm.errors`: the renderer is not its only user.
The launchers (which the renderer asks for their launch words), the request's command line
and the ssh backend quote through it too, and the launchers sit below the renderer, so the
function lives below both (``scripts/bench_structure.py``'s layers: no import runs back up).
"""

from __future__ import annotations

import re

from slurmfm.errors import UnsafeValueError

_SAFE_BARE = re.compile(r"^[A-Za-z0-9_@%+:,./-]+$")


def sh_quote(value: str, *, what: str = "value") -> str:
    """Return ``value`` as one bash word that expands to exactly ``value``.

    Bare words are kept when they contain only characters that bash never interprets
    (so scripts stay readable); everything else is wrapped in single quotes, with embedded
    single quotes written as ``'\\''``. A NUL byte cannot exist in a bash word or in an
    environment variable, so it is rejected instead of silently truncated.
    """
    if "\x00" in value:
        raise UnsafeValueError(f"{what}: contains a NUL byte, which bash cannot carry")
    if "\r" in value:  # sbatch refuses a script with DOS line breaks (src/sbatch/sbatch.c)
        raise UnsafeValueError(f"{what}: contains a carriage return, which sbatch refuses")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeValueError(f"{what}: is not valid Unicode text (lone surrogate)") from None
    if value and _SAFE_BARE.fullmatch(value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"


def sh_join(words: list[str], *, what: str = "argument") -> str:
    """Quote every word and join with spaces (a command line made of user values)."""
    return " ".join(sh_quote(w, what=what) for w in words)


# sbatch reads ``#SBATCH`` lines with its own tokenizer (quotes handled differently from bash,
# no escapes, whitespace splits), so values there are restricted to a conservative charset
# instead of quoted. Anything else is refused with a clear message.
_SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./\-\[\]&|!*()]+$")


def sbatch_value(value: str, *, what: str) -> str:
    """Validate a value for an ``#SBATCH --opt=value`` line and return it unchanged."""
    if not value:
        raise UnsafeValueError(f"{what}: must not be empty")
    if not _SBATCH_SAFE.fullmatch(value):
        bad = sorted({c for c in value if not _SBATCH_SAFE.fullmatch(c)})
        shown = ", ".join(repr(c) for c in bad)
        raise UnsafeValueError(
            f"{what}: {value!r} has characters that #SBATCH lines cannot carry safely ({shown})"
        )
    return value


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_name(name: str, *, what: str = "environment variable name") -> str:
    """Validate an environment variable name (it is emitted bare, so it must be an identifier)."""
    if not _ENV_NAME.fullmatch(name):
        raise UnsafeValueError(f"{what}: {name!r} is not a valid shell variable name")
    return name
