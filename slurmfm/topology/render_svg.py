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


def render_svg(t: Topology, *, title: str = "") -> str:
    """The topology as a standalone SVG document (string)."""
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
    nodes_of: dict[str, list[str]] = {}
    for n, leaf in t.leaf_of.items():
        nodes_of.setdefault(leaf, []).append(n)
    for v in nodes_of.values():
        v.sort(key=natural_key)

    def leaf_cols(s: str) -> int:
        return max(1, math.ceil(len(nodes_of.get(s, [])) / ROWS_PER_COLUMN))

    widths: dict[str, int] = {}

    def width(s: str) -> int:
        if s not in widths:
            if children[s]:
                widths[s] = sum(width(c) for c in children[s])
            else:  # wide enough for the full name of EC2 nn- ids (20 characters)
                widths[s] = max(leaf_cols(s) * COL_W, int(min(len(s), 24) * 7.6) + 24)
        return widths[s]

    tops = sorted((s for s, p in t.parent_of.items() if p is None), key=natural_key)
    depth = max((t.level(s) for s in t.parent_of), default=-1) + 1
    counts = t.free_counts()

    def leaf_rows(s: str) -> int:
        """Rows per column, balanced (18 nodes -> 2 columns of 9, not 16 + 2)."""
        return math.ceil(len(nodes_of.get(s, [])) / leaf_cols(s))

    max_rows = max((leaf_rows(s) for s in nodes_of), default=0)

    tree_w = sum(width(s) for s in tops)
    total_w = max(tree_w + 2 * MARGIN, 640)
    state_counts: dict[str, int] = {}
    for node in t.nodes.values():
        st = node.state if node.state in STATE_COLORS else "unknown"
        state_counts[st] = state_counts.get(st, 0) + 1
    # legend items (label, kind) laid out left to right, wrapped to the picture width
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
    header_h = 30 + (24 if title else 0) + 20 * (lrow + 1) + 8
    y0 = header_h + MARGIN
    nodes_y = y0 + max(depth - 1, 0) * ROW_H + SW_H + 18
    total_h = nodes_y + max_rows * (NODE_H + NODE_GAP) + MARGIN

    body: list[str] = []
    edges: list[str] = []
    pos: dict[str, tuple[float, float]] = {}  # switch -> centre x, top y

    def place(s: str, x: float) -> None:
        y = y0 + (depth - 1 - t.level(s)) * ROW_H
        pos[s] = (x + width(s) / 2, y)
        cx = x
        for c in children[s]:
            place(c, cx)
            cx += width(c)

    x = float(MARGIN + (total_w - 2 * MARGIN - tree_w) / 2)
    for s in tops:
        place(s, x)
        x += width(s)

    # edges first so boxes cover their ends
    for s, (cx, y) in pos.items():
        for c in children[s]:
            ccx, cy = pos[c]
            edges.append(
                f'<line x1="{cx:.1f}" y1="{y + SW_H:.1f}" x2="{ccx:.1f}" y2="{cy:.1f}" '
                'stroke="#80868b" stroke-width="1.5"/>'
            )

    for s, (cx, y) in sorted(pos.items(), key=lambda kv: natural_key(kv[0])):
        free, total = counts.get(s, (0, 0))
        w = min(max(width(s) - 10, 76), 210)
        left = cx - w / 2
        sw = t.switch(s)
        tip = f"{s} (level {sw.level})" + (f" = {sw.source_id}" if sw.source_id else "")
        tip += f": {free} free of {total} nodes"
        frac = free / total if total else 0.0
        body.append(
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

    for leaf, members in nodes_of.items():
        cx, _ = pos[leaf]
        cols = leaf_cols(leaf)
        left0 = cx - cols * COL_W / 2 + (COL_W - NODE_W) / 2
        rows = leaf_rows(leaf)
        for i, n in enumerate(members):
            col, row = divmod(i, rows)
            nx = left0 + col * COL_W
            ny = nodes_y + row * (NODE_H + NODE_GAP)
            node = t.nodes[n]
            state = node.state if node.state in STATE_COLORS else "unknown"
            tip = f"{n}: {node.state}"
            if node.instance_id:
                tip += f", {node.instance_id}"
            if node.nvlink_domain:
                tip += f", NVLink domain {node.nvlink_domain}"
            body.append(
                f'<g class="node {state}"><title>{escape(tip)}</title>'
                f'<rect x="{nx:.1f}" y="{ny:.1f}" width="{NODE_W}" height="{NODE_H}" rx="3" '
                f'fill="{STATE_COLORS[state]}" stroke="#5f6368" stroke-width="0.8"/>'
                f'<text x="{nx + NODE_W / 2:.1f}" y="{ny + 13:.1f}" text-anchor="middle" '
                f'font-family="{MONO}" font-size="11" fill="#202124">'
                f"{escape(_short(n, 11))}</text></g>"
            )
        body.append(
            f'<line x1="{cx:.1f}" y1="{pos[leaf][1] + SW_H:.1f}" x2="{cx:.1f}" '
            f'y2="{nodes_y - 4:.1f}" stroke="#80868b" stroke-width="1" stroke-dasharray="3,2"/>'
        )

    # header: title, totals, legend
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
    head.extend(legend)

    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" '
            f'height="{total_h:.0f}" viewBox="0 0 {total_w:.0f} {total_h:.0f}">',
            f"<title>{escape(title or 'slurmfm topology')}</title>",
            f'<rect width="{total_w:.0f}" height="{total_h:.0f}" fill="#ffffff"/>',
            *head,
            *edges,
            *body,
            "</svg>",
            "",
        ]
    )
