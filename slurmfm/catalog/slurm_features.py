"""Slurm feature gates as data: which option or behaviour exists from which release.

Why: the clusters slurmfm targets run very different Slurm releases (the local lab 22.05,
ParallelCluster 3.11-3.15 ship 23.11-25.11, PCS offers 23.11-25.11, HyperPod needs 25.11 for
partition topology, Debian gives 24.11 and 26.05). Emitting ``--segment`` to a 23.11 controller
or relying on ``BlockAsNodeRank`` on 24.11 fails at submit time or, worse, silently changes
placement. Each gate cites its source; when no source gives an exact first release,
``description`` says so, ``verified`` is False and the *later* plausible release is used, so
slurmfm never claims support it cannot back.

Sources: SchedMD/slurm's CHANGELOG files and release tags, the commits named per gate, and runs
on this repository's local lab (``scripts/slurm-lab``: Slurm 22.05.8 on the host, 24.11.5 and
26.05.5 in chroots; ``tests/catalog/test_slurm_features.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from slurmfm.errors import UnsupportedError

__all__ = [
    "FEATURES",
    "Feature",
    "SlurmVersion",
    "UnsupportedBySlurm",
    "require",
    "supports",
]

_VERSION_RE = re.compile(
    r"""^\s*(?:slurm(?:-wlm)?[\s-]+)?v?          # optional "slurm " / "slurm-" prefix
        (?P<major>\d{1,3})(?P<sep>[.-])(?P<minor>\d{1,2})  # 24.11 (or tag style 24-11)
        (?:(?P=sep)(?P<micro>\d{1,3}))?                   # .5 (same separator)
        (?:-\d+[\w.+~-]*)?                        # Debian/tag revision: -1, -4+deb13u1, -2
        \s*$""",
    re.IGNORECASE | re.VERBOSE,
)


@dataclass(frozen=True, order=True)
class SlurmVersion:
    """A Slurm release ``major.minor[.micro]`` (year.month.patch), totally ordered."""

    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        """Parse "22.05.8", "24.11", "slurm 24.11.5", "26.05.5-1", "24.11.5-4+deb13u1".

        Why lenient about prefixes/suffixes: the text comes from ``sinfo --version`` ("slurm
        24.11.5"), Debian package versions ("26.05.5-1") and tags ("slurm-24-11-5-1").
        """
        m = _VERSION_RE.match(text)
        if m is None:
            raise ValueError(f"not a Slurm version: {text!r} (expected e.g. '24.11' or '24.11.5')")
        micro = m.group("micro")
        return cls(int(m.group("major")), int(m.group("minor")), int(micro) if micro else 0)

    def __str__(self) -> str:
        # Year-based releases (14.03 on) are written with a two-digit month; 2.3 stays 2.3.
        month = f"{self.minor:02d}" if self.major >= 14 else str(self.minor)
        base = f"{self.major}.{month}"
        return base if self.micro == 0 else f"{base}.{self.micro}"


@dataclass(frozen=True)
class Feature:
    """A Slurm option/behaviour and the release range that has it.

    ``verified`` is False when ``introduced`` is a conservative floor or a CHANGELOG reading that
    no reference run confirmed on that exact release.
    """

    name: str
    introduced: SlurmVersion
    removed: SlurmVersion | None
    description: str
    source: str
    verified: bool = True


class UnsupportedBySlurm(UnsupportedError, ValueError):
    """The cluster's Slurm is too old (or too new) for a requested feature."""


_V = SlurmVersion
SRC_TIMELINE = "SchedMD/slurm:CHANGELOG (per release) and release tags"
SRC_TREE_FIX = "SchedMD/slurm commits 2ec1d02624, 64263118c3 (ticket 20547; checked on 22.05.8)"
SRC_NEWER = "scripts/slurm-lab (runs on Slurm 24.11.5 and 26.05.5)"
SRC_LAB = "scripts/slurm-lab (runs on Slurm 22.05.8)"
SRC_AWS = (
    "aws-samples/awsome-distributed-training:3.test_cases; "
    "https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-resiliency-slurm-auto-resume.html"
)

SRC_RN_2511 = "SchedMD/slurm:RELEASE_NOTES.md (Release Notes for Slurm 25.11, New Features)"
SRC_RN_2605 = "SchedMD/slurm:RELEASE_NOTES.md (Release Notes for Slurm 26.05, Highlights)"
SRC_SID = (
    "scripts/slurm-lab --suite sid (runs on Slurm 26.05.5; tests/catalog/test_newer_slurm.py, "
    "tests/topology/test_newer_topology_yaml.py, tests/observe/test_slurmctld_metrics.py)"
)

_FLOOR_NOTE = (
    "No source here records the first release; 22.05 (the oldest Slurm this "
    "project runs and tests, the local lab) is used as a conservative floor."
)

_ALL: tuple[Feature, ...] = (
    Feature(
        "switches",
        _V(2, 3),
        None,
        "sbatch --switches=count[@time] caps leaf switches under topology/tree "
        "(SchedulerParameters=max_switch_wait, default 300 s). Works on 22.05, 24.11, 26.05.",
        f"{SRC_TIMELINE} (commit 08e9f24); {SRC_LAB}; {SRC_NEWER}",
    ),
    Feature(
        "topology_block",
        _V(23, 11),
        None,
        "TopologyPlugin=topology/block (BlockName lines; BlockSizes from 24.05, BlockLevels in "
        "23.11).",
        f"{SRC_TIMELINE} (topology_block.c first in tag 23-11-0-1)",
    ),
    Feature(
        "segment",
        _V(24, 5),
        None,
        "sbatch --segment=S: node count must be a multiple of S; each segment placed in one "
        "block. 24.11 checks divisibility in the controller, 26.05 in the client.",
        f"{SRC_TIMELINE} (CHANGELOG 24.05); {SRC_NEWER}",
    ),
    Feature(
        "topology_yaml",
        _V(25, 5),
        None,
        "topology.yaml: several topologies, per-partition Topology=; topology.conf is ignored "
        "when it exists. Verified working on 26.05.",
        f"{SRC_TIMELINE} (CHANGELOG 25.05); {SRC_NEWER}",
    ),
    Feature(
        "block_as_node_rank",
        _V(25, 11),
        None,
        "TopologyParam=BlockAsNodeRank: node ranks follow block order. Absent from 24.11's "
        "slurm.conf(5), works on 26.05 (the lab's 26.05.5); the 25.11 first release comes from the "
        "CHANGELOG reading only -- no 25.11 cluster was run, so the exact release is unverified.",
        f"{SRC_TIMELINE} (CHANGELOG 25.11); {SRC_NEWER}",
        verified=False,
    ),
    Feature(
        "exclusive_topo",
        _V(24, 5),
        None,
        "sbatch --exclusive=topo: do not share the topology segment/block with other jobs. "
        "Observed on 24.11 and 26.05.",
        f"{SRC_TIMELINE} (CHANGELOG 24.05); {SRC_NEWER}",
    ),
    Feature(
        "tree_selection_rules_2405_3",
        _V(24, 5, 3),
        None,
        "topology/tree best-fit as changed in 24.05.3: a closer leaf replaces the best only if "
        "it fits, and ancestor free counts are decremented. 21.08-24.05.2 use the older rules "
        "(verified on 22.05.8); the placement simulator must pick the matching variant.",
        SRC_TREE_FIX,
    ),
    Feature(
        "segment_larger_than_base_block",
        _V(25, 11),
        None,
        "--segment larger than the base block (fits a higher BlockSizes level): 24.11 rejects it "
        "('segment > bblock_node_cnt is not supported'), 26.05 accepts it. 25.11 is the CHANGELOG "
        "reading; not run on 25.11, so the exact release is unverified.",
        f"{SRC_TIMELINE} (CHANGELOG 25.11); {SRC_NEWER}",
        verified=False,
    ),
    Feature(
        "nodelist_with_segment",
        _V(26, 5),
        None,
        "--nodelist with --segment under topology/block: 24.11.5 refuses the job ('Requested "
        "node configuration is not available'), 26.05.5 lays the segments out inside the listed "
        "nodes. Not run on 25.05 or 25.11, so the first release is unverified; 26.05 is the "
        "first release seen to take it.",
        f"{SRC_NEWER} (tests/plan/test_real_slurm_plan.py, "
        "test_gb200_nodelist_across_ultraservers)",
        verified=False,
    ),
    Feature(
        "sbatch_test_only",
        _V(22, 5),
        None,
        "sbatch --test-only: predicts start time and nodes without submitting (uses a job id). "
        f"Works on 22.05.8, 24.11, 26.05. {_FLOOR_NOTE}",
        f"{SRC_LAB}; {SRC_NEWER}",
        verified=False,
    ),
    Feature(
        "open_mode",
        _V(22, 5),
        None,
        "sbatch --open-mode=append: keeps output across requeues / HyperPod auto-resume. "
        f"{_FLOOR_NOTE}",
        f"{SRC_AWS} (HyperPod auto-resume guidance)",
        verified=False,
    ),
    Feature(
        "signal_batch",
        _V(22, 5),
        None,
        "sbatch --signal=B:SIG@secs: signal the batch shell before the time limit (checkpoint "
        f"hook; submitit uses --signal=USR2@90). {_FLOOR_NOTE}",
        "facebookincubator/submitit:submitit/slurm/slurm.py",
        verified=False,
    ),
    Feature(
        "requeue",
        _V(22, 5),
        None,
        "sbatch --requeue + scontrol requeue (torchx hard-codes --requeue). " + _FLOOR_NOTE,
        f"meta-pytorch/torchx:torchx/schedulers/slurm_scheduler.py; {SRC_AWS}",
        verified=False,
    ),
    Feature(
        "requeue_expedite",
        _V(25, 11),
        None,
        "sbatch --requeue=expedite: a requeued batch job is eligible to restart at once, as the "
        "highest-priority job, its previous nodes kept from other work (25.11 release notes); "
        "without it a requeued job waits AuthInfo=cred_expire + 1 s. Needs "
        "SlurmctldParameters=enable_expedited_requeue: 26.05.5 refuses the job otherwise "
        "('Requested operation not supported on this system'). On the 26.05 lab an owner's "
        "scontrol requeue restarted the batch script within 0.1 s and its steps ran. 25.11 is "
        "the release-notes reading; not run on 25.11, so the exact release is unverified.",
        f"https://slurm.schedmd.com/news.html (Slurm 25.11, Expedited Requeue); {SRC_NEWER}",
        verified=False,
    ),
    Feature(
        "gpus_per_node",
        _V(19, 5),
        None,
        "sbatch --gpus-per-node (select/cons_tres GPU options). 19.05 is the commonly cited first "
        "release but has no source here (unverified); the lab shows it works on 22.05.8 and 26.05.",
        f"{SRC_LAB}; {SRC_NEWER}",
        verified=False,
    ),
    Feature(
        "kill_on_invalid_dep",
        _V(22, 5),
        None,
        "sbatch --kill-on-invalid-dep=yes: a job whose dependency can never be satisfied is "
        "terminated (state CANCELLED) instead of pending with reason DependencyNeverSatisfied "
        "(the default unless SchedulerParameters=kill_invalid_depend). In sbatch(1) of 22.05.8 "
        f"on the local lab, and behaviour checked there (tests/e2e/test_dependencies.py). "
        f"{_FLOOR_NOTE}",
        f"sbatch(1) 22.05.8 (man page on the local lab, --kill-on-invalid-dep); {SRC_LAB}",
        verified=False,
    ),
    Feature(
        "hetjob",
        _V(20, 2),
        None,
        "`#SBATCH hetjob` separates the components of a heterogeneous job and `srun "
        "--het-group=N` runs a step in one of them (the directive was `packjob` before the "
        "20.02 rename). Unverified first release: taken from Slurm's 20.02 release notes, "
        "which are not cited here; the lab checks it works on 22.05.8.",
        "NVIDIA/NeMo-Run:nemo_run/core/execution/slurm.py; "
        f"meta-pytorch/torchx:torchx/schedulers/slurm_scheduler.py; {SRC_LAB}",
        verified=False,
    ),
    Feature(
        "wait_all_nodes",
        _V(22, 5),
        None,
        "sbatch --wait-all-nodes=1: start the script only when every node is booted (AWS "
        f"samples' launch skeleton; matters for dynamic cloud nodes). {_FLOOR_NOTE}",
        "aws-samples/awsome-distributed-training:3.test_cases (every Slurm sample)",
        verified=False,
    ),
)

_NEWER: tuple[Feature, ...] = (
    Feature(
        "consolidate_segments",
        _V(25, 11),
        None,
        "sbatch/salloc/srun --consolidate-segments (topology/block): all segments of the job "
        "in one higher-level aggregated block, i.e. packed into as few blocks as possible. "
        "25.11.2 fixed a slurmctld crash with it (CHANGELOG/slurm-25.11.md). Accepted by "
        "sbatch on the 26.05 lab; not run on 25.11, so the exact release is unverified.",
        f"{SRC_RN_2511}; SchedMD/slurm:doc/man/man1/sbatch.1 (--consolidate-segments); {SRC_SID}",
        verified=False,
    ),
    Feature(
        "spread_segments",
        _V(25, 11),
        None,
        "sbatch/salloc/srun --spread-segments (topology/block): each segment on a base block "
        "of its own. Accepted by sbatch on the 26.05 lab; not run on 25.11, so the exact release "
        "is unverified.",
        f"{SRC_RN_2511}; SchedMD/slurm:doc/man/man1/sbatch.1 (--spread-segments); {SRC_SID}",
        verified=False,
    ),
    Feature(
        "network_unique_channel_per_segment",
        _V(25, 11),
        None,
        "--network=unique-channel-per-segment: one IMEX channel per segment instead of one "
        "per job, with SwitchType=switch/nvidia_imex and topology/block (no effect "
        "otherwise). Accepted by sbatch on the 26.05 lab; not run with switch/nvidia_imex here "
        "(no IMEX) nor on 25.11, so the exact release is unverified.",
        f"{SRC_RN_2511}; SchedMD/slurm:doc/man/man1/sbatch.1 (--network, "
        "unique-channel-per-segment); SchedMD/slurm:src/plugins/switch/nvidia_imex",
        verified=False,
    ),
    Feature(
        "srun_async",
        _V(26, 5),
        None,
        "srun --async: the step is handed to stepmgr to queue and launch, so no srun process "
        "waits in the background; rejected outside a job allocation (26.05.0), and "
        "srun --parsable prints the bare step id (26.05.0). The lab's 26.05.5 knows it; the "
        "first release is the release notes' reading (unverified).",
        f"{SRC_RN_2605}; SchedMD/slurm:CHANGELOG/slurm-26.05.md (26.05.0)",
        verified=False,
    ),
    Feature(
        "topology_ring",
        _V(26, 5),
        None,
        "topology/ring: a one-dimensional ring topology (its plugin ships with the lab's "
        "26.05.5); slurmfm reads and writes it as data only. First release from the release "
        "notes (unverified).",
        f"{SRC_RN_2605}; topology.yaml(5) of 26.05.5 (Debian slurm-client, the sid lab); {SRC_SID}",
        verified=False,
    ),
    Feature(
        "topology_torus3d",
        _V(26, 5),
        None,
        "topology/torus3d: a three-dimensional torus topology (its plugin ships with the "
        "lab's 26.05.5); slurmfm reads and writes it as data only. First release from the "
        "release notes (unverified).",
        f"{SRC_RN_2605}; topology.yaml(5) of 26.05.5 (Debian slurm-client, the sid lab); {SRC_SID}",
        verified=False,
    ),
    Feature(
        "slurmctld_openmetrics",
        _V(25, 11),
        None,
        "slurmctld serves OpenMetrics (Prometheus) telemetry on SlurmctldPort of SlurmctldHost "
        "by default: GET /metrics lists the endpoints (/metrics/jobs, /metrics/nodes, "
        "/metrics/partitions, /metrics/scheduler, /metrics/jobs-users-accts); they carry data "
        "only with MetricsType=metrics/openmetrics (slurm.conf(5); the 26.05 lab answers 200 "
        "with an empty body without it); CommunicationParameters=disable_http turns HTTP off. "
        "26.05 adds GPU allocation figures and answers 303 from a backup controller. First "
        "release from the release notes (unverified).",
        f"{SRC_RN_2511} (Highlights); SchedMD/slurm:CHANGELOG/slurm-25.11.md (25.11.0); "
        f"{SRC_RN_2605}; https://slurm.schedmd.com/metrics.html; {SRC_SID}",
        verified=False,
    ),
)

FEATURES: Mapping[str, Feature] = MappingProxyType({f.name: f for f in (*_ALL, *_NEWER)})
"""All feature gates, keyed by name (read-only)."""


def supports(feature: str, version: SlurmVersion) -> bool:
    """True when ``version`` has ``feature``; an unknown feature name raises ``KeyError``."""
    f = FEATURES[feature]
    if version < f.introduced:
        return False
    return f.removed is None or version < f.removed


def require(feature: str, version: SlurmVersion, what: str) -> None:
    """Raise :class:`UnsupportedBySlurm` unless ``version`` supports ``feature``.

    ``what`` names the user-facing request (e.g. "--segment=9"), so the message tells the user
    what to drop or which Slurm to ask for.
    """
    if supports(feature, version):
        return
    f = FEATURES[feature]
    if version < f.introduced:
        raise UnsupportedBySlurm(
            f"{what} needs Slurm >= {f.introduced} ({feature}); this cluster runs {version}"
        )
    raise UnsupportedBySlurm(
        f"{what} was removed in Slurm {f.removed} ({feature}); this cluster runs {version}"
    )
