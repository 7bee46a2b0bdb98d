"""The NCCL transport verdict: did NCCL pick EFA (aws-ofi-nccl) or fall back to sockets?

Lines matched, newest plugin first (aws/aws-ofi-nccl ``src/nccl_ofi_net.c`` and older tags):
``NET/OFI Selected provider is efa`` (1.14+), ``Selected Provider is efa`` (up to 1.13), and
NCCL's own ``Using network AWS Libfabric`` / ``Using network Libfabric`` / ``Using network OFI``
(NVIDIA/nccl ``src/init.cc`` prints the plugin's name). A socket fallback prints ``Using network
Socket`` or ``NET/Socket : Using``. Only jobs whose launcher writes an NCCL log are checked (the
per-node entry sets ``NCCL_DEBUG_FILE`` on node 0 for torchrun-family launchers, and for vLLM
and SGLang servers that span nodes, whose worker processes inherit it; a one-node server is
not checked, so it never gets a false "no NCCL line" warning).
"""

from __future__ import annotations

import glob
import re
import time
from collections.abc import Callable

from . import fsafe

EFA = re.compile(
    r"NET/OFI Selected [Pp]rovider is efa|Selected Provider is efa|"
    r"Using network (?:AWS Libfabric|Libfabric|OFI)"
)
SOCKET = re.compile(r"Using network Socket|NET/Socket : Using")


def verdict(text: str) -> str | None:
    """'efa', 'socket' or None (no network line yet)."""
    if EFA.search(text):
        return "efa"
    if SOCKET.search(text):
        return "socket"
    return None


def read_logs(pattern: str) -> str:
    parts = []
    for path in sorted(glob.glob(pattern)):
        text = fsafe.read_text(path, limit=64 << 20)  # this user's regular files only
        if text is not None:
            parts.append(text)
    return "\n".join(parts)


def watch(
    pattern: str,
    timeout_s: float,
    running: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 2.0,
) -> str | None:
    """Poll the logs matching ``pattern`` until a verdict, the step ends, or the timeout."""
    deadline = clock() + timeout_s
    while True:
        v = verdict(read_logs(pattern))
        if v is not None:
            return v
        if clock() >= deadline or not running():
            return None
        sleep(poll_s)
