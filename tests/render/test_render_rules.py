"""What the script and `validate` say for each rendering rule: containers, the GPU and EFA
requests, servers, striping and the other facts a script carries."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from render_helpers import recipe, rendered

from slurmfm.cli import main
from slurmfm.plan.types import Placement
from slurmfm.recipe.loader import validate

REPO = Path(__file__).resolve().parents[2]


def launch_line(text: str) -> str:
    """The training srun command (backslash continuations joined), as the runtime runs it."""
    joined = text.replace("\\\n", " ")
    # the launch srun is the argv of the runtime's batch step: `exec python3 ... batch ... --
    # srun ... python3 "$SLURMFM_RUNTIME" node --prefix N ...` (in a container: `sh -c ...`)
    (line,) = [ln for ln in joined.splitlines() if ln.startswith("exec ") and " srun " in ln]
    return line[line.index(" srun ") + 1 :]


GB200: dict[str, Any] = {
    "cluster__instance_type": "p6e-gb200.36xlarge",
    "parallelism": {"tp": 4},
}


# --- 12.16: --auto-resume=1 once on HyperPod -----------------------------------------------
@pytest.mark.parametrize("launcher", ["torchrun", "nemo"])
def test_hyperpod_auto_resume_once(launcher: str) -> None:
    over: dict[str, Any] = {"cluster__flavor": "hyperpod"}
    if launcher == "nemo":
        over["launcher"] = {"kind": "nemo", "recipe": "llama3_8b"}
    line = launch_line(rendered(recipe(**over)).text)
    assert shlex.split(line.replace('"', "")).count("--auto-resume=1") == 1


# --- 12.3: the save protocol is an explicit recipe choice --------------------------------------
@pytest.mark.parametrize(
    ("launcher", "explicit", "expected"),
    [
        ({"kind": "torchrun", "script": "t.py"}, None, True),
        ({"kind": "torchrun", "script": "t.py"}, False, False),
        # NeMo 2.0 saves on TERM (its PreemptionCallback), as Megatron-LM does
        ({"kind": "nemo", "recipe": "llama3_8b"}, None, True),
        ({"kind": "nemo", "recipe": "llama3_8b"}, False, False),
        ({"kind": "megatron"}, None, True),
    ],
)
def test_save_mode_reaches_the_script(
    launcher: dict[str, Any], explicit: bool | None, expected: bool
) -> None:
    over: dict[str, Any] = {"launcher": launcher}
    if explicit is not None:
        over["resilience__save_on_signal"] = explicit
    r = recipe(**over)
    assert r.save_on_signal is expected
    text = rendered(r).text
    assert f"--save-protocol {int(expected)} " in text  # what the runtime's batch step does


def test_save_on_signal_refused_for_launchers_without_a_protocol() -> None:
    from slurmfm.errors import SlurmfmError

    with pytest.raises((ValueError, SlurmfmError), match="save_on_signal"):
        recipe(
            launcher={"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct"},
            resilience__save_on_signal=True,
        )


def test_shipped_fsdp_recipe_requeues_at_the_signal() -> None:
    """Its train.py (awsome-distributed-training FSDP) has no USR2 handler."""
    res = CliRunner().invoke(main, ["validate", str(REPO / "recipes" / "llama3-8b-p5-fsdp.yaml")])
    assert res.exit_code == 0, res.output
    assert "save mode: requeue-at-signal (explicit)" in res.stdout


def test_validate_names_the_default_mode() -> None:
    res = CliRunner().invoke(
        main, ["validate", str(REPO / "recipes" / "llama3-70b-p5en-megatron.yaml")]
    )
    assert "save mode: save-on-signal (explicit)" in res.stdout
    assert "TERM" in res.stdout


# --- 12.12: the pre-timeout window against the checkpoint size ---------------------------------
def test_window_too_short_for_the_checkpoint_warns() -> None:
    r = recipe(resilience__model_params_b=405, storage__write_mb_s=300)
    (w,) = [w for w in rendered(r).warnings if w.startswith("resilience.save_before_timeout_s")]
    assert "5,670 GB" in w
    assert "18,900 s" in w


@pytest.mark.parametrize(
    ("params_b", "mb_s", "window", "warned"),
    [
        (8, 300, 300, True),  # 112 GB at 300 MB/s: 374 s
        (8, 400, 300, False),  # 280 s
        (70, 6000, 300, False),  # 980 GB: 164 s
        (405, 24000, 600, False),  # 5,670 GB: 237 s
        (405, 24000, 200, True),
    ],
)
def test_window_gate(params_b: float, mb_s: float, window: int, warned: bool) -> None:
    r = recipe(
        resilience__model_params_b=params_b,
        resilience__save_before_timeout_s=window,
        storage__write_mb_s=mb_s,
    )
    assert (r.save_window_warning() is not None) is warned


def test_window_not_checked_without_a_size_or_a_save() -> None:
    assert recipe().save_window_warning() is None
    assert (
        recipe(
            resilience__model_params_b=405, resilience__save_on_signal=False
        ).save_window_warning()
        is None
    )


def test_validate_warns_about_the_window(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        [
            "validate",
            str(REPO / "recipes" / "gb200-llama3-405b.yaml"),
            "--set",
            "storage.write_mb_s=300",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "cannot hold one save" in res.stderr


# --- 12.10 / 25.1: GB200 without a topology plan gets a --segment from the recipe's intent --------
@pytest.mark.parametrize(
    ("nodes", "segment"),
    [(18, 18), (9, 9), (36, 18), (27, 9), (6, 6), (3, 3), (12, 12), (2, 2), (54, 18)],
)
def test_gb200_default_segment_is_the_largest_that_fits_one_ultraserver(
    nodes: int, segment: int
) -> None:
    """A job that fits one UltraServer is one segment (one NVLink domain); a larger one gets
    the largest segment that divides it and fits an 18-instance UltraServer."""
    r = recipe(**GB200, resources__nodes=nodes)
    out = rendered(r, "24.11")
    assert f"#SBATCH --segment={segment}" in out.text
    assert segment <= 18
    assert nodes % segment == 0


@pytest.mark.parametrize("nodes", [19, 37])
def test_gb200_without_a_dividing_segment_warns(nodes: int) -> None:
    out = rendered(recipe(**GB200, resources__nodes=nodes), "24.11")
    assert "--segment" not in out.text
    assert any("may be placed across UltraServers" in w for w in out.warnings)


def test_gb200_segment_needs_24_05() -> None:
    out = rendered(recipe(**GB200, resources__nodes=18), "23.11")
    assert "--segment" not in out.text
    assert any("needs Slurm >= 24.05" in w for w in out.warnings)


def test_planned_segment_and_other_types_untouched() -> None:
    out = rendered(recipe(**GB200, resources__nodes=18), "24.11", Placement(segment=18))
    assert "#SBATCH --segment=18" in out.text
    assert "--segment=9" not in out.text
    out = rendered(recipe(**GB200, resources__nodes=18), "24.11", Placement(mode="constrain"))
    assert "--segment" not in out.text
    assert "--segment" not in rendered(recipe(resources__nodes=18)).text
    assert "--segment" not in rendered(recipe(**GB200, resources__nodes=1)).text


# --- 12.4: IMEX channel mount where Enroot does not provide it -----------------------------------
@pytest.mark.parametrize(
    ("instance", "enroot", "mounts", "expected"),
    [
        ("p6e-gb200.36xlarge", "auto", ["/fsx:/fsx"], "/fsx:/fsx,/dev/nvidia-caps-imex-channels"),
        ("p6e-gb200.36xlarge", "3.5.0", [], "/dev/nvidia-caps-imex-channels"),
        ("p6e-gb200.36xlarge", "4.0.0", ["/fsx:/fsx"], "/fsx:/fsx"),
        (
            "p6e-gb200.36xlarge",
            "auto",
            ["/dev/nvidia-caps-imex-channels:/dev/nvidia-caps-imex-channels"],
            "/dev/nvidia-caps-imex-channels:/dev/nvidia-caps-imex-channels",
        ),
        ("p5.48xlarge", "auto", ["/fsx:/fsx"], "/fsx:/fsx"),
    ],
)
def test_imex_channel_mount(instance: str, enroot: str, mounts: list[str], expected: str) -> None:
    tp = 4 if instance.startswith("p6e") else 8
    r = recipe(
        cluster__instance_type=instance,
        parallelism={"tp": tp},
        container={"image": "/fsx/i.sqsh", "mounts": mounts, "enroot": enroot},
    )
    line = launch_line(rendered(r).text)
    got = re.findall(r"--container-mounts=(\S+)", line)
    # the runtime file last, read-only: the node entry runs in the container (issue 37)
    assert got == [expected + ',"$SLURMFM_RUNTIME:$SLURMFM_RUNTIME:ro"']


def test_gb200_profile_does_not_restate_nccl_defaults() -> None:
    text = rendered(recipe(**GB200, container={"image": "/fsx/i.sqsh"})).text
    assert "NCCL_MNNVL_ENABLE" not in text
    assert "NCCL_NVLS_ENABLE" not in text


# --- 12.9: workarounds only where their trigger is ---------------------------------------------
def test_p5en_job_gets_no_blanket_workarounds() -> None:
    text = rendered(recipe(cluster__instance_type="p5en.48xlarge")).text
    assert "NCCL_NVLS_ENABLE" not in text
    assert "NCCL_CUMEM_ENABLE" not in text


def test_permuted_devices_in_the_recipe_turn_nvls_off() -> None:
    out = rendered(recipe(env={"CUDA_VISIBLE_DEVICES": "0,4,2,6,1,5,3,7"}))
    (line,) = [e for e in out.env if e.name == "NCCL_NVLS_ENABLE"]
    assert line.shell_value == "0"
    assert "issues/1906" in line.why


def test_cumem_off_with_pipeline_stages_across_nodes_warns() -> None:
    out = rendered(recipe(parallelism={"tp": 8, "pp": 2}, env={"NCCL_CUMEM_ENABLE": "0"}))
    assert any("issues/1721" in w for w in out.warnings)


# --- 12.13: hetjob components each with their own profile and health -----------------------------
def test_hetjob_component_profile_and_health() -> None:
    r = validate(
        {
            "name": "het",
            "cluster": {"instance_type": "p6-b200.48xlarge"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "torchrun", "script": "t.py"},
            "network": {"aws_ofi_nccl": "1.6.0"},  # legacy flags only on p4/p5
            "serve": {
                "nodes": 1,
                "placement": "hetjob",
                "instance_type": "p5.48xlarge",
                "parallelism": {"tp": 8},
                "launcher": {"kind": "vllm", "model": "m"},
            },
        }
    )
    out = rendered(r)
    c0, c1 = out.components
    assert (c0.group, c0.instance, c0.env) == (0, "p6-b200.48xlarge", ())
    assert (c0.health.gpus, c0.health.efa) == (8, 8)
    assert (c1.group, c1.instance) == (1, "p5.48xlarge")
    assert {e.name: e.shell_value for e in c1.env} == {"FI_EFA_USE_DEVICE_RDMA": "1"}
    assert c1.unset == ()
    assert (c1.health.gpus, c1.health.efa) == (8, 32)
    assert (c0.nodes, c1.nodes, c0.imex, c1.imex) == (2, 1, False, False)
    # the batch script's exports stay component 0's profile
    assert "FI_EFA_USE_DEVICE_RDMA" not in {e.name for e in out.env}
    assert rendered(recipe()).components == ()


def batch_words(text: str) -> list[str]:
    """The words of the runtime's batch step, as bash passes them (variables left as text)."""
    joined = text.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if ln.startswith("exec python3 ")]
    words = shlex.split(line.replace('"${#slurmfm_serve[@]}"', "1"))
    return words[words.index("batch") :]


