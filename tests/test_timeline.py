"""The memory timeline of an access trace (stats_tools/lms_timeline.py, `lms_stats.py timeline`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from tensorflow_lms_allocator import trace
from tensorflow_lms_allocator.engine import Engine

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "stats_tools"))
import lms_timeline  # noqa: E402


def known_trace(path: Path) -> tuple[int, int]:
    """A 6 MiB tensor: born pinned, unpinned, evicted, pinned again, freed; and a
    4 MiB one live before the trace, never touched."""
    engine = Engine(16 * MIB, host_bytes=64 * MIB, policy="lru")
    before = engine.allocate(4 * MIB)
    with trace.record_engine(engine, path):
        a = engine.allocate(6 * MIB, pin=True)
        engine.unpin(a)
        engine.evict(a)
        engine.pin(a)
        engine.unpin(a)
        engine.free(a)
    return a, before


def test_each_allocation_goes_through_the_states_the_trace_recorded(tmp_path):
    a, before = known_trace(tmp_path / "t")
    timeline = lms_timeline.build(str(tmp_path / "t"))
    bands = {b.address: b for b in timeline.bands}
    assert set(bands) == {a, before}
    assert [s for _, _, s in bands[a].segments] == [
        "pinned", "resident", "evicted", "pinned", "resident"]
    times = [t for seg in bands[a].segments for t in seg[:2]]
    assert times == sorted(times)  # contiguous, in order
    assert all(start == end for (_, end, _), (start, _, _) in
               zip(bands[a].segments, bands[a].segments[1:]))
    assert [s for _, _, s in bands[before].segments] == ["resident"]
    assert len(timeline.evictions) == len(timeline.page_ins) == 1


def lms_stats(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "stats_tools" / "lms_stats.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_html_is_self_contained_with_a_band_per_state_segment(tmp_path):
    known_trace(tmp_path / "t")
    done = lms_stats("timeline", str(tmp_path / "t"), "-o", str(tmp_path / "t.html"))
    assert done.returncode == 0, done.stderr
    assert "2 allocations, 6 bands, 1 evictions, 1 page-ins" in done.stdout
    page = (tmp_path / "t.html").read_text()
    svg = re.search(r"<svg.*</svg>", page, re.S).group(0)
    root = ElementTree.fromstring(svg)  # well-formed
    rects = root.findall("{http://www.w3.org/2000/svg}rect")
    assert len(rects) == 6
    assert sorted({r.get("fill") for r in rects}) == sorted(lms_timeline.COLOURS.values())
    assert "<script" not in page and "src=" not in page and "href=" not in page
    assert "6,291,456 bytes" in page  # tooltips


def test_the_png_and_the_size_stacking(tmp_path):
    known_trace(tmp_path / "t")
    for stack in ("address", "size"):
        out = tmp_path / f"t-{stack}.png"
        done = lms_stats("timeline", str(tmp_path / "t"), "-o", str(out), "--stack", stack)
        assert done.returncode == 0, done.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_bad_input_is_a_one_line_error(tmp_path):
    known_trace(tmp_path / "t")
    done = lms_stats("timeline", str(tmp_path / "t"), "-o", str(tmp_path / "t.svg"))
    assert done.returncode == 2 and "must end in .html or .png" in done.stderr
    (tmp_path / "junk").write_text("no")
    done = lms_stats("timeline", str(tmp_path / "junk"), "-o", str(tmp_path / "j.html"))
    assert done.returncode == 2 and "junk" in done.stderr and "not an LMS access trace" in \
        done.stderr
