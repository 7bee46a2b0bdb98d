"""Spare nodes: which spare replaces a failed node, the launch rewritten for it, and the batch
step swapping in the job (no requeue) where it can and requeueing where it cannot."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from test_batch import Step, state

from slurmfm.job import gate
from slurmfm.job import spares as sp
from slurmfm.job.batch import Batch
from slurmfm.job.cli import parser
from slurmfm.job.options import BatchOptions

POOL = sp.Pool(("n1", "n2", "n3", "n4"), ("n5", "n6"), master="10.0.0.1")
ADDRS = {f"n{i}": f"10.0.0.{i}" for i in range(1, 7)}


def test_the_spare_takes_the_failed_nodes_place_so_healthy_ranks_do_not_move() -> None:
    sw = sp.replace(POOL, ["n3"])
    assert sw is not None
    assert sw.pool.order == ("n1", "n2", "n5", "n4")
    assert sw.pool.spares == ("n6",)
    assert sw.pairs == (("n3", "n5"),)
    assert sw.pool.gone == ("n3",)
    assert sw.describe() == "n3 replaced by spare n5; 1 spare(s) left"


def test_a_spare_under_the_failed_nodes_leaf_switch_is_preferred() -> None:
    topo = (("n3", "top.leafB.n3"), ("n5", "top.leafA.n5"), ("n6", "top.leafB.n6"))
    sw = sp.replace(POOL._replace(topo=topo), ["n3"])
    assert sw is not None
    assert sw.pairs == (("n3", "n6"),)
    # nothing nearer: the first spare of the order
    far = (("n3", "top.leafC.n3"), ("n5", "top.leafA.n5"), ("n6", "top.leafB.n6"))
    sw = sp.replace(POOL._replace(topo=far), ["n3"])
    assert sw is not None
    assert sw.pairs == (("n3", "n5"),)


def test_too_few_healthy_spares_is_no_swap_and_a_failed_spare_is_set_aside() -> None:
    assert sp.replace(POOL, ["n1", "n2", "n3"]) is None
    assert sp.replace(POOL, ["n1", "n5", "n6"]) is None  # both spares failed too
    assert sp.replace(POOL, ["elsewhere"]) is None
    sw = sp.replace(POOL, ["n5"])
    assert sw is not None
    assert (sw.pool.order, sw.pool.spares, sw.dropped) == (POOL.order, ("n6",), ("n5",))
    sw = sp.replace(POOL, ["n2", "n5"])
    assert sw is not None
    assert sw.pairs == (("n2", "n6"),)
    assert sw.pool.spares == ()


def test_a_replacement_that_fails_in_turn_is_replaced_from_the_original_launch() -> None:
    first = sp.replace(POOL, ["n1"])
    assert first is not None
    second = sp.replace(first.pool, ["n5"])
    assert second is not None
    assert second.pool.order == ("n6", "n2", "n3", "n4")
    assert dict(second.pool.moved) == {"n1": "n6"}
    argv = ["srun", "--nodes=4", "--nodelist=n1,n2,n3,n4", "torchrun", "--master-addr=10.0.0.1"]
    words, master = sp.rewrite(argv, second.pool, ADDRS)
    assert words == [
        "srun",
        "--nodes=4",
        "--nodelist=n6,n2,n3,n4",
        "torchrun",
        "--master-addr=10.0.0.6",
    ]
    assert master == "10.0.0.6"


def test_rewrite_maps_every_node_list_form_and_keeps_the_master_when_node_0_stayed() -> None:
    sw = sp.replace(POOL._replace(tasks="n1,n1,n2,n2,n3,n3,n4,n4"), ["n3"])
    assert sw is not None
    argv = [
        "srun",
        "--nodelist=n1,n2,n3,n4",
        "-w",
        "n3,n4",
        "--nodelist",
        "n1,n1,n3,n3",
        "--master-addr=10.0.0.1",
        "--nnodes=4",
    ]
    words, master = sp.rewrite(argv, sw.pool, ADDRS)
    assert words == [
        "srun",
        "--nodelist=n1,n2,n5,n4",
        "-w",
        "n5,n4",
        "--nodelist",
        "n1,n1,n5,n5",
        "--master-addr=10.0.0.1",
        "--nnodes=4",  # torchrun's node count stays N
    ]
    assert master == "10.0.0.1"
    env = sp.env_for(sw.pool, master)
    assert env["SLURMFM_HOST_ORDER"] == "n1 n2 n5 n4"
    assert env["SLURMFM_NODELIST"] == "n1,n2,n5,n4"
    assert env["SLURMFM_SPARES"] == "n6"
    assert env["SLURMFM_TASK_NODELIST"] == "n1,n1,n2,n2,n5,n5,n4,n4"


def test_the_pool_comes_from_the_prepare_steps_exports() -> None:
    assert sp.from_env({"SLURMFM_HOST_ORDER": "a b"}) is None
    pool = sp.from_env(
        {
            "SLURMFM_HOST_ORDER": "a b",
            "SLURMFM_SPARES": "c",
            "SLURMFM_TOPO_ADDRS": "a=s.l1.a c=s.l1.c",
            "SLURMFM_RDZV_HOST": "10.1.1.1",
        }
    )
    assert pool == sp.Pool(
        ("a", "b"), ("c",), topo=(("a", "s.l1.a"), ("c", "s.l1.c")), master="10.1.1.1"
    )


class Lab:
    """scontrol/srun for a 3-node allocation (n1 n2 train, n3 stands by): the health gate
    answers from ``gates`` in turn; the probe hears every node not in ``dead``."""

    def __init__(self, gates: Sequence[str] = (), dead: Sequence[str] = ()) -> None:
        self.gates = list(gates)
        self.dead = set(dead)
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        a = list(argv)
        self.calls.append(a)
        if a[:2] == ["scontrol", "ping"]:
            return 0, "Slurmctld(primary) at c is UP"
        if a[0] == "sacct":
            return 1, "Slurm accounting storage is disabled"
        if a[0] == "srun" and "printenv" in a:
            return 1, "\n".join(h for h in ("n1", "n2", "n3") if h not in self.dead)
        if a[0] == "srun" and "health" in a:
            out = self.gates.pop(0) if self.gates else ""
            return (1 if "FAIL" in out else 0), out
        return 0, ""


def healthy(*nodes: str) -> str:
    return "".join(f"slurmfm-health {n} OK\n" for n in nodes)


def batch(
    tmp: Path, lab: Lab, steps: Sequence[Any], *opts: str, entry: bool = False
) -> tuple[Batch, list[Any]]:
    """The batch step of the 2 + 1 job; ``entry``: the launch runs the node entry, so the
    health gate runs inside the launch step (slurmfm.job.gate), else in a step of its own."""
    node = ["python3", "rt.pyz", "node", "--"] if entry else []
    a = parser().parse_args(
        [
            "batch",
            "--runtime",
            "rt.pyz",
            "--drain",
            "1",
            "--restart-in-job",
            "1",
            "--retry-exit",
            "1",
            *opts,
            "--",
            "srun",
            "--nodes=2",
            "--nodelist=n1,n2",
            *node,
            "torchrun",
            "--nnodes=2",
            "--master-addr=10.0.0.1",
            "train.py",
        ]
    )
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NAME": "rt",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURMFM_LOG_DIR": str(tmp),
        "SLURMFM_CHECKPOINT_DIR": str(tmp / "ckpt"),
        "SLURMFM_HOST_ORDER": "n1 n2",
        "SLURMFM_NODELIST": "n1,n2",
        "SLURMFM_SPARES": "n3",
        "SLURMFM_RDZV_HOST": "10.0.0.1",
        "SLURMFM_NODE_ADDRS": "n1=10.0.0.1 n2=10.0.0.2 n3=10.0.0.3",
    }
    (tmp / "ckpt").mkdir(exist_ok=True)
    launched: list[Any] = []
    it = iter(steps)
    box: list[Batch] = []

    def popen(argv: list[str], env: dict[str, str] | None = None, **kw: object) -> Any:
        launched.append((list(argv), dict(env or {})))
        step = next(it)
        if isinstance(step, Gated):
            step.start(box[0].evidence_dir)
        return step

    ticks = iter(range(10**6))
    b = Batch(
        BatchOptions.from_namespace(a),
        env,
        run=lab,
        popen=popen,
        clock=lambda: float(next(ticks)),
        sleep=lambda s: None,
    )
    b.launch = a.argv[1:]  # type: ignore[attr-defined]
    box.append(b)
    return b, launched


class Gated(Step):
    """A launch whose node entries check themselves (the gate inside the launch step): each
    node's verdict lands in the evidence directory; after the word "go" it ends ``rc``,
    without it (a node failed) 3, the gate's own code."""

    def __init__(self, rc: int, verdicts: dict[str, str]) -> None:
        super().__init__(rc)
        self.verdicts = verdicts
        self.stdin = io.BytesIO()
        self.stdin.close = lambda: None  # type: ignore[method-assign]

    def start(self, directory: str) -> None:
        for name, verdict in self.verdicts.items():
            Path(directory, name + gate.SUFFIX).write_text(verdict + "\n")

    def wait(self, timeout: float | None = None) -> int:
        if self.stdin.getvalue() != gate.GO:
            self.rc = gate.NOT_STARTED
        return super().wait(timeout)


