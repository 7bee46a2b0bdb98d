"""``slurmfm topology``: import, export and show cluster topologies.

Why a separate module: the topology commands pull in networkx, ruamel.yaml, rich and (for live
EC2 imports) boto3; keeping them here, imported lazily inside each command, leaves
``slurmfm --help`` as fast as before (only click is imported at module level, as in __init__.py).
Errors the user can fix (``SlurmfmError``, and ``TopologyError`` for bad files) print one line
per problem on stderr and exit with status 2, like the rest of the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from slurmfm.cli.common import friendly, write_atomic

if TYPE_CHECKING:
    from slurmfm.backends.slurm_cli import SlurmCLI
    from slurmfm.topology.model import Topology

F = TypeVar("F", bound=Callable[..., Any])

IMPORT_FORMATS = ("auto", "ec2-json", "hyperpod", "tree", "block", "yaml", "scontrol")
_STORE_FMT = {
    "auto": None,
    "ec2-json": "ec2",
    "hyperpod": "hyperpod",
    "tree": "conf",
    "block": "conf",
    "yaml": "yaml",
    "scontrol": "scontrol",
}
STATE_STYLE = {
    "idle": "green",
    "allocated": "red",
    "mixed": "yellow",
    "drain": "magenta",
    "down": "bright_black",
    "unknown": "white",
}


def _slurm() -> SlurmCLI:
    """The one Slurm client (slurmfm.backends.slurm_cli): no second runner here."""
    from slurmfm.backends.slurm_cli import SlurmCLI

    return SlurmCLI()


def _summary(t: Topology) -> str:
    return (
        f"{len(t.nodes)} nodes, {len(t.parent_of)} switches, {t.kind}, depth {t.depth}, "
        f"{len(t.domains())} NVLink domains"
    )


@click.group("topology")
def topology() -> None:
    """Import, export and show cluster network topologies (EC2, HyperPod, Slurm files)."""


# ---------------------------------------------------------------------------- import
@topology.command("import")
@click.argument("source", required=False, type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Save here.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(IMPORT_FORMATS),
    default="auto",
    show_default=True,
    help="Format of SOURCE (auto detects from content).",
)
@click.option(
    "--mapping",
    type=click.Path(exists=True, dir_okay=False),
    help="Instance id -> Slurm node name (JSON object or 'i-... node' lines), for EC2 data.",
)
@click.option("--partition", help="Which topology of a topology.yaml to import.")
@click.option("--from-ec2", is_flag=True, help="Call EC2 DescribeInstanceTopology (needs boto3).")
@click.option("--region", help="AWS region for --from-ec2 (default: the AWS environment's).")
@click.option("--instance-type", "instance_types", multiple=True, help="Filter (p5*, repeatable).")
@click.option("--instance-id", "instance_ids", multiple=True, help="Only these instances.")
@click.option(
    "--names-from-slurm",
    is_flag=True,
    help="Name EC2 instances by matching private IPs with `scontrol show nodes` NodeAddr.",
)
@friendly
def import_(
    source: str | None,
    output: str,
    fmt: str,
    mapping: str | None,
    partition: str | None,
    from_ec2: bool,
    region: str | None,
    instance_types: tuple[str, ...],
    instance_ids: tuple[str, ...],
    names_from_slurm: bool,
) -> None:
    """Read a topology (file SOURCE or live EC2) and save it in slurmfm's JSON format."""
    from slurmfm.errors import SlurmfmError
    from slurmfm.topology import store

    names: dict[str, str] | None = None
    if mapping:
        from slurmfm.topology.ec2 import load_mapping_file

        names = load_mapping_file(mapping)
    if from_ec2:
        if source:
            raise SlurmfmError("give either SOURCE or --from-ec2, not both")
        t = _import_ec2(region, instance_types, instance_ids, names, names_from_slurm)
    else:
        if not source:
            raise SlurmfmError("missing SOURCE (a file), or use --from-ec2")
        if names_from_slurm:
            raise SlurmfmError("--names-from-slurm only applies to --from-ec2")
        t = store.load_any(source, fmt=_STORE_FMT[fmt], names=names, partition=partition)
        if fmt in ("tree", "block") and t.kind != fmt:
            raise SlurmfmError(f"{source}: is a {t.kind} topology, not {fmt}")
    store.save_topology(t, output)
    click.echo(f"wrote {output}: {_summary(t)}", err=True)


