"""vLLM across nodes without Ray (issue 44): the version gate runs in the Python of the job's
own ``vllm`` (slurmfm/job/vllm.py), and each node's entry gives its server its own flags
(slurmfm/job/node.py ``vllm_node``). The real two-node run is
tests/serve/test_real_vllm.py::test_real_vllm_two_nodes_without_ray_serves_and_cleans_up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmfm.job import node
from slurmfm.job import vllm as v

MODEL = ["vllm", "serve", "/fsx/m", "--tensor-parallel-size", "8"]


def fake_vllm(tmp_path: Path, version: str | None, shebang: bool = True) -> dict[str, str]:
    """A ``vllm`` on PATH whose Python finds vLLM ``version``'s metadata (None: no vLLM);
    importing the fake vllm package fails, which proves the gate never imports it. The
    script writes the words it was given to ``argv.txt``."""
    site, bindir = tmp_path / "site", tmp_path / "bin"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    bindir.mkdir(exist_ok=True)
    (site / "vllm" / "__init__.py").write_text("raise SystemExit('vllm imported')\n")
    if version is not None:
        info = site / f"vllm-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    exe = bindir / "vllm"
    out = tmp_path / "argv.txt"
    head = f"#!{sys.executable}\n" if shebang else ""
    exe.write_text(head + f"import sys\nopen({str(out)!r}, 'w').write(' '.join(sys.argv[1:]))\n")
    exe.chmod(0o755)
    return {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "PYTHONPATH": str(site),
        "PYTHONNOUSERSITE": "1",
        "HOME": str(tmp_path),
    }


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.11.1", True),
        ("0.32.0+cpu", True),  # the lab's CPU build (scripts/vllm-lab)
        ("1.0.0rc1", True),
        ("0.11.0", False),  # --nnodes/--node-rank came in 0.11.1 (vllm-project/vllm#23691)
        ("0.10.2", False),
        (None, False),
    ],
)
def test_the_gate_reads_the_installed_vllm_without_importing_it(
    tmp_path: Path, version: str | None, ok: bool
) -> None:
    env = fake_vllm(tmp_path, version)
    got, found = v.native_supported("vllm", env)
    assert got is ok, found
    if version is not None:
        assert version in found
    assert v.NATIVE_MIN == (0, 11, 1)
    assert v.SOURCES  # the gate is data with its sources


def test_a_wrapper_without_a_python_line_takes_the_ray_path(tmp_path: Path) -> None:
    env = fake_vllm(tmp_path, "0.32.0", shebang=False)
    got, found = v.native_supported("vllm", env)
    assert not got
    assert "no #! python line" in found
    assert v.native_supported("no-such-vllm", env)[0] is False


def test_node_words_one_model_across_nodes() -> None:
    head = v.node_words(MODEL, 0, 2, "10.0.0.1", 24501)
    assert head == [
        *MODEL,
        *("--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1"),
        *("--master-port", "24501"),
    ]
    other = v.node_words(MODEL, 1, 2, "10.0.0.1", 24501)
    assert other[-1] == "--headless"
    assert other[len(MODEL) : len(MODEL) + 4] == ["--nnodes", "2", "--node-rank", "1"]


def test_node_words_data_parallel() -> None:
    head = v.node_words(MODEL, 0, 2, "10.0.0.1", 24501, dp=4, dp_local=2)
    assert head[len(MODEL) :] == [
        *("--data-parallel-size", "4", "--data-parallel-size-local", "2"),
        *("--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "24501"),
    ]
    other = v.node_words(MODEL, 1, 2, "10.0.0.1", 24501, dp=4, dp_local=2)
    assert other[-3:] == ["--data-parallel-start-rank", "2", "--headless"]
    assert "--nnodes" not in other  # the DP flags place the engines, not --nnodes


@given(nnodes=st.integers(1, 64), local=st.integers(1, 8), dp_on=st.booleans())
def test_every_rank_once_and_one_api_server(nnodes: int, local: int, dp_on: bool) -> None:
    """Only node 0 serves the API; the data-parallel start ranks tile 0..dp-1."""
    dp = nnodes * local if dp_on else 1
    starts: list[int] = []
    for rank in range(nnodes):
        words = v.node_words(MODEL, rank, nnodes, "h", 24501, dp=dp, dp_local=local)
        assert ("--headless" in words) is (rank > 0)
        if dp > 1:
            i = words.index("--data-parallel-start-rank") if rank else -1
            starts.append(int(words[i + 1]) if rank else 0)
        else:
            assert words[words.index("--node-rank") + 1] == str(rank)
    if dp > 1:
        assert [s + k for s in starts for k in range(local)] == list(range(dp))


def node_env(tmp_path: Path, version: str, me: str) -> dict[str, str]:
    env = fake_vllm(tmp_path, version)
    env.update(
        SLURMD_NODENAME=me,
        SLURMFM_HOST_ORDER="n1 n2",
        SLURMFM_NODE_ADDRS="n1=10.0.0.1 n2=10.0.0.2",
        SLURMFM_SERVE_HEAD="10.0.0.1",
        SLURMFM_SERVE_DIST_PORT="24501",
    )
    return env


def test_the_node_entry_runs_the_second_node_headless(tmp_path: Path) -> None:
    """The per-node entry itself (``runtime node --vllm auto``): the gate passes, and the
    second node's server gets its rank, ``--headless`` and node 0's address and port."""
    env = node_env(tmp_path, "0.32.0+cpu", "n2")
    argv = ["vllm", "serve", "/fsx/m", "--tensor-parallel-size", "1"]
    rc = node.main(argv, 0, "none", {"ray": "ray"}, env, vllm=("auto", 1, 1))
    assert rc == 0
    assert (tmp_path / "argv.txt").read_text() == (
        "serve /fsx/m --tensor-parallel-size 1 --nnodes 2 --node-rank 1 "
        "--master-addr 10.0.0.1 --master-port 24501 --headless"
    )


def test_an_older_vllm_goes_over_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = node_env(tmp_path, "0.10.2", "n1")
    words, over_ray = node.vllm_node(MODEL, 0, 2, ("auto", 1, 1), env)
    assert over_ray
    assert words == [*MODEL, "--distributed-executor-backend", "ray"]
    assert "over Ray (vLLM 0.10.2 is older than 0.11.1)" in capsys.readouterr().out
    words, over_ray = node.vllm_node(MODEL, 0, 2, ("native", 1, 1), env)
    assert not over_ray
    assert env["VLLM_HOST_IP"] == "10.0.0.1"  # pinned to its own NodeAddr, as over Ray
    assert words[-2:] == ["--master-port", "24501"]
