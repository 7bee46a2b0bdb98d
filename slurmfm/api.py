"""The Python API for research scripts: load, override, render, dry-run, submit, poll.

Every function here is a thin composition of the pure core (recipe -> script) and one backend,
so that what a script does and what ``slurmfm submit`` does are the same code path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from slurmfm.errors import Problem, RecipeError

if TYPE_CHECKING:
    from slurmfm.backends.base import Backend, JobStatus
    from slurmfm.backends.dryrun import DryRunInfo
    from slurmfm.plan.types import Placement
    from slurmfm.recipe.schema import Recipe
    from slurmfm.render.script import RenderedScript

BackendKind = Literal["auto", "cli", "pyslurm"]


def load(
    source: str | Path | Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> Recipe:
    """Load a recipe from a YAML file path or a dict, applying dotted-path overrides."""
    from slurmfm.recipe.loader import load_recipe, validate

    if isinstance(source, Mapping):
        return validate(dict(source), source="<dict>", overrides=overrides)
    return load_recipe(source, overrides)


def override(recipe: Recipe, overrides: Mapping[str, Any]) -> Recipe:
    """Return a new recipe with ``{"resources.nodes": 4, ...}`` applied and re-validated."""
    from slurmfm.recipe.loader import validate

    data = recipe.model_dump(mode="json", exclude_unset=False)
    return validate(data, source="<recipe>", overrides=overrides)


def render(
    recipe: Recipe, *, slurm_version: str | None = None, placement: Placement | None = None
) -> RenderedScript:
    """Render the sbatch script; ``slurm_version`` is what a cluster reported, if known."""
    from slurmfm.render.script import Target, render_script

    return render_script(recipe, Target.for_recipe(recipe, slurm_version), placement)


def missing_secrets(recipe: Recipe, env: Mapping[str, str] | None = None) -> list[str]:
    """Names in ``recipe.secrets`` that the submitting environment does not provide."""
    env = os.environ if env is None else env
    return [name for name in recipe.secrets if not env.get(name)]


def dry_run(
    recipe: Recipe, *, slurm_version: str | None = None, placement: Placement | None = None
) -> DryRunInfo:
    """Everything ``submit`` would do, without doing it."""
    from slurmfm.backends.dryrun import DryRunInfo

    script = render(recipe, slurm_version=slurm_version, placement=placement)
    return DryRunInfo(
        recipe=recipe,
        script=script,
        needs_env=tuple(recipe.secrets),
        creates_dirs=(recipe.storage.log_dir,),
    )


def get_backend(kind: BackendKind = "auto", env: Mapping[str, str] | None = None) -> Backend:
    """The Slurm CLI backend, or pyslurm when asked for (``auto`` prefers a matching pyslurm)."""
    from slurmfm.backends.slurm_cli import SlurmCLI

    cli = SlurmCLI(dict(env) if env is not None else None)
    if kind == "cli":
        return cli
    from slurmfm.backends.pyslurm_backend import PySlurmBackend, probe

    result = probe(cli.version(), env=dict(env) if env is not None else None)
    if result.usable:
        return PySlurmBackend()
    if kind == "pyslurm":
        from slurmfm.errors import BackendError

        raise BackendError(f"pyslurm backend unavailable: {result.reason}")
    return cli


@dataclass
class Job:
    """A submitted job with the backend that can ask about it."""

    job_id: str
    backend: Backend
    script: RenderedScript | None = None

    def status(self) -> JobStatus:
        return self.backend.status(self.job_id)

    def wait(self, timeout: float = 3600.0, interval: float = 0.5) -> JobStatus:
        import time

        from slurmfm.errors import BackendError

        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            if st.done:
                return st
            if time.monotonic() > deadline:
                raise BackendError(f"job {self.job_id} still {st.state} after {timeout:.0f} s")
            time.sleep(interval)

    def cancel(self) -> None:
        self.backend.cancel(self.job_id)


def submit(
    recipe: Recipe,
    *,
    backend: BackendKind | Backend = "cli",
    env: Mapping[str, str] | None = None,
    placement: Placement | None = None,
) -> Job:
    """Render for the cluster's real Slurm version and submit; secrets must be in ``env``."""
    be = get_backend(backend, env) if isinstance(backend, str) else backend
    missing = missing_secrets(recipe, env)
    if missing:
        raise RecipeError(
            [
                Problem(
                    "<environment>",
                    None,
                    "secrets",
                    f"{', '.join(missing)} not set in the submitting environment "
                    "(slurmfm passes secrets through the environment, never the script)",
                )
            ]
        )
    script = render(recipe, slurm_version=be.version(), placement=placement)
    # sbatch does not create the --output directory; a job whose log dir is missing fails
    # without any output, so create it before submitting.
    Path(recipe.storage.log_dir).mkdir(parents=True, exist_ok=True)
    result = be.submit(script.text, env=dict(env) if env is not None else None)
    return Job(result.job_id, be, script)


def status(job_id: str, *, backend: BackendKind | Backend = "cli") -> JobStatus:
    """The state of a job by id."""
    be = get_backend(backend) if isinstance(backend, str) else backend
    return be.status(job_id)


def cancel(job_id: str, *, backend: BackendKind | Backend = "cli") -> None:
    """Cancel a job by id."""
    be = get_backend(backend) if isinstance(backend, str) else backend
    be.cancel(job_id)
