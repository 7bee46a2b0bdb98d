"""``python3 RUNTIME <subcommand>``: the entry points the batch script and its steps call.

* ``prepare``: host order, rendezvous, node addresses, resume pointer; prints ``export`` lines
  (values quoted with shlex) that the batch script evaluates before its ``srun`` lines.
* ``batch``: the batch step itself (:mod:`.batch`); the script ``exec``s into it.
* ``node``: the per-node entry of a launch step (:mod:`.node`).
* ``health``: the per-node health gate (:mod:`.health`).
* ``observe``: the per-node observability agent (:mod:`.agent`).
* ``task``: this array task's values from the script's sweep table (:mod:`.sweep`).
* ``whoami``: prints ``NODE SLURM_TOPOLOGY_ADDR`` (for the topology order).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import rankorder
from .options import (
    BatchOptions,
    ContainerRemoveOptions,
    ForwardOptions,
    HealthOptions,
    NodeOptions,
    Options,
    PrepareOptions,
    TaskOptions,
)

if TYPE_CHECKING:
    import argparse  # imported where a parser is built (a node entry reads its options without)

    from .pd import Role
    from .state import StateFile

# Each subcommand imports what it uses: the per-node entry (``node``) runs once per node and
# attempt, and on a node the imports of the others were most of its start-up.


def _kv(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


def storage_ok(a: PrepareOptions, ckpt: str, st: StateFile) -> bool:
    """Lay out the checkpoint directory on Lustre; refuse to start without enough free space.

    ``--stripe-layout`` is the layout the renderer chose for the recipe's checkpoint format
    (slurmfm/catalog/storage.py: a progressive layout for file-per-rank checkpoints, following
    https://wiki.lustre.org/Lustre_Striping_Best_Practices); without one the file system's
    default stays. Layouts apply to new files only. The shared log directory is never
    restriped (it belongs to every user of the directory). On Lustre the emptiest storage
    target (OST) is what fills first, so its free space counts.
    """
    from .health import run_command

    _, fstype = run_command(["stat", "-f", "-c", "%T", ckpt], 30)
    lustre = fstype.strip() == "lustre"
    layout = a.stripe_layout.split()
    if lustre and layout:
        if not all(re.fullmatch(r"-[EcS]|-1|\d+[KMGT]?", w) for w in layout):
            print(f"slurmfm: warning: ignoring layout {a.stripe_layout!r}", file=sys.stderr)
        else:
            rc, _ = run_command(["lfs", "setstripe", *layout, ckpt], 60)
            if rc != 0:
                print(f"slurmfm: warning: lfs setstripe failed on {ckpt}", file=sys.stderr)
    if a.min_free_kb <= 0:
        return True
    free_kb = -1
    where = "on its file system"
    if lustre:
        rc, out = run_command(["lfs", "df", ckpt], 60)
        osts = [
            int(line.split()[3])
            for line in out.splitlines()
            if "OST:" in line and len(line.split()) > 3 and line.split()[3].isdigit()
        ]
        if osts:
            free_kb, where = min(osts), "on its emptiest Lustre OST"
    if free_kb < 0:
        try:
            sv = os.statvfs(ckpt)
            free_kb = sv.f_bavail * sv.f_frsize // 1024
        except OSError:
            return True
    if free_kb < a.min_free_kb:
        print(
            "slurmfm: %s has %d GiB free %s; the recipe needs %s GiB (storage.min_free_gb)"
            % (ckpt, free_kb // 1048576, where, a.min_free_gb),
            file=sys.stderr,
        )
        st.record("fail", "not enough free space")
        return False
    return True


def own_checkpoint_dir(path: str) -> str | None:
    """None when the run's checkpoint directory and its whole chain from the checkpoint root
    are safe (made when missing), else why not, in words.

    The job resumes from what is there (``latest``, ``DONE``, the framework's files): a
    directory another user owns, or may write, or a link put where it was (another user's,
    or another of our own runs) could hand it forged or foreign checkpoints
    (:func:`.checkpoint.ensure_run_dir`). Our own directories made group-writable by an
    umask of 002 are closed to the group here.
    """
    from . import fsafe
    from .checkpoint import ensure_run_dir

    try:
        ensure_run_dir(path)
    except fsafe.Refused as exc:
        return "is not safe: %s" % exc
    except OSError:
        return None  # not there and not makeable here: nothing to trust (as before)
    return None


def remove_everywhere(runtime: str, env: dict[str, str], timeout_s: float = 30.0) -> None:
    """At the end of the batch step: this attempt's runtime copies off every node (best
    effort; the next attempt gets a new copy under a new name)."""
    from . import install

    for argv in install.cleanup_steps(env, runtime):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
            )


def _split_tail(order: list[str], k: int, what: str) -> tuple[list[str], list[str]] | None:
    """The order less its last ``k`` hosts, and those hosts (spares, or a split server's
    nodes); None, said on stderr, when no trainer would be left."""
    if len(order) <= k:
        print(
            "slurmfm: %d hosts cannot hold %d %s and a trainer" % (len(order), k, what),
            file=sys.stderr,
        )
        return None
    return order[:-k], order[-k:]


def prepare(a: PrepareOptions, env: dict[str, str], out: list[str]) -> int:
    from .state import StateFile, state_path

    restart = int(env.get("SLURM_RESTART_COUNT", "0") or 0)
    st = StateFile(
        env.get("SLURMFM_STATE_FILE") or state_path(env.get("SLURMFM_LOG_DIR", "."), env), restart
    )
    runtime = env.get("SLURMFM_RUNTIME", "")
    if not (a.bytecode and runtime):
        return _prepare(a, env, out, st, restart, dict)
    # The copy with bytecode is made and sent to the nodes while the rest of prepare runs
    # (scontrol, the storage checks): off the way to the launch where the host has a core
    # to spare.
    import threading

    made: list[dict[str, str]] = []
    worker = threading.Thread(target=lambda: made.append(bytecode_copy(runtime, env)))
    worker.start()

    def joined() -> dict[str, str]:
        worker.join()
        return made[0] if made else {}

    rc = _prepare(a, env, out, st, restart, joined)
    final = joined().get("SLURMFM_RUNTIME", "") if rc != 0 else ""
    if final:
        # The job ends here: this host's copy goes now; the nodes' copies stay, private
        # files in /tmp, as the first copy's do when prepare fails.
        with contextlib.suppress(OSError):
            os.unlink(final)
    return rc


def _prepare(
    a: PrepareOptions,
    env: dict[str, str],
    out: list[str],
    st: StateFile,
    restart: int,
    late: Callable[[], dict[str, str]],
) -> int:
    """Prepare's work; ``late()`` gives the exports of the copy with bytecode, called once
    everything else is known (:func:`bytecode_copy`). Each part adds its exports in the
    order the job needs them: placement, rendezvous, serving, observe, checkpoint."""
    from . import slurm as sl

    alloc = sl.hostnames(env["SLURM_JOB_NODELIST"])
    exports: dict[str, str] = {}
    placed = _placement(a, env, alloc, exports)
    if placed is None:
        return 2
    order, spare_order, serve_order, _topo = placed
    if not _rendezvous(a, env, restart, order, serve_order, spare_order, exports):
        return 2
    exports["SLURMFM_STATE_FILE"] = st.path  # this job's own record (state.claim)
    _observe_dir(env, exports)
    ckpt = env.get("SLURMFM_CHECKPOINT_DIR", "")
    if not _checkpoint(a, ckpt, st, exports):
        return 2
    st.record("start", "nodes={}".format(env.get("SLURM_JOB_NODELIST", "")))
    st.record("checkpoint-dir", ckpt)
    st.record("hosts", exports["SLURMFM_HOST_ORDER"])
    _announce(env, exports, st, placed)
    exports.update(late())
    for k in sorted(exports):
        out.append(f"export {k}={shlex.quote(exports[k])}")
    return 0


def _topology(a: PrepareOptions, alloc: list[str]) -> dict[str, str] | None:
    """Each node's network address in the topology (``whoami`` on every node), where the
    order is to follow it: neither planned nor a rank map given."""
    from . import install
    from . import slurm as sl
    from .health import run_command

    if not (a.topo_addr and not a.planned and not a.rank_map):
        return None
    _rc, text = run_command([*sl.srun_per_node(len(alloc)), *install.argv(), "whoami"], 120)
    topo: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) >= 1 and parts[0] in alloc:
            topo[parts[0]] = parts[1] if len(parts) > 1 else ""
    return topo


def _placement(
    a: PrepareOptions, env: dict[str, str], alloc: list[str], exports: dict[str, str]
) -> tuple[list[str], list[str], list[str], dict[str, str] | None] | None:
    """(training order, spares, serving nodes, the nodes' topology addresses); None where
    the order cannot be made (said on stderr). The spares' exports are added to ``exports``."""
    from . import hosts as hs
    from . import slurm as sl

    topo = _topology(a, alloc)
    planned = a.planned.split()
    if planned and a.spare_nodes:
        # the plan names the N training nodes; Slurm added the spares to them (--nodelist
        # with a larger --nodes): they follow, in natural order
        planned += sorted((h for h in alloc if h not in planned), key=hs.natural_key)
    try:
        order = hs.host_order(alloc, planned, _kv(a.rank_map), topo)
    except hs.OrderError as exc:
        print(f"slurmfm: {exc}", file=sys.stderr)
        return None
    spare_order: list[str] = []
    if a.spare_nodes:
        # resources.spare_nodes: the last K of the order stand by (slurmfm/job/spares.py)
        split = _split_tail(order, a.spare_nodes, "spare node(s)")
        if split is None:
            return None
        order, spare_order = split
        exports["SLURMFM_SPARES"] = " ".join(spare_order)
        if topo:
            exports["SLURMFM_TOPO_ADDRS"] = " ".join(
                "%s=%s" % (h, topo[h]) for h in order + spare_order if topo.get(h)
            )
    serve_order: list[str] = []
    if a.serve == "split":
        split = _split_tail(order, a.serve_nodes, "serving node(s)")
        if split is None:
            return None
        order, serve_order = split
    elif a.serve == "hetjob":
        serve_order = sl.hostnames(env["SLURM_JOB_NODELIST_HET_GROUP_1"])
    elif a.serve == "all":
        serve_order = list(order)
    return order, spare_order, serve_order, topo


def _rendezvous(
    a: PrepareOptions,
    env: dict[str, str],
    restart: int,
    order: list[str],
    serve_order: list[str],
    spare_order: list[str],
    exports: dict[str, str],
) -> bool:
    """The order's and the rendezvous' exports (nodes' addresses, port, tasks) and a
    server's; False where a port cannot be used (said on stderr)."""
    from . import hosts as hs
    from .health import run_command

    every = sorted(set(order) | set(serve_order) | set(spare_order))
    _, text = run_command(["scontrol", "-o", "show", "node", ",".join(every)], 60)
    addrs = hs.parse_node_addrs(text)
    job_id = int(env.get("SLURM_JOB_ID", "0") or 0)
    eph = hs.ephemeral_range()
    local = env.get("SLURMD_NODENAME", "")
    head = order[0]
    rdzv_port = a.rdzv_port or hs.rendezvous_port(
        job_id, restart, a.port_base, a.port_span, eph, here=head == local
    )
    exports.update(
        SLURMFM_HOST_ORDER=" ".join(order),
        SLURMFM_NODELIST=",".join(order),
        SLURMFM_NNODES=str(len(order)),
        SLURMFM_NODE_ADDRS=" ".join(f"{h}={addrs.get(h, h)}" for h in every),
        SLURMFM_RDZV_HOST=addrs.get(head, head),
        SLURMFM_RDZV_PORT=str(rdzv_port),
    )
    if a.tasks_per_node > 0:
        # srun --distribution=arbitrary places task i on the i-th name of --nodelist: each
        # host once per task, in the job's order, so SLURM_PROCID follows the planned order
        # (Lightning's SLURMEnvironment takes the global rank from it).
        exports["SLURMFM_NTASKS"] = str(len(order) * a.tasks_per_node)
        exports["SLURMFM_TASK_NODELIST"] = ",".join(
            h for h in order for _ in range(a.tasks_per_node)
        )
    exports["MASTER_ADDR"] = exports["SLURMFM_RDZV_HOST"]
    exports["MASTER_PORT"] = exports["SLURMFM_RDZV_PORT"]
    if not a.rdzv_port:
        # the range a relaunch in this allocation picks its new port from (Batch.move_port)
        exports["SLURMFM_RDZV_RANGE"] = "%d+%d" % (a.port_base, a.port_span)
    if not serve_order:
        return True
    shead = addrs.get(serve_order[0], serve_order[0])
    exports.update(
        SLURMFM_SERVE_ORDER=" ".join(serve_order),
        SLURMFM_SERVE_NODELIST=",".join(serve_order),
        SLURMFM_SERVE_HEAD=shead,
        SLURMFM_SERVE_PORT=str(a.serve_port),
        SLURMFM_SERVE_URL="http://%s:%d" % (shead, a.serve_port),
    )
    if a.pd_prefill:
        return _pd_ports(a, job_id, restart, rdzv_port, eph, serve_order, addrs, exports)
    if a.dist_port < 0:
        return True

    # SGLang derives ports from both its dist port and its HTTP port (hs.SGLANG_*): a picked
    # port keeps clear of them all; a recipe's fixed port must.
    def clash(p: int) -> str | None:
        return hs.sglang_port_clash(p, a.serve_port, a.serve_dp, (rdzv_port,), eph)

    dist = a.dist_port or hs.choose_port(
        job_id,
        restart,
        a.port_base + a.port_span,
        a.port_span,
        eph,
        is_free=lambda p: True,
        usable=lambda p: clash(p) is None,
    )
    why = clash(dist)
    if why:
        print(f"slurmfm: SGLang dist port {dist}: {why}", file=sys.stderr)
        return False
    exports["SLURMFM_SERVE_DIST_PORT"] = str(dist)
    return True


def _pd_roles(a: PrepareOptions) -> tuple[Role, Role]:
    """Prefill's and decode's :class:`.pd.Role` from ``--pd-span``, ``--pd-decode-span``,
    ``--pd-tp P,D`` and ``--pd-dp P,D`` (a script of an older slurmfm has only the first:
    both roles then take it, their --tp and --dp-size in the command)."""
    from . import pd

    def pair(text: str, default: int) -> tuple[int, int]:
        parts = [int(x) for x in text.split(",") if x.strip().isdigit()]
        return (parts[0], parts[1]) if len(parts) == 2 else (default, default)

    tp, dp = pair(a.pd_tp, 0), pair(a.pd_dp, a.serve_dp)
    spans = (max(1, a.pd_span), max(1, a.pd_decode_span or a.pd_span))
    return pd.Role(spans[0], tp[0], dp[0]), pd.Role(spans[1], tp[1], dp[1])


def _pd_ports(
    a: PrepareOptions,
    job_id: int,
    restart: int,
    rdzv_port: int,
    eph: tuple[int, int],
    order: list[str],
    addrs: dict[str, str],
    exports: dict[str, str],
) -> bool:
    """SGLang prefill/decode (:mod:`.pd`): the servers of the order and their ports, one
    block per job picked like SGLang's dist port, exported as ``SLURMFM_PD``; False where
    the ports cannot be used (said on stderr)."""
    from . import hosts as hs
    from . import pd

    roles = _pd_roles(a)
    n_prefill = a.pd_prefill // roles[0].span
    n = n_prefill + a.pd_decode // roles[1].span

    def clash(p: int) -> str | None:
        return pd.port_clash(a.serve_port, p, n, n_prefill, a.serve_dp, (rdzv_port,), eph)

    why = pd.http_clash(a.serve_port, n, eph)
    if why:
        print(f"slurmfm: SGLang prefill/decode: {why}", file=sys.stderr)
        return False
    try:
        base = a.dist_port or hs.choose_port(
            job_id,
            restart,
            a.port_base + a.port_span,
            a.port_span,
            eph,
            is_free=lambda p: True,
            usable=lambda p: clash(p) is None,
        )
    except hs.OrderError as exc:
        print(f"slurmfm: SGLang prefill/decode: {exc}", file=sys.stderr)
        return False
    why = clash(base)
    if why:
        print(f"slurmfm: SGLang prefill/decode ports from {base}: {why}", file=sys.stderr)
        return False
    try:
        servers = pd.layout(
            order,
            addrs,
            a.pd_prefill,
            a.pd_decode,
            a.pd_span,
            a.serve_port,
            base,
            a.serve_dp,
            roles,
        )
    except ValueError as exc:
        print(f"slurmfm: SGLang prefill/decode: {exc}", file=sys.stderr)
        return False
    exports["SLURMFM_SERVE_DIST_PORT"] = str(base)
    exports[pd.ENV] = pd.to_json(exports["SLURMFM_SERVE_URL"], servers)
    print("slurmfm: " + pd.describe(exports["SLURMFM_SERVE_URL"], servers), file=sys.stderr)
    return True


def _observe_dir(env: dict[str, str], exports: dict[str, str]) -> None:
    """The job's observe directory, its own even when another user made the name first."""
    from . import fsafe

    obs = env.get("SLURMFM_OBS_DIR", "")
    if not obs:
        return
    try:
        mine = fsafe.claim_dir(obs)
    except OSError as exc:
        print(f"slurmfm: observability: cannot create {obs}: {exc}", file=sys.stderr)
        mine = obs
    if mine != obs:
        print(f"slurmfm: ignoring {obs} (not this job's user's); using {mine}", file=sys.stderr)
        stop = os.path.basename(env.get("SLURMFM_OBS_STOP", "")) or "stop"
        exports.update(
            SLURMFM_OBS_DIR=mine,
            SLURMFM_OBS_STOP=os.path.join(mine, stop),
            SLURMFM_PROGRESS_FILE=os.path.join(mine, "progress.json"),
        )


def _checkpoint(a: PrepareOptions, ckpt: str, st: StateFile, exports: dict[str, str]) -> bool:
    """The checkpoint directory checked (the job's own, its storage) and the resume pointer
    exported; False where the job must not start (recorded)."""
    from .checkpoint import resume_from

    why = own_checkpoint_dir(ckpt) if ckpt else None
    if why:
        print(
            f"slurmfm: checkpoint directory {ckpt} {why}: refusing to save or resume there",
            file=sys.stderr,
        )
        st.record("fail", f"checkpoint directory {why}")
        return False
    if ckpt and not storage_ok(a, ckpt, st):
        return False
    res = resume_from(ckpt) if ckpt else None
    if res:
        exports["SLURMFM_RESUME_FROM"] = res
        print(f"slurmfm: resuming from {res}", file=sys.stderr)
    return True


def _announce(
    env: dict[str, str],
    exports: dict[str, str],
    st: StateFile,
    placed: tuple[list[str], list[str], list[str], dict[str, str] | None],
) -> None:
    """The job log's lines on the order (by leaf: :mod:`.rankorder`), the rendezvous, the
    spares and the servers; the order by leaf is recorded in the state file too."""
    order, spare_order, serve_order, topo = placed
    leaf_of, source = _leaves(topo)
    by_leaf = rankorder.summary(order, leaf_of, source)
    st.record("order", by_leaf)
    print(
        "slurmfm: job {} host order: {}; rendezvous {}:{}; {}".format(
            env.get("SLURM_JOB_ID", "?"),
            exports["SLURMFM_HOST_ORDER"],
            exports["MASTER_ADDR"],
            exports["MASTER_PORT"],
            by_leaf,
        ),
        file=sys.stderr,
    )
    if spare_order:
        print("slurmfm: spare hosts: " + " ".join(spare_order), file=sys.stderr)
    if serve_order:
        serve_by_leaf = rankorder.summary(serve_order, leaf_of, source)
        if len(serve_order) > 1:
            st.record("serve-order", serve_by_leaf)
        print(
            "slurmfm: serving hosts: {}; endpoint will be {}{}".format(
                exports["SLURMFM_SERVE_ORDER"],
                exports["SLURMFM_SERVE_URL"],
                "; " + serve_by_leaf if len(serve_order) > 1 else "",
            ),
            file=sys.stderr,
        )


def _leaves(topo: dict[str, str] | None) -> tuple[dict[str, str], str]:
    """Each node's leaf (or block) for the order line, and where it came from: the nodes'
    ``SLURM_TOPOLOGY_ADDR`` when prepare asked them, else one ``scontrol show topology``
    (:mod:`.rankorder`)."""
    from .health import run_command

    if topo:
        return rankorder.leaves_from_addrs(topo), "SLURM_TOPOLOGY_ADDR"
    rc, text = run_command(["scontrol", "show", "topology"], 30)
    return rankorder.leaves_from_scontrol(text if rc == 0 else ""), "scontrol show topology"


def bytecode_copy(runtime: str, env: dict[str, str]) -> dict[str, str]:
    """The exports that make every later step run a copy of the runtime with bytecode
    (:func:`.install.with_bytecode`), copied to every node by Slurm like the first one; none
    where it cannot be made or copied (the steps then compile from source, as before)."""
    from . import install
    from .health import run_command

    made = install.with_bytecode(runtime, env.get("SLURM_JOB_ID", "") or "job")
    if made is None:
        return {}
    staging, final, sha = made
    rc, text = run_command(["sbcast", "--force", staging, final], 120)
    with contextlib.suppress(OSError):
        os.unlink(staging)
    if rc != 0:
        with contextlib.suppress(OSError):
            os.unlink(final)
        why = " ".join(text.split())[:200] or "exit %d" % rc
        msg = "slurmfm: the steps run the runtime without bytecode (sbcast: %s)" % why
        print(msg, file=sys.stderr)
        return {}
    return {"SLURMFM_RUNTIME": final, "SLURMFM_RUNTIME_SHA": sha, install.PLAIN_ENV: runtime}


def _launch_argv(p: argparse.ArgumentParser) -> None:
    """The command to launch, everything after the options (a leading ``--`` is dropped by
    :func:`_rest`): ``batch`` and ``node``."""
    import argparse

    p.add_argument("argv", nargs=argparse.REMAINDER)


# Each subcommand: its options' class (None: none), its help line, and whether the command
# to launch follows its options (:func:`_launch_argv`).
_SUBCOMMANDS: dict[str, tuple[type[Options] | None, str | None, bool]] = {
    "prepare": (PrepareOptions, None, False),
    "batch": (BatchOptions, None, True),
    "node": (NodeOptions, None, True),
    "forward": (
        ForwardOptions,
        "signal the workers of this node's launch step, and each new one, until it ends",
        False,
    ),
    "container-remove": (ContainerRemoveOptions, "remove this node's named container", False),
    "health": (HealthOptions, None, False),
    "observe": (None, None, False),
    "stacks": (None, "dump (py-spy) and stop this node's training workers (a hang)", False),
    "abort": (None, "abort this node's stopped training workers: faulthandler's stacks", False),
    "task": (TaskOptions, None, False),
    "whoami": (None, None, False),
}


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """The runtime's command line; each subcommand's options come from its class in
    :mod:`.options`, the one declaration the renderer writes them from. ``only``: a
    subcommand's name, to build that one's parser alone (every step parses one subcommand,
    and building all ten was a tenth of the per-node entry's start-up); any other value
    builds them all (help, and the message for an unknown one)."""
    import argparse

    p = argparse.ArgumentParser(prog="slurmfm-runtime", description=__doc__)
    sub = p.add_subparsers(dest="cmd")
    sub.required = True
    for name, (options, help_line, launches) in _SUBCOMMANDS.items():
        if only in _SUBCOMMANDS and name != only:
            continue
        s = sub.add_parser(name, help=help_line) if help_line else sub.add_parser(name)
        if options is not None:
            options.add_to(s)
        if launches:
            _launch_argv(s)
    return p


def _rest(argv: Sequence[str]) -> list[str]:
    words = list(argv)
    return words[1:] if words[:1] == ["--"] else words


def _batch(a: argparse.Namespace, env: dict[str, str]) -> int:
    """``batch``: the batch step, under its supervisor unless told not to (:mod:`.supervise`)."""
    from .batch import Batch

    o = BatchOptions.from_namespace(a)
    if not o.runtime:
        o = o._replace(runtime=sys.argv[0])
    words = _rest(a.argv)
    k = o.serve_words
    serve_argv, launch = words[:k], words[k:]
    if env.get("SLURMFM_SUPERVISED") == "1":  # the supervisor's child
        return Batch(o, env).main(serve_argv, launch)
    if not o.supervise:
        try:
            return Batch(o, env).main(serve_argv, launch)
        finally:
            remove_everywhere(o.runtime, env)
    from .state import StateFile, state_path
    from .supervise import supervise

    state = StateFile(
        env.get("SLURMFM_STATE_FILE") or state_path(env.get("SLURMFM_LOG_DIR", "."), env),
        int(env.get("SLURM_RESTART_COUNT", "0") or 0),
    )
    try:
        return supervise(
            lambda: Batch(o, dict(env, SLURMFM_SUPERVISED="1")).main(serve_argv, launch),
            state,
            env,
            o.max_restarts,
            o.requeue,
        )
    finally:
        remove_everywhere(o.runtime, env)


def _forward(a: argparse.Namespace, env: dict[str, str]) -> int:
    """``forward``: the save signal to this node's training processes until the launch ends."""
    import signal

    from .node import forward_until_done

    fo = ForwardOptions.from_namespace(a)
    node = env.get("SLURMD_NODENAME", "")
    sent = forward_until_done(
        env.get("SLURM_JOB_ID", ""),
        getattr(signal, "SIG" + fo.signal),
        node,
        poll_s=fo.poll_s,
        tasks=fo.tasks,
    )
    print(
        "slurmfm: %s: SIG%s to %d training process(es); the launch ended"
        % (node or "?", fo.signal, sent),
        flush=True,
    )
    return 0


def _health(a: argparse.Namespace, env: dict[str, str]) -> int:
    """``health``: this node's checks, one ``slurmfm-health NODE OK|FAIL why`` line."""
    node = env.get("SLURMD_NODENAME", "unknown")
    ho = HealthOptions.from_namespace(a)
    from .health import check_node

    bad = check_node(
        ho.gpus,
        ho.efa,
        ho.dcgm,
        ho.imex,
        sysfs=env.get("SLURMFM_SYSFS", "/sys"),
        efa_tries=ho.efa_tries,
        efa_delay_s=ho.efa_delay_s,
    )
    if bad:
        print(f"slurmfm-health {node} FAIL {bad}", flush=True)
        return 1
    print(f"slurmfm-health {node} OK", flush=True)
    return 0


def _node(no: NodeOptions, argv: list[str], env: dict[str, str]) -> int:
    """``node``: the per-node entry of a launch step (:func:`.node.main`)."""
    from .node import main as node_main

    env["SLURMFM_HOST_ORDER"] = env.get(no.order_var, "")
    return node_main(
        argv,
        no.prefix,
        no.forward,
        no.ray_settings(),
        env,
        no.forward_tasks,
        no.numa,
        vllm=(no.vllm, no.vllm_dp, no.vllm_dp_local),
        pd=no if no.pd else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    env = dict(os.environ)
    if words[:1] == ["node"]:
        # every launch task on every node: its options without argparse where they are as
        # the renderer writes them (NodeOptions.from_words), else parsed below
        read = NodeOptions.from_words(words[1:])
        if read is not None:
            return _node(*read, env)
    a = parser(words[0] if words else None).parse_args(words)
    if a.cmd == "prepare":
        out: list[str] = []
        rc = prepare(PrepareOptions.from_namespace(a), env, out)
        if rc == 0:
            print("\n".join(out))
        return rc
    if a.cmd == "batch":
        return _batch(a, env)
    if a.cmd == "node":
        return _node(NodeOptions.from_namespace(a), _rest(a.argv), env)
    if a.cmd == "forward":
        return _forward(a, env)
    if a.cmd == "container-remove":
        from .node import container_remove

        co = ContainerRemoveOptions.from_namespace(a)
        gone = container_remove(co.name, earlier=co.earlier)
        if gone is None:
            return 1
        print(
            "slurmfm: %s: removed container %s"
            % (env.get("SLURMD_NODENAME", "?"), " ".join(gone) or "(none)"),
            flush=True,
        )
        return 0
    if a.cmd in ("stacks", "abort"):
        from .hang import abort_workers, stop_workers

        job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
        if a.cmd == "stacks":
            print("\n".join(stop_workers(job, node)), flush=True)
        else:
            abort_workers(job, node)
        return 0
    if a.cmd == "health":
        return _health(a, env)
    if a.cmd == "observe":
        from .agent import main as agent_main

        return agent_main()
    if a.cmd == "task":
        from .sweep import SweepError
        from .sweep import main as sweep_main

        try:
            script = TaskOptions.from_namespace(a).script
            print("\n".join(sweep_main(script, env.get("SLURM_ARRAY_TASK_ID"))))
        except (SweepError, ValueError) as exc:
            print(f"slurmfm: {exc}", file=sys.stderr)
            return 2
        return 0
    if a.cmd == "whoami":
        print("{} {}".format(env.get("SLURMD_NODENAME", ""), env.get("SLURM_TOPOLOGY_ADDR", "")))
        return 0
    return 2  # pragma: no cover - argparse requires a subcommand
