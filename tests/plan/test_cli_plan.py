"""``slurmfm plan`` CLI contract: JSON keys, --unavailable @FILE, exit 2 with a reason."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from slurmfm.cli.plan import plan_command

REPO = Path(__file__).resolve().parents[2]

TOPOLOGY_CONF = """\
SwitchName=leaf1 Nodes=node[008,005,016,009]
SwitchName=leaf2 Nodes=node[010,007,004,015]
SwitchName=leaf3 Nodes=node[002,011,001,006]
SwitchName=leaf4 Nodes=node[012,013,014,003]
SwitchName=spine1 Switches=leaf[1-2]
SwitchName=spine2 Switches=leaf[3-4]
SwitchName=core Switches=spine[1-2]
"""

BLOCK_CONF = """\
BlockName=block1 Nodes=node[001-018]
BlockName=block2 Nodes=node[019-036]
BlockSizes=18,36
"""


def topo(tmp_path: Path, text: str = TOPOLOGY_CONF) -> str:
    f = tmp_path / "topology.conf"
    f.write_text(text)
    return str(f)


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(plan_command, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_json_has_the_contract_keys(tmp_path: Path) -> None:
    code, out, err = run(
        "--topology", topo(tmp_path), "--nodes", "6", "--tp", "8", "--pp", "2", "--json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert {"nodes", "leaves", "switches", "segment", "sbatch_options", "predicted"} <= set(data)
    assert len(data["nodes"]) == 6
    assert data["sbatch_options"][0].startswith("--nodelist=")
    assert data["predicted"]["nvlink_violations"] == 0
    assert data["leaves"] == ["leaf1", "leaf2"]


def test_unavailable_at_file_and_constrain(tmp_path: Path) -> None:
    f = tmp_path / "busy.txt"
    f.write_text("node[008,005]  # drained\nnode010\n")
    code, out, err = run(
        "--topology",
        topo(tmp_path),
        "--nodes",
        "5",
        "--unavailable",
        f"@{f}",
        "--mode",
        "constrain",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert not {"node008", "node005", "node010"} & set(data["nodes"])
    assert data["switches"] == "2@00:10:00"
    assert data["sbatch_options"] == ["--switches=2@00:10:00"]


def test_recipe_with_flag_overrides_and_explain(tmp_path: Path) -> None:
    code, out, err = run(
        str(REPO / "recipes" / "quickstart.yaml"),
        "--topology",
        topo(tmp_path),
        "--nodes",
        "4",
        "--explain",
    )
    assert code == 0, err
    assert "why:" in out
    assert "switch: " in out
    assert "slowdown" in out
    assert "nodes (4, rank order)" in out


def test_block_segment_gated_by_version(tmp_path: Path) -> None:
    t = topo(tmp_path, BLOCK_CONF)
    args = [
        "--topology",
        t,
        "--nodes",
        "18",
        "--gpus-per-node",
        "4",
        "--tp",
        "8",
        "--mode",
        "constrain",
        "--json",
    ]
    code, out, err = run(*args, "--slurm-version", "24.11")
    assert code == 0, err
    assert json.loads(out)["segment"] == 18
    code, out, err = run(*args, "--slurm-version", "22.05")
    assert code == 0, err
    assert json.loads(out)["segment"] is None


def test_impossible_request_exits_2_with_reason(tmp_path: Path) -> None:
    code, _out, err = run("--topology", topo(tmp_path), "--nodes", "17")
    assert code == 2
    assert "not enough free nodes" in err
    code, _out, err = run("--topology", topo(tmp_path), "--nodes", "2", "--tp", "16")
    assert code == 2
    assert "NVLink domain" in err
    code, _out, err = run("--topology", str(tmp_path / "missing.conf"), "--nodes", "2")
    assert code == 2
    assert "cannot read" in err
    code, _out, err = run("--topology", topo(tmp_path))
    assert code == 2
    assert "RECIPE or --nodes" in err


def test_risk_reaches_the_plan(tmp_path: Path) -> None:
    """``--risk model`` may leave Slurm's own choice on a gain the model predicts in one
    scenario; the default keeps it (slurmfm.plan.guard.keep_slurm_unless_robust)."""
    args = ["--topology", topo(tmp_path), "--nodes", "6", "--tp", "8", "--pp", "2", "--explain"]
    code, default, err = run(*args)
    assert code == 0, err
    code, none, err = run(*args, "--risk", "none")
    assert code == 0, err
    code, model, err = run(*args, "--risk", "model")
    assert code == 0, err
    assert none == default
    assert "risk=none" in none
    assert "kept Slurm's own choice" in none
    assert "risk=model" in model
    assert "robust gain over Slurm's own choice" in model
    order = [ln for ln in model.splitlines() if ln.startswith("nodes (6, rank order)")]
    assert order
    assert order[0] not in none.splitlines()  # another rank order on the same fabric


def test_bad_risk_exits_2(tmp_path: Path) -> None:
    code, _out, err = run("--topology", topo(tmp_path), "--nodes", "2", "--risk", "high")
    assert code == 2
    assert "--risk" in err


def test_submit_passes_risk_to_the_plan(tmp_path: Path) -> None:
    from slurmfm.cli import main

    base = [
        "submit",
        str(REPO / "recipes" / "quickstart.yaml"),
        "--dry-run",
        "--slurm-version",
        "24.11",
        "--set",
        "resources.nodes=6",
    ]
    for risk in ("none", "model"):
        res = CliRunner().invoke(main, [*base, "--topology", topo(tmp_path), "--risk", risk])
        assert res.exit_code == 0, res.stderr
        guard = [ln for ln in res.stderr.splitlines() if ln.startswith("plan: guard: kept")]
        assert guard
        assert guard[0].endswith(f"risk={risk})")
    res = CliRunner().invoke(main, [*base, "--topology", topo(tmp_path), "--risk", "high"])
    assert res.exit_code == 2
    res = CliRunner().invoke(main, [*base, "--risk", "model"])  # no plan to make
    assert res.exit_code == 2
    assert "--risk needs --topology" in res.stderr


def test_a_serving_recipes_replicas_stay_in_one_ultraserver(tmp_path: Path) -> None:
    """`slurmfm plan RECIPE`: an SGLang prefill/decode job on GB200 with servers of --tp 16
    (4 nodes) and 6 free nodes in each UltraServer plans 4 + 4 nodes, not 6 + 2 (Slurm 26.05,
    which takes a --nodelist across blocks with a --segment; 24.11 takes none)."""
    recipe = tmp_path / "pd.yaml"
    recipe.write_text(
        "name: pd\ncluster: {instance_type: p6e-gb200.36xlarge, slurm_version: '26.05'}\n"
        "resources: {nodes: 8}\nparallelism: {tp: 16}\n"
        "launcher: {kind: sglang, model: m, disaggregation: {prefill_nodes: 4, decode_nodes: 4}}\n"
    )
    busy = tmp_path / "busy"
    busy.write_text("\n".join([f"node{i:03d}" for i in (*range(7, 19), *range(25, 37))]))
    code, out, err = run(
        str(recipe), "--topology", topo(tmp_path, BLOCK_CONF), "--unavailable", f"@{busy}",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    nodes = json.loads(out)["nodes"]
    blocks = [int(n[4:]) <= 18 for n in nodes]
    assert len(set(blocks[:4])) == len(set(blocks[4:])) == 1, nodes
