"""A memory timeline of an LMS access trace: `lms_stats.py timeline TRACE -o OUT`.

Each allocation of the trace is a band: x is time, y its place in memory
(stacked by address, its offset from the lowest address of the trace, or by
size, largest at the bottom), its height its size. The band is coloured by the
allocation's state: pinned (a kernel uses it), resident (on the device,
inactive), evicted (in host memory). Reclaims (evictions) and page-ins are
ticks along the top. ``-o OUT.html`` writes a self-contained page (inline SVG,
a tooltip per band; no network), ``-o OUT.png`` a picture (matplotlib).

The trace is read with ``tensorflow_lms_allocator.trace``, which never
imports TensorFlow (Note [Activation] in ``overlay/activation.py``).

Example:
    $ python stats_tools/lms_stats.py timeline steps.lmstrace -o steps.html
    steps.lmstrace: 321 allocations, 1,102 bands, 10 evictions, 10 page-ins -> steps.html
"""

from __future__ import annotations

import bisect
import html
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

MIB = float(1 << 20)
COLOURS = {"pinned": "#d62728", "resident": "#1f77b4", "evicted": "#bbbbbb"}
STACKS = ("address", "size")


def load_trace_module() -> ModuleType:
    """tensorflow_lms_allocator.trace (importing it never imports TensorFlow)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tensorflow_lms_allocator import trace

    return trace


@dataclass
class Band:
    """One allocation's life: (start s, end s, state) segments."""

    address: int
    size: int
    op: str
    segments: list[tuple[float, float, str]] = field(default_factory=list)
    pins: int = 0
    evicted: bool = False
    since: float = 0.0

    def state(self) -> str:
        return "evicted" if self.evicted else "pinned" if self.pins > 0 else "resident"

    def change(self, t: float, pins: int | None = None, evicted: bool | None = None) -> None:
        before = self.state()
        if pins is not None:
            self.pins = max(pins, 0)
        if evicted is not None:
            self.evicted = evicted
        if self.state() != before:
            self.close(t, before)

    def close(self, t: float, state: str) -> None:
        if t > self.since:
            self.segments.append((self.since, t, state))
        self.since = t


@dataclass
class Timeline:
    bands: list[Band]
    evictions: list[float]  # times, s
    page_ins: list[float]
    end: float


def build(path: str) -> Timeline:
    """Reads the trace at `path` into bands; TraceFormatError if it is not one."""
    trace = load_trace_module()
    t = trace.load(path)
    starts: list[int] = []
    live: dict[int, Band] = {}
    done: list[Band] = []
    evictions: list[float] = []
    page_ins: list[float] = []

    def containing(address: int) -> Band | None:
        i = bisect.bisect_right(starts, address) - 1
        if i < 0:
            return None
        band = live[starts[i]]
        return band if address < band.address + max(band.size, 1) else None

    def within(first: int, size: int) -> list[Band]:
        i = bisect.bisect_left(starts, first)
        out = []
        while i < len(starts) and starts[i] < first + size:
            out.append(live[starts[i]])
            i += 1
        return out

    end = 0.0
    for r in t.records:
        now = int(r["time_ns"]) / 1e9
        end = max(end, now)
        kind = trace.EVENT_NAMES.get(int(r["event"]), "")
        address, size = int(r["address"]), int(r["bytes"])
        if kind == "allocate":
            band = Band(address, size, t.ops[int(r["op"])], since=now,
                        pins=1 if int(r["flags"]) & trace.BORN_PINNED else 0)
            if address in live:  # cannot happen in a well-formed trace; keep the new one
                starts.remove(address)
            bisect.insort(starts, address)
            live[address] = band
        elif kind in ("pin", "unpin"):
            band = containing(address)
            if band is not None:
                band.change(now, pins=band.pins + (1 if kind == "pin" else -1))
        elif kind == "free":
            band = containing(address)
            if band is not None:
                band.close(now, band.state())
                starts.remove(band.address)
                del live[band.address]
                done.append(band)
        elif kind in ("evict", "page_in"):
            (evictions if kind == "evict" else page_ins).append(now)
            for band in within(address, size):
                band.change(now, evicted=kind == "evict")
    for band in live.values():
        band.close(end, band.state())
        done.append(band)
    return Timeline(done, evictions, page_ins, end)


def layout(timeline: Timeline, stack: str) -> list[tuple[Band, float, float]]:
    """(band, y MiB, height MiB) for each band."""
    if stack not in STACKS:
        raise ValueError(f"--stack {stack!r}: use one of {', '.join(STACKS)}")
    if not timeline.bands:
        return []
    if stack == "address":
        base = min(b.address for b in timeline.bands)
        return [(b, (b.address - base) / MIB, b.size / MIB) for b in timeline.bands]
    placed, y = [], 0.0
    for b in sorted(timeline.bands, key=lambda b: (-b.size, b.address)):
        placed.append((b, y, b.size / MIB))
        y += b.size / MIB
    return placed