def het(trainer: str, server: str, **over: Any) -> Any:
    tp = {"p6e-gb200.36xlarge": 4}
    return recipe(
        cluster__instance_type=trainer,
        parallelism={"tp": tp.get(trainer, 8)},
        network={"aws_ofi_nccl": "1.6.0"},  # legacy flags only on p4/p5
        serve={
            "nodes": 2,
            "placement": "hetjob",
            "instance_type": server,
            "parallelism": {"tp": tp.get(server, 8), "pp": 2},
            "launcher": {"kind": "vllm", "model": "m"},
        },
        **over,
    )


def test_hetjob_script_hands_each_component_to_the_runtime() -> None:
    """What the renderer computed per component reaches the runtime's options exactly."""
    from slurmfm.job import hetjob

    out = rendered(het("p6-b200.48xlarge", "p5.48xlarge"))
    a = parser_args(out.text)
    (c1,) = hetjob.components(a.component, a.component_env, a.component_unset)
    assert c1 == hetjob.Component(1, 2, True, 8, 32, False, (("FI_EFA_USE_DEVICE_RDMA", "1"),))
    assert (a.gpus, a.efa, a.imex) == (8, 8, 0)  # component 0: the trainer's own
    # the reverse: a profile line of the trainer that the server's type lacks is unset there
    a = parser_args(rendered(het("p5.48xlarge", "p6-b200.48xlarge")).text)
    (c1,) = hetjob.components(a.component, a.component_env, a.component_unset)
    assert c1.unset == ("FI_EFA_USE_DEVICE_RDMA",)
    assert (c1.efa, a.efa) == (8, 32)
    # one component: nothing of the kind
    a = parser_args(rendered(recipe()).text)
    assert (a.component, a.component_env, a.component_unset) == ((), (), ())