def launch_argv(b: Batch) -> list[str]:
    return list(b.launch)  # type: ignore[attr-defined]


def test_a_node_failing_the_gate_at_the_restart_is_swapped_and_the_step_runs_again(
    tmp_path: Path,
) -> None:
    lab = Lab(
        [
            healthy("n1", "n2", "n3"),
            healthy("n2", "n3") + "slurmfm-health n1 FAIL dcgmi diag -r 1 failed\n",
            healthy("n2", "n3"),
        ]
    )
    b, launched = batch(tmp_path, lab, [Step(1), Step(1), Step(0)], "--health", "1", "--dcgm", "1")
    assert b.main([], launch_argv(b)) == 0
    assert not any(c[:2] == ["scontrol", "requeue"] for c in lab.calls)  # never requeued
    assert [
        "scontrol",
        "update",
        "NodeName=n1",
        "State=DRAIN",
        "Reason=slurmfm: health gate: dcgmi diag -r 1 failed",
    ] in lab.calls
    (first, _), (second, env), (third, _) = launched
    assert third == second
    assert "--nodelist=n1,n2" in first
    # the spare in n1's place: node 0 now, so the rendezvous moved with it
    assert "--nodelist=n3,n2" in second
    assert "--master-addr=10.0.0.3" in second
    assert "--nnodes=2" in second
    assert env["SLURMFM_HOST_ORDER"] == "n3 n2"
    assert env["SLURMFM_RDZV_HOST"] == "10.0.0.3"
    events = [x.split()[0] for x in state(tmp_path)]
    assert events == ["event=relaunch", "event=spare", "event=relaunch", "event=finished"]
    assert (
        "health gate failed on n1: n1 replaced by spare n3; 0 spare(s) left" in (state(tmp_path)[1])
    )
    gates = [c for c in lab.calls if c[0] == "srun" and "health" in c]
    assert gates[0][:2] == ["srun", "--nodes=3"]
    # n1 is out of the job's own steps from then on
    assert gates[-1][1:3] == ["--nodes=2", "--ntasks=2"]
    assert "--exclude=n1" in gates[-1]