def _import_ec2(
    region: str | None,
    instance_types: tuple[str, ...],
    instance_ids: tuple[str, ...],
    names: dict[str, str] | None,
    names_from_slurm: bool,
) -> Topology:
    """Live DescribeInstanceTopology with a rich progress line (pages of 100 instances)."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from slurmfm.topology import ec2

    client = ec2.client_from_env(region)
    console = Console(stderr=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]DescribeInstanceTopology[/]: {task.fields[count]} instances"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("ec2", total=None, count=0)
        raw = ec2.describe_instance_topology(
            client,
            instance_ids=list(instance_ids) or None,
            instance_types=list(instance_types) or None,
            progress=lambda n: progress.update(task, count=n),
        )
    report = ec2.parse_topology_json(raw)
    ips: dict[str, str] | None = None
    if names_from_slurm:
        ids = [r.instance_id for r in report.records]
        ips = ec2.map_by_private_ip(client, ids)
        addr = ec2.parse_scontrol_nodes(_slurm().show_nodes())
        names = {**ec2.names_from_ips(ips, addr), **(names or {})}
    t = ec2.to_topology(report, names, private_ips=ips)
    console.print(f"EC2: {report.summary()}")
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    return t


# ---------------------------------------------------------------------------- export
def _slurm_version(given: str | None) -> str:
    """--slurm-version, else the local Slurm's (the backend's one way to ask the version)."""
    from slurmfm.errors import SlurmfmError

    if given:
        return given
    try:
        return _slurm().version()
    except SlurmfmError as exc:
        raise SlurmfmError(f"give --slurm-version (could not ask Slurm: {exc})") from exc


@topology.command("export")
@click.argument("topology_file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(("tree", "block", "yaml")), required=True)
@click.option("--slurm-version", help="Target Slurm (default: `sbatch --version` here).")
@click.option(
    "--partition",
    "partitions",
    multiple=True,
    metavar="NAME=FILE",
    help="topology.yaml: partition NAME uses the topology saved in FILE (repeatable).",
)
@click.option("--default", "default", help="topology.yaml: cluster_default topology name.")
@click.option("--block-size", type=int, help="Base block size (default: largest UltraServer).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here (atomic).")
@friendly
def export(
    topology_file: str | None,
    fmt: str,
    slurm_version: str | None,
    partitions: tuple[str, ...],
    default: str | None,
    block_size: int | None,
    output: str | None,
) -> None:
    """Write topology.conf (tree/block) or topology.yaml for a saved topology."""
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.errors import SlurmfmError
    from slurmfm.topology import slurm_formats, store

    raw_version = _slurm_version(slurm_version)
    try:
        version = SlurmVersion.parse(raw_version)
    except ValueError as exc:
        raise SlurmfmError(str(exc)) from exc
    if fmt == "yaml":
        if topology_file:
            raise SlurmfmError("topology.yaml is built from --partition NAME=FILE, not TOPOLOGY")
        if not partitions:
            raise SlurmfmError("--format yaml needs at least one --partition NAME=FILE")
        parts: dict[str, Topology] = {}
        for spec in partitions:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise SlurmfmError(f"--partition {spec!r}: expected NAME=FILE")
            if name in parts:
                raise SlurmfmError(f"--partition {name!r} given twice")
            parts[name] = store.load_any(path)
        text = slurm_formats.export_yaml(parts, version, default=default, block_size=block_size)
    else:
        if partitions:
            raise SlurmfmError("--partition applies to --format yaml only")
        if not topology_file:
            raise SlurmfmError("missing TOPOLOGY (a saved topology or any importable file)")
        t = store.load_any(topology_file)
        if fmt == "tree":
            text = slurm_formats.export_tree(t, version)
        else:
            text = slurm_formats.export_block(t, version, block_size=block_size)
    if output:
        write_atomic(output, text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


# ---------------------------------------------------------------------------- show
def _rich_tree(t: Topology, show_nodes: bool) -> Any:
    from rich.text import Text
    from rich.tree import Tree

    counts = t.free_counts()

    def label(s: str) -> Text:
        free, total = counts[s]
        style = "green" if free == total else ("red" if free == 0 else "yellow")
        txt = Text(s, style="bold")
        txt.append(f"  {free}/{total} free", style=style)
        src = t.source_ids.get(s)
        if src and src != s:
            txt.append(f"  ({src})", style="dim")
        return txt

    root = t.root
    tree = Tree(label(root))

    def add(parent: Any, s: str) -> None:
        sw = t.switch(s)
        if sw.is_leaf:
            if show_nodes:
                line = Text()
                for i, n in enumerate(sw.children):
                    if i:
                        line.append(" ")
                    state = t.nodes[n].state
                    line.append(n, style=STATE_STYLE.get(state, "white"))
                parent.add(line)
            return
        for c in sw.children:
            add(parent.add(label(c)), c)

    if t.kind == "block":
        from slurmfm.topology.slurm_formats import block_order

        for b in block_order(t):
            add(tree.add(label(b)), b)
    else:
        add(tree, root)
    return tree


@topology.command("show")
@click.argument("topology_file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--live", is_flag=True, help="Read `scontrol show topology` and `sinfo` states.")
@click.option("--svg", type=click.Path(dir_okay=False), help="Also write an SVG picture here.")
@click.option("--title", default="", help="Title for the SVG.")
@click.option("--nodes/--no-nodes", "show_nodes", default=True, help="List nodes under leaves.")
@friendly
def show(
    topology_file: str | None, live: bool, svg: str | None, title: str, show_nodes: bool
) -> None:
    """Print the fabric tree with free/busy counts per switch (and optionally an SVG)."""
    from rich.console import Console

    from slurmfm.errors import SlurmfmError
    from slurmfm.topology import store

    if topology_file:
        t = store.load_any(topology_file)
    elif live:
        from slurmfm.topology.live import read_live

        t, notes = read_live(_slurm())
        for note in notes:
            click.echo(f"slurmfm: {note}", err=True)
    else:
        raise SlurmfmError("give a TOPOLOGY file, or --live to read the cluster")
    console = Console()
    console.print(_rich_tree(t, show_nodes))
    free = sum(1 for n in t.nodes.values() if n.free)
    console.print(f"{_summary(t)}; {free} free, {len(t.nodes) - free} busy/unavailable")
    if svg:
        from slurmfm.topology.render_svg import render_svg

        write_atomic(svg, render_svg(t, title=title or (topology_file or "live cluster")))
        click.echo(f"wrote {svg}", err=True)
