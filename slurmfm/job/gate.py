"""The health gate inside the launch step: every node checks itself, then waits for "go".

A separate health-gate step and a separate agents step cost a job step each (each ``srun``
is created by slurmctld one after the other, and starts an interpreter on every node) before
the launch step starts a third. So where the launch runs this runtime's node entry on the
host, the batch step starts the launch once, with the gate's expectations in
``SLURMFM_GATE``; each node's entry (:mod:`.node`, on the node's first task) runs
:func:`.health.check_node`, writes its verdict into the attempt's private evidence directory
(:mod:`.evidence`) and prints the ``slurmfm-health NODE OK|FAIL`` line of the separate gate.
Every task then waits on its standard input, which ``srun`` copies from the batch step to
every task (``--input``, https://slurm.schedmd.com/srun.html#OPT_input; ``SLURM_STDINMODE``
is its environment form), for the one line :data:`GO`. The batch step writes it once all
nodes passed; anything else (a node failed, the batch step died, the gate timed out) is
end-of-file, and the entry exits without starting the launch. Nothing runs on a healthy
node before every node is known to be healthy, as with the separate gate.
"""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING

from . import evidence as ev

if TYPE_CHECKING:
    from collections.abc import Callable

# ``json`` and :func:`.health.check_node` are imported where used: every node entry imports
# this module before its launcher starts, and only a launch with the gate on reads its value.

ENV = "SLURMFM_GATE"
GO = b"go\n"
SUFFIX = ".gate"
# The exit of a node entry that did not start the launch (the health gate's own code).
NOT_STARTED = 3


def spec(gpus: int, efa: int, dcgm: int, imex: bool, efa_tries: int, efa_delay_s: float) -> str:
    """The value of :data:`ENV`: what a node must have."""
    import json

    return json.dumps(
        {
            "gpus": gpus,
            "efa": efa,
            "dcgm": dcgm,
            "imex": imex,
            "efa_tries": efa_tries,
            "efa_delay_s": efa_delay_s,
        },
        sort_keys=True,
    )


def check_here(
    value: str,
    node: str,
    directory: str,
    sysfs: str = "/sys",
    check: Callable[..., str | None] | None = None,
) -> str | None:
    """Check this node against the gate's ``value``; record and print the verdict. None when
    healthy, else the reason. A value this runtime cannot read fails the node with why.
    ``sysfs``: where the EFA devices are listed (``SLURMFM_SYSFS`` in tests)."""
    import json

    if check is None:
        from .health import check_node

        check = check_node
    try:
        want = json.loads(value)
        why = check(
            int(want["gpus"]),
            int(want["efa"]),
            int(want["dcgm"]),
            bool(want["imex"]),
            sysfs=sysfs,
            efa_tries=int(want["efa_tries"]),
            efa_delay_s=float(want["efa_delay_s"]),
        )
    except (ValueError, KeyError, TypeError) as e:
        why = "unreadable health gate settings (%s)" % e
    verdict = "OK" if why is None else "FAIL " + " ".join(why.split())
    ev.write_private(os.path.join(directory, node + SUFFIX), verdict + "\n")
    print("slurmfm-health %s %s" % (node, verdict), flush=True)
    return why


def wait_go(stream: IO[bytes] | None = None) -> bool:
    """Block until the batch step's word: True for :data:`GO`, False at end-of-file."""
    source = sys.stdin.buffer if stream is None else stream
    try:
        return source.readline() == GO
    except (OSError, ValueError):
        return False


def results(directory: str) -> dict[str, str | None]:
    """The verdicts recorded so far, by node: None for healthy, else the reason."""
    out: dict[str, str | None] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        if not name.endswith(SUFFIX):
            continue
        text = ev.read_small(os.path.join(directory, name)).strip()
        if text == "OK":
            out[name[: -len(SUFFIX)]] = None
        elif text.startswith("FAIL"):
            out[name[: -len(SUFFIX)]] = text[4:].strip() or "failed"
    return out
