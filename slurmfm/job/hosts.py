"""Host order, node rank, node addresses and the rendezvous port.

Host order decides which global ranks each node holds (node i of the order holds ranks
``i*procs .. i*procs+procs-1``). Sources, in priority: a planned order (pin mode) used as is; a
rank map (constrain mode) that sorts whatever Slurm allocated; ``SLURM_TOPOLOGY_ADDR`` (each
node's switch path, top to leaf) sorted naturally, which groups nodes by leaf or block;
otherwise the allocation's own order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence


class OrderError(Exception):
    """The planned order does not fit the allocation."""


_DIGIT_RUN = re.compile(r"\d+")


def _encode_run(m: re.Match[str]) -> str:
    run = m.group()
    # A run with a leading zero compares digit by digit ("left-aligned"), and ends before any
    # longer run it is a prefix of: keep it and close it with NUL (below every character).
    # Others compare as numbers: "1", then the length, then the digits (longer is larger).
    return run + "\0" if run[0] == "0" else f"1{len(run):04d}{run}"


def natural_key(name: str) -> str:
    """The one sort key for host and switch names: Slurm's ``strnatcmp`` order, as a string.

    Slurm sorts its node table and its hostlists with ``strnatcmp`` (SchedMD/slurm
    ``src/slurmctld/read_config.c`` ``_sort_nodes_by_name``, ``src/common/hostlist.c``
    ``hostrange_prefix_cmp``; the algorithm is ``src/common/strnatcmp.c``): runs of digits
    compare as numbers (``node2`` < ``node10``), except that a run starting with ``0`` compares
    digit by digit (``node01`` < ``node1``), and everything else compares by character code
    (``node-1`` < ``node1``, since ``-`` < ``1``). Encoding each digit run so that plain
    string comparison gives that order makes the key one ``str`` (fast to build and compare).
    Leading spaces, which ``strnatcmp`` skips, do not occur in host names.

    Fast path (a 64k-node plan sorts every name): a name is a stem and a trailing digit run
    (``p5-`` + ``00017``); the stem's key is computed by the regex once per distinct stem and
    cached, the trailing run is encoded inline. Same result as the regex on the whole name.
    """
    stem = name.rstrip("0123456789")
    if stem and stem[-1].isdecimal():  # a non-ASCII digit (``\d``) continues the run
        return _DIGIT_RUN.sub(_encode_run, name)
    head = _STEM_KEYS.get(stem)
    if head is None:
        if len(_STEM_KEYS) >= _STEM_KEYS_MAX:
            _STEM_KEYS.clear()
        head = _STEM_KEYS[stem] = _DIGIT_RUN.sub(_encode_run, stem)
    if len(stem) == len(name):
        return head
    run = name[len(stem) :]
    if run[0] == "0":
        return head + run + "\0"
    return f"{head}1{len(run):04d}{run}"


_STEM_KEYS: dict[str, str] = {}
_STEM_KEYS_MAX = 65536  # distinct stems are few (one per name prefix); bound a long-lived cache


def host_order(
    alloc: Sequence[str],
    planned: Sequence[str] = (),
    rank_map: dict[str, str] | None = None,
    topo_addr: dict[str, str] | None = None,
) -> list[str]:
    """The order of ``alloc`` the job ranks its nodes by (see the module docstring)."""
    if planned:
        if sorted(planned) != sorted(alloc):
            raise OrderError(
                "planned order has %d hosts, allocation has %d (%s)"
                % (len(planned), len(alloc), " ".join(sorted(set(alloc) ^ set(planned))))
            )
        return list(planned)
    if rank_map:
        # hosts without a key go last, in allocation order (the "~" sorts after the keys)
        return sorted(alloc, key=lambda h: (rank_map.get(h, "~" + h),))
    if topo_addr is not None:
        if set(topo_addr) != set(alloc):
            return list(alloc)
        return sorted(alloc, key=lambda h: (natural_key(topo_addr[h]), natural_key(h)))
    return list(alloc)


def node_rank(order: Sequence[str], node: str) -> int:
    """This node's index in the order, -1 when it is not in it."""
    try:
        return list(order).index(node)
    except ValueError:
        return -1


