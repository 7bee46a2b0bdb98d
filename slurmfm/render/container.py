"""A launch in a Pyxis container: its options (image, mounts, the variables named for the
container, the IMEX channel, the container's name), its first program (the node rank from
the task id, then the launch command) and how the save signal reaches its training
processes; pure (part of :mod:`slurmfm.render.script`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurmfm.launchers import LauncherSpec
from slurmfm.quote import env_name, sh_quote

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.recipe.schema import Recipe


def _container_entry(torchrun: bool, nccl_log: bool) -> str:
    """The first program of a launch task in a Pyxis container: fixed POSIX ``sh`` text (no
    user value). Its arguments are the runtime's node entry (``python3 -I -S -c CHECKED node
    ... -- COMMAND``), which it ``exec``s with the image's ``python3``: the private runtime
    copy is mounted read-only at the same path (:func:`_container_opts`) and checked there by
    the same program as on the host, so node reports, error files, the launcher's stderr
    tail, the rank from the host order (recomputed on a replay) and node 0's printed command
    are the same in and out of a container.

    The save signal ignored first: should a USR2 reach the whole step (``scancel
    --signal=USR2`` of the step), the entry and the launcher ignore it (an ignored signal
    stays ignored across ``exec``, POSIX execve(2)); the host step ``runtime forward``
    delivers it (_container_forward).

    An image without ``python3`` runs the launch as it did before the entry moved into the
    container, and task 0 says so in the job log in one line: the words up to ``--`` (the
    entry) are dropped, the node rank is this node's place in the host order (torchrun reads
    ``PET_NODE_RANK``: pytorch/pytorch:torch/distributed/argparse_util.py, an option with
    ``action=env`` defaults to ``PET_<DEST>``; ``--node-rank`` is one), and node 0 logs NCCL's
    network choice for the runtime's transport check.
    """
    lines = [
        'trap "" USR2',
        'command -v python3 >/dev/null 2>&1 && exec "$@"',
        'if [ "${SLURM_PROCID:-0}" = 0 ]; then echo "slurmfm: $SLURMD_NODENAME: no python3 in'
        " the container image: the launch runs without the runtime's node entry (no node"
        ' reports, error files or progress from the nodes)" >&2; fi',
        'while [ "$#" -gt 0 ]; do a=$1; shift; [ "$a" = -- ] && break; done',
        "r=0; for h in $SLURMFM_HOST_ORDER; do"
        ' [ "$h" = "$SLURMD_NODENAME" ] && break; r=$((r + 1)); done; export SLURMFM_NODE_RANK=$r'
        + (" PET_NODE_RANK=$r" if torchrun else ""),
    ]
    if nccl_log:
        lines.append(
            'if [ "$r" = 0 ]; then export NCCL_DEBUG=INFO'
            ' NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$SLURMFM_NCCL_LOG"; fi'
        )
    lines.append('exec "$@"')
    return sh_quote("\n".join(lines))


def container_name(role: str) -> str:
    """The Pyxis container name of a job's attempt (shell text, expanded by the batch script)."""
    return "slurmfm-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}-" + role


def _container_forward(
    launcher: LauncherSpec, forward: str, in_container: bool
) -> dict[str, object]:
    """The batch options (:class:`BatchOptions` fields) that deliver the save signal to a
    training launch in a container.

    Only a host step on every node delivers it (``runtime forward``), to the training
    processes it finds there, and the launch ``srun`` gets no signal: Slurm passes a signal
    sent to ``srun`` to every process of the step, and under Pyxis' ``use_squashfuse=1`` those
    include Enroot's ``squashfuse``, which holds the container's root file system and dies of
    USR2 (its default action; github.com/NVIDIA/enroot src/runtime.sh starts it in the step;
    tests/e2e/test_real_container_launch.py shows it on real Pyxis). Megatron-LM saves on
    TERM; the others on USR2 (slurmfm.checkpoint). NeMo's tasks are its training processes
    (no launcher), so they get it themselves.
    """
    if not in_container or launcher.server:
        return {}
    return {
        "container_forward": forward if forward != "none" else "USR2",
        "container_forward_tasks": launcher.forward_tasks,
    }


def _container_opts(
    recipe: Recipe,
    inst: InstanceType,
    env_names: list[str],
    mount_runtime: bool = True,
    role: str = "launch",
) -> tuple[list[str], list[str]]:
    """Pyxis options for a container step on ``inst``, and warnings.

    ``--container-env`` names every variable slurmfm or the recipe sets (``env_names``): Pyxis
    exports the host environment into the container after the entrypoint, but a variable the
    image already defines keeps the image's value unless it is named there (NVIDIA/pyxis
    README, tests/env.bats). NGC images define ``LD_LIBRARY_PATH`` and some ``NCCL_*``, so
    without it the profile and ``env:`` would silently not apply. On multi-node NVLink types
    the IMEX channel directory is bind-mounted where Enroot does not provide it.
    """
    from slurmfm.catalog.containers import CONTAINER_FEATURES, IMEX_CHANNELS_DIR, has
    from slurmfm.catalog.containers import parse_version as container_version

    c = recipe.container
    if c is None:
        return [], []
    warnings: list[str] = []
    opts = [f"--container-image={sh_quote(c.image, what='container.image')}"]
    mounts = list(c.mounts)
    enroot = container_version("container.enroot", c.enroot)
    if (
        inst.needs_imex
        and not has("imex_channels", enroot)
        and not any(m.split(":", 1)[0].rstrip("/") == IMEX_CHANNELS_DIR for m in mounts)
    ):
        mounts.append(IMEX_CHANNELS_DIR)
    # A step that runs the per-node entry inside the image (every training launch:
    # _container_entry; vLLM's Ray sequence, SGLang's node rank) sees the runtime file
    # read-only at the same path, where the same check program checks it.
    mount_list = [sh_quote(",".join(mounts), what="container.mounts")] if mounts else []
    if mount_runtime:
        mount_list.append('"$SLURMFM_RUNTIME:$SLURMFM_RUNTIME:ro"')
    if mount_list:
        opts.append("--container-mounts=" + ",".join(mount_list))
    if c.workdir:
        opts.append(f"--container-workdir={sh_quote(c.workdir, what='container.workdir')}")
    if not c.mount_home:
        opts.append("--no-container-mount-home")
    names = sorted(set(env_names))
    if names:
        pyxis = container_version("container.pyxis", c.pyxis)
        if has("container_env", pyxis):
            listed = ",".join(env_name(n) for n in names)
            opts.append(f"--container-env={sh_quote(listed, what='container-env')}")
        else:
            f = CONTAINER_FEATURES["container_env"]
            warnings.append(
                f"container.pyxis: {c.pyxis} has no --container-env (from {f.introduced}): a "
                f"variable the image defines keeps the image's value, which can override "
                f"{', '.join(names)} [{f.source}]"
            )
    # A named container is kept on the node after its step (NVIDIA/pyxis README,
    # --container-name): every step of this attempt in this role (the in-container IMEX
    # check, the launch, a relaunch) reuses its file system instead of unpacking the image
    # again on every node (scripts/bench_container_name.py measures it). One per attempt, so
    # that a requeued run starts from the image; the runtime removes it when the attempt ends
    # (`container-remove`). Pyxis' use_squashfuse=1 mounts only unnamed containers' images:
    # there a name would unpack the image instead (container.named: false).
    if c.named:
        opts.append(f'--container-name="{container_name(role)}"')
    return opts, warnings