def test_without_a_healthy_spare_the_job_requeues_off_the_failed_node(tmp_path: Path) -> None:
    lab = Lab(
        [
            healthy("n1", "n2", "n3"),
            "slurmfm-health n1 FAIL x\nslurmfm-health n2 OK\nslurmfm-health n3 FAIL y\n",
        ]
    )
    b, launched = batch(tmp_path, lab, [Step(1)], "--health", "1", "--dcgm", "1")
    assert b.main([], launch_argv(b)) == 3  # the health gate's code, as without spares
    assert ["scontrol", "requeue", "77"] in lab.calls
    assert len(launched) == 1
    assert state(tmp_path)[-1] == "event=requeue health gate failed on n1 n3"


def test_a_gate_that_did_not_hear_from_every_node_swaps_nothing(tmp_path: Path) -> None:
    lab = Lab(["slurmfm-health n1 FAIL x\nslurmfm-health n2 OK\n"])  # n3 said nothing
    b, launched = batch(tmp_path, lab, [Step(0)], "--health", "1", "--dcgm", "1")
    assert b.main([], launch_argv(b)) == 3
    assert not launched
    assert state(tmp_path)[-1] == "event=requeue health gate failed on n1"


def test_a_spare_failing_the_first_gate_is_set_aside_and_the_job_starts(tmp_path: Path) -> None:
    lab = Lab([healthy("n1", "n2") + "slurmfm-health n3 FAIL x\n"])
    b, launched = batch(tmp_path, lab, [Step(0)], "--health", "1", "--dcgm", "1")
    assert b.main([], launch_argv(b)) == 0
    ((argv, _),) = launched
    assert "--nodelist=n1,n2" in argv
    assert state(tmp_path)[0].startswith("event=spare health gate failed on n3: spare n3 failed")