def test_hetjob_gb200_server_in_a_container_gets_the_channel_and_its_check() -> None:
    r = het("p5.48xlarge", "p6e-gb200.36xlarge", container={"image": "/fsx/i.sqsh"})
    out = rendered(r)
    a = parser_args(out.text)
    from slurmfm.job import hetjob

    (c1,) = hetjob.components(a.component, a.component_env, a.component_unset)
    assert (c1.gpus, c1.efa, c1.imex) == (4, 16, True)
    assert a.imex == 0  # the p5 trainer needs no IMEX
    serve_line = out.text.replace("\\\n", " ").split("slurmfm_serve=(", 1)[1].split(")", 1)[0]
    serve = shlex.split(serve_line.replace("$SLURMFM_RUNTIME", "/rt"))
    # the runtime's in-container check runs in the server step's own image and mounts
    words = hetjob.container_words(serve)
    assert words[0] == "--container-image=/fsx/i.sqsh"
    assert words[1] == "--container-mounts=/dev/nvidia-caps-imex-channels,/rt:/rt:ro"
    assert hetjob.step_group(serve) == 1


def parser_args(text: str) -> Any:
    """The runtime's options from the script's batch line, parsed as the runtime does."""
    from slurmfm.job.cli import parser
    from slurmfm.job.options import BatchOptions

    return BatchOptions.from_namespace(parser().parse_args(batch_words(text)))