def insert_rank(argv: Sequence[str], prefix: int, rank: int) -> list[str]:
    """Insert ``--node-rank=R`` after the first ``prefix`` words (0: insert nothing)."""
    words = list(argv)
    if prefix <= 0:
        return words
    return words[:prefix] + ["--node-rank=%d" % rank] + words[prefix:]


def expand_hostlist(text: str) -> list[str]:
    """A Slurm host list (``n[001-003,7],gpu-a``) as host names, without ``scontrol``: a node
    entry in a container has no Slurm commands. Each bracket holds comma-separated numbers or
    ``lo-hi`` ranges, zero-padded to the width written (Slurm's hostlist syntax,
    https://slurm.schedmd.com/slurm.conf.html#SECTION_NODE-CONFIGURATION); several brackets
    in one name multiply. A part it cannot read is returned as written."""
    out: list[str] = []
    depth, part = 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            if part:
                out.extend(_expand_one(part))
            part = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        part += ch
    return out


def _expand_one(name: str) -> list[str]:
    head, bracket, rest = name.partition("[")
    if not bracket:
        return [name]
    body, close, tail = rest.partition("]")
    if not close:
        return [name]
    values: list[str] = []
    for item in body.split(","):
        lo, dash, hi = item.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            return [name]
        width = len(lo)
        values.extend(str(i).zfill(width) for i in range(int(lo), int(hi or lo) + 1))
    return [head + v + t for v in values for t in _expand_one(tail)]


def replayed_order(order: Sequence[str], step_nodes: Sequence[str]) -> list[str]:
    """The host order of a step HyperPod's auto-resume replayed on replaced nodes.

    AWS's auto-resume replays the srun on the nodes the job has after the replacement
    (https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-resiliency-slurm-auto-resume.html),
    but the order, the master and the ranks were fixed when the batch step started; AWS's own
    example recomputes them inside the step. Here every surviving node keeps its place and a
    replacement takes the place of the node it replaced (in natural order when several were),
    so the ranks of the healthy nodes do not move. Unverified on HyperPod itself.
    """
    present = set(step_nodes)
    known = set(order)
    new = sorted((n for n in step_nodes if n not in known), key=natural_key)
    out = []
    for h in order:
        if h in present:
            out.append(h)
        elif new:
            out.append(new.pop(0))
    return out + new


def with_master(argv: Sequence[str], old: str, new: str) -> list[str]:
    """``argv`` with the rendezvous host ``old`` replaced by ``new`` in torchrun's
    ``--master-addr``/``--master_addr`` and ``--rdzv-endpoint``/``--rdzv_endpoint``."""
    out = []
    for word in argv:
        key, eq, val = word.partition("=")
        if eq and key in ("--master-addr", "--master_addr") and val == old:
            out.append(key + "=" + new)
        elif eq and key in ("--rdzv-endpoint", "--rdzv_endpoint") and val.startswith(old + ":"):
            out.append(key + "=" + new + val[len(old) :])
        else:
            out.append(word)
    return out


def with_port(argv: Sequence[str], old: int, new: int) -> list[str]:
    """``argv`` with the rendezvous port ``old`` replaced by ``new`` in torchrun's
    ``--master-port``/``--master_port`` and the port of ``--rdzv-endpoint``/``--rdzv_endpoint``."""
    out = []
    for word in argv:
        key, eq, val = word.partition("=")
        if eq and key in ("--master-port", "--master_port") and val == str(old):
            out.append("%s=%d" % (key, new))
        elif eq and key in ("--rdzv-endpoint", "--rdzv_endpoint") and val.endswith(":%d" % old):
            out.append("%s=%s:%d" % (key, val.rpartition(":")[0], new))
        else:
            out.append(word)
    return out


def parse_node_addrs(scontrol_show_node: str) -> dict[str, str]:
    """``NodeName -> NodeAddr`` from ``scontrol -o show node`` output."""
    from .slurm import node_records

    out: dict[str, str] = {}
    for rec in node_records(scontrol_show_node):
        name = rec["NodeName"]
        out[name] = rec.get("NodeAddr") or name
    return out


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The node's ephemeral port range (Linux default 32768-60999)."""
    try:
        with open(path, encoding="ascii") as fh:
            lo, hi = (int(x) for x in fh.read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int) -> bool:
    """True when nothing on this host listens on or holds ``port`` (TCP, all addresses)."""
    import socket  # here: only the first node's port pick needs it, not every node entry

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def rendezvous_port(
    job_id: int, restart: int, base: int, span: int, ephemeral: tuple[int, int], here: bool
) -> int:
    """The launch's rendezvous port (:func:`choose_port`), checked free only where the first
    node of the order is this host (``here``): no other node's ports can be seen from here.
    One rule for prepare's pick and a relaunch's (``move_port``)."""
    free: Callable[[int], bool] = port_is_free if here else (lambda p: True)
    return choose_port(job_id, restart, base, span, ephemeral, is_free=free)


