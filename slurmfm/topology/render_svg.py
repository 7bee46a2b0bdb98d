"""An SVG picture of the fabric: switches by level, nodes colored by Slurm state, free counts.

Why SVG built by hand: operators look at it in a browser or attach it to a ticket, login nodes
rarely have graphviz or matplotlib, and the layout here is simple (a tree drawn top-down with the
leaves' nodes listed under them), so plain string building keeps the dependency list as it is.

Layout: one row per switch level (root on top; levels count from the leaves as in
``scontrol show topology``), each leaf's nodes in columns of at most :data:`ROWS_PER_COLUMN`
boxes below it, parents centred over their children. Every switch shows ``free/total`` nodes
(free = idle, :data:`slurmfm.topology.model.FREE_STATES`) and a bar. Long names are shortened
on screen but kept whole in ``<title>`` tooltips, so every name is in the file.
"""

from __future__ import annotations

import math
from xml.sax.saxutils import escape, quoteattr

from slurmfm.topology.model import Topology, natural_key

__all__ = ["STATE_COLORS", "render_svg"]

STATE_COLORS: dict[str, str] = {
    "idle": "#8fd19e",
    "allocated": "#f28b82",
    "mixed": "#fdd663",
    "drain": "#c58af9",
    "down": "#9aa0a6",
    "unknown": "#ffffff",
}
"""Fill per normalised node state (scontrol.normalize_state); pastel so black text reads."""

ROWS_PER_COLUMN = 16
NODE_W, NODE_H, NODE_GAP = 84, 18, 4
COL_W = NODE_W + 8
SW_H = 38
ROW_H = 78
MARGIN = 20
FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"


def _short(name: str, limit: int) -> str:
    """Keep the end of long names: EC2 ids and node numbers differ at the end."""
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


def _children_of(t: Topology) -> dict[str, list[str]]:
    """Each switch's children in drawing order: natural name order, except that blocks keep
    Slurm's block index order (the order ``topology/block`` scans them in)."""
    children: dict[str, list[str]] = {s: [] for s in t.parent_of}
    for s, p in t.parent_of.items():
        if p is not None:
            children[p].append(s)
    for v in children.values():
        v.sort(key=natural_key)
    if t.kind == "block":  # blocks in Slurm's index order, not name order
        from slurmfm.topology.slurm_model import block_order

        rank = {b: i for i, b in enumerate(block_order(t))}
        for v in children.values():
            v.sort(key=lambda c: (rank.get(c, len(rank)), natural_key(c)))
    return children


def _nodes_of(t: Topology) -> dict[str, list[str]]:
    """Each leaf's nodes in natural name order (the order Slurm's node table has them)."""
    nodes_of: dict[str, list[str]] = {}
    for n, leaf in t.leaf_of.items():
        nodes_of.setdefault(leaf, []).append(n)
    for v in nodes_of.values():
        v.sort(key=natural_key)
    return nodes_of


class _Layout:
    """Sizes and places of the tree: switch widths from the leaves up, positions top-down.

    Why a class: the widths are memoised and read again by the placement, the switch boxes
    and the node columns; one object keeps them with the tree they measure.
    """

    def __init__(self, t: Topology) -> None:
        self.t = t
        self.children = _children_of(t)
        self.nodes_of = _nodes_of(t)
        self.tops = sorted((s for s, p in t.parent_of.items() if p is None), key=natural_key)
        self.depth = max((t.level(s) for s in t.parent_of), default=-1) + 1
        self.pos: dict[str, tuple[float, float]] = {}  # switch -> centre x, top y
        self._widths: dict[str, int] = {}

    def leaf_cols(self, s: str) -> int:
        """Node columns under leaf ``s`` (at most :data:`ROWS_PER_COLUMN` rows each)."""
        return max(1, math.ceil(len(self.nodes_of.get(s, [])) / ROWS_PER_COLUMN))

    def leaf_rows(self, s: str) -> int:
        """Rows per column, balanced (18 nodes -> 2 columns of 9, not 16 + 2)."""
        return math.ceil(len(self.nodes_of.get(s, [])) / self.leaf_cols(s))

    def width(self, s: str) -> int:
        """Pixels switch ``s`` and everything below it take: its children side by side."""
        if s not in self._widths:
            if self.children[s]:
                self._widths[s] = sum(self.width(c) for c in self.children[s])
            else:  # wide enough for the full name of EC2 nn- ids (20 characters)
                self._widths[s] = max(self.leaf_cols(s) * COL_W, int(min(len(s), 24) * 7.6) + 24)
        return self._widths[s]

    def place(self, s: str, x: float, y0: float) -> None:
        """Put ``s`` centred over its children from ``x`` on, a row per level from ``y0``."""
        y = y0 + (self.depth - 1 - self.t.level(s)) * ROW_H
        self.pos[s] = (x + self.width(s) / 2, y)
        cx = x
        for c in self.children[s]:
            self.place(c, cx, y0)
            cx += self.width(c)


