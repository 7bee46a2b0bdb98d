"""The job's observability wiring: the script's exports reach the agent exactly, and the
batch step starts and stops one agent per node. What each agent does on its node is unit-tested
in tests/observe/test_agent.py, and on the real lab (with real Prometheus) in
tests/observe/test_real_slurm_observe.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmfm.job import install
from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script


def render(tmp: Path, **obs: Any) -> str:
    recipe = validate(
        {
            "name": "rt",
            "cluster": {"instance_type": "p5.48xlarge"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "torchrun", "script": "train.py", "python": "fake-train"},
            "storage": {"checkpoint_root": str(tmp / "ckpt"), "log_dir": str(tmp / "logs")},
            "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
            "observability": {
                "textfile_dir": str(tmp / "textfile"),
                "dcgm_job_mapping_dir": str(tmp / "map"),
                "interval_s": 1,
                **obs,
            },
        }
    )
    return render_script(recipe, Target.for_recipe(recipe, "24.11")).text


def test_batch_starts_the_agents_beside_the_training_and_stops_them(tmp_path: Path) -> None:
    """The batch step starts one agent per node (an --overlap step) without waiting for them
    (each writes its start snapshot before it reads the stop file), once only, and asks them
    to stop through the stop file."""
    from slurmfm.job.batch import Batch
    from slurmfm.job.options import BatchOptions

    obs = tmp_path / "rt_77.observe"
    started: list[list[str]] = []

    class Agents:
        def __init__(self, argv: list[str], env: dict[str, str]) -> None:
            started.append(argv)
            for h in ("n1", "n2"):  # what each node's agent writes at start
                (obs / f"node_{h}_r0.json").write_text("{}")
            self.rc: int | None = None

        def poll(self) -> int | None:
            if (obs / "stop-r0").exists():
                self.rc = 0
            return self.rc

        def wait(self, timeout: float | None = None) -> int:
            return self.rc or 0

        def terminate(self) -> None:
            self.rc = -15

    a = BatchOptions.from_argv(
        ["--runtime", "rt.pyz", "--observe", "1", "--observe-job-json", '{"recipe": "rt"}']
    )
    env = {
        "SLURM_JOB_NUM_NODES": "2",
        "SLURMFM_OBS_DIR": str(obs),
        "SLURMFM_OBS_STOP": str(obs / "stop-r0"),
        "SLURMFM_LOG_DIR": str(tmp_path),
    }
    b = Batch(a, env, popen=Agents, clock=lambda: 0.0, sleep=lambda s: None)
    b.observe_start()
    b.observe_start()  # a relaunch in the same allocation keeps the agents it has
    assert started == [
        [
            "srun",
            "--nodes=2",
            "--ntasks=2",
            "--ntasks-per-node=1",
            "--overlap",
            "--mem=0",
            *install.argv(),
            "observe",
        ]
    ]
    assert json.loads((obs / "job.json").read_text()) == {"recipe": "rt"}
    b.observe_stop()
    assert (obs / "stop-r0").exists()
    assert b.observers == []


def test_observability_off_renders_nothing(tmp_path: Path) -> None:
    text = render(tmp_path, enabled="off")
    assert "SLURMFM_OBS_" not in text
    assert "--label" not in text
    assert "--observe 1" not in text
    on = render(tmp_path)
    assert "--observe 1 --observe-job-json" in on
    assert "--label" in on


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    # NUL and line breaks in a path are refused at validate (tests/recipe/test_input_safety.py)
    path=st.one_of(
        st.text(
            st.characters(exclude_categories=("Cs",), exclude_characters="\x00\n\r"), max_size=30
        ),
        st.sampled_from(["$(printf x > canary)", "`printf y > canary`", "'; printf z > canary; '"]),
    )
)
def test_metrics_directories_reach_the_agent_exactly(tmp_path: Path, path: str) -> None:
    """Directory values go through sh_quote: whatever they hold arrives as written."""
    textfile = "/" + path
    dcgm = "/d " + path
    text = render(tmp_path, textfile_dir=textfile, dcgm_job_mapping_dir=dcgm)
    # the exports from SLURMFM_OBS_TEXTFILE_DIR's to SLURMFM_OBS_DIR's (values may span lines)
    block = text[
        text.index("export SLURMFM_OBS_TEXTFILE_DIR=") : text.index("export SLURMFM_OBS_DIR=")
    ]
    probe = block + 'printf "%s\\0%s" "$SLURMFM_OBS_TEXTFILE_DIR" "$SLURMFM_OBS_DCGM_DIR"'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, check=True, cwd=tmp_path)
    assert out.stdout.decode("utf-8").split("\0") == [textfile, dcgm]
    assert not (tmp_path / "canary").exists()
