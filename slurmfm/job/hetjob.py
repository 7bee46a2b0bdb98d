"""Heterogeneous job components and container steps, as the batch step needs them.

A heterogeneous job (``#SBATCH hetjob``) has one allocation per component; ``srun
--het-group=N`` runs a step in component N only (Slurm docs, heterogeneous_jobs.html,
"Launching Applications (Job Steps)"). The batch script names each component beyond the first
with ``--component`` (its node count, health expectations and the GPUs its observability agent
maps) and the NCCL/EFA profile lines in which its instance type differs from the batch script's
exports with ``--component-env`` / ``--component-unset``: the runtime applies them to every step
of that component (the srun inherits the environment it is started with and exports it to the
tasks: srun(1) ``--export``, default ALL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Sequence

# The channel device NCCL's multi-node NVLink needs (NVIDIA/nccl src/mnnvl.cc; channel files
# under this directory: NVIDIA IMEX guide "IMEX Channels",
# https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/imexchannels.html).
IMEX_CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"

# Run inside the job's container image on each node: only sh's own `test` and `echo`, so any
# image with /bin/sh passes or fails it; one report line per node, as the health step prints.
CONTAINER_IMEX_CHECK = (
    'n="${SLURMD_NODENAME:-unknown}"; '
    f"if test -e {IMEX_CHANNEL}; then "
    'echo "slurmfm-health $n OK"; '
    f'else echo "slurmfm-health $n FAIL no {IMEX_CHANNEL} inside the container '
    '(mount the directory: container.mounts)"; fi'
)


class Component(NamedTuple):
    """One component of the job, as the runtime needs it (group 0 is the batch's own)."""

    group: int
    nodes: int
    health: bool
    gpus: int
    efa: int
    imex: bool
    env: tuple[tuple[str, str], ...] = ()
    unset: tuple[str, ...] = ()


class ComponentError(ValueError):
    pass


def component_spec(c: Component) -> str:
    """The script's ``--component`` value of ``c`` (its environment goes in
    :func:`env_spec`/:func:`unset_spec` words); :func:`parse_component` reads it back."""
    return "%d nodes=%d health=%d gpus=%d efa=%d imex=%d" % (
        c.group,
        c.nodes,
        c.health,
        c.gpus,
        c.efa,
        c.imex,
    )


def env_spec(group: int, name: str, value: str) -> str:
    """A ``--component-env`` value, ``G:NAME=VALUE`` (VALUE may be the script's shell text)."""
    return "%d:%s=%s" % (group, name, value)


def unset_spec(group: int, name: str) -> str:
    """A ``--component-unset`` value, ``G:NAME``."""
    return "%d:%s" % (group, name)


def parse_component(spec: str) -> Component:
    """``"1 nodes=2 health=1 gpus=8 efa=32 imex=0"`` (the script's ``--component``)."""
    words = spec.split()
    try:
        group = int(words[0])
        kv = dict(w.split("=", 1) for w in words[1:])
        return Component(
            group,
            int(kv.get("nodes", "1")),
            kv.get("health", "0") == "1",
            int(kv.get("gpus", "0")),
            int(kv.get("efa", "0")),
            kv.get("imex", "0") == "1",
        )
    except (IndexError, ValueError) as exc:
        raise ComponentError(f"--component {spec!r}: {exc}") from exc


def components(
    specs: Sequence[str], env_specs: Sequence[str], unset_specs: Sequence[str]
) -> list[Component]:
    """The components beyond the first, each with its own environment lines.

    ``env_specs``: ``"G:NAME=VALUE"``; ``unset_specs``: ``"G:NAME"``.
    """
    out = []
    for spec in specs:
        c = parse_component(spec)
        env = []
        for e in env_specs:
            g, _, kv = e.partition(":")
            name, eq, value = kv.partition("=")
            if g == str(c.group) and eq and name:
                env.append((name, value))
        unset = tuple(
            u.partition(":")[2] for u in unset_specs if u.partition(":")[0] == str(c.group)
        )
        out.append(c._replace(env=tuple(env), unset=unset))
    return out


def step_group(argv: Sequence[str]) -> int | None:
    """The ``--het-group=N`` of an srun command line, if it names one group."""
    for w in argv[1:]:
        if not w.startswith("-"):
            break
        if w.startswith("--het-group="):
            value = w.split("=", 1)[1]
            return int(value) if value.isdigit() else None
    return None


def step_env(env: dict[str, str], comp: Component | None) -> dict[str, str]:
    """``env`` with component ``comp``'s own profile applied (a copy; ``comp`` None: as is).

    Values arrive expanded by the batch shell, as its own exports are (a profile value that
    prepends to ``LD_LIBRARY_PATH`` prepends to the batch's, which may already hold component
    0's prefix: harmless, the component's own directories come first).
    """
    out = dict(env)
    if comp is None:
        return out
    for name in comp.unset:
        out.pop(name, None)
    out.update(comp.env)
    return out


def container_words(argv: Sequence[str]) -> list[str]:
    """The Pyxis options of an srun command line (``--container-*``, ``--no-container-*``)."""
    if list(argv[:1]) != ["srun"]:
        return []
    out = []
    for w in argv[1:]:
        if not w.startswith("-"):
            break
        if w.startswith(("--container-", "--no-container-")):
            out.append(w)
    return out