def _legend_layout(t: Topology, total_w: float) -> tuple[list[tuple[float, int, str, str]], int]:
    """Legend items ``(x, row, label, kind)`` laid out left to right, wrapped to the picture
    width, and the last row used (the header's height depends on it)."""
    state_counts: dict[str, int] = {}
    for node in t.nodes.values():
        st = node.state if node.state in STATE_COLORS else "unknown"
        state_counts[st] = state_counts.get(st, 0) + 1
    items = [(f"{st} ({state_counts.get(st, 0)})", st) for st in STATE_COLORS]
    items.append(("switch: free/total nodes below it", "switch"))
    placed: list[tuple[float, int, str, str]] = []
    lx, lrow = float(MARGIN), 0
    for label, kind in items:
        iw = 24 + 7.0 * len(label) + (16 if kind == "switch" else 0)
        if lx + iw > total_w - MARGIN and lx > MARGIN:
            lx, lrow = float(MARGIN), lrow + 1
        placed.append((lx, lrow, label, kind))
        lx += iw + 12
    return placed, lrow


def _edge_lines(lay: _Layout) -> list[str]:
    """A line from each switch to each child; drawn first so the boxes cover their ends."""
    edges: list[str] = []
    for s, (cx, y) in lay.pos.items():
        for c in lay.children[s]:
            ccx, cy = lay.pos[c]
            edges.append(
                f'<line x1="{cx:.1f}" y1="{y + SW_H:.1f}" x2="{ccx:.1f}" y2="{cy:.1f}" '
                'stroke="#80868b" stroke-width="1.5"/>'
            )
    return edges


def _switch_boxes(lay: _Layout) -> list[str]:
    """Every switch as a box with its (shortened) name and a free/total bar; the tooltip
    carries the whole name, its level, EC2 id and free count."""
    t = lay.t
    counts = t.free_counts()
    out: list[str] = []
    for s, (cx, y) in sorted(lay.pos.items(), key=lambda kv: natural_key(kv[0])):
        free, total = counts.get(s, (0, 0))
        w = min(max(lay.width(s) - 10, 76), 210)
        left = cx - w / 2
        sw = t.switch(s)
        tip = f"{s} (level {sw.level})" + (f" = {sw.source_id}" if sw.source_id else "")
        tip += f": {free} free of {total} nodes"
        frac = free / total if total else 0.0
        out.append(
            f'<g class="switch" id={quoteattr("sw-" + s)}><title>{escape(tip)}</title>'
            f'<rect x="{left:.1f}" y="{y:.1f}" width="{w:.1f}" height="{SW_H}" rx="5" '
            'fill="#e8f0fe" stroke="#1a73e8" stroke-width="1.5"/>'
            f'<text x="{cx:.1f}" y="{y + 15:.1f}" text-anchor="middle" font-family="{FONT}" '
            f'font-size="12" font-weight="bold" fill="#174ea6">'
            f"{escape(_short(s, max(8, int(w / 7.5))))}</text>"
            f'<rect x="{left + 6:.1f}" y="{y + 22:.1f}" width="{w - 12:.1f}" height="11" '
            'fill="#f28b82" rx="2"/>'
            f'<rect x="{left + 6:.1f}" y="{y + 22:.1f}" width="{(w - 12) * frac:.1f}" '
            'height="11" fill="#8fd19e" rx="2"/>'
            f'<text x="{cx:.1f}" y="{y + 31:.1f}" text-anchor="middle" font-family="{FONT}" '
            f'font-size="10" fill="#202124">{free}/{total} free</text></g>'
        )
    return out


def _node_box(t: Topology, n: str, nx: float, ny: float) -> str:
    """Node ``n`` as a box colored by its Slurm state; the tooltip has its EC2 instance and
    NVLink domain."""
    node = t.nodes[n]
    state = node.state if node.state in STATE_COLORS else "unknown"
    tip = f"{n}: {node.state}"
    if node.instance_id:
        tip += f", {node.instance_id}"
    if node.nvlink_domain:
        tip += f", NVLink domain {node.nvlink_domain}"
    return (
        f'<g class="node {state}"><title>{escape(tip)}</title>'
        f'<rect x="{nx:.1f}" y="{ny:.1f}" width="{NODE_W}" height="{NODE_H}" rx="3" '
        f'fill="{STATE_COLORS[state]}" stroke="#5f6368" stroke-width="0.8"/>'
        f'<text x="{nx + NODE_W / 2:.1f}" y="{ny + 13:.1f}" text-anchor="middle" '
        f'font-family="{MONO}" font-size="11" fill="#202124">'
        f"{escape(_short(n, 11))}</text></g>"
    )