def test_gb200_container_recipe_gives_the_runtime_its_imex_checks() -> None:
    """recipes/gb200-llama3-405b.yaml: the host check (--imex 1) and, from the launch step's
    own Pyxis options, the in-container check (slurmfm/job/batch.py container_gate)."""
    from slurmfm.job import hetjob
    from slurmfm.recipe.loader import load_recipe

    r = load_recipe(REPO / "recipes" / "gb200-llama3-405b.yaml")
    text = rendered(r).text
    words = batch_words(text)
    a = parser_args(text)
    assert (a.health, a.gpus, a.efa, a.imex) == (1, 4, 16, 1)
    launch = words[words.index("--") + 1 :]
    assert launch[0] == "srun"
    pyxis = hetjob.container_words(launch)
    assert pyxis[0] == "--container-image=/fsx/containers/nemo-25.11-arm64.sqsh"
    assert pyxis[1].startswith("--container-mounts=/fsx:/fsx,/dev/nvidia-caps-imex-channels,")
    assert "--no-container-mount-home" in pyxis
    assert hetjob.step_group(launch) is None  # one component: the check runs beside it


# --- 12.5: NeMo tasks laid out in the planned host order ----------------------------------------
def test_nemo_step_uses_arbitrary_distribution_in_host_order() -> None:
    r = recipe(
        cluster__instance_type="p6-b200.48xlarge",
        launcher={"kind": "nemo", "recipe": "llama3_8b"},
    )
    text = rendered(r).text
    line = launch_line(text)
    assert "--distribution=arbitrary" in line
    assert "--ntasks-per-node=8" in line
    # the runtime's prepare step lists each host of the order once per task
    assert '--ntasks="$SLURMFM_NTASKS"' in line
    assert "--nodes=" not in line  # Slurm >= 24.11 refuses --nodes with arbitrary
    assert '--nodelist="$SLURMFM_TASK_NODELIST"' in line
    assert "--tasks-per-node 8" in text


def test_nemo_trainer_beside_a_split_server_has_one_node_list() -> None:
    r = recipe(
        cluster__instance_type="p6-b200.48xlarge",
        resources__nodes=3,
        launcher={"kind": "nemo", "recipe": "llama3_8b"},
        serve={"nodes": 1, "launcher": {"kind": "vllm", "model": "m"}, "parallelism": {"tp": 8}},
    )
    line = launch_line(rendered(r).text)
    assert line.count("--nodelist=") == 1
    assert "--distribution=arbitrary" in line