def test_a_node_not_answering_is_drained_and_swapped_without_a_requeue(tmp_path: Path) -> None:
    lab = Lab(dead=["n2"])
    b, launched = batch(tmp_path, lab, [Step(1), Step(0)])
    assert b.main([], launch_argv(b)) == 0
    assert not any(c[:2] == ["scontrol", "requeue"] for c in lab.calls)
    probe = next(c for c in lab.calls if "printenv" in c)
    assert "--nodelist=n1,n2,n3" in probe  # the spare is probed too
    assert [
        "scontrol",
        "update",
        "NodeName=n2",
        "State=DRAIN",  # a DOWN node would end the whole job (no --no-kill)
        "Reason=slurmfm: did not answer after a failed step (job 77)",
    ] in lab.calls
    assert not any("State=DOWN" in " ".join(c) for c in lab.calls)
    assert "--nodelist=n1,n3" in launched[1][0]
    assert "--master-addr=10.0.0.1" in launched[1][0]  # node 0 stayed
    assert [x.split()[0] for x in state(tmp_path)] == [
        "event=spare",
        "event=relaunch",
        "event=finished",
    ]


def test_a_swap_still_counts_against_the_restart_cap(tmp_path: Path) -> None:
    lab = Lab(dead=["n2"])
    b, launched = batch(tmp_path, lab, [Step(1)], "--max-restarts", "0")
    assert b.main([], launch_argv(b)) == 1
    assert len(launched) == 1
    assert state(tmp_path)[-1].startswith("event=give-up restart cap 0 reached")


def prepared(monkeypatch: Any, tmp: Path, *opts: str) -> dict[str, str]:
    """The prepare step's exports on a 3-node allocation n1 n2 n3 (leaves: n1 n3 on l1)."""
    from slurmfm.job import cli

    def run(argv: Sequence[str], timeout: float) -> tuple[int, str]:
        if argv[0] == "srun":  # whoami on every node
            return 0, "n1 s.l1.n1\nn2 s.l2.n2\nn3 s.l1.n3\n"
        return 0, "".join(f"NodeName=n{i} NodeAddr=10.0.0.{i}\n" for i in (1, 2, 3))

    from slurmfm.job import health, slurm

    monkeypatch.setattr(health, "run_command", run)  # prepare imports it when it runs
    monkeypatch.setattr(slurm, "hostnames", lambda text: ["n1", "n2", "n3"])
    env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_ID": "7", "SLURMFM_LOG_DIR": str(tmp)}
    out: list[str] = []
    assert cli.prepare(cli.parser().parse_args(["prepare", *opts]), env, out) == 0
    return {k[len("export ") :]: v.strip("'") for k, v in (x.split("=", 1) for x in out)}