def _node_columns(lay: _Layout, nodes_y: float) -> list[str]:
    """Each leaf's nodes in balanced columns below it, and a dashed line down to them."""
    out: list[str] = []
    for leaf, members in lay.nodes_of.items():
        cx, _ = lay.pos[leaf]
        cols = lay.leaf_cols(leaf)
        left0 = cx - cols * COL_W / 2 + (COL_W - NODE_W) / 2
        rows = lay.leaf_rows(leaf)
        for i, n in enumerate(members):
            col, row = divmod(i, rows)
            nx = left0 + col * COL_W
            ny = nodes_y + row * (NODE_H + NODE_GAP)
            out.append(_node_box(lay.t, n, nx, ny))
        out.append(
            f'<line x1="{cx:.1f}" y1="{lay.pos[leaf][1] + SW_H:.1f}" x2="{cx:.1f}" '
            f'y2="{nodes_y - 4:.1f}" stroke="#80868b" stroke-width="1" stroke-dasharray="3,2"/>'
        )
    return out


def _legend(placed: list[tuple[float, int, str, str]], ty: int) -> list[str]:
    """The legend group: a swatch per node state and a sample switch bar, from row ``ty``."""
    legend = ['<g class="legend">']
    for lx, lrow, label, kind in placed:
        ly = ty + 20 * lrow
        if kind == "switch":
            legend.append(
                f'<rect x="{lx:.1f}" y="{ly}" width="30" height="14" fill="#f28b82" rx="2"/>'
                f'<rect x="{lx:.1f}" y="{ly}" width="18" height="14" fill="#8fd19e" rx="2"/>'
                f'<text x="{lx + 36:.1f}" y="{ly + 11}" font-family="{FONT}" font-size="12" '
                f'fill="#202124">{escape(label)}</text>'
            )
        else:
            legend.append(
                f'<rect x="{lx:.1f}" y="{ly}" width="14" height="14" rx="2" '
                f'fill="{STATE_COLORS[kind]}" stroke="#5f6368" stroke-width="0.8"/>'
                f'<text x="{lx + 19:.1f}" y="{ly + 11}" font-family="{FONT}" font-size="12" '
                f'fill="#202124">{escape(label)}</text>'
            )
    legend.append("</g>")
    return legend


def _header(t: Topology, title: str, placed: list[tuple[float, int, str, str]]) -> list[str]:
    """The header: the title (if any), the totals line and the legend."""
    head: list[str] = []
    ty = MARGIN + 4
    if title:
        head.append(
            f'<text x="{MARGIN}" y="{ty + 14}" font-family="{FONT}" font-size="18" '
            f'font-weight="bold" fill="#202124">{escape(title)}</text>'
        )
        ty += 24
    free_all = sum(1 for node in t.nodes.values() if node.free)
    head.append(
        f'<text x="{MARGIN}" y="{ty + 12}" font-family="{FONT}" font-size="12" fill="#3c4043">'
        f"{len(t.nodes)} nodes, {free_all} free; {len(t.parent_of)} switches, "
        f"{t.kind} topology, depth {t.depth}</text>"
    )
    ty += 20
    return head + _legend(placed, ty)


def render_svg(t: Topology, *, title: str = "") -> str:
    """The topology as a standalone SVG document (string).

    Sizes first (the tree's width, the legend's rows, the deepest node column), then the
    switches placed top-down, then the parts drawn in paint order: header, edges, boxes.
    """
    lay = _Layout(t)
    max_rows = max((lay.leaf_rows(s) for s in lay.nodes_of), default=0)
    tree_w = sum(lay.width(s) for s in lay.tops)
    total_w = max(tree_w + 2 * MARGIN, 640)
    placed, lrow = _legend_layout(t, total_w)
    header_h = 30 + (24 if title else 0) + 20 * (lrow + 1) + 8
    y0 = header_h + MARGIN
    nodes_y = y0 + max(lay.depth - 1, 0) * ROW_H + SW_H + 18
    total_h = nodes_y + max_rows * (NODE_H + NODE_GAP) + MARGIN

    x = float(MARGIN + (total_w - 2 * MARGIN - tree_w) / 2)
    for s in lay.tops:
        lay.place(s, x, y0)
        x += lay.width(s)
    edges = _edge_lines(lay)
    body = _switch_boxes(lay) + _node_columns(lay, nodes_y)
    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" '
            f'height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}">',
            f"<title>{escape(title or 'slurmfm topology')}</title>",
            f'<rect width="{total_w:.0f}" height="{total_h:.0f}" fill="#ffffff"/>',
            *_header(t, title, placed),
            *edges,
            *body,
            "</svg>",
            "",
        ]
    )