# --- 12.7: only retryable failures requeue ------------------------------------------------------
def test_retry_exit_codes_reach_the_runtime() -> None:
    """Default: no retryable codes (the runtime still retries dead nodes, signals, the save)."""
    assert "--retry-exit none" in rendered(recipe()).text
    r = recipe(resilience__retry_exit_codes=[75, 1, 75])
    assert "--retry-exit 1,75" in rendered(r).text


@pytest.mark.parametrize("codes", [[0], [256], [-1], ["x"]])
def test_retry_exit_codes_are_validated(codes: list[Any]) -> None:
    with pytest.raises(Exception, match="retry_exit_codes"):
        recipe(resilience__retry_exit_codes=codes)


# --- 12.15 / issue 40: the NCCL check where NCCL logs a network choice ----------------------
@pytest.mark.parametrize(
    ("launcher", "parallelism", "nodes", "checked"),
    [
        ({"kind": "torchrun", "script": "/fsx/train.py"}, {"tp": 8}, 2, True),
        # servers across nodes: their processes inherit node 0's NCCL_DEBUG_FILE (issue 40)
        ({"kind": "vllm", "model": "m"}, {"tp": 8, "pp": 2}, 2, True),
        ({"kind": "sglang", "model": "m"}, {"tp": 16}, 2, True),
        # a one-node server: no network for NCCL to choose, no false "no NCCL line" warning
        ({"kind": "vllm", "model": "m"}, {"tp": 8}, 1, False),
        ({"kind": "sglang", "model": "m"}, {"tp": 8}, 1, False),
    ],
)
def test_nccl_log_and_check_only_for_launchers_that_write_it(
    launcher: dict[str, Any], parallelism: dict[str, int], nodes: int, checked: bool
) -> None:
    """vLLM and SGLang set NCCL up themselves; across nodes they are checked as training is
    (an image without aws-ofi-nccl would serve over TCP sockets silently), on one node not."""
    r = recipe(
        launcher=launcher,
        parallelism=parallelism,
        resources__nodes=nodes,
        resilience={"nccl_transport_check": "warn"},
    )
    text = rendered(r).text
    a = parser_args(text)
    assert (a.nccl_check != "off") is checked
    assert ("export SLURMFM_NCCL_LOG=" in text) is checked
    if checked:
        assert a.nccl_check == "warn"


# --- 12.16: Lustre striping touches the run's checkpoint directory, never the log directory ---
FAKE_BIN = {
    # stat -f -c %T DIR: every directory is on Lustre
    "stat": "echo lustre",
    "lfs": 'echo "lfs $*" >> "$LFS_CALLS"',
    "scontrol": 'case "$2" in hostnames) echo n1 ;; *) echo "NodeName=n1 NodeAddr=127.0.0.1" ;; esac',
}


PFL = "-E 64M -c 1 -E 1G -c 4 -E -1 -c 8"


