"""What every launcher spec answers; the defaults are a training launcher's.

A launcher kind is one module of :mod:`slurmfm.launchers`: its recipe section (a pydantic
model), its checks against the rest of the recipe, its launch line, its completion check,
its save protocol and the runtime options that follow from them. The renderer and the schema
ask the spec (:func:`slurmfm.launchers.spec`) instead of testing the kind, so adding a
launcher is one module, one line in the registry and a golden script.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, NamedTuple, TypeVar

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.job.options import NodeOptions
    from slurmfm.recipe.schema import Recipe


_L = TypeVar("_L")


def section(recipe: Recipe, cls: type[_L]) -> _L:
    """The recipe's launcher section as its launcher's own model (a spec asked about another
    launcher's recipe is a slurmfm bug)."""
    launcher = recipe.launcher
    if not isinstance(launcher, cls):
        raise TypeError(f"internal: a {cls.__name__} spec asked about a {launcher.kind} recipe")
    return launcher


class LaunchLine(NamedTuple):
    """The per-node command as lines of shell words (user values already quoted), the
    number of words of the first line after which the node entry inserts ``--node-rank``
    (0: none), and what it is, for the script's comment."""

    lines: list[str]
    prefix: int
    description: str


class LauncherSpec:
    """One launcher kind's facts and rules. Subclasses set the class attributes and override
    what differs; an instance is stateless (one per kind, in the registry)."""

    kind: ClassVar[str]
    # A model server (the whole job serves, or a trainer's serve: group): no training state.
    server: ClassVar[bool] = False
    # The signal on which the training saves and exits (the save protocol), None: none that
    # slurmfm can drive, so the job requeues at the pre-timeout signal without a save.
    save_signal: ClassVar[str | None] = "USR2"
    # How the save is done, for `validate`'s save-mode line.
    save_how: ClassVar[str] = "USR2"
    # Refused on a type without GPUs (the CPU lab), where it cannot start.
    needs_gpus: ClassVar[bool] = False
    # One Slurm task per GPU (the launcher reads Slurm's ranks) rather than one per node.
    task_per_gpu: ClassVar[bool] = False
    # What one task per node (or GPU) is, for the #SBATCH --ntasks-per-node comment.
    why_tasks: ClassVar[str] = "one launcher per node; torchrun starts the per-GPU processes"
    # NCCL runs under the per-node entry, which logs node 0's transport for the check.
    nccl_log: ClassVar[bool] = True
    # The container launch signals the launched process itself, not its children.
    forward_tasks: ClassVar[bool] = False
    # Its tensor-parallel group may span nodes over EFA by the user's choice (SGLang's
    # multi-node guide does), so the planner applies no NVLink-unit rule to it.
    tp_spans_nodes: ClassVar[bool] = False
    # The launch runs torchrun (python -m torch.distributed.run): worker binding by its own
    # --numa-binding (slurmfm/catalog/binding.py).
    torchrun: ClassVar[bool] = False

    def tasks_per_node(self, recipe: Recipe) -> int:
        """Slurm tasks per node of the launch step."""
        return recipe.procs_per_node if self.task_per_gpu else 1

    def launch(self, recipe: Recipe, checkpoint_dir_expr: str) -> LaunchLine:
        """The training launch (servers: :mod:`slurmfm.render.serve`)."""
        raise NotImplementedError(f"launcher {self.kind}: no training launch")

    def node_options(self, recipe: Recipe, base: NodeOptions) -> NodeOptions:
        """The per-node entry's options of the training launch (``base``: the renderer's
        prefix, forward and binding); a launcher whose nodes do more than run the launch
        line (a Ray cluster: slurmfm/launchers/ray.py) adds its own."""
        return base

    def driver(self, recipe: Recipe, checkpoint_dir_expr: str) -> str | None:
        """Program text the launch runs from a heredoc (NeMo's driver), or None."""
        return None

    def done_check(self, recipe: Recipe) -> str:
        """The runtime's ``--done-check``: ``marker`` (slurmfm.checkpoint.mark_done),
        ``megatron:ITERS`` or ``none``."""
        return "marker"

    def forward(self, recipe: Recipe) -> str:
        """What the training processes get on the save signal besides Slurm's own USR2,
        which already reaches every process of the step: ``none`` or a signal name."""
        return "none"

    def host_script(self, recipe: Recipe) -> str | None:
        """A program file the launch runs from the host (not the container image), which the
        login-node preflight checks exists; None: none to check."""
        return None

    def checkpoint_format(self, recipe: Recipe) -> str | None:
        """The checkpoint format for the Lustre layout (slurmfm/catalog/storage.py)."""
        return None

    def save_interval(self, recipe: Recipe) -> int | None:
        """The periodic checkpoint interval in steps where the launcher's own argument sets it
        (Megatron-LM's ``--save-interval``), for the Young/Daly advice of ``validate``
        (slurmfm/observe/goodput.py); None where the user's script decides."""
        return None

    #: whether the launcher has such an argument (the advice names it)
    save_interval_arg: str | None = None

    def check(self, recipe: Recipe, inst: InstanceType) -> None:
        """Cross-section checks of this launcher against the recipe on ``inst``; a
        ValueError says what is wrong."""
        if self.needs_gpus and inst.gpus == 0:
            raise ValueError(f"launcher.kind: {self.kind} needs GPUs; {inst.name} has none")


def python_module(python: str, module: str) -> list[str]:
    """Shell words that run ``python -m module`` with the job's working directory off
    ``sys.path`` (:mod:`slurmfm.job.safepath`: a package planted in a shared submit directory
    must not be imported as the job's user). The program is the script's
    ``$slurmfm_run_module``, defined once above the launch (slurmfm.render.script), so that
    the launch line reads as ``python3 -c "$slurmfm_run_module" torch.distributed.run``."""
    from slurmfm.job.safepath import SHELL_VAR, module_words
    from slurmfm.quote import sh_quote

    py, c, _code, mod = module_words(python, module)
    return [sh_quote(py, what="launcher.python"), c, f'"${SHELL_VAR}"', sh_quote(mod)]


def torchrun_words(recipe: Recipe, python: str) -> tuple[list[str], list[str]]:
    """torchrun itself, and its options for a static rendezvous on the job's host order
    (shared by the torchrun and Megatron-LM launchers)."""

    torchrun = python_module(python, "torch.distributed.run")
    common = [
        f"--nnodes={recipe.train_nodes}",
        f"--nproc-per-node={recipe.procs_per_node}",
        '--master-addr="$SLURMFM_RDZV_HOST"',
        '--master-port="$SLURMFM_RDZV_PORT"',
    ]
    return torchrun, common
