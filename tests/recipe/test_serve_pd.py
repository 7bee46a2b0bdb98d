"""Bad prefill/decode layouts (issue 44 item 3): counts that do not add up to the job's nodes,
a server that does not fit its group, disaggregation where slurmfm cannot start it, flags the
runtime sets. Each is one located line ``FILE:LINE: field: what is wrong``; ``slurmfm
validate`` exits 2 with nothing else written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmfm.cli import main
from slurmfm.errors import RecipeError
from slurmfm.recipe.loader import load_recipe
from slurmfm.render.script import Target, render_script

PD = """\
name: pd
cluster:
  instance_type: p5.48xlarge
  partition: gpu
resources:
  nodes: 4
parallelism:
  tp: 16
launcher:
  kind: sglang
  model: /fsx/m
  disaggregation:
    prefill_nodes: 2
    decode_nodes: 2
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return [str(p) for p in info.value.problems]


def test_a_good_layout_loads_and_renders(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(PD)
    r = load_recipe(path)
    d = r.launcher.disaggregation  # type: ignore[union-attr]
    assert d is not None
    assert (d.prefill_nodes, d.decode_nodes, d.transfer_backend) == (
        2,
        2,
        "mooncake",
    )
    text = render_script(r, Target.for_recipe(r, "24.11")).text
    assert "prepare --serve all --serve-nodes 4 --serve-port 30000 --dist-port 0 " in text
    assert "--pd-prefill 2 --pd-decode 2 --pd-span 2 --pd-decode-span 2 --pd-tp 16,16 " in text
    assert "node --prefix 0 --pd mooncake --pd-router-python python3 --pd-startup-s 1800 --" in text
    # the runtime adds each server's port, role and rendezvous: none in the shared line
    for word in ("--nnodes", "--dist-init-addr", '--port "$SLURMFM_SERVE_PORT"'):
        assert word not in text
    # one server of 2 nodes crosses the network: NCCL's transport is checked
    assert "--nccl-check" in text
    one = PD.replace("tp: 16", "tp: 8")  # servers of one node: no NCCL across nodes
    path.write_text(one)
    r = load_recipe(path)
    text = render_script(r, Target.for_recipe(r, "24.11")).text
    assert "--pd-decode 2 --pd-decode-span 1 --pd-tp 8,8 --pd-dp 1,1)" in text
    assert "--nccl-check" not in text


def test_prefill_and_decode_with_their_own_tp_and_dp(tmp_path: Path) -> None:
    """Prefill servers of --tp 8 (one node) with 8 DP-attention ranks, decode servers of
    --tp 16 (two nodes): SGLang moves the KV cache between any two TP sizes (its
    mooncake/nixl ``send_kvcache_slice``, cited in slurmfm/launchers/sglang.py)."""
    path = tmp_path / "recipe.yaml"
    path.write_text(
        PD.replace(
            "    decode_nodes: 2\n",
            "    decode_nodes: 2\n    prefill_tp: 8\n    prefill_replicas: 8\n",
        )
    )
    r = load_recipe(path)
    text = render_script(r, Target.for_recipe(r, "24.11")).text
    assert "--serve-dp 8 --pd-prefill 2 --pd-decode 2 --pd-decode-span 2 " in text
    assert "--pd-tp 8,16 --pd-dp 8,1)" in text
    # the shared line has no --tp or --dp-size: each node's entry adds its role's
    assert "--tp 16" not in text
    assert "--dp-size" not in text


@pytest.mark.parametrize(
    ("extra", "where", "what"),
    [
        (
            "    decode_tp: 12\n",
            ":15: launcher.disaggregation.decode_tp:",
            "a decode server of tp x pp = 12 x 1 = 12 GPUs does not fill whole nodes of 8",
        ),
        (
            "    decode_replicas: 3\n",
            ":15: launcher.disaggregation.decode_replicas:",
            "the 3 replicas of a decode server inside its --tp 16 group",
        ),
        (
            "    prefill_tp: 24\n",
            ":13: launcher.disaggregation.prefill_nodes:",
            "2 node(s) do not hold whole prefill servers of 3 nodes",
        ),
        (
            "  extra_args: [--tp-size, '8']\n",
            ":15: launcher.extra_args:",
            "--tp-size is set by slurmfm",
        ),
    ],
)
def test_a_bad_role_layout_is_one_located_line(
    tmp_path: Path, extra: str, where: str, what: str
) -> None:
    got = problems(tmp_path, PD.replace("    decode_nodes: 2\n", "    decode_nodes: 2\n" + extra))
    assert len(got) == 1, got
    assert where in got[0], got[0]
    assert what in got[0], got[0]


def test_gb200_roles_of_different_spans_must_not_push_a_server_across_ultraservers(
    tmp_path: Path,
) -> None:
    """Prefill servers of 1 node and decode servers of 4 (GB200, 4 GPUs each): the host
    order holds whole 4-node blocks per UltraServer, so 2 prefill nodes would push the
    first decode server across two; 4 do not."""
    gb = (
        "name: pd\ncluster:\n  instance_type: p6e-gb200.36xlarge\n  partition: gpu\n"
        "resources:\n  nodes: NODES\nparallelism:\n  tp: 16\nlauncher:\n  kind: sglang\n"
        "  model: /fsx/m\n  disaggregation:\n    prefill_nodes: PREFILL\n"
        "    decode_nodes: 4\n    prefill_tp: 4\n"
    )
    got = problems(tmp_path, gb.replace("NODES", "6").replace("PREFILL", "2"))
    assert len(got) == 1, got
    assert ":13: launcher.disaggregation.prefill_nodes:" in got[0]
    assert "must be multiples of 4 nodes" in got[0]
    assert "no server straddles two UltraServers" in got[0]
    path = tmp_path / "ok.yaml"
    path.write_text(gb.replace("NODES", "8").replace("PREFILL", "4"))
    assert load_recipe(path).resources.nodes == 8


@pytest.mark.parametrize(
    ("edit", "where", "what"),
    [
        # 2 + 3 nodes on a job of 4
        (
            ("decode_nodes: 2", "decode_nodes: 3"),
            ":12: launcher.disaggregation:",
            "prefill_nodes + decode_nodes = 2 + 3 = 5 must equal the job's 4 nodes",
        ),
        # a server of tp 4 on 8-GPU nodes: not whole nodes
        (("tp: 16", "tp: 4"), ":8: parallelism.tp:", "does not fill whole nodes of 8 GPUs"),
        # servers of 2 nodes (tp 16): 3 prefill nodes do not hold whole servers
        (
            ("nodes: 4", "nodes: 5", "prefill_nodes: 2", "prefill_nodes: 3"),
            ":13: launcher.disaggregation.prefill_nodes:",
            "3 node(s) do not hold whole prefill servers of 2 nodes",
        ),
        (
            ("nodes: 4", "nodes: 5", "decode_nodes: 2", "decode_nodes: 3"),
            ":14: launcher.disaggregation.decode_nodes:",
            "3 node(s) do not hold whole decode servers of 2 nodes",
        ),
        # vLLM: experimental, no router
        (
            ("kind: sglang", "kind: vllm", "tp: 16", "tp: 8"),
            ":12: launcher.disaggregation:",
            "vLLM's disaggregated prefill is experimental and ships no router",
        ),
        # flags the runtime sets per server
        (
            ("    decode_nodes: 2\n", "    decode_nodes: 2\n  extra_args: [--port, '8000']\n"),
            ":15: launcher.extra_args:",
            "--port is set by slurmfm",
        ),
        (
            (
                "    decode_nodes: 2\n",
                "    decode_nodes: 2\n  extra_args: ['--disaggregation-mode=prefill']\n",
            ),
            ":15: launcher.extra_args:",
            "--disaggregation-mode is set by slurmfm",
        ),
        (
            ("  model: /fsx/m\n", "  model: /fsx/m\n  dist_port: 26000\n"),
            ":12: launcher.dist_port:",
            "the runtime picks each server's dist",
        ),
        (
            ("  model: /fsx/m\n", "  model: /fsx/m\n  port: 64800\n"),
            ":12: launcher.port:",
            "leaves no room for the 2 servers' ports",
        ),
        (
            ("    decode_nodes: 2\n", "    decode_nodes: 2\n    transfer_backend: tcp\n"),
            ":15: launcher.disaggregation.transfer_backend:",
            "'mooncake' or 'nixl'",
        ),
    ],
)
def test_a_bad_layout_is_one_located_line(
    tmp_path: Path, edit: tuple[str, ...], where: str, what: str
) -> None:
    text = PD
    for old, new in zip(edit[::2], edit[1::2], strict=True):
        assert old in text, old
        text = text.replace(old, new, 1)
    got = problems(tmp_path, text)
    assert len(got) == 1, got
    assert where in got[0], got[0]
    assert what in got[0], got[0]


def test_a_trainers_server_cannot_be_disaggregated(tmp_path: Path) -> None:
    text = (
        "name: grpo\ncluster:\n  instance_type: p5.48xlarge\n  partition: gpu\n"
        "resources:\n  nodes: 3\nlauncher:\n  kind: torchrun\n  script: /fsx/t.py\n"
        "parallelism:\n  tp: 8\n"
        "serve:\n  nodes: 2\n  parallelism:\n    tp: 8\n"
        "  launcher:\n    kind: sglang\n    model: /fsx/m\n"
        "    disaggregation: {prefill_nodes: 1, decode_nodes: 1}\n"
    )
    got = problems(tmp_path, text)
    assert len(got) == 1, got
    assert ":19: serve.launcher.disaggregation: prefill/decode disaggregation is for a " in got[0]


def test_validate_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(PD.replace("decode_nodes: 2", "decode_nodes: 1"))
    res = CliRunner().invoke(main, ["validate", str(bad)])
    assert res.exit_code == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"{bad}:12: launcher.disaggregation: prefill_nodes + decode_nodes")
