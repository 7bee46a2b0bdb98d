"""Serving on the real local Slurm: stand-in servers started exactly as the recipes start
vLLM and SGLang (same launch line, node ranks, Ray/dist-init rendezvous, readiness wait and
endpoint file), train-and-serve split, and a heterogeneous job.

The stand-ins (``standins/``) answer ``/health`` and ``/v1/models`` like the real servers; the
vLLM one insists on as many Ray nodes as its pipeline stages, the SGLang one on every node rank
joining node 0, so a wrong node count, rank or address fails the job.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from lab import REPO_ROOT, SlurmLab, free_port, wait_until

from slurmfm.backends.slurm_cli import parse_scontrol_record
from slurmfm.job.node import stop_own_ray

pytestmark = [pytest.mark.slurm]

STANDINS = Path(__file__).resolve().parent / "standins"


def base(tmp: Path, name: str, nodes: int, launcher: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
        "resources": {
            "nodes": nodes,
            "procs_per_node": 1,
            "time_limit": "00:05:00",
            "exclusive": False,
        },
        "parallelism": {"tp": 1, "pp": 1},
        "launcher": launcher,
        "env": {"PYTHONPATH": str(STANDINS / "pylib"), "OMP_NUM_THREADS": "1"},
        "storage": {"checkpoint_root": str(tmp / "ckpt"), "log_dir": str(tmp / "logs")},
        # no pre-timeout save signal: the default 300 s before a 5-minute limit is "at once",
        # and a USR2 in the middle of a serving test made it flaky (these jobs end in seconds)
        "resilience": {"requeue": False, "save_before_timeout_s": 0},
    }


def executable(tmp: Path, name: str) -> str:
    """A stand-in as an executable of its own: a bash wrapper running it with this Python,
    because the chroot labs (Slurm 24.11/26.05) have no python3 of their own on PATH."""
    wrapper = tmp / "bin" / name
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f'#!/bin/bash\nexec {sys.executable} {STANDINS / "bin" / name} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def ray_port() -> int:
    """A free port for a Ray head that is none of the ports Ray takes for its own parts (the
    dashboard's 8265 is among the test ports: ``ray start`` refused it in one CI run)."""
    from slurmfm.launchers.vllm import RAY_OWN_PORTS, RAY_WORKER_PORTS

    port = free_port()
    while port in RAY_OWN_PORTS or port in RAY_WORKER_PORTS:
        port = free_port()
    return port


def vllm_launcher(tmp: Path, **over: Any) -> dict[str, Any]:
    return {
        "kind": "vllm",
        "model": "meta-llama/Llama-3.1-70B-Instruct",
        "command": executable(tmp, "vllm"),
        "ray": executable(tmp, "ray"),
        "python": sys.executable,
        "port": free_port(),
        "ray_port": ray_port(),
        "ready_poll_s": 1,
        "ready_timeout_s": 90,
        "ray_timeout_s": 60,
        "multinode": "ray",  # the Ray path is the subject (the default is without Ray)
        **over,
    }


def sglang_launcher(**over: Any) -> dict[str, Any]:
    from slurmfm.job.hosts import sglang_port_clash

    port = free_port()
    dist = free_port()
    while sglang_port_clash(dist, port):  # the recipe refuses ports SGLang's would share
        dist = free_port()
    return {
        "kind": "sglang",
        "model": "deepseek-ai/DeepSeek-V3",
        "python": sys.executable,
        "port": port,
        "dist_port": dist,
        "ready_poll_s": 1,
        "ready_timeout_s": 90,
        **over,
    }


def trainer_recipe(tmp: Path, name: str, nodes: int, serve: dict[str, Any]) -> dict[str, Any]:
    """A torchrun trainer (standins/trainer.py) with a ``serve:`` section."""
    trainer = {"kind": "torchrun", "script": str(STANDINS / "trainer.py"), "python": sys.executable}
    return {**base(tmp, name, nodes, trainer), "serve": serve}


def submit(
    lab: SlurmLab, tmp: Path, recipe: dict[str, Any], env: dict[str, str] | None = None
) -> str:
    """Submit ``recipe``; ``env`` is added to the submitting environment (sbatch passes it
    on to the job, so a stand-in found first on PATH there is what the job runs)."""
    path = tmp / "recipe.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    proc = lab.run(
        [*lab.slurmfm_argv(), "submit", str(path)],
        cwd=REPO_ROOT,
        timeout=120,
        env={**lab.env, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()[0]


def job_log(tmp: Path, name: str, job_id: str) -> str:
    f = tmp / "logs" / f"{name}_{job_id}.out"
    return f.read_text() if f.exists() else ""


def wait_endpoint(lab: SlurmLab, tmp: Path, name: str, job_id: str) -> dict[str, Any]:
    f = tmp / "logs" / "endpoints" / f"{name}.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if f.exists():
            return dict(json.loads(f.read_text()))
        rec = parse_scontrol_record(lab.run(["scontrol", "show", "job", "-o", job_id]).stdout)
        if rec.get("JobState") not in {"PENDING", "RUNNING", "CONFIGURING"}:
            break
        time.sleep(0.5)
    pytest.fail(f"no endpoint file for job {job_id}:\n{job_log(tmp, name, job_id)}")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - http only
        return json.load(r)


def cancel_and_wait(lab: SlurmLab, job_id: str) -> dict[str, str]:
    lab.run(["scancel", job_id])
    return lab.wait_job(job_id, timeout=60)


def job_nodes(lab: SlurmLab, job_id: str) -> list[str]:
    rec = parse_scontrol_record(lab.run(["scontrol", "show", "job", "-o", job_id]).stdout)
    return lab.hostnames(rec["NodeList"])


def node_addr(lab: SlurmLab, node: str) -> str:
    """Slurm's NodeAddr for ``node`` (what the job runtime pins Ray and vLLM to)."""
    return parse_scontrol_record(lab.run(["scontrol", "show", "node", "-o", node]).stdout)[
        "NodeAddr"
    ]


def events(log: str) -> list[dict[str, Any]]:
    return [json.loads(m.group(0)) for m in re.finditer(r'\{"event"[^\n]*\}(?=\n|$)', log)]


def test_vllm_two_nodes_ready_and_endpoint(each_lab: SlurmLab, tmp_path: Path) -> None:
    recipe = base(
        tmp_path, "serve-vllm", 2, vllm_launcher(tmp_path, model_cache=str(tmp_path / "hf"))
    )
    recipe["parallelism"] = {"tp": 1, "pp": 2}
    job_id = submit(each_lab, tmp_path, recipe)
    try:
        ep = wait_endpoint(each_lab, tmp_path, "serve-vllm", job_id)
        port = recipe["launcher"]["port"]
        order = job_nodes(each_lab, job_id)
        assert ep["url"] == f"http://127.0.0.1:{port}"
        assert ep["port"] == port
        assert ep["job_id"] == job_id
        assert ep["run_id"] == "serve-vllm"
        assert ep["kind"] == "vllm"
        assert ep["model"] == "meta-llama/Llama-3.1-70B-Instruct"
        assert sorted(ep["nodes"].split()) == sorted(order)
        env_file = (tmp_path / "logs" / "endpoints" / "serve-vllm.env").read_text()
        assert f"SLURMFM_ENDPOINT_URL=http://127.0.0.1:{port}\n" in env_file
        info = get_json(ep["url"] + "/standin/info")
        # Two Ray nodes joined (pp=2 needs them); vllm serve ran on the first planned host.
        assert info["ray_nodes"] == 2
        assert info["pp"] == 2
        assert info["tp"] == 1
        assert info["node"] == ep["nodes"].split()[0]
        assert info["hf_home"] == str(tmp_path / "hf")
        # Every node's `ray start` got --node-ip-address and VLLM_HOST_IP = its own NodeAddr
        # (vLLM examples/online_serving/run_cluster.sh); the server has VLLM_HOST_IP too.
        # Before, workers got neither (the stand-in records None for a missing address).
        pinned = {
            n["NodeManagerHostname"]: (n["NodeManagerAddress"], n["standin_vllm_host_ip"])
            for n in info["ray_node_list"]
        }
        assert pinned == {h: (node_addr(each_lab, h),) * 2 for h in order}
        assert info["vllm_host_ip"] == node_addr(each_lab, info["node"])
        assert get_json(ep["url"] + "/v1/models")["data"][0]["id"] == recipe["launcher"]["model"]
        state = (tmp_path / "logs" / f"serve-vllm_{job_id}.state").read_text()
        assert f"event=ready url={ep['url']}" in state
        # `slurmfm endpoint` finds it from the recipe alone
        cli = each_lab.slurmfm("endpoint", str(tmp_path / "recipe.yaml"))
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.strip() == ep["url"]
    finally:
        cancel_and_wait(each_lab, job_id)
    # the endpoint is withdrawn when the server's job ends
    assert not (tmp_path / "logs" / "endpoints" / "serve-vllm.json").exists()
    assert not (tmp_path / "logs" / "endpoints" / "serve-vllm.env").exists()
    gone = each_lab.slurmfm("endpoint", str(tmp_path / "recipe.yaml"))
    assert gone.returncode == 1
    assert "no running server has published" in gone.stderr


def ray_owned(job_id: str) -> list[int]:
    """Processes on this host that carry the Ray mark ``job_id.*`` (node.stop_own_ray)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(e.startswith(f"SLURMFM_RAY_OWNER={job_id}.".encode()) for e in env):
                found.append(int(d.name))
    return found


def test_vllm_two_nodes_over_real_ray(host_b_lab: SlurmLab, tmp_path: Path) -> None:
    """The multi-node sequence with real Ray 2.60 (head, a worker given its own address,
    readiness once both are alive; vLLM examples/online_serving/multi-node-serving.sh), a
    stand-in only for `vllm serve` on top: CPU vLLM refuses Ray ("current platform cpu does
    not support ray"). At the end each node stops its own Ray and no other."""
    import ray.util  # the test venv's real Ray, which the job runs

    ray_cli = str(Path(sys.executable).parent / "ray")
    recipe = base(tmp_path, "real-ray", 2, vllm_launcher(tmp_path, ray=ray_cli))
    recipe["parallelism"] = {"tp": 1, "pp": 2}
    (tmp_path / "no-standin-ray").mkdir()
    # no stand-in `ray` module on the job's path: the vllm stand-in asks the real Ray
    recipe["env"] = {"PYTHONPATH": str(tmp_path / "no-standin-ray"), "OMP_NUM_THREADS": "1"}
    # another Ray on the same host, not the job's (`ray stop` would end it too)
    other = {**os.environ, "SLURMFM_RAY_OWNER": "someone.else"}
    start = [ray_cli, "start", "--head", f"--port={ray_port()}", "--node-ip-address=127.0.0.1"]
    start += ["--include-dashboard=false", "--disable-usage-stats"]
    subprocess.run(start, env=other, check=True, capture_output=True, timeout=120)
    # directories an earlier run's job of the same id left (a run killed past its cleanup;
    # the lab numbers its jobs from the same first id every time) are not this job's
    before = set(Path("/tmp").glob("slurmfm-ray-*"))
    try:
        job_id = submit(host_b_lab, tmp_path, recipe)

        def mine() -> list[Path]:
            return sorted(set(Path("/tmp").glob(f"slurmfm-ray-{job_id}-*")) - before)

        try:
            ep = wait_endpoint(host_b_lab, tmp_path, "real-ray", job_id)
            info = get_json(ep["url"] + "/standin/info")
            order = job_nodes(host_b_lab, job_id)
            assert info["ray_nodes"] == 2, info
            assert info["node"] == ep["nodes"].split()[0]
            # real Ray's own record of its nodes: both alive, each at its Slurm NodeAddr as Ray
            # resolves it: a loopback address (the lab's 127.0.0.1) becomes this host's own
            # (ray-project/ray python/ray/_private/services.py, resolve_ip_for_localhost)
            host_ip = ray.util.get_node_ip_address()

            def as_ray(addr: str) -> str:
                return host_ip if addr in ("127.0.0.1", "localhost", "::1") else addr

            alive = [n for n in info["ray_node_list"] if n["Alive"]]
            assert len(alive) == 2, info["ray_node_list"]
            assert sorted(n["NodeManagerAddress"] for n in alive) == sorted(
                as_ray(node_addr(host_b_lab, h)) for h in order
            )
            log = job_log(tmp_path, "real-ray", job_id)
            assert "slurmfm: Ray cluster has 2 nodes; starting the server" in log
            assert ray_owned(job_id), "the job's Ray daemons carry its mark"
            # each node's Ray in a private directory of its own, not the host's shared /tmp/ray
            own = mine()
            assert len(own) == 2, own
            for d in own:
                # private; Ray's own temp dir inside it is 0777 (Ray's choice), reachable by no one
                assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
                assert list((d / "r").glob("session_*")), sorted(d.rglob("*"))[:20]
        finally:
            cancel_and_wait(host_b_lab, job_id)
        wait_until("the job's own Ray stopped", lambda: not ray_owned(job_id), 60)
        wait_until(
            "its private directories removed",
            lambda: not mine(),
            30,
        )
        assert ray_owned("someone"), "the other Ray lives on"
    finally:  # the other Ray goes whatever happened above
        stop_own_ray("someone.else")


def test_sglang_two_nodes_ranks_from_the_host_order(each_lab: SlurmLab, tmp_path: Path) -> None:
    recipe = base(tmp_path, "serve-sglang", 2, sglang_launcher())
    recipe["parallelism"] = {"tp": 2}
    job_id = submit(each_lab, tmp_path, recipe)
    try:
        ep = wait_endpoint(each_lab, tmp_path, "serve-sglang", job_id)
        info = get_json(ep["url"] + "/standin/info")
        assert info["nnodes"] == 2
        assert info["ranks"] == [0, 1]
        assert info["tp"] == 2
        # node 0 of the host order runs rank 0, the HTTP server and the dist-init address
        assert info["node"] == ep["nodes"].split()[0]
        assert ep["url"] == f"http://127.0.0.1:{recipe['launcher']['port']}"
    finally:
        cancel_and_wait(each_lab, job_id)


def test_readiness_timeout_fails_the_job_clearly(each_lab: SlurmLab, tmp_path: Path) -> None:
    launcher = vllm_launcher(tmp_path, extra_args=["--standin-fail-health"], ready_timeout_s=4)
    job_id = submit(each_lab, tmp_path, base(tmp_path, "serve-sick", 1, launcher))
    rec = each_lab.wait_job(job_id, timeout=90)
    log = job_log(tmp_path, "serve-sick", job_id)
    assert rec["JobState"] == "FAILED", log
    port = launcher["port"]
    assert (
        f"slurmfm: the vllm server at http://127.0.0.1:{port}/health did not become healthy "
        "within 4 s (launcher.ready_timeout_s)"
    ) in log
    state = (tmp_path / "logs" / f"serve-sick_{job_id}.state").read_text()
    assert "event=fail vllm server not healthy" in state
    assert not (tmp_path / "logs" / "endpoints" / "serve-sick.json").exists()


def test_server_that_dies_fails_readiness_at_once(each_lab: SlurmLab, tmp_path: Path) -> None:
    # The server exits while "loading": the wait ends at once, not after ready_timeout_s.
    launcher = vllm_launcher(tmp_path, ready_timeout_s=300, extra_args=["--standin-crash"])
    recipe = base(tmp_path, "serve-dies", 1, launcher)
    t0 = time.monotonic()
    job_id = submit(each_lab, tmp_path, recipe)
    rec = each_lab.wait_job(job_id, timeout=120)
    log = job_log(tmp_path, "serve-dies", job_id)
    assert rec["JobState"] == "FAILED", log
    assert "server step ended before" in log
    assert "CUDA out of memory while loading the model (simulated)" in log
    assert time.monotonic() - t0 < 200  # did not sit out the 300 s readiness timeout


@pytest.mark.torch
def test_train_and_serve_split(each_lab: SlurmLab, tmp_path: Path) -> None:
    serve = {"nodes": 1, "launcher": sglang_launcher(model="Qwen/Qwen2.5-7B-Instruct")}
    recipe = trainer_recipe(tmp_path, "grpo-split", 3, serve)
    job_id = submit(each_lab, tmp_path, recipe)
    rec = each_lab.wait_job(job_id, timeout=180)
    log = job_log(tmp_path, "grpo-split", job_id)
    assert rec["JobState"] == "COMPLETED", log
    ranks = sorted((e for e in events(log) if e["event"] == "trainer"), key=lambda e: e["rank"])
    assert [e["world_size"] for e in ranks] == [2, 2]
    train_nodes = ranks[0]["host_order"].split()
    assert [e["node"] for e in ranks] == train_nodes
    server = ranks[0]["server"]
    assert ranks[0]["models"] == ["Qwen/Qwen2.5-7B-Instruct"]
    alloc = job_nodes(each_lab, job_id)
    # the server took the allocation's remaining node; the trainer never ran there
    assert sorted([*train_nodes, server["node"]]) == sorted(alloc)
    assert server["node"] not in train_nodes
    assert f"slurmfm: serving hosts: {server['node']};" in log
    assert "stopping the sglang server" in log
    assert (tmp_path / "logs" / f"grpo-split_{job_id}_serve.out").exists()
    assert not (tmp_path / "logs" / "endpoints" / "grpo-split.json").exists()


def gpu_node_standins(tmp: Path, gpus: int, efa: int, path: str) -> dict[str, str]:
    """What the health gate looks at on a p5 node, standing in on a lab node: an
    ``nvidia-smi -L`` listing ``gpus`` GPUs (first on ``path``) and a sysfs tree with ``efa``
    EFA devices (``SLURMFM_SYSFS``, the health step's sysfs root)."""
    bindir = tmp / "gpu-bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/bash\n"
        f'for i in $(seq 0 {gpus - 1}); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done\n'
    )
    smi.chmod(0o755)
    for i in range(efa):
        (tmp / "sysfs" / "class" / "infiniband" / f"rdmap{i}s0").mkdir(parents=True)
    return {"PATH": f"{bindir}:{path}", "SLURMFM_SYSFS": str(tmp / "sysfs")}


@pytest.mark.torch
def test_train_and_serve_hetjob(each_lab: SlurmLab, tmp_path: Path) -> None:
    """A heterogeneous job whose server (component 1) is a p5 and whose trainer (component
    0) is a CPU node: component 1's nodes pass their own health gate (8 GPUs, 32 EFA devices,
    from stand-ins), run their own observability agent, and the server step gets p5's
    NCCL/EFA profile, which the trainer's step does not."""
    serve = {
        "nodes": 1,
        "placement": "hetjob",
        "partition": "debug",
        "instance_type": "p5.48xlarge",  # the lab's nodes carry Gres=gpu:8
        "parallelism": {"tp": 8},  # one replica on the node's 8 GPUs
        "launcher": vllm_launcher(tmp_path, model="Qwen/Qwen2.5-7B-Instruct"),
    }
    recipe = trainer_recipe(tmp_path, "grpo-het", 1, serve)
    recipe["observability"] = {
        "enabled": "on",
        "textfile_dir": None,
        "dcgm_job_mapping_dir": None,
        "interval_s": 1,
    }
    job_id = submit(
        each_lab, tmp_path, recipe, gpu_node_standins(tmp_path, 8, 32, each_lab.env["PATH"])
    )
    rec = each_lab.wait_job(job_id, timeout=180)
    log = job_log(tmp_path, "grpo-het", job_id)
    assert rec["JobState"] == "COMPLETED", log
    # Both components were allocated: the job record lists the second one as JOBID+1.
    comps = each_lab.run(["scontrol", "show", "job", "-o", job_id]).stdout.strip().splitlines()
    assert len(comps) == 2, comps
    het = [parse_scontrol_record(c) for c in comps]
    assert [h["HetJobOffset"] for h in het] == ["0", "1"]
    assert het[1]["Partition"] == "debug"
    serve_node = each_lab.hostnames(het[1]["NodeList"])
    train_node = each_lab.hostnames(het[0]["NodeList"])
    (ev,) = [e for e in events(log) if e["event"] == "trainer"]
    assert ev["server"]["node"] == serve_node[0]
    assert ev["node"] == train_node[0]
    assert ev["models"] == ["Qwen/Qwen2.5-7B-Instruct"]
    # component 1's node passed the gate with p5's expectations (the CPU trainer has none)
    assert re.findall(r"^slurmfm-health (\S+) (\S+)", log, re.MULTILINE) == [
        (serve_node[0], "OK")
    ], log
    # its own profile: p5's EFA settings on the server, none on the CPU trainer
    assert ev["server"]["net_env"]["FI_PROVIDER"] == "efa", ev["server"]
    assert ev["server"]["net_env"]["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth"
    assert "FI_PROVIDER" not in ev["net_env"], ev["net_env"]
    assert "NCCL_SOCKET_IFNAME" not in ev["net_env"], ev["net_env"]
    # an agent ran on each component's node
    obs = tmp_path / "logs" / f"grpo-het_{job_id}.observe"
    nodes = sorted(p.name for p in obs.glob("node_*_r0.json"))
    assert nodes == sorted(f"node_{n}_r0.json" for n in (*train_node, *serve_node)), nodes