def write_png(timeline: Timeline, stack: str, output: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(12, 6.5))
    for band, y, h in layout(timeline, stack):
        for state in COLOURS:
            spans = [(a, b - a) for a, b, s in band.segments if s == state]
            if spans:
                ax.broken_barh(spans, (y, max(h, 0.05)), facecolors=COLOURS[state],
                               linewidth=0)
    top = ax.get_ylim()[1]
    ax.vlines(timeline.evictions, top * 1.00, top * 1.03, colors="#ff7f0e", linewidth=0.8)
    ax.vlines(timeline.page_ins, top * 1.03, top * 1.06, colors="#2ca02c", linewidth=0.8)
    ax.set_xlim(0, max(timeline.end, 1e-6))
    ax.set_xlabel("time since the trace started (s)")
    ax.set_ylabel("address offset (MiB)" if stack == "address" else "allocations by size (MiB)")
    ax.legend(handles=[Patch(color=c, label=s) for s, c in COLOURS.items()]
              + [Patch(color="#ff7f0e", label="reclaim (eviction)"),
                 Patch(color="#2ca02c", label="page-in")],
              loc="upper right", fontsize=8)
    ax.set_title(f"LMS memory timeline: {len(timeline.bands)} allocations, "
                 f"{len(timeline.evictions)} evictions, {len(timeline.page_ins)} page-ins")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)


def write_html(timeline: Timeline, stack: str, output: str, title: str) -> None:
    width, height, left, top, bottom = 1200.0, 640.0, 70.0, 40.0, 40.0
    placed = layout(timeline, stack)
    y_max = max((y + h for _, y, h in placed), default=1.0) or 1.0
    t_max = max(timeline.end, 1e-9)

    def x(t: float) -> float:
        return left + (width - left - 10) * t / t_max

    def y_of(mib: float) -> float:
        return top + (height - top - bottom) * (1 - mib / y_max)

    parts = []
    for band, y, h in placed:
        for a, b, state in band.segments:
            y0, y1 = y_of(y + h), y_of(y)
            tip = html.escape(f"{band.size:,} bytes at {band.address:#x}, {state} "
                              f"{a:.4f}-{b:.4f} s, allocated by {band.op}")
            parts.append(f'<rect x="{x(a):.2f}" y="{y0:.2f}" width="{max(x(b) - x(a), 0.3):.2f}" '
                         f'height="{max(y1 - y0, 0.5):.2f}" fill="{COLOURS[state]}">'
                         f"<title>{tip}</title></rect>")
    for times, colour, y0 in ((timeline.evictions, "#ff7f0e", top - 24),
                              (timeline.page_ins, "#2ca02c", top - 12)):
        parts += [f'<line x1="{x(t):.2f}" x2="{x(t):.2f}" y1="{y0}" y2="{y0 + 10}" '
                  f'stroke="{colour}"/>' for t in times]
    ticks = []
    for k in range(6):
        t, mib = t_max * k / 5, y_max * k / 5
        ticks.append(f'<text x="{x(t):.1f}" y="{height - bottom + 16}" font-size="11" '
                     f'text-anchor="middle">{t:.3g} s</text>')
        ticks.append(f'<text x="{left - 6}" y="{y_of(mib) + 4:.1f}" font-size="11" '
                     f'text-anchor="end">{mib:.0f}</text>')
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {s}' for s, c in COLOURS.items())
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}">'
           + "".join(parts) + "".join(ticks)
           + f'<text x="12" y="{top + 10}" font-size="11">MiB</text></svg>')
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>
<body style="font-family:sans-serif">
<h3>LMS memory timeline: {html.escape(title)}</h3>
<p>{len(timeline.bands)} allocations stacked by {stack}; {len(timeline.evictions)} evictions
(<span style="color:#ff7f0e">&#9646;</span> top row), {len(timeline.page_ins)} page-ins
(<span style="color:#2ca02c">&#9646;</span> second row). {legend}. Hover a band for details.</p>
{svg}
</body></html>
"""
    Path(output).write_text(page)


def render(path: str, output: str, stack: str = "address") -> str:
    """Writes the timeline of the trace at `path` to `output` (.html or .png)."""
    suffix = Path(output).suffix.lower()
    if suffix not in (".html", ".png"):
        raise ValueError(f"-o {output}: the output must end in .html or .png")
    timeline = build(path)
    if suffix == ".png":
        write_png(timeline, stack, output)
    else:
        write_html(timeline, stack, output, Path(path).name)
    bands = sum(len(b.segments) for b in timeline.bands)
    return (f"{path}: {len(timeline.bands):,} allocations, {bands:,} bands, "
            f"{len(timeline.evictions):,} evictions, {len(timeline.page_ins):,} page-ins "
            f"-> {output}")