def test_prepare_sets_the_last_of_the_order_aside(monkeypatch: Any, tmp_path: Path) -> None:
    e = prepared(monkeypatch, tmp_path, "--spare-nodes", "1")
    assert (e["SLURMFM_HOST_ORDER"], e["SLURMFM_SPARES"], e["SLURMFM_NNODES"]) == (
        "n1 n2",
        "n3",
        "2",
    )
    assert e["SLURMFM_NODE_ADDRS"] == "n1=10.0.0.1 n2=10.0.0.2 n3=10.0.0.3"  # the spare's too
    # topology-sorted: the order groups leaf l1 (n1 n3) first, the spare is n2; its address
    # is exported for the swap's choice
    e = prepared(monkeypatch, tmp_path, "--spare-nodes", "1", "--topo-addr", "1")
    assert (e["SLURMFM_HOST_ORDER"], e["SLURMFM_SPARES"]) == ("n1 n3", "n2")
    assert e["SLURMFM_TOPO_ADDRS"] == "n1=s.l1.n1 n3=s.l1.n3 n2=s.l2.n2"
    # a pinned plan names the training nodes; the node Slurm added stands by
    e = prepared(monkeypatch, tmp_path, "--spare-nodes", "1", "--planned", "n3 n1")
    assert (e["SLURMFM_HOST_ORDER"], e["SLURMFM_SPARES"]) == ("n3 n1", "n2")


def test_a_node_failing_the_gate_inside_the_launch_step_is_swapped_and_the_launch_reruns(
    tmp_path: Path,
) -> None:
    """The gate inside the launch checks the training nodes only: at the restart it fails
    n1; the launch did not start, the spare takes n1's place (no restart counted for that),
    and the next launch's gate checks the spare."""
    runs = [
        Gated(1, {"n1": "OK", "n2": "OK"}),
        Gated(0, {"n1": "FAIL dcgmi diag -r 1 failed", "n2": "OK"}),
        Gated(0, {"n3": "OK", "n2": "OK"}),
    ]
    lab = Lab()
    b, launched = batch(tmp_path, lab, runs, "--health", "1", "--dcgm", "1", entry=True)
    assert b.main([], launch_argv(b)) == 0
    assert not any(c[:2] == ["scontrol", "requeue"] for c in lab.calls)
    assert not any("health" in c for c in lab.calls if c[0] == "srun")  # no gate step
    assert [x.split()[0] for x in state(tmp_path)] == [
        "event=relaunch",
        "event=spare",
        "event=finished",
    ]
    assert "(in-job restart 1, restart 1 of 3)" in state(tmp_path)[0]
    assert "--nodelist=n3,n2" in launched[2][0]
    assert launched[2][1]["SLURMFM_HOST_ORDER"] == "n3 n2"
    assert runs[2].stdin.getvalue() == gate.GO


def test_a_spare_failing_the_gate_inside_the_launch_leaves_no_spare_and_requeues(
    tmp_path: Path,
) -> None:
    runs = [
        Gated(0, {"n1": "FAIL x", "n2": "OK"}),
        Gated(0, {"n3": "FAIL y", "n2": "OK"}),
    ]
    lab = Lab()
    b, launched = batch(tmp_path, lab, runs, "--health", "1", "--dcgm", "1", entry=True)
    assert b.main([], launch_argv(b)) == 3
    assert ["scontrol", "requeue", "77"] in lab.calls
    assert len(launched) == 2
    assert state(tmp_path)[-1] == "event=requeue health gate failed on n3"
