"""The HTML report (`cadence doctor DUMPDIR --html FILE`): one self-contained
file, nothing fetched from the network.

From the top: the verdict (class, headline, the ranks, links and hosts it
names, the exclusion list); the link matrix of the stuck operation (or of the
last collective every rank completed) as a heatmap, rows = sender, columns =
receiver, each cell the bytes moved and the state of that link's messages,
stalled links outlined; the link counters (cumulative bytes per link since
the communicator was created) when the dumps have them; a per-rank arrival
timeline of the last collectives; the evidence; the ranks and their dumps.

The pictures are inline SVG written here by hand rather than matplotlib PNGs
(base64 in the page): vector graphics stay crisp at any zoom and in print,
their text can be searched and copied, and every cell and bar carries its
own hover text. A few lines of inline JavaScript show that text as a tooltip
at once (the native `<title>` is there too, for readers without scripts).

Times are on rank 0's clock (each rank's measured offset applied, as the
classifier does). Sizes scale with the number of ranks: 2 ranks get large
labelled cells, 64 ranks small ones with every other label.
"""

from __future__ import annotations

import html
import json
import math
import os
import time

from cadence.diagnosis.dumps import Dump, Msg, MsgState, Op, peer_listing
from cadence.diagnosis.exclude import exclusion_hosts
from cadence.diagnosis.trace import op_name
from cadence.diagnosis.verdict import VerdictClass, ranks_text
from cadence.units import fmt_bytes, fmt_secs

