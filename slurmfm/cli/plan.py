"""``slurmfm plan``: choose nodes and rank order on a topology, and show why.

Only click is imported at module top (``slurmfm --help`` stays fast; see the package's
``__init__``). Flags override the recipe; without a recipe the flags describe the job. An
impossible request exits 2 with the planner's reason, like every other user-fixable error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard

import click

from slurmfm.cli.common import friendly, risk_option

if TYPE_CHECKING:
    from slurmfm.launchers import MegatronLauncher
    from slurmfm.plan.planner import Plan


def _unavailable(value: str | None) -> list[str]:
    """A Slurm hostlist, or ``@FILE`` with hostlists separated by whitespace or commas."""
    if not value:
        return []
    from slurmfm.errors import SlurmfmError
    from slurmfm.topology.hostlist import expand_hostlist

    text = value
    if value.startswith("@"):
        from pathlib import Path

        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise SlurmfmError(f"--unavailable {value}: cannot read: {exc.strerror}") from exc
        lines = [ln.split("#", 1)[0] for ln in text.splitlines()]
        text = ",".join(w for ln in lines for w in ln.split())
    try:
        return expand_hostlist(text.strip().strip(","))
    except ValueError as exc:
        raise SlurmfmError(f"--unavailable: {exc}") from exc


def _print_plan(p: Plan, *, as_json: bool, explain: bool) -> None:
    if as_json:
        import json

        click.echo(json.dumps(p.as_json(), indent=2, sort_keys=False))
        return
    click.echo(f"mode: {p.mode}")
    click.echo(f"nodes ({len(p.nodes)}, rank order): {' '.join(p.nodes)}")
    click.echo(f"leaves ({len(p.leaves)}): {' '.join(p.leaves)}")
    click.echo("sbatch: " + (" ".join(p.sbatch_options) or "(none)"))
    r = p.predicted
    click.echo(
        f"predicted: {r.predicted_s * 1e3:.3f} ms/step, ideal {r.ideal_s * 1e3:.3f} ms, "
        f"slowdown {r.slowdown:.3f}"
    )
    if explain:
        click.echo("why:")
        for line in p.explanation:
            click.echo(f"  - {line}")


def _is_megatron(launcher: object) -> TypeGuard[MegatronLauncher]:
    from slurmfm.launchers import MegatronLauncher

    return isinstance(launcher, MegatronLauncher)


@click.command("plan")
@click.argument("recipe", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--topology",
    "topology_file",
    required=True,
    type=click.Path(dir_okay=False),
    help="Topology file in any format slurmfm reads (topology.conf/yaml, EC2 JSON...), or "
    "'live' for the cluster's own (scontrol show topology, with node states from sinfo).",
)
@click.option("--nodes", type=click.IntRange(min=1), help="Whole nodes (overrides the recipe).")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    help="GPUs (processes) per node; default the recipe's procs_per_node, else 8.",
)
@click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel size.")
@click.option("--pp", type=click.IntRange(min=1), help="Pipeline-parallel size.")
@click.option("--cp", type=click.IntRange(min=1), help="Context-parallel size.")
@click.option("--ep", type=click.IntRange(min=1), help="Expert-parallel size.")
@click.option(
    "--unavailable",
    metavar="HOSTLIST|@FILE",
    help="Nodes not to use: a Slurm hostlist or @FILE of hostlists.",
)
@click.option(
    "--mode",
    type=click.Choice(["pin", "constrain"]),
    default="pin",
    show_default=True,
    help="pin: --nodelist in planned order; constrain: --switches/--segment + rank map.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@click.option("--explain", is_flag=True, help="Print why: switch, leaves, leftover, cost.")
@click.option(
    "--slurm-version",
    metavar="V",
    help="Target Slurm (gates --segment, 24.05+); default the recipe's, else unknown.",
)
@click.option(
    "--params",
    "params_file",
    type=click.Path(dir_okay=False),
    help="Cost-model calibration file (YAML/JSON; see slurmfm.plan.cost.CostParams).",
)
@click.option(
    "--switch-wait",
    default="00:10:00",
    show_default=True,
    metavar="TIME",
    help="The @TIME of --switches in constrain mode.",
)
@click.option(
    "--oversubscription",
    type=click.FloatRange(min=1),
    help="Uplink oversubscription of every EFA tier (leaf, spine, core) for the cost model; "
    "AWS does not publish it (default 1, or the --params file's).",
)
@click.option(
    "--simulate",
    is_flag=True,
    help="Also check the plan against Slurm's own choice in simulated time (SimGrid, "
    "python3-simgrid) and keep the faster (pin mode, tree fabrics).",
)
@risk_option
@click.option(
    "--avoid-failed-since",
    metavar="DURATION",
    help="Leave out nodes that failed slurmfm's health gate in the last DURATION (24h, 90m, "
    "2d): from Slurm's slurmfm drain reasons and the state files under --failed-records.",
)
@click.option(
    "--failed-records",
    multiple=True,
    type=click.Path(file_okay=False),
    help="A log directory whose *.state job records to read for --avoid-failed-since (repeatable).",
)
@friendly
def plan_command(
    recipe: str | None,
    topology_file: str,
    nodes: int | None,
    gpus_per_node: int | None,
    tp: int | None,
    pp: int | None,
    cp: int | None,
    ep: int | None,
    unavailable: str | None,
    mode: str,
    as_json: bool,
    explain: bool,
    slurm_version: str | None,
    params_file: str | None,
    switch_wait: str,
    oversubscription: float | None,
    simulate: bool,
    risk: str,
    avoid_failed_since: str | None,
    failed_records: tuple[str, ...],
) -> None:
    """Plan nodes and rank order for RECIPE (or for the job the flags describe)."""
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.errors import SlurmfmError
    from slurmfm.plan.cost import CostParams, JobShape
    from slurmfm.plan.planner import job_for_recipe, plan
    from slurmfm.topology.model import TopologyError

    version = None
    rec = None
    if recipe:
        from slurmfm.recipe.loader import load_recipe
        from slurmfm.target import Target

        rec = load_recipe(recipe)
        base = job_for_recipe(rec)
        if rec.cluster.slurm_version != "auto":
            version = Target.for_recipe(rec).slurm_version
    else:
        if nodes is None:
            raise SlurmfmError("plan: give a RECIPE or --nodes")
        base = JobShape(nodes=nodes, gpus_per_node=gpus_per_node or 8)
    job = JobShape(
        nodes=nodes if nodes is not None else base.nodes,
        gpus_per_node=gpus_per_node if gpus_per_node is not None else base.gpus_per_node,
        tp=tp if tp is not None else base.tp,
        pp=pp if pp is not None else base.pp,
        cp=cp if cp is not None else base.cp,
        ep=ep if ep is not None else base.ep,
        span=base.span,  # a server's replicas stay whole in one NVLink domain
    )
    if not slurm_version and topology_file == "live":
        # The cluster is one call away: plan for its Slurm, as submit does (or say why not).
        from slurmfm.cli.common import cluster_version

        slurm_version = cluster_version(None)
    if slurm_version:
        try:
            version = SlurmVersion.parse(slurm_version)
        except ValueError as exc:
            raise SlurmfmError(f"--slurm-version: {exc}") from exc
    try:
        from slurmfm.api import load_topology

        topo = load_topology(topology_file)  # a file, or "live" (scontrol + sinfo)
    except TopologyError as exc:
        raise SlurmfmError(f"--topology: {exc}") from exc
    params = CostParams.from_file(params_file) if params_file else None
    launcher = rec.launcher if rec is not None else None
    # The schema (pydantic) is imported only with a recipe: without one it was a third of a
    # 64k-node plan's CPU time (scripts/bench_plan_scale.py).
    if launcher is not None and not params_file and _is_megatron(launcher):
        from slurmfm.plan.cost import message_bytes_for_megatron

        sizes = message_bytes_for_megatron(launcher.model_args, tp=job.tp, pp=job.pp, dp=job.dp)
        if sizes:  # the recipe's model and batch, not the illustrative defaults
            params = CostParams.default().with_message_bytes(sizes)
    if oversubscription is not None:
        params = (params or CostParams.default()).with_oversubscription(oversubscription)
    avoid = None
    if avoid_failed_since:
        from slurmfm.plan.failed import parse_duration, recent_failures

        avoid = recent_failures(parse_duration(avoid_failed_since), failed_records)
    elif failed_records:
        raise SlurmfmError("--failed-records needs --avoid-failed-since")
    result = plan(
        topo,
        job,
        unavailable=_unavailable(unavailable),
        mode="constrain" if mode == "constrain" else "pin",
        slurm_version=version,
        params=params,
        switch_wait=switch_wait,
        simulate=simulate,
        avoid=avoid,
        risk="model" if risk == "model" else "none",
    )
    _print_plan(result, as_json=as_json, explain=explain)
