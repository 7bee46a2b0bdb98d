"""A Ray cluster for post-training (veRL, OpenRLHF, NeMo-RL): ``launcher.kind: ray``.

The job's node 0 (the first of its host order) starts the Ray head, the other nodes join it
as Ray workers, and once every node has joined the user's driver runs on the head with
``RAY_ADDRESS`` set; when the driver ends, each node stops its own Ray and the step ends with
the driver's exit. This is the sequence of Ray's own guide (docs.ray.io "Deploying on Slurm":
"start a Ray head node, multiple Ray worker nodes, and run your Ray script on the head node")
and of veRL's Slurm sample (volcengine/verl:examples/slurm/ray_on_slurm.slurm: ``ray start
--head`` on the first node, ``ray start --address`` on the others, then ``python3 -m
verl.trainer.main_ppo ...`` on the head). Each node's runtime entry runs its part with the
vLLM-over-Ray code (slurmfm/job/node.py ``run_ray_node``): the head's port, per-node private
temp dirs, stopping only the job's own Ray.

The head's GCS port is the job's rendezvous port unless ``ray_port`` fixes one: picked per
job and restart in 20000-25999, out of the kernel's ephemeral range and of the ports Ray keeps
for itself (10001-19999, 8265, 52365), and checked free on the head.

The job is a training job: the checkpoint directory (``$SLURMFM_CHECKPOINT_DIR``, passed to
the driver by ``checkpoint_arg``), the restarts and the requeue are the training launchers'.
Exit 0 of the driver is the end of the work (``done_check`` ``none``); a failure is judged by
the driver's own evidence (its exit and the exception in its output, slurmfm/job/evidence.py).
There is no save on signal: Slurm's USR2 would reach Ray's own daemons in the step too, so at
the time limit the job requeues and the driver resumes from its last periodic checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from slurmfm.launchers.base import LauncherSpec, LaunchLine, python_module, section
from slurmfm.launchers.vllm import RAY_OWN_PORTS, RAY_WORKER_PORTS
from slurmfm.strict import _Strict

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.job.options import NodeOptions
    from slurmfm.recipe.schema import Recipe


class RayLauncher(_Strict):
    """A Ray cluster over the job's nodes and the user's driver on its head."""

    kind: Literal["ray"]
    driver: str = Field(
        min_length=1, description="the driver: a script, or a module with module: true"
    )
    args: list[str] = Field(default_factory=list, description="the driver's arguments")
    module: bool = Field(default=False, description="run `driver` as a module (python -m)")
    python: str = Field(default="python3", min_length=1, description="a python with ray")
    ray: str = Field(default="ray", min_length=1, description="the ray executable")
    ray_port: int | None = Field(
        default=None, ge=1024, le=65535, description="the head's GCS port; default: per job"
    )
    join_timeout_s: int = Field(
        default=300, ge=1, description="wait for every node to join before the driver starts"
    )
    checkpoint_arg: str | None = Field(
        default=None,
        min_length=1,
        description="the driver argument the job's checkpoint dir is appended to "
        "(veRL: trainer.default_local_dir=)",
    )

    @field_validator("ray_port")
    @classmethod
    def _not_a_port_ray_takes(cls, port: int | None) -> int | None:
        if port is None:
            return port
        if port in RAY_OWN_PORTS:
            raise ValueError(
                f"{port} is the Ray head's own {RAY_OWN_PORTS[port]} port: ray start would "
                "refuse it"
            )
        if port in RAY_WORKER_PORTS:
            raise ValueError(
                f"{port} is in Ray's worker port range 10002-19999: ray start would refuse it"
            )
        return port


class RaySpec(LauncherSpec):
    kind = "ray"
    # No save signal slurmfm can drive: Slurm's USR2 reaches every process of the step, Ray's
    # raylet and GCS server among them (C++ processes, for which USR2 is not a save request).
    save_signal = None
    save_how = "none"
    why_tasks = "one task per node: the Ray head or a Ray worker; Ray starts the workers"

    def launch(self, recipe: Recipe, checkpoint_dir_expr: str) -> LaunchLine:
        from slurmfm.quote import sh_quote

        L = section(recipe, RayLauncher)
        if L.module:
            first = python_module(L.python, L.driver)
        else:
            first = [
                sh_quote(L.python, what="launcher.python"),
                sh_quote(L.driver, what="launcher.driver"),
            ]
        words = [sh_quote(a, what="launcher.args") for a in L.args]
        if L.checkpoint_arg is not None:
            words.append(
                sh_quote(L.checkpoint_arg, what="launcher.checkpoint_arg")
                + f'"{checkpoint_dir_expr}"'
            )
        return LaunchLine(
            [" ".join(first), *([" ".join(words)] if words else [])],
            0,
            "a Ray cluster: the head on node 0 of the host order, workers on the others, the "
            "driver on the head once every node joined",
        )

    def node_options(self, recipe: Recipe, base: NodeOptions) -> NodeOptions:
        from slurmfm.job.node import RDZV
        from slurmfm.quote import sh_quote

        L = section(recipe, RayLauncher)
        sh_quote(L.ray, what="launcher.ray")  # refused here when bash cannot carry it
        return base._replace(
            ray=L.ray,
            ray_python=L.python,
            ray_port=RDZV if L.ray_port is None else str(L.ray_port),
            ray_nodes=str(recipe.train_nodes),
            ray_timeout_s=str(L.join_timeout_s),
            ray_driver=True,
        )

    def done_check(self, recipe: Recipe) -> str:
        """The driver's exit 0 is the end of the work: a Ray driver has no marker of its own."""
        return "none"

    def host_script(self, recipe: Recipe) -> str | None:
        L = section(recipe, RayLauncher)
        return None if L.module or recipe.container is not None else L.driver

    def check(self, recipe: Recipe, inst: InstanceType) -> None:
        super().check(recipe, inst)
        p = recipe.parallelism
        for name in ("tp", "pp", "cp", "ep"):
            if getattr(p, name) != 1:
                raise ValueError(
                    f"parallelism.{name}: launcher ray does not apply it; the driver sets its "
                    "own parallel sizes (veRL: actor_rollout_ref.rollout."
                    "tensor_model_parallel_size in launcher.args)"
                )
        if recipe.serve is not None:
            raise ValueError(
                "serve: launcher ray runs its generation inside the Ray cluster (the driver's "
                "rollout workers); serve: does not apply"
            )


RAY = RaySpec()
