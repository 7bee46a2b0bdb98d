"""The per-node agent: textfile metrics (checked with the Prometheus client library's own
text parser), DCGM-Exporter job mapping files (against fixtures in DCGM-Exporter's documented
format), EFA counter snapshots from a fake sysfs, and the whole life cycle on one "node"."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from slurmfm.job import agent

FIXTURES = Path(__file__).parent / "fixtures"


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


label_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(value=label_text, help_text=label_text)
def test_any_label_value_round_trips_through_the_prometheus_parser(
    value: str, help_text: str
) -> None:
    text = agent.format_family("slurmfm_x", help_text, "gauge", [({"recipe": value}, 1)])
    [fam] = list(text_string_to_metric_families(text))
    assert fam.samples[0].labels == {"recipe": value}
    assert fam.samples[0].value == 1


@given(st.one_of(st.integers(-(2**60), 2**60), st.floats(allow_nan=False)))
def test_values_round_trip(value: float) -> None:
    text = agent.format_family("slurmfm_x", "h", "gauge", [({}, value)])
    [fam] = list(text_string_to_metric_families(text))
    assert fam.samples[0].value == value


def test_invalid_names_are_refused() -> None:
    with pytest.raises(ValueError, match="metric name"):
        agent.format_family("1bad", "h", "gauge", [])
    with pytest.raises(ValueError, match="label name"):
        agent.format_family("ok", "h", "gauge", [({"bad-label": "x"}, 1)])


def make_agent(tmp: Path, **env: str) -> agent.Agent:
    (tmp / "textfile").mkdir(exist_ok=True)
    (tmp / "obs").mkdir(exist_ok=True)
    base = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "llama",
        "SLURMD_NODENAME": "p5-st-1",
        "SLURMFM_RESTART": "2",
        "SLURMFM_HOST_ORDER": "p5-st-1 p5-st-2",
        "SLURMFM_OBS_TEXTFILE_DIR": str(tmp / "textfile"),
        "SLURMFM_OBS_DIR": str(tmp / "obs"),
        "SLURMFM_OBS_RECIPE": "llama",
        "SLURMFM_RUN_ID": "run-1",
        "SLURMFM_OBS_GPUS": "0",
        "SLURMFM_PROGRESS_FILE": str(tmp / "obs" / "progress.json"),
        "SLURM_TOPOLOGY_ADDR": "spine1.leaf3.p5-st-1",
    }
    base.update(env)
    return agent.Agent(base)


def test_textfile_is_valid_and_carries_the_job_labels(tmp_path: Path) -> None:
    (tmp_path / "obs").mkdir()
    (tmp_path / "obs" / "progress.json").write_text(
        json.dumps({"step": 120, "checkpoint_step": 100, "time": 1.7e9, "checkpoint_time": 1.6e9})
    )
    a = make_agent(tmp_path)
    a.start()
    path = tmp_path / "textfile" / "slurmfm_job_4242_p5-st-1.prom"
    fams = families(path.read_text())
    want = {"jobid": "4242", "recipe": "llama", "run_id": "run-1", "node": "p5-st-1"}
    for name in (
        "slurmfm_job_restarts",
        "slurmfm_job_running",
        "slurmfm_train_step",
        "slurmfm_checkpoint_step",
    ):
        [(labels, _)] = fams[name]
        assert labels == want, name
    assert fams["slurmfm_job_restarts"][0][1] == 2
    assert fams["slurmfm_train_step"][0][1] == 120
    assert fams["slurmfm_checkpoint_step"][0][1] == 100
    [(info, one)] = fams["slurmfm_job_info"]
    assert one == 1
    assert info["node_rank"] == "0"
    assert info["topology_addr"] == "spine1.leaf3.p5-st-1"
    # no temporary file is left where node_exporter looks
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    a.finish()
    assert not path.exists()


def test_only_the_first_node_reports_progress(tmp_path: Path) -> None:
    (tmp_path / "obs").mkdir()
    (tmp_path / "obs" / "progress.json").write_text(json.dumps({"step": 5}))
    a = make_agent(tmp_path, SLURMD_NODENAME="p5-st-2")
    fams = families(a.metrics_text())
    assert "slurmfm_train_step" not in fams
    assert fams["slurmfm_job_node_rank"][0][1] == 1


def test_missing_directories_warn_once_and_never_raise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent._warned.clear()
    a = make_agent(
        tmp_path,
        SLURMFM_OBS_TEXTFILE_DIR=str(tmp_path / "nope"),
        SLURMFM_OBS_DCGM_DIR=str(tmp_path / "nodcgm"),
        SLURMFM_OBS_GPUS="8",
        SLURM_JOB_GPUS="0,1",
    )
    a.start()
    a.write_textfile()
    a.write_textfile()
    a.finish()
    err = capsys.readouterr().err
    assert err.count("textfile directory") == 1
    assert err.count("DCGM job mapping directory") == 1


def test_unwritable_textfile_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agent._warned.clear()
    a = make_agent(tmp_path)
    Path(a.textfile_path()).mkdir()  # the rename fails, as on a read-only directory (even as root)
    a.write_textfile()
    assert "cannot write in" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "textfile").iterdir()] == [Path(a.textfile_path()).name]


def read_mapping(directory: Path) -> dict[str, list[str]]:
    """Read a mapping directory the way DCGM-Exporter does (hpc.go): files whose name is a GPU
    id, one job per line."""
    out = {}
    for p in directory.iterdir():
        if p.is_file() and p.name.isdigit():
            out[p.name] = [line for line in p.read_text().splitlines() if line]
    return out


def test_mapping_files_match_the_documented_format(tmp_path: Path) -> None:
    mapdir = tmp_path / "map"
    mapdir.mkdir()
    (mapdir / "2").write_text("4243\n")  # another job shares GPU 2
    written = agent.map_gpus(str(mapdir), "4242", [0, 1, 2])
    assert written == [0, 1, 2]
    expected = FIXTURES / "dcgm_mapping"
    assert read_mapping(mapdir) == {
        "0": ["4242"],
        "1": ["4242"],
        "2": ["4243", "4242"],
    }
    # byte for byte like the fixture (order of jobs in a shared file aside)
    for name in ("0", "1"):
        assert (mapdir / name).read_bytes() == (expected / name).read_bytes()
    assert sorted((mapdir / "2").read_text().split()) == sorted(
        (expected / "2").read_text().split()
    )
    assert sorted(p.name for p in mapdir.iterdir()) == ["0", "1", "2"]  # no temp files
    agent.unmap_gpus(str(mapdir), "4242", written)
    assert read_mapping(mapdir) == {"2": ["4243"]}


def test_mapping_written_by_a_prolog_is_left_to_it(tmp_path: Path) -> None:
    mapdir = tmp_path / "map"
    mapdir.mkdir()
    (mapdir / "0").write_text("4242\n")  # the prolog already mapped GPU 0
    written = agent.map_gpus(str(mapdir), "4242", [0, 1])
    assert written == [1]
    agent.unmap_gpus(str(mapdir), "4242", written)
    assert read_mapping(mapdir) == {"0": ["4242"]}


def test_stale_textfiles_of_this_node_are_removed(tmp_path: Path) -> None:
    a = make_agent(tmp_path)
    tf = tmp_path / "textfile"
    old = time.time() - agent.STALE_TEXTFILE_S - 60
    for name in (
        "slurmfm_job_1_p5-st-1.prom",  # stale, this node: removed
        "slurmfm_job_2_p5-st-2.prom",  # stale, another node sharing the directory: kept
        "other_exporter.prom",  # not ours: kept
    ):
        (tf / name).write_text("x 1\n")
        os.utime(tf / name, (old, old))
    (tf / "slurmfm_job_3_p5-st-1.prom").write_text("x 1\n")  # fresh: kept
    assert a.remove_stale_textfiles() == ["slurmfm_job_1_p5-st-1.prom"]
    assert sorted(p.name for p in tf.iterdir()) == [
        "other_exporter.prom",
        "slurmfm_job_2_p5-st-2.prom",
        "slurmfm_job_3_p5-st-1.prom",
    ]


def test_gpu_indices_prefer_slurm_then_nvidia_smi(tmp_path: Path) -> None:
    assert agent.gpu_indices({"SLURM_STEP_GPUS": "4,5,6,7"}, 8) == [4, 5, 6, 7]
    assert agent.gpu_indices({"SLURM_JOB_GPUS": "1,0"}, 8) == [0, 1]
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n'\n")
    smi.chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{old}"
    try:
        assert agent.gpu_indices({}, 8) == [0, 1, 2]
    finally:
        os.environ["PATH"] = old
    assert agent.gpu_indices({}, 0) == []


def test_efa_counters_from_sysfs() -> None:
    c = agent.efa_counters(str(FIXTURES / "sysfs-efa"))
    assert sorted(c) == ["rdmap16s27", "rdmap32s27"]
    assert c["rdmap16s27"]["1"]["tx_bytes"] == 1000
    assert agent.efa_counters("/nonexistent") == {}


def test_agent_process_life_cycle(tmp_path: Path) -> None:
    """Run the agent as the job's ``observe`` step does (the runtime's package's agent, on its
    own process), stop it with the stop file."""
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs-efa", sysfs)
    mapdir = tmp_path / "map"
    mapdir.mkdir()
    (tmp_path / "textfile").mkdir()
    (tmp_path / "obs").mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_ID": "77",
        "SLURMD_NODENAME": "n1",
        "SLURMFM_HOST_ORDER": "n1",
        "SLURMFM_OBS_TEXTFILE_DIR": str(tmp_path / "textfile"),
        "SLURMFM_OBS_DCGM_DIR": str(mapdir),
        "SLURMFM_OBS_DIR": str(tmp_path / "obs"),
        "SLURMFM_OBS_STOP": str(tmp_path / "obs" / "stop"),
        "SLURMFM_OBS_EFA": "1",
        "SLURMFM_OBS_GPUS": "2",
        "SLURMFM_OBS_INTERVAL": "1",
        "SLURM_JOB_GPUS": "0,1",
        "SLURMFM_SYSFS": str(sysfs),
        "PYTHONPATH": str(Path(agent.__file__).resolve().parents[2]),
    }
    src = "import sys\nfrom slurmfm.job.agent import main\nsys.exit(main())\n"
    proc = subprocess.Popen([sys.executable, "-c", src], env=env)
    prom = tmp_path / "textfile" / "slurmfm_job_77_n1.prom"
    deadline = time.monotonic() + 20
    while not prom.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert prom.exists()
    assert read_mapping(mapdir) == {"0": ["77"], "1": ["77"]}
    hw = sysfs / "class/infiniband/rdmap16s27/ports/1/hw_counters/tx_bytes"
    hw.write_text("5000\n")
    (tmp_path / "obs" / "stop").touch()
    assert proc.wait(timeout=20) == 0
    assert not prom.exists()
    assert read_mapping(mapdir) == {}
    start = json.loads((tmp_path / "obs" / "efa_start_n1_r0.json").read_text())
    end = json.loads((tmp_path / "obs" / "efa_end_n1_r0.json").read_text())
    assert start["devices"]["rdmap16s27"]["1"]["tx_bytes"] == 1000
    assert end["devices"]["rdmap16s27"]["1"]["tx_bytes"] == 5000
    node = json.loads((tmp_path / "obs" / "node_n1_r0.json").read_text())
    assert node["gpus"] == [0, 1]
    assert node["efa_devices"] == ["rdmap16s27", "rdmap32s27"]
    assert "end" in node
    assert node["runs_in"] == "agents step"


def test_progress_reporter_is_throttled_and_atomic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmfm import checkpoint as ck

    target = tmp_path / "progress.json"
    monkeypatch.setenv("SLURMFM_PROGRESS_FILE", str(target))
    monkeypatch.setattr(ck, "_last_write", [0.0])
    assert ck.report_progress(1)
    assert not ck.report_progress(2)  # within min_interval_s
    assert json.loads(target.read_text())["step"] == 1
    ck.save(tmp_path / "ck", 3, lambda d: (d / "w").write_text("x"))
    data = json.loads(target.read_text())
    assert data["step"] == 3
    assert data["checkpoint_step"] == 3
    # the progress history beside it (the goodput ledger's; tests/observe/test_goodput.py)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "progress.json", "progress.jsonl"]
    monkeypatch.setenv("SLURMFM_PROGRESS_FILE", str(tmp_path / "missing" / "p.json"))
    assert not ck.report_progress(4, force=True)  # never raises
