"""The rendered job script's observability, run under bash against the fake cluster of
tests/resilience/test_runtime.py (stub srun/scontrol, fake sysfs per node).

Checked: every node's agent maps the node's GPUs for DCGM-Exporter while training runs and
removes the mapping afterwards; each node writes its own textfile with the job labels and the
step the training reported; EFA counters are saved at start and end; the host order is in the
state file; and a missing metrics directory never fails the job.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from resilience.test_runtime import fake_cluster

from slurmfm.recipe.loader import validate
from slurmfm.render.script import Target, render_script

# Stands in for torchrun: records what the node sees while "training", makes EFA traffic,
# reports progress the way slurmfm.checkpoint does, and waits for the textfile to refresh.
TRAIN = r"""#!/bin/bash
n=$SLURMD_NODENAME
ls "$MAPDIR" > "$STUB_OUT/mapping-$n" 2>&1
cat "$MAPDIR"/0 >> "$STUB_OUT/mapping-$n" 2>/dev/null
hw="$SLURMFM_SYSFS/class/infiniband/rdmap0s0/ports/1/hw_counters"
echo 5000 > "$hw/tx_bytes"
if [ "$SLURMFM_NODE_RANK" = 0 ]; then
  printf '{"step": 7, "checkpoint_step": 5, "time": 1}' > "$SLURMFM_PROGRESS_FILE"
fi
sleep 2.5
cp "$TEXTFILE_DIR/slurmfm_job_77_$n.prom" "$STUB_OUT/prom-$n" 2>/dev/null || true
exit 0
"""


@pytest.fixture
def cluster(tmp_path: Path) -> dict[str, Any]:
    fake = fake_cluster(tmp_path, fake_train=TRAIN)
    for h in ("n1", "n2"):
        hw = tmp_path / "sys" / h / "class/infiniband/rdmap0s0/ports/1/hw_counters"
        hw.mkdir(parents=True)
        (hw / "tx_bytes").write_text("1000\n")
        (hw / "rx_bytes").write_text("10\n")
    for d in ("map", "textfile", "logs"):
        (tmp_path / d).mkdir()
    return fake


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


def run(cluster: dict[str, Any], text: str) -> subprocess.CompletedProcess[str]:
    tmp: Path = cluster["tmp"]
    script = tmp / "job.sh"
    script.write_text(text)
    env = {
        "PATH": f"{cluster['bin']}:/usr/bin:/bin",
        "STUB_OUT": str(cluster["out"]),
        "FAKE_HOSTS": "n1 n2",
        "FAKE_SYSFS": str(tmp / "sys"),
        "FAKE_GPUS": "8",
        "SLURM_JOB_NODELIST": "n1,n2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NAME": "rt",
        "MAPDIR": str(tmp / "map"),
        "TEXTFILE_DIR": str(tmp / "textfile"),
    }
    return subprocess.run(
        ["bash", str(script)], env=env, cwd=tmp, text=True, capture_output=True, timeout=120
    )


def test_every_node_maps_gpus_writes_metrics_and_cleans_up(cluster: dict[str, Any]) -> None:
    tmp: Path = cluster["tmp"]
    proc = run(cluster, render(tmp))
    assert proc.returncode == 0, proc.stderr
    out: Path = cluster["out"]
    for n in ("n1", "n2"):
        # while training ran: files 0..7, each naming this job (DCGM-Exporter's format)
        seen = (out / f"mapping-{n}").read_text().split()
        assert seen == [*map(str, range(8)), "77"], seen
        fams = {
            s.name: s
            for f in text_string_to_metric_families((out / f"prom-{n}").read_text())
            for s in f.samples
        }
        assert fams["slurmfm_job_restarts"].labels == {
            "jobid": "77",
            "recipe": "rt",
            "run_id": "rt",
            "node": n,
        }
        assert fams["slurmfm_job_gpus"].value == 8
        assert fams["slurmfm_job_efa_devices"].value == 1
        if n == "n1":
            assert fams["slurmfm_train_step"].value == 7
            assert fams["slurmfm_checkpoint_step"].value == 5
        else:
            assert "slurmfm_train_step" not in fams
    # after the job: mapping and textfiles gone, EFA snapshots and node facts kept
    assert list((tmp / "map").iterdir()) == []
    assert list((tmp / "textfile").iterdir()) == []
    obs = tmp / "logs" / "rt_77.observe"
    for n in ("n1", "n2"):
        start = json.loads((obs / f"efa_start_{n}_r0.json").read_text())
        end = json.loads((obs / f"efa_end_{n}_r0.json").read_text())
        assert start["devices"]["rdmap0s0"]["1"]["tx_bytes"] == 1000
        assert end["devices"]["rdmap0s0"]["1"]["tx_bytes"] == 5000
    assert json.loads((obs / "job.json").read_text())["procs_per_node"] == 8
    state = (tmp / "logs" / "rt_77.state").read_text()
    assert "event=hosts n1 n2" in state
    assert "event=finished" in state


def test_missing_metrics_directories_never_fail_the_job(cluster: dict[str, Any]) -> None:
    tmp: Path = cluster["tmp"]
    text = render(tmp, textfile_dir=str(tmp / "absent"), dcgm_job_mapping_dir=str(tmp / "absent2"))
    proc = run(cluster, text)
    assert proc.returncode == 0, proc.stderr
    assert "event=finished" in (tmp / "logs" / "rt_77.state").read_text()
    # one warning per node and directory, not one per interval
    assert proc.stderr.count("textfile directory") == 2, proc.stderr
    assert proc.stderr.count("DCGM job mapping directory") == 2, proc.stderr


def test_observability_off_renders_nothing(tmp_path: Path) -> None:
    text = render(tmp_path, enabled="off")
    assert "SLURMFM_OBSERVE_AGENT" not in text
    assert "--label" not in text
    assert "event=hosts" not in text  # the record call is there, its output is not
    assert 'slurmfm_record hosts "$SLURMFM_HOST_ORDER"' in text


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