# SGLang's own ports (sgl-project/sglang:python/sglang/srt/server_args.py, PortArgs.init_new):
# with --nnodes > 1 it takes --dist-init-addr's port D for torch.distributed and D+1 .. D+5 for
# its ZMQ sockets (tokenizer, detokenizer, rpc, metrics, scheduler input or pub/sub), and
# D+6+rank for each data-parallel-attention rank; next to the HTTP port P it puts the NCCL port
# (P + randint(100, 1000), stepped by 42 while busy) and, single-node DP, P + 233.
SGLANG_DIST_EXTRA = 6
SGLANG_HTTP_BAND = 1100


def ports_clash(
    ports: range,
    what: str,
    other: range,
    other_what: str,
    taken: Sequence[int] = (),
    ephemeral: tuple[int, int] = (0, -1),
) -> str | None:
    """Why the block ``ports`` cannot be used, or None: it meets ``other`` (the HTTP ports),
    holds a port in ``taken`` (the rendezvous) or reaches the ``ephemeral`` range. ``what``
    names the block (``{}`` is its span, ``A-B``), ``other_what`` the other one likewise;
    one check for SGLang's dist port (:func:`sglang_port_clash`) and a prefill/decode job's
    block (``.pd.port_clash``)."""
    name = what.format("%d-%d" % (ports.start, ports.stop - 1))
    if ports.start < other.stop and other.start < ports.stop:
        return "%s meet %s" % (name, other_what.format("%d-%d" % (other.start, other.stop - 1)))
    for port in taken:
        if port in ports:
            return "%s hold port %d" % (name, port)
    lo, hi = ephemeral
    if ports.start <= hi and lo < ports.stop:
        return "%s reach the ephemeral range %d-%d" % (name, lo, hi)
    return None


def sglang_port_clash(
    dist: int,
    http: int,
    dp: int = 1,
    taken: Sequence[int] = (),
    ephemeral: tuple[int, int] = (0, -1),
) -> str | None:
    """Why SGLang's dist port ``dist`` cannot be used next to HTTP port ``http``, or None.

    The ports SGLang derives from each (see the note above) must not meet each other, a port
    in ``taken`` (the rendezvous) or the ephemeral range.
    """
    return ports_clash(
        range(dist, dist + SGLANG_DIST_EXTRA + max(1, dp)),
        "SGLang's ports {} (from the dist port)",
        range(http, http + SGLANG_HTTP_BAND),
        "{} (from the HTTP port %d)" % http,
        taken,
        ephemeral,
    )


def choose_port(
    job_id: int,
    restart: int,
    base: int,
    span: int,
    ephemeral: tuple[int, int],
    is_free: Callable[[int], bool] = port_is_free,
    tries: int = 64,
    usable: Callable[[int], bool] | None = None,
) -> int:
    """A port in ``[base, base+span)``, outside ``ephemeral``, free where it can be checked.

    Why: a port inside the ephemeral range can be held by any outgoing connection on the head
    node; a port that changes with the restart count lets a requeue avoid a port the last run
    left in TIME_WAIT. Deterministic for a given job and restart. ``usable`` rules ports out
    like the ephemeral range does (without spending a try on them).
    """
    lo, hi = ephemeral
    start = (job_id * 7 + restart * 131) % span
    first = None
    for i in range(span):
        port = base + (start + i) % span
        if lo <= port <= hi or not 1024 <= port <= 65535:
            continue
        if usable is not None and not usable(port):  # e.g. SGLang's derived ports
            continue
        if first is None:
            first = port
        if tries <= 0:
            break
        tries -= 1
        if is_free(port):
            return port
    if first is None:
        raise OrderError(
            "no port in %d-%d lies outside the ephemeral range %d-%d"
            % (base, base + span - 1, lo, hi)
        )
    return first