CLASS_COLORS = {
    VerdictClass.HEALTHY: "#2e7d32", VerdictClass.NONCOMM_HANG: "#b26a00",
    VerdictClass.COMM_HANG: "#c62828", VerdictClass.MISMATCH: "#6a1b9a",
}
STATE_COLORS = {
    "stalled": "#d62728", "pending": "#fd8d3c", "held": "#fdd049", "none": "#f3f3f3",
    "self": "#d9d9d9",
}
BAR_COLORS = {"ok": "#4c9a5a", "failed": "#d62728", "running": "#fd8d3c"}
STRONG = ' font-weight="700" fill="#c62828"'


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def _mix(c0: str, c1: str, f: float) -> str:
    """Color between c0 and c1 (f in [0, 1])."""
    f = min(1.0, max(0.0, f))
    a = [int(c0[i:i + 2], 16) for i in (1, 3, 5)]
    b = [int(c1[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * f):02x}" for x, y in zip(a, b, strict=True))


def read_counters(dumps: list[Dump]) -> dict[tuple[str, int], list[dict]]:
    """Each dump's `links` counters ((comm, rank) → list), read again from
    its file (the classifier does not keep them); missing or null ones are
    left out (they are null while an operation runs)."""
    out: dict[tuple[str, int], list[dict]] = {}
    for d in dumps:
        try:
            with open(d.path, encoding="utf-8") as f:
                links = json.load(f).get("links")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(links, list):
            out[(d.comm, d.rank)] = [x for x in links if isinstance(x, dict)]
    return out


class _View:
    """One communicator's dumps, as the report shows them."""

    def __init__(self, dumps: list[Dump], verdict):
        comms: dict[str, list[Dump]] = {}
        for d in dumps:
            comms.setdefault(d.comm, []).append(d)
        if verdict is not None and verdict.comm in comms:
            self.comm = verdict.comm
        else:
            self.comm = max(comms, key=lambda c: (comms[c][0].nranks, len(comms[c]), c))
        self.others = sorted(c for c in comms if c != self.comm)
        self.by_rank = {d.rank: d for d in comms[self.comm]}
        self.nranks = comms[self.comm][0].nranks
        self.peers = peer_listing(comms[self.comm])
        self.colls = {r: {o.seq: o for o in d.ops if not o.is_p2p and o.seq > 0}
                      for r, d in self.by_rank.items()}

    def host(self, r: int) -> str:
        d = self.by_rank.get(r)
        return d.host if d is not None else str(self.peers.get(r, {}).get("host", "?"))

    def who(self, r: int) -> str:
        d = self.by_rank.get(r)
        pid = d.pid if d is not None else self.peers.get(r, {}).get("pid", "?")
        return f"rank {r} ({self.host(r)}, pid {pid})"


# --- the link matrix ---------------------------------------------------------


def _focus(v: _View, verdict) -> tuple[str, dict[int, Op]]:
    """The operation the matrix shows and each rank's record of it: the
    verdict's, else the last collective every dumped rank recorded."""
    op = getattr(verdict, "op", None)
    if op is not None and verdict.comm == v.comm:
        if not op.is_p2p:
            recs = {r: ops[op.seq] for r, ops in v.colls.items() if op.seq in ops}
            return f"{op_name(op)} (the verdict's operation)", recs
        owner = next((r for r, d in v.by_rank.items() if any(o is op for o in d.ops)), None)
        recs = {} if owner is None else {owner: op}
        want = "recv" if op.collective == "send" else "send"
        peer = v.by_rank.get(op.root)
        if peer is not None and owner is not None:
            for o in peer.ops:
                if o.collective == want and o.root == owner and o.seq == op.seq:
                    recs[op.root] = o
        return f"{op_name(op)} (the verdict's operation)", recs
    common = set.intersection(*(set(ops) for ops in v.colls.values())) if v.colls else set()
    if common:
        k = max(common)
        return (f"{op_name(next(iter(v.colls.values()))[k])} (the last collective every "
                "dumped rank recorded)"), {r: ops[k] for r, ops in v.colls.items()}
    return "no collective recorded by every rank", {}


class _Cell:
    def __init__(self):
        self.sends: list[Msg] = []
        self.recvs: list[Msg] = []
        self.send_known = False
        self.recv_known = False


def _cells(v: _View, recs: dict[int, Op]) -> dict[tuple[int, int], _Cell]:
    cells = {(s, d): _Cell() for s in range(v.nranks) for d in range(v.nranks)}
    for r, o in recs.items():
        if o.messages is None:
            continue
        for s in range(v.nranks):
            cells[(r, s)].send_known = True
            cells[(s, r)].recv_known = True
        for m in o.messages:
            if not 0 <= m.peer < v.nranks:
                continue
            if m.dir == "send":
                cells[(r, m.peer)].sends.append(m)
            else:
                cells[(m.peer, r)].recvs.append(m)
    return cells


def _cell_state(c: _Cell, stalled: bool) -> str:
    ms = c.sends + c.recvs
    if stalled:
        return "stalled"
    if any(m.state == MsgState.PENDING for m in ms):
        return "pending"
    if any(m.state == MsgState.HELD for m in ms):
        return "held"
    if ms:
        return "done"
    if c.send_known or c.recv_known:
        return "none"
    return "unknown"


def _side(ms: list[Msg], what: str) -> str:
    if not ms:
        return f"{what}: no messages"
    moved = sum(m.moved for m in ms)
    total = sum(m.bytes for m in ms)
    states = sorted({m.state for m in ms})
    text = f"{what}: {fmt_bytes(moved)} of {fmt_bytes(total)} in {len(ms)} message" \
           f"{'s' if len(ms) != 1 else ''} ({', '.join(states)})"
    open_ = [(j, m) for j, m in enumerate(ms, 1) if m.state != MsgState.DONE]
    for j, m in open_[:3]:
        text += f"\n  message {j}: {m.state}, {fmt_bytes(m.moved)} of {fmt_bytes(m.bytes)}"
    if len(open_) > 3:
        text += f"\n  (+{len(open_) - 3} more not done)"
    return text


def _grid(n: int, labels, cell: int, title_rows: str, title_cols: str) -> tuple[list[str], int]:
    """Axis labels of an n x n matrix; returns (svg parts, margin)."""
    step = 1 if cell >= 11 else 2 if cell >= 6 else 4
    font = max(7, min(12, cell - 2 if cell < 14 else 12))
    margin = 64 if n > 9 else 54
    parts = []
    for i in range(n):
        if i % step and not labels(i)[1]:
            continue
        text, strong = labels(i)
        weight = STRONG if strong else ""
        y = margin + i * cell + cell / 2 + font / 3
        parts.append(f'<text x="{margin - 4}" y="{y:.1f}" font-size="{font}" '
                     f'text-anchor="end"{weight}>{esc(text)}</text>')
        x = margin + i * cell + cell / 2 + font / 3
        parts.append(f'<text x="{x:.1f}" y="{margin - 4}" font-size="{font}" '
                     f'transform="rotate(-90 {x:.1f} {margin - 4})"{weight}>{esc(text)}</text>')
    parts.append(f'<text x="4" y="14" font-size="11" fill="#555">{esc(title_rows)} ↓ / '
                 f'{esc(title_cols)} →</text>')
    return parts, margin


def _cell_size(n: int) -> int:
    return max(5, min(44, 576 // max(n, 1)))


def link_matrix_svg(v: _View, recs: dict[int, Op], stalled: set[tuple[int, int]],
                    named: set[int]) -> str:
    n = v.nranks
    cells = _cells(v, recs)
    cell = _cell_size(n)
    parts, margin = _grid(n, lambda i: (str(i), i in named), cell, "sender", "receiver")
    peak = max((sum(m.bytes for m in c.recvs or c.sends) for c in cells.values()), default=0)
    for (s, d), c in sorted(cells.items()):
        x, y = margin + d * cell, margin + s * cell
        link = f"{s} → {d} ({v.host(s)} → {v.host(d)})"
        if s == d:
            parts.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" '
                         f'fill="{STATE_COLORS["self"]}"/>')
            continue
        state = _cell_state(c, (s, d) in stalled)
        moved = sum(m.moved for m in (c.recvs or c.sends))
        total = sum(m.bytes for m in (c.recvs or c.sends))
        if state == "done":
            f = math.sqrt(total / peak) if peak else 0.0
            fill = _mix("#e5f5e0", "#238b45", 0.25 + 0.75 * f)
        elif state == "unknown":
            fill = "url(#nodata)"
        else:
            fill = STATE_COLORS[state]
        tip = [f"link {link}: {state}" + (" (named by the verdict)" if state == "stalled"
                                          else "")]
        if state == "none":
            tip = [f"link {link}: no messages in this operation"]
        elif state == "unknown":
            tip.append("no message records for this operation on either side")
        else:
            tip.append(_side(c.sends, f"rank {s} sent"))
            tip.append(_side(c.recvs, f"rank {d} received"))
        tip_s = "\n".join(tip)
        stroke = ' stroke="#000" stroke-width="2"' if state == "stalled" else \
            ' stroke="#fff" stroke-width="0.5"'
        parts.append(f'<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                     f'fill="{fill}"{stroke}><title>{esc(tip_s)}'
                     f'</title></rect>')
        if cell >= 36 and state not in ("none", "unknown"):
            color = "#fff" if state in ("stalled",) or (state == "done" and total > peak / 3) \
                else "#222"
            parts.append(f'<text x="{x + cell / 2}" y="{y + cell / 2 - 2}" font-size="10" '
                         f'text-anchor="middle" fill="{color}" pointer-events="none">'
                         f'{esc(fmt_bytes(moved, short=True))}</text>')
            parts.append(f'<text x="{x + cell / 2}" y="{y + cell / 2 + 10}" font-size="9" '
                         f'text-anchor="middle" fill="{color}" pointer-events="none">'
                         f'{esc(state)}</text>')
    size = margin + n * cell + 8
    return _svg(size, size, parts, "link matrix of the operation")


def counters_svg(v: _View, counters: dict[tuple[str, int], list[dict]],
                 named: set[int]) -> str | None:
    """Cumulative bytes per link (sender's count; the receiver's when the
    sender left none), log color scale."""
    n = v.nranks
    vals: dict[tuple[int, int], dict] = {}
    for r in range(n):
        for x in counters.get((v.comm, r), []):
            p = x.get("peer")
            if not isinstance(p, int) or not 0 <= p < n or p == r:
                continue
            sent = vals.setdefault((r, p), {})
            sent["bytes"] = x.get("bytes_sent", 0)
            sent["msgs"] = x.get("msgs_sent", 0)
            sent["busy_ns"] = x.get("busy_ns", 0)
            sent["transport"] = x.get("transport", "")
            got = vals.setdefault((p, r), {})
            got["recv_bytes"] = x.get("bytes_recv", 0)
    if not vals:
        return None
    cell = _cell_size(n)
    parts, margin = _grid(n, lambda i: (str(i), i in named), cell, "sender", "receiver")
    amounts = {k: x.get("bytes", x.get("recv_bytes", 0)) or 0 for k, x in vals.items()}
    peak = max(amounts.values(), default=0)
    for s in range(n):
        for d in range(n):
            x, y = margin + d * cell, margin + s * cell
            if s == d:
                parts.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" '
                             f'fill="{STATE_COLORS["self"]}"/>')
                continue
            info = vals.get((s, d))
            if info is None:
                tip = f"link {s} → {d}: no counters (neither side's dump has them)"
                fill = "url(#nodata)"
            else:
                b = amounts[(s, d)]
                f = math.log1p(b) / math.log1p(peak) if peak else 0.0
                fill = _mix("#f0f4fa", "#08519c", f) if b else STATE_COLORS["none"]
                lines = [f"link {s} → {d} ({v.host(s)} → {v.host(d)})"]
                if "bytes" in info:
                    lines.append(f"rank {s} sent {fmt_bytes(info['bytes'])} in {info['msgs']} "
                                 f"messages over {info['transport'] or '?'}")
                    busy = info["busy_ns"] / 1e9
                    if busy > 0:
                        lines.append(f"busy {fmt_secs(busy)}, "
                                     f"{fmt_bytes(info['bytes'] / busy)}/s while busy")
                if "recv_bytes" in info:
                    lines.append(f"rank {d} received {fmt_bytes(info['recv_bytes'])}")
                tip = "\n".join(lines)
            parts.append(f'<rect class="cell" x="{x}" y="{y}" width="{cell}" height="{cell}" '
                         f'fill="{fill}" stroke="#fff" stroke-width="0.5" '
                         f'><title>{esc(tip)}</title></rect>')
            if cell >= 36 and info is not None and amounts[(s, d)]:
                color = "#fff" if amounts[(s, d)] > peak / 8 else "#222"
                parts.append(f'<text x="{x + cell / 2}" y="{y + cell / 2 + 4}" font-size="10" '
                             f'text-anchor="middle" fill="{color}" pointer-events="none">'
                             f'{esc(fmt_bytes(amounts[(s, d)], short=True))}</text>')
    size = margin + n * cell + 8
    return _svg(size, size, parts, "link counters")


# --- the arrival timeline ----------------------------------------------------


def _window(v: _View, verdict, last: int) -> list[int]:
    seqs = sorted({k for ops in v.colls.values() for k in ops})
    op = getattr(verdict, "op", None)
    if op is not None and verdict.comm == v.comm and not op.is_p2p:
        seqs = [k for k in seqs if k <= op.seq + 2]
    return seqs[-last:]


def timeline_svg(v: _View, verdict, last: int) -> tuple[str, int]:
    """Rows = ranks, columns = the last collectives; in each column, a bar
    per rank from when it entered to when it left, on the column's own time
    scale (from the first rank's entry to the last rank's exit), so a late
    rank's bar starts late and a missing rank has none."""
    cols = _window(v, verdict, last)
    n = v.nranks
    named = set(getattr(verdict, "ranks", []) or [])
    stuck = verdict.op.seq if getattr(verdict, "op", None) is not None and \
        verdict.comm == v.comm and not verdict.op.is_p2p else None
    row = max(8, min(22, 640 // max(n, 1)))
    font = max(7, min(12, row - 2))
    label_w = 150 if row >= 14 else 64
    head = 118
    width_avail = 1050 - label_w  # within the page's 1160 px, slanted names included
    col_w = max(44, min(140, width_avail // max(len(cols), 1)))
    parts = []
    for i, k in enumerate(cols):
        x0 = label_w + i * col_w
        present = {r: ops[k] for r, ops in v.colls.items() if k in ops}
        spans = {r: _span(v.by_rank[r], o) for r, o in present.items()}
        t_first = min((s for s, _ in spans.values()), default=0.0)
        t_last = max((e for _, e in spans.values()), default=0.0)
        span = max(t_last - t_first, 1e-6)
        entries = sorted(s for s, _ in spans.values())
        skew = entries[-1] - entries[0] if entries else 0.0
        name = op_name(next(iter(present.values()))) if present else f"#{k}"
        hl = k == stuck
        tip = (f"{name}: {len(present)} of {n} ranks recorded it; from the first entry to the "
               f"last exit {fmt_secs(t_last - t_first)}; arrival skew {fmt_secs(skew)}")
        if hl:
            parts.append(f'<rect x="{x0 + 1}" y="{head - 30}" width="{col_w - 2}" '
                         f'height="{n * row + 32}" fill="#fdecea" stroke="#c62828" '
                         'stroke-width="1.5"/>')
        tx, ty = x0 + col_w / 2, head - 34
        parts.append(f'<text x="{tx:.1f}" y="{ty}" font-size="11" '
                     f'transform="rotate(-35 {tx:.1f} {ty})"{STRONG if hl else ""} '
                     f'><title>{esc(tip)}</title>{esc(name)}</text>')
        parts.append(f'<text x="{x0 + col_w / 2:.1f}" y="{head - 8}" font-size="9" '
                     f'text-anchor="middle" fill="#555">{esc(fmt_secs(t_last - t_first))}</text>')
        parts.append(f'<line x1="{x0}" y1="{head - 4}" x2="{x0}" y2="{head + n * row}" '
                     'stroke="#ddd"/>')
        inner = col_w - 8
        for r in range(n):
            y = head + r * row
            if r not in v.by_rank:
                continue
            o = present.get(r)
            if o is None:
                ks = v.colls.get(r, {})
                if ks and min(ks) > k:
                    why, mark = "older than its oldest record", "…"
                else:
                    why, mark = f"never entered {name}", "✕"
                t = f"rank {r}: {why}"
                parts.append(f'<text x="{x0 + col_w / 2:.1f}" y="{y + row / 2 + font / 3:.1f}" '
                             f'font-size="{font}" text-anchor="middle" '
                             f'fill="{"#c62828" if mark == "✕" else "#999"}" '
                             f'><title>{esc(t)}</title>{mark}</text>')
                continue
            s, e = spans[r]
            bx = x0 + 4 + (s - t_first) / span * inner
            bw = max(2.0, (e - s) / span * inner)
            status = "running" if o.running else "ok" if o.ok else "failed"
            end_word = {"running": "still running at its dump,",
                        "ok": "left", "failed": "failed"}[status]
            t = (f"rank {r} ({v.host(r)}) {name}: entered {fmt_secs(s - t_first)} after the "
                 f"first rank, {end_word} {fmt_secs(e - t_first)} after it "
                 f"(in it {fmt_secs(e - s)})")
            if o.failed:
                t += f"\n{o.status[:300]}"
            parts.append(f'<rect class="bar" x="{bx:.2f}" y="{y + 1.5:.1f}" width="{bw:.2f}" '
                         f'height="{row - 3}" fill="{BAR_COLORS[status]}" '
                         f'><title>{esc(t)}</title></rect>')
    for r in range(n):
        y = head + r * row
        if r % 2:
            parts.insert(0, f'<rect x="0" y="{y}" width="{label_w + len(cols) * col_w}" '
                            f'height="{row}" fill="#f7f7f7"/>')
        if r not in v.by_rank:
            text = f"rank {r}: no dump" if row >= 14 else f"{r} ?"
        else:
            text = f"rank {r} ({v.host(r)})" if row >= 14 else str(r)
        strong = r in named
        if row < 10 and r % 2 and not strong:
            continue
        t = v.who(r) + ("" if r in v.by_rank else ": wrote no dump")
        parts.append(f'<text x="{label_w - 6}" y="{y + row / 2 + font / 3:.1f}" '
                     f'font-size="{font}" text-anchor="end"{STRONG if strong else ""} '
                     f'><title>{esc(t)}</title>{esc(text)}</text>')
    w = label_w + len(cols) * col_w + 100  # room for the last column's slanted name
    h = head + n * row + 6
    return _svg(w, h, parts, "arrival timeline"), len(cols)


def _span(d: Dump, o: Op) -> tuple[float, float]:
    end = d.dump_ns if o.running else o.end_ns
    return d.wall(o.start_ns), d.wall(max(end, o.start_ns))


# Shared by every picture of the page (defined once: ids are page-wide).
DEFS = ('<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>'
        '<pattern id="nodata" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#ccc" stroke-width="2"/></pattern>'
        '</defs></svg>')


def _svg(w: float, h: float, parts: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
            f'viewBox="0 0 {w:.0f} {h:.0f}" role="img" aria-label="{esc(label)}" '
            f'font-family="sans-serif">{"".join(parts)}</svg>')


def _legend(items: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{c}"></i>{esc(t)}</span>' for c, t in items) + "</div>"


# --- the page ----------------------------------------------------------------


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;
 background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 20px 40px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 6px;
 border-bottom:1px solid #ddd;padding-bottom:3px}
.verdict{border-left:8px solid var(--c);background:#fff;padding:12px 16px;
 box-shadow:0 1px 3px rgba(0,0,0,.12)}
.badge{display:inline-block;background:var(--c);color:#fff;font-weight:700;
 padding:2px 10px;border-radius:3px;font-size:15px;letter-spacing:.02em}
.headline{font-size:15px;margin:8px 0;line-height:1.4}
table.kv td{padding:2px 10px 2px 0;vertical-align:top;font-size:13px}
table.kv td:first-child{color:#666;white-space:nowrap}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
.evidence li{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;margin:3px 0;
 white-space:pre-wrap;word-break:break-word}
.note{color:#666;font-size:12.5px;margin:4px 0 8px}
.legend{font-size:12px;margin:6px 0}.legend span{margin-right:14px;white-space:nowrap}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;
 border:1px solid #999}
.scroll{overflow-x:auto;background:#fff;padding:8px;border:1px solid #e3e3e3}
.pair{display:flex;flex-wrap:wrap;gap:24px}
table.ranks{border-collapse:collapse;font-size:12px}
table.ranks td,table.ranks th{border-bottom:1px solid #eee;padding:2px 8px;text-align:left}
#tip{position:fixed;display:none;pointer-events:none;background:#222;color:#fff;
 font-size:12px;padding:5px 8px;border-radius:3px;max-width:520px;white-space:pre-wrap;
 z-index:10}
.cell:hover,.bar:hover{stroke:#000;stroke-width:1.5}
"""

# Records script errors on the page itself (the test reads them back from
# the DOM). Then: each SVG element's <title> (the native tooltip, slow to
# show, kept in the file for readers without scripts; one copy of the text
# keeps a 64-rank page small) becomes a tooltip shown at once.
JS_ERRORS = """
window.addEventListener("error", function (e) {
  var h = document.documentElement;
  h.setAttribute("data-errors", (h.getAttribute("data-errors") || "") + e.message + "\\n");
});
"""
JS_TIPS = """
(function () {
  var tip = document.getElementById("tip");
  document.addEventListener("mouseover", function (e) {
    var t = e.target.closest ? e.target.closest("[data-tip]") : null;
    if (!t) { tip.style.display = "none"; return; }
    tip.textContent = t.getAttribute("data-tip");
    tip.style.display = "block";
  });
  document.addEventListener("mousemove", function (e) {
    if (tip.style.display !== "block") return;
    var x = e.clientX + 14, y = e.clientY + 14;
    if (x + tip.offsetWidth > window.innerWidth) x = e.clientX - tip.offsetWidth - 8;
    if (y + tip.offsetHeight > window.innerHeight) y = e.clientY - tip.offsetHeight - 8;
    tip.style.left = x + "px"; tip.style.top = y + "px";
  });
  // The native <title> tooltips would show beside ours.
  var titles = document.querySelectorAll("svg title");
  for (var i = 0; i < titles.length; i++) {
    var t = titles[i];
    t.parentNode.setAttribute("data-tip", t.textContent);
    t.parentNode.removeChild(t);
  }
  document.documentElement.setAttribute("data-ready", "1");
})();
"""


def render(dumps: list[Dump], verdict, *, last: int = 20,
           counters: dict[tuple[str, int], list[dict]] | None = None,
           source: str | None = None) -> str:
    """The page (a string). `counters`: each dump's `links` counters; read
    from the dump files when not given."""
    v = _View(dumps, verdict)
    if counters is None:
        counters = read_counters(dumps)
    color = CLASS_COLORS.get(verdict.cls, "#1565c0")
    named = set(verdict.ranks) if verdict.comm in (None, v.comm) else set()
    stalled = set(verdict.links) if verdict.comm == v.comm else set()
    exclude = exclusion_hosts(verdict, dumps)

    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>cadence doctor: {esc(verdict.cls)}</title>",
           f"<script>{JS_ERRORS}</script>", f"<style>{CSS}</style></head><body>{DEFS}<main>"]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    where = f" of {esc(source)}" if source else ""
    out.append(f'<h1>cadence doctor</h1><p class="note">report{where}, written {when}; '
               f"job {esc(verdict.job or dumps[0].job)}, {len(dumps)} dumps</p>")

    # The verdict.
    rows = []
    if verdict.op is not None:
        rows.append(("operation", f"{verdict.op.describe()}, {fmt_bytes(verdict.op.bytes)}, "
                                  f"signature {verdict.op.sig}, comm {verdict.comm}"))
    if verdict.ranks:
        rows.append(("ranks", "; ".join(v.who(r) if verdict.comm == v.comm else f"rank {r}"
                                        for r in verdict.ranks)))
    if verdict.links:
        rows.append(("links", ", ".join(f"{s} → {d} ({v.host(s)} → {v.host(d)})"
                                        for s, d in verdict.links)))
    if verdict.hosts:
        rows.append(("hosts", ", ".join(verdict.hosts)))
    if exclude:
        rows.append(("exclude on restart", ", ".join(exclude) +
                     f"  (e.g. srun --exclude={','.join(exclude)})"))
    kv = "".join(f"<tr><td>{esc(k)}</td><td>{esc(x)}</td></tr>" for k, x in rows)
    out.append(f'<section class="verdict" id="verdict" style="--c:{color}">'
               f'<span class="badge">{esc(verdict.cls)}</span>'
               f'<p class="headline" id="headline">{esc(verdict.headline)}</p>'
               f'<table class="kv">{kv}</table></section>')

    # The link matrix.
    label, recs = _focus(v, verdict)
    out.append(f"<h2>Link matrix: {esc(label)}</h2>")
    out.append(f'<p class="note">comm {esc(v.comm)}, {v.nranks} ranks. Rows: the sending '
               "rank; columns: the receiving rank. Each cell: the bytes of that link's "
               "messages in this operation (as the receiver took them in; as the sender "
               "gave them when the receiver left no record) and their state as recorded; the "
               "stalled links the verdict names are outlined. Hover for both sides.</p>")
    missing = sorted(set(range(v.nranks)) - set(recs))
    if missing:
        out.append(f'<p class="note">no record of it from ranks '
                   f"{esc(ranks_text(missing))} (never entered, or wrote no dump): their "
                   "rows and columns show only what the other side recorded.</p>")
    matrix = link_matrix_svg(v, recs, stalled, named)
    cnt = counters_svg(v, counters, named)
    out.append('<div class="pair"><div class="scroll">' + matrix + "</div>")
    if cnt is not None:
        out.append('<div class="scroll"><div class="note">cumulative bytes sent per link since '
                   "the communicator was created (link counters)</div>" + cnt + "</div>")
    out.append("</div>")
    out.append(_legend([(STATE_COLORS["stalled"], "stalled (verdict)"),
                        (STATE_COLORS["pending"], "pending"), (STATE_COLORS["held"], "held"),
                        ("#6fbf73", "done (darker: more bytes)"),
                        (STATE_COLORS["none"], "no messages"), ("#fff", "no records (hatched)")]))
    if cnt is None:
        out.append('<p class="note">no link counters in these dumps (a rank dumped while an '
                   "operation ran leaves them out).</p>")

    # The timeline.
    tl, ncols = timeline_svg(v, verdict, last)
    out.append(f"<h2>Arrival timeline: the last {ncols} collectives</h2>")
    out.append('<p class="note">Each column is one collective on its own time scale, from the '
               "first rank's entry to the last rank's exit (its length below the name); each "
               "bar is one rank, from when it entered to when it left, on rank 0's clock "
               "(offsets between hosts applied). A late rank's bar starts late; ✕: the rank "
               "never entered; …: older than that rank's records.</p>")
    out.append('<div class="scroll">' + tl + "</div>")
    out.append(_legend([(BAR_COLORS["ok"], "completed"), (BAR_COLORS["failed"], "failed"),
                        (BAR_COLORS["running"], "running when dumped")]))

    # The evidence.
    out.append("<h2>Evidence</h2><ul class=\"evidence\">")
    out += [f"<li>{esc(e)}</li>" for e in verdict.evidence]
    out.append("</ul>")
    stacks = getattr(verdict, "stacks", None) or {}
    if stacks:
        out.append("<h2>Python stacks of the named ranks</h2>")
        for r, text in sorted(stacks.items()):
            out.append(f'<p class="note">{esc(v.who(r))}, when the others were stuck:</p>'
                       f'<pre class="mono scroll">{esc(text.rstrip())}</pre>')
    if v.others:
        out.append(f'<p class="note">other communicators in these dumps (not drawn): '
                   f"{esc(', '.join(v.others))}</p>")

    # The ranks.
    out.append(f"<h2>Ranks</h2><details{' open' if v.nranks <= 16 else ''}>"
               f"<summary>{len(v.by_rank)} of {v.nranks} ranks dumped</summary>"
               '<table class="ranks"><tr><th>rank</th><th>host</th><th>hostname</th>'
               "<th>pid</th><th>clock offset</th><th>dump</th><th>last operation</th></tr>")
    for r in range(v.nranks):
        d = v.by_rank.get(r)
        if d is None:
            out.append(f"<tr><td>{r}</td><td>{esc(v.host(r))}</td><td></td>"
                       f"<td>{esc(v.peers.get(r, {}).get('pid', '?'))}</td><td></td>"
                       "<td>no dump</td><td></td></tr>")
            continue
        last_op = d.ops[-1] if d.ops else None
        last_s = "" if last_op is None else f"{op_name(last_op)}: {_status(last_op.status)}"
        off = f"{d.clock_offset_ns / 1e6:+.3f} ms ({d.clock_method})"
        out.append(f"<tr><td>{r}</td><td>{esc(d.host)}</td><td>{esc(d.hostname)}</td>"
                   f"<td>{d.pid}</td><td>{esc(off)}</td><td>{esc(d.reason.split(':')[0])}</td>"
                   f"<td>{esc(last_s)}</td></tr>")
    out.append("</table></details>")
    out.append(f'<div id="tip"></div></main><script>{JS_TIPS}</script></body></html>')
    return "\n".join(out)


def _status(status: str, n: int = 100) -> str:
    # Error texts start with "cadence comm X rank R, allreduce #k: ".
    if status.startswith("cadence ") and ": " in status:
        status = status.split(": ", 1)[1]
    return status if len(status) <= n else status[: n - 1] + "…"


def write(path: str, dumps: list[Dump], verdict, *, source: str | None = None,
          last: int = 20) -> None:
    page = render(dumps, verdict, source=source or os.path.dirname(dumps[0].path) or None,
                  last=last)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
