"""Lustre layouts for checkpoint directories, per checkpoint format, with their sources.

Why per format: a layout set on a directory applies to every new file in it
(lustre/lustre-release:Documentation/man1/lfs-setstripe.1). The old ``lfs setstripe -c -1 -S
16M`` striped every file of a file-per-rank checkpoint (Megatron ``torch_dist``, PyTorch DCP,
NeMo's distributed checkpoints: one or more files per rank, each written by one process) over
every OST: each small file then costs a lock and an RPC on every OST, and many writers contend
on all of them. Lustre's striping guidance (https://wiki.lustre.org/Lustre_Striping_Best_Practices,
"When to Stripe") is stripe count 1 for small files and 1-4 for medium ones, 4-8 for large files
written by a single client, and a progressive file layout (PFL: components that widen as a
file grows, ``lfs setstripe -E END -c COUNT ...``) when sizes vary. So file-per-rank formats get
a PFL that keeps small files on one OST and spreads a large shard over at most 8; a launcher
whose checkpoint format slurmfm does not know (a torchrun script) and servers keep the file
system's own default layout, which its administrator chose (FSx for Lustre: the layout set on
the file system or its directories, https://docs.aws.amazon.com/fsx/latest/LustreGuide/performance.html,
"Striping data in your file system").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FILE_PER_RANK_PFL", "SRC_LUSTRE_STRIPING", "CheckpointLayout", "checkpoint_layout"]

SRC_LUSTRE_STRIPING = (
    "https://wiki.lustre.org/Lustre_Striping_Best_Practices; "
    "lustre/lustre-release:Documentation/man1/lfs-setstripe.1"
)

# Progressive file layout: the first 64 MiB on one OST, to 1 GiB over 4, the rest over 8.
FILE_PER_RANK_PFL: tuple[str, ...] = (
    "-E",
    "64M",
    "-c",
    "1",
    "-E",
    "1G",
    "-c",
    "4",
    "-E",
    "-1",
    "-c",
    "8",
)

# Megatron-LM's --ckpt-format values (NVIDIA/Megatron-LM:megatron/training/arguments.py; the
# default is torch_dist): all write files per rank (torch_dist, zarr, torch_dcp: a distributed
# checkpoint directory; torch: mp_rank_XX files; fsdp_dtensor: DCP).
_MEGATRON_FILE_PER_RANK = frozenset({"torch_dist", "zarr", "torch_dcp", "torch", "fsdp_dtensor"})


@dataclass(frozen=True)
class CheckpointLayout:
    """``lfs setstripe`` arguments for the checkpoint directory (None: leave the default)."""

    args: tuple[str, ...] | None
    why: str


def checkpoint_layout(launcher: str, megatron_format: str | None = None) -> CheckpointLayout:
    """The layout for a launcher's checkpoints (``megatron_format``: its ``--ckpt-format``)."""
    if launcher == "megatron":
        fmt = megatron_format or "torch_dist"  # Megatron-LM's default --ckpt-format
        if fmt in _MEGATRON_FILE_PER_RANK:
            return CheckpointLayout(
                FILE_PER_RANK_PFL,
                f"Megatron --ckpt-format {fmt} writes files per rank: a progressive layout "
                f"({SRC_LUSTRE_STRIPING})",
            )
        return CheckpointLayout(None, f"Megatron --ckpt-format {fmt}: the file system's default")
    if launcher == "nemo":
        return CheckpointLayout(
            FILE_PER_RANK_PFL,
            "NeMo's distributed checkpoints write files per rank: a progressive layout "
            f"({SRC_LUSTRE_STRIPING})",
        )
    return CheckpointLayout(
        None, f"{launcher}: checkpoint format not known to slurmfm, the file system's default"
    )
