"""Plans are unchanged by speed work: ``slurmfm plan`` output recorded before it, compared byte
for byte.

Why: the speed work on the 64k-node plan (docs/placement-plans.md, "Speed at 64k nodes":
one-pass topology.conf parsing, a natural sort key built per name shape, fewer per-node
objects) could silently change a selection, a tie-break or the rank order. The fabrics are ``scripts/bench_placement.make_fabric``
ones (uneven leaves, host names unrelated to the fabric, shuffled switch lines) stored as files,
so the test does not depend on the generator: a 512-node fabric (Slurm-guard path, both modes)
and an 8,192-node one with unpadded names (``node1``...; large-job path and guard path).

To record again after an intended change of plans: ``python tests/plan/test_plan_regression.py``
(then review the diff: it is what users get).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmfm.cli.plan import plan_command

DATA = Path(__file__).resolve().parent / "data" / "plan_regression"

# name -> (fabric file stem, plan flags)
CASES: dict[str, tuple[str, list[str]]] = {
    "small-pin": ("small", ["--nodes", "64", "--tp", "8", "--pp", "4", "--json"]),
    "small-constrain": ("small", ["--nodes", "48", "--mode", "constrain", "--json"]),
    "small-explain": ("small", ["--nodes", "96", "--pp", "2", "--explain"]),
    "mid-pin-large": ("mid", ["--nodes", "2048", "--tp", "8", "--pp", "8", "--json"]),
    "mid-pin-guard": ("mid", ["--nodes", "256", "--pp", "2", "--explain"]),
    "mid-constrain": ("mid", ["--nodes", "512", "--mode", "constrain", "--json"]),
}


def _argv(case: str) -> list[str]:
    stem, flags = CASES[case]
    return [
        *("--topology", str(DATA / f"{stem}.topology.conf")),
        *("--unavailable", f"@{DATA / f'{stem}.busy.txt'}"),
        *flags,
    ]


def _run(case: str) -> str:
    res = CliRunner().invoke(plan_command, _argv(case))
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_output_unchanged(case: str) -> None:
    expected = (DATA / f"{case}.expected").read_text(encoding="utf-8")
    assert _run(case) == expected


def _record() -> None:  # pragma: no cover - run by hand, see the module docstring
    import random

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_placement as bp

    for stem, seed, n, names in (
        ("small", 14, 512, None),
        ("mid", 1406, 8192, [f"node{i}" for i in range(1, 8193)]),
    ):
        conf = DATA / f"{stem}.topology.conf"
        if not conf.exists():
            rng = random.Random(seed)
            fab = bp.make_fabric(rng, n, host_names=names)
            busy = bp.make_busy(rng, fab, 0.5)
            conf.write_text(fab.conf, encoding="utf-8")
            (DATA / f"{stem}.busy.txt").write_text("\n".join(sorted(busy)) + "\n")
    for case in CASES:
        (DATA / f"{case}.expected").write_text(_run(case), encoding="utf-8")


if __name__ == "__main__":
    _record()
