"""Slurm hostlists: the one place slurmfm expands and writes them (``--nodelist`` included).

Why one module: the planner, the renderer, the CLI and the job-log readers all read or write
Slurm hostlist expressions (``p5-[0001-0064,0100]``), and two implementations had drifted apart.
Everything goes through python-hostlist (https://gitlab.com/kent.engstrom/python-hostlist,
``hostlist.expand_hostlist`` / ``hostlist.collect_hostlist``), the well-kept library, except two
things it does not do the way slurmfm needs:

* **Speed on the common shapes.** ``node[001-128,200]`` and ``p5-00017``-style names (one stem,
  one digit run of one width) are expanded and collected here, giving python-hostlist's exact
  text (``tests/topology/test_hostlist.py`` compares the two on random name sets): a 64k-node
  topology.conf or ``--nodelist`` otherwise spends most of its time in python-hostlist's
  per-name regexes. Every other shape goes to the library.
* **Ranges only on a trailing number** (:func:`compress_hostlist`, for the topology files
  slurmfm writes): python-hostlist also makes ranges in the middle of a name (``nn-1a[2-3]b``),
  which real Slurm 22.05.8 rejects ("Invalid hostlist", ``scontrol show hostnames`` on the lab)
  while 26.05.5 accepts it.

:func:`nodelist` is ``--nodelist``'s value: the planner's ``sbatch_options`` and the rendered
``#SBATCH --nodelist`` both call it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from slurmfm.topology.model import natural_key

__all__ = [
    "BadHostlist",
    "collect_hostlist",
    "compress_hostlist",
    "expand_hostlist",
    "nodelist",
]

_BAD_NODE_CHARS = re.compile(r"[\s,\[\]=#]")
_TRAILING_NUM = re.compile(r"^(.*?)(\d+)$")


class BadHostlist(ValueError):
    """A malformed hostlist expression (a ``ValueError``, so callers may catch either)."""


# A comma outside brackets: the next bracket after it is an opening one (or there is none).
_TOP_COMMA = re.compile(r",(?![^\[]*\])")
_SIMPLE_RANGE = re.compile(r"([^\[\],]*)\[([0-9,-]+)\]([^\[\],]*)")


def _expand_simple(part: str) -> list[str] | None:
    """``prefix[a-b,c]suffix`` (one bracket, ascending ranges) -> names; None for anything else."""
    m = _SIMPLE_RANGE.fullmatch(part)
    if m is None:
        return None
    prefix, body, suffix = m.groups()
    out: list[str] = []
    for r in body.split(","):
        lo, sep, hi = r.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            return None
        width = len(lo)  # Slurm pads every number of a range to the width of its first
        out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(a, b + 1))
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist expression -> names; :class:`BadHostlist` when malformed.

    Plain names and one-bracket ranges (``node[001-128,200]``, the forms Slurm and slurmfm
    write) are expanded here: a 64k-node topology.conf spends most of its parse time in
    python-hostlist otherwise. Anything else (several brackets) goes to python-hostlist.
    Duplicates are dropped, first occurrence kept, as python-hostlist does.
    """
    text = expr.strip()
    if "[" not in text and "]" not in text:
        if len(text.split(maxsplit=1)) < 2:  # no blank inside: no all-blank part (fast path)
            plain = dict.fromkeys(text.split(","))
            plain.pop("", None)
            return list(plain)
        return list(dict.fromkeys(p for p in text.split(",") if p and not p.isspace()))
    if text.count("[") != text.count("]"):
        raise BadHostlist(f"bad hostlist {expr!r}: unbalanced brackets")
    parts = _TOP_COMMA.split(text)
    names: list[str] = []
    for part in parts:
        if "[" not in part and "]" not in part:
            if part and not part.isspace():
                names.append(part)
            continue
        simple = _expand_simple(part)
        if simple is not None:
            names.extend(simple)
            continue
        import hostlist

        try:
            names.extend(hostlist.expand_hostlist(part))
        except hostlist.BadHostlist as exc:
            raise BadHostlist(f"bad hostlist {expr!r}: {exc}") from exc
    return list(dict.fromkeys(names))


def collect_hostlist(names: Sequence[str]) -> str:
    """python-hostlist's ``collect_hostlist(names)``, the same text, faster for one-width names.

    Why: a 64k-node plan's ``--nodelist`` has 16k names, and python-hostlist makes one regex
    match, sort key and formatted probe per name per pass (one pass per digit run of the
    name). When every name is one stem and a digit run of one width (``p5-00017``), its passes
    give ``stem[runs]``: consecutive numbers, ascending, duplicates dropped, no brackets for
    a single name (``collect_hostlist_1`` in python-hostlist 2.3.0's ``hostlist.py``,
    http://www.nsc.liu.se/~kent/python-hostlist/). Any other input goes to python-hostlist;
    tests/topology/test_slurm_formats.py compares the two on random name sets.
    """
    if names:
        first = names[0]
        digits = "0123456789"
        stem = first.rstrip(digits)
        cut, width = len(stem), len(first)
        if (
            cut < width
            and not _BAD_NODE_CHARS.search(stem)
            and all(len(n) == width and n.rstrip(digits) == stem for n in names)
        ):
            nums = sorted({int(n[cut:]) for n in names})
            w = width - cut
            if len(nums) == 1:
                return first
            bounds: list[tuple[int, int]] = []
            start = prev = nums[0]
            for x in nums[1:]:
                if x != prev + 1:
                    bounds.append((start, prev))
                    start = x
                prev = x
            bounds.append((start, prev))
            runs = (f"{a:0{w}d}" if a == b else f"{a:0{w}d}-{b:0{w}d}" for a, b in bounds)
            return f"{stem}[{','.join(runs)}]"
    import hostlist

    return str(hostlist.collect_hostlist(list(names)))


def compress_hostlist(names: Iterable[str]) -> str:
    """Names -> a hostlist that every Slurm release parses (ranges only on a trailing number).

    Names are grouped by (prefix, digit count), so ``n9,n10`` stay separate and ``node001`` keeps
    its padding; the result is sorted and deterministic.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in set(names):
        m = _TRAILING_NUM.match(name)
        if m is None:
            plain.append(name)
        else:
            groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
    items: list[tuple[str, str]] = [(natural_key(p), p) for p in plain]
    for (prefix, width), nums in groups.items():
        nums.sort()
        if len(nums) == 1:
            text = f"{prefix}{nums[0]:0{width}d}"
            items.append((natural_key(text), text))
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for x in [*nums[1:], None]:
            if x is not None and x == prev + 1:
                prev = x
                continue
            ranges.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            if x is not None:
                start = prev = x
        text = f"{prefix}[{','.join(ranges)}]"
        items.append((natural_key(f"{prefix}{nums[0]:0{width}d}"), text))
    return ",".join(t for _, t in sorted(items))


def nodelist(nodes: Sequence[str]) -> str:
    """``--nodelist``'s value for ``nodes`` (python-hostlist's ``collect_hostlist`` text).

    The order of ``nodes`` is not kept: Slurm allocates a node list as a set and the job
    orders its ranks itself (pin mode carries the planned order separately).
    """
    return collect_hostlist(list(nodes))