@pytest.mark.parametrize(
    ("launcher", "stripe", "layout"),
    [
        ({"kind": "megatron"}, "auto", PFL),  # torch_dist: files per rank
        ({"kind": "megatron", "model_args": {"ckpt-format": "torch"}}, "auto", PFL),
        ({"kind": "megatron"}, "off", None),
        ({"kind": "torchrun", "script": "/fsx/train.py"}, "auto", None),  # format unknown
    ],
)
def test_lustre_layout_follows_the_checkpoint_format_and_spares_the_log_directory(
    tmp_path: Path, launcher: dict[str, Any], stripe: str, layout: str | None
) -> None:
    """The generated script's own prepare step, run with its embedded runtime on a fake Lustre:
    only the run's checkpoint directory gets a layout, and the one Lustre's striping guidance
    gives its format: a progressive layout for file-per-rank checkpoints (not ``-c -1 -S 16M``,
    which put every small per-rank file on every OST), the file system's default where the
    format is unknown. Before issue 12, the script ran ``lfs setstripe -c 1 "$SLURMFM_LOG_DIR"``,
    changing the layout of a directory every user of the cluster shares."""
    import os
    import subprocess
    import sys

    from slurmfm.render.payload import extract

    ckpt, logs = tmp_path / "ckpt" / "r", tmp_path / "logs"
    ckpt.mkdir(parents=True)
    logs.mkdir()
    text = rendered(
        recipe(
            launcher=launcher,
            storage={"checkpoint_root": str(ckpt.parent), "log_dir": str(logs), "stripe": stripe},
        )
    ).text
    assert "lfs " not in text  # every Lustre call goes through the runtime (base64 has no " ")
    (line,) = [ln for ln in text.splitlines() if '"$slurmfm_checked" prepare' in ln]
    opts = shlex.split(line.split(" prepare", 1)[1].rstrip(")"))
    runtime = tmp_path / "runtime.pyz"
    runtime.write_bytes(extract(text))
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, body in FAKE_BIN.items():
        (fake / name).write_text("#!/bin/sh\n" + body + "\n")
        (fake / name).chmod(0o755)
    calls = tmp_path / "lfs-calls"
    env = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        "LFS_CALLS": str(calls),
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NAME": "r",
        "SLURMD_NODENAME": "n1",
        "SLURMFM_CHECKPOINT_DIR": str(ckpt),
        "SLURMFM_LOG_DIR": str(logs),
    }
    proc = subprocess.run(
        [sys.executable, str(runtime), "prepare", *opts],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lfs = calls.read_text().splitlines() if calls.exists() else []
    setstripe = [c for c in lfs if c.startswith("lfs setstripe")]
    assert setstripe == ([f"lfs setstripe {layout} {ckpt}"] if layout else [])
    assert not [c for c in lfs if str(logs) in c.split()]


# --- issue 11: servers in a container keep the runtime's entry only where it has work ----------
@pytest.mark.parametrize(("nodes", "entry"), [(1, False), (2, True)])
def test_server_in_a_container_runs_the_entry_only_across_nodes(nodes: int, entry: bool) -> None:
    """One server node: the server runs directly, no runtime in the image (nothing to do
    there). Across nodes the entry starts Ray (vLLM) and needs the runtime file mounted."""
    r = recipe(
        resources__nodes=nodes,
        parallelism={"tp": 8, "pp": nodes},
        launcher={"kind": "vllm", "model": "m"},
        container={"image": "/fsx/i.sqsh", "mounts": ["/fsx:/fsx"]},
    )
    joined = rendered(r).text.replace("\\\n", " ")
    (line,) = [ln for ln in joined.splitlines() if ln.startswith("slurmfm_serve=(srun ")]
    assert ('"$slurmfm_checked" node' in line) is entry
    mounts = re.findall(r"--container-mounts=(\S+)", line)
    assert mounts == (
        ['/fsx:/fsx,"$SLURMFM_RUNTIME:$SLURMFM_RUNTIME:ro"'] if entry else ["/fsx:/fsx"]
    )


# --- NeMo 2.0's save on TERM (its PreemptionCallback) -------------------------------------------
def test_nemo_saves_on_term_from_its_preemption_callback() -> None:
    """TERM to each task itself (NeMo runs no launcher), the callback in the driver; with
    ``save_on_signal: false`` neither, and the job requeues at the signal as before."""
    import ast

    nemo = {"kind": "nemo", "recipe": "llama3_8b"}
    text = rendered(recipe(launcher=nemo)).text
    line = launch_line(text)
    assert " node --prefix 0 --forward TERM --forward-tasks 1 -- " in line
    assert "--save-protocol 1 " in text
    driver = text.split("<<'SLURMFM_NEMO_DRIVER_EOF'\n", 1)[1].split("SLURMFM_NEMO_DRIVER_EOF")[0]
    ast.parse(driver)
    assert "from nemo.lightning.pytorch.callbacks import PreemptionCallback" in driver
    assert "[run.Config(PreemptionCallback)]" in driver
    assert driver.index("PreemptionCallback") < driver.index("run.run(recipe, direct=True)")
    off = rendered(recipe(launcher=nemo, resilience__save_on_signal=False)).text
    assert " node --prefix 0 --forward none -- " in launch_line(off)
    assert "--save-protocol 0 " in off
    assert "PreemptionCallback" not in off


def test_validate_says_nemo_saves_on_term() -> None:
    r = recipe(launcher={"kind": "nemo", "recipe": "llama3_8b"})
    assert r.save_mode.startswith("save mode: save-on-signal (launcher default)")
    assert "TERM (NeMo's PreemptionCallback)" in r.save_mode
