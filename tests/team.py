"""Two real unprivileged users of one group, for the shared-storage tests (docs/security.md).

``alice`` (the victim) and ``mallory`` (the attacker) are real accounts of the group
``slurmfm-team`` (made with ``useradd`` when missing; the tests run as root, as the lab
does). :func:`as_user` runs a function in a forked child under that user's ids and umask
002 and hands back its result or the one-line error it raised: every file operation in it
is checked by the kernel, not by the code under test. :func:`team_dir` makes a team
directory under ``/var/tmp``: ``ckpt`` (the checkpoint root, 3775 by default: the sticky
root docs/security.md recommends) and ``logs`` (2775: group-writable, not sticky).
"""

from __future__ import annotations

import grp
import os
import pickle
import pwd
import subprocess
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

GROUP = "slurmfm-team"
ALICE, MALLORY = "slurmfm-alice", "slurmfm-mallory"


def ensure_users() -> None:
    """The group and both users (root only; the real tier's fixtures make the same ones)."""
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", GROUP], check=True)
    for name in (ALICE, MALLORY):
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(
                ["useradd", "-M", "-N", "-g", GROUP, "-s", "/bin/bash", name], check=True
            )


def uid(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


def gid() -> int:
    return grp.getgrnam(GROUP).gr_gid


class Raised(Exception):
    """What the function raised in the child: its type's name and its message."""


def as_user(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run as ``name`` (real and effective ids, group ``slurmfm-team``, umask
    002) in a forked child; its return value, or :class:`Raised` with ``Type: message``."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            pw = pwd.getpwnam(name)
            os.setgroups([gid()])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            os.umask(0o002)
            os.environ["HOME"] = "/nonexistent"
            payload: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as exc:
            payload = ("raised", f"{type(exc).__name__}: {exc}")
            if not isinstance(exc, (OSError, ValueError, RuntimeError, SystemExit)):
                payload = ("raised", payload[1] + "\n" + traceback.format_exc())
        try:
            data = pickle.dumps(payload)
        except Exception:
            data = pickle.dumps(("ok", repr(payload[1])))
        with os.fdopen(write, "wb") as fh:
            fh.write(data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)  # noqa: S301 - our own child's bytes
    if kind == "raised":
        raise Raised(value)
    return value


def team_dir(root_mode: int = 0o3775) -> Path:
    """A fresh team directory: ``ckpt`` (``root_mode``, root:team) and ``logs`` (2775)."""
    ensure_users()
    d = Path(tempfile.mkdtemp(prefix="slurmfm-team-", dir="/var/tmp"))
    d.chmod(0o755)
    for sub, mode in (("ckpt", root_mode), ("logs", 0o2775)):
        (d / sub).mkdir()
        os.chown(d / sub, 0, gid())
        (d / sub).chmod(mode)
    return d
