"""The per-node health gate: the GPUs and EFA devices the instance type has, and DCGM.

Runs on each node in one ``srun`` step before the training starts; prints one line
``slurmfm-health NODE OK`` or ``slurmfm-health NODE FAIL <why>`` that the batch step reads.
The EFA count is retried (``efa_tries`` x ``efa_delay_s``) because the EFA driver can come up
late after boot; AWS's own health checks retry it 3 times 5 s apart
(aws/sagemaker-hyperpod-cluster-setup and aws-samples/awsome-distributed-training
``4.validation_and_observability/1.pytorch-env-validation``). The IMEX domain check is retried
the same way (its daemons on the other nodes may still be connecting), and a domain that is not
UP fails only the nodes ``nvidia-imex-ctl -N`` names as not READY: where the IMEX node file
lists the whole compute resource, one instance down elsewhere must not fail every node.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: subscripted ABCs and tuple[...] need Python 3.9 at run time
    from collections.abc import Callable, Sequence

    Runner = Callable[[Sequence[str], float], tuple[int, str]]


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, str]:
    """Run ``argv``; (exit code, stdout+stderr). A missing program or timeout is a failure."""
    try:
        proc = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            # a tool may print bytes that are not UTF-8 (a path, a device name): never a crash
            encoding="utf-8",
            errors="replace",
            check=False,
        )
    except FileNotFoundError:
        return 127, f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} timed out after {timeout:g} s"
    return proc.returncode, proc.stdout or ""


def count_efa(sysfs: str) -> int:
    """EFA devices: ``rdmap*`` entries under ``/sys/class/infiniband``."""
    try:
        return len(
            [
                d
                for d in os.listdir(os.path.join(sysfs, "class", "infiniband"))
                if d.startswith("rdmap")
            ]
        )
    except OSError:
        return 0


def check_node(
    expect_gpus: int,
    expect_efa: int,
    dcgm_level: int = 0,
    imex: bool = False,
    sysfs: str = "/sys",
    dev: str = "/dev",
    run: Runner = run_command,
    sleep: Callable[[float], None] = time.sleep,
    efa_tries: int = 3,
    efa_delay_s: float = 5.0,
    command_timeout_s: float = 60.0,
    local_addrs: Sequence[str] | None = None,
) -> str | None:
    """None when the node is healthy, else the reason (one line).

    ``local_addrs``: this node's names and addresses, to find it in the IMEX status
    (default :func:`local_addresses`).
    """
    if expect_gpus > 0:
        rc, out = run(["nvidia-smi", "-L"], command_timeout_s)
        if rc != 0:
            first = (out.strip().splitlines() or [""])[0]
            return f"nvidia-smi failed: {first}"
        n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        if n != expect_gpus:
            return "%d GPUs visible, expected %d" % (n, expect_gpus)
    if expect_efa > 0:
        n = count_efa(sysfs)
        for _ in range(max(0, efa_tries - 1)):
            if n == expect_efa:
                break
            sleep(efa_delay_s)
            n = count_efa(sysfs)
        if n != expect_efa:
            return "%d EFA devices, expected %d (after %d tries)" % (n, expect_efa, efa_tries)
    if imex:
        # NCCL's MNNVL needs the IMEX channel device (NVIDIA/nccl src/mnnvl.cc)
        if not os.path.exists(os.path.join(dev, "nvidia-caps-imex-channels")):
            return f"no {dev}/nvidia-caps-imex-channels (IMEX channel missing)"
        mine = set(local_addresses() if local_addrs is None else local_addrs)
        bad: str | None = None
        for attempt in range(max(1, efa_tries)):
            if attempt:
                sleep(efa_delay_s)
            rc, out = run(["nvidia-imex-ctl", "-N"], command_timeout_s)
            if rc == 127:  # no binary: nothing to ask
                break
            bad = imex_domain_problem(rc, out, mine)
            if not bad:
                break
        else:
            return "nvidia-imex-ctl -N: %s (after %d tries)" % (bad, max(1, efa_tries))
    if dcgm_level > 0:
        rc, _ = run(["dcgmi", "diag", "-r", str(dcgm_level)], command_timeout_s * 30)
        if rc != 0:
            return "dcgmi diag -r %d failed" % dcgm_level
    return None


def local_addresses() -> list[str]:
    """This node's host names and IPv4 addresses (as the IMEX node file may list either)."""
    import socket  # here: only the IMEX check needs it, not every node entry's start

    names = {socket.gethostname(), os.environ.get("SLURMD_NODENAME", "")}
    addrs = set(names)
    for name in names:
        try:
            addrs.update(socket.gethostbyname_ex(name)[2])
        except OSError:
            continue
    _rc, out = run_command(["hostname", "-I"], 10)
    addrs.update(out.split() if _rc == 0 else ())
    return sorted(a for a in addrs if a)


def imex_domain_problem(
    rc: int, out: str, local: set[str] | frozenset[str] | None = None
) -> str | None:
    """What ``nvidia-imex-ctl -N`` says is wrong with the IMEX domain, or None when it is up.

    The output (NVIDIA IMEX guide, "IMEX Service Command Service",
    https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/cmdservice.html) lists each
    node as ``Node #I - ADDRESS - STATE`` (READY when its daemon is up), a connectivity table
    (``C`` connected) and ``Domain State: UP`` when every node of the domain is connected;
    anything else (DEGRADED, DOWN) leaves cross-node NVLink memory unusable on the nodes that
    are not READY. With ``local`` (this node's names and addresses), a domain that is not UP is
    this node's problem only when the status names it, or names no node at all; a node that is
    READY while another is not passes, and the other node's own gate fails it.
    """
    if rc != 0:
        first = (out.strip().splitlines() or [""])[0]
        return "exit %d: %s" % (rc, first) if first else "exit %d" % rc
    state = ""
    not_ready = []
    named: set[str] = set()
    for line in out.splitlines():
        text = line.strip()
        if text.startswith("Domain State:"):
            state = text.split(":", 1)[1].strip()
        elif text.startswith("Node #"):
            parts = [p.strip() for p in text.split(" - ")]
            if len(parts) >= 3 and parts[2].split()[:1] != ["READY"]:
                not_ready.append("%s is %s" % (parts[1], parts[2]))
                named.add(parts[1])
    if state.upper() == "UP":
        return None
    if local is not None and named and not named & set(local):
        return None
    why = "IMEX domain state %s" % (state or "not reported")
    return why + ("; " + ", ".join(not_ready) if not_ready else "")


def parse_report(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(nodes OK, [(node, why)] failed) from the step's output lines."""
    ok: list[str] = []
    bad: list[tuple[str, str]] = []
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0] == "slurmfm-health":
            if parts[2] == "OK":
                ok.append(parts[1])
            elif parts[2] == "FAIL":
                bad.append((parts[1], parts[3] if len(parts) > 3 else "failed"))
    return ok, bad
