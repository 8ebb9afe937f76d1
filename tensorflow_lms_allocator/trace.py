"""Access traces: what an LMS engine was asked to do, in order.

A trace starts with a snapshot of the allocations (and pins) already live,
so that it is self-contained, then holds one event per allocate, free, pin,
unpin, eviction and page-in, each with its time, address, bytes, unit id, OS thread and the op
that was running on that thread (when LMS knows it: kernels' pins and their
allocations). The format is Note [Access trace format] in
``cc/engine/trace_recorder.h``: a 16-byte header, 40-byte records, a JSON
trailer.

Recording, on the engine alone:

    >>> from tensorflow_lms_allocator.engine import Engine
    >>> from tensorflow_lms_allocator import trace
    >>> engine = Engine(device_bytes=8 << 20, host_bytes=64 << 20, granule_bytes=1 << 20)
    >>> with trace.record_engine(engine, "/tmp/run.lmstrace"):
    ...     a = engine.allocate(6 << 20)
    >>> t = trace.load("/tmp/run.lmstrace")
    >>> [e.name for e in t.events()]
    ['allocate']

In TensorFlow, ``tensorflow_lms_allocator.record_trace(path)`` records the
LMS device's engine the same way.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

MAGIC, END_MAGIC, VERSION = b"LMSTRACE", b"LMSTREND", 1
HEADER_BYTES, TRAILER_FIXED_BYTES = 16, 16
DEFAULT_MAX_MB = 256
EVENT_NAMES = {1: "allocate", 2: "free", 3: "pin", 4: "unpin", 5: "evict", 6: "page_in"}
RECORD = np.dtype([("time_ns", "<u8"), ("address", "<u8"), ("bytes", "<u8"),
                   ("unit_id", "<u8"), ("thread", "<u4"), ("op", "<u2"), ("event", "u1"),
                   ("flags", "u1")])
BORN_PINNED = 1  # flags of an allocate event: its kernel holds it pinned
LIVE_AT_START = 2  # flags of the snapshot the trace starts with (allocate, pin)
UNCLAIMED = 4  # flags of an allocate event: made outside any kernel, unevictable until pinned


class TraceFormatError(ValueError):
    """The file is not an LMS access trace, or it is truncated."""


@dataclass(frozen=True)
class Event:
    time_ns: int
    name: str  # one of EVENT_NAMES' values
    address: int
    bytes: int
    unit_id: int
    thread: int
    op: str  # "-" when no op was known
    born_pinned: bool  # an allocation its kernel holds pinned (unpinned without a pin event)
    live_at_start: bool = False  # the starting snapshot: live before the trace began
    unclaimed: bool = False  # made outside any kernel: not evictable until its first pin


@dataclass
class Trace:
    """A loaded trace: `records` (a NumPy structured array) and the op names."""

    records: np.ndarray
    ops: list[str]  # ops[i] names op index i; ops[0] is "-"
    dropped: int
    max_bytes: int

    def events(self) -> Iterator[Event]:
        """The events one by one, as Event objects (records is faster for big traces)."""
        for r in self.records:
            yield Event(int(r["time_ns"]), EVENT_NAMES.get(int(r["event"]), "unknown"),
                        int(r["address"]), int(r["bytes"]), int(r["unit_id"]),
                        int(r["thread"]), self.ops[int(r["op"])],
                        bool(r["flags"] & BORN_PINNED), bool(r["flags"] & LIVE_AT_START),
                        bool(r["flags"] & UNCLAIMED))

    def counts(self) -> dict[str, int]:
        """How many events of each kind."""
        values, counts = np.unique(self.records["event"], return_counts=True)
        return {EVENT_NAMES.get(int(v), "unknown"): int(c) for v, c in zip(values, counts)}


def load(path: str | Path) -> Trace:
    """Reads a trace file; TraceFormatError saying what is wrong with it.

    Example:
        >>> t = load("/tmp/run.lmstrace")  # doctest: +SKIP
        >>> t.counts()  # doctest: +SKIP
        {'allocate': 120, 'free': 118, 'pin': 340, 'unpin': 340}
    """
    data = Path(path).read_bytes()
    if len(data) < HEADER_BYTES + TRAILER_FIXED_BYTES or data[:8] != MAGIC:
        raise TraceFormatError(f"{path}: not an LMS access trace (no {MAGIC!r} header)")
    version, record_bytes = struct.unpack_from("<II", data, 8)
    if version != VERSION or record_bytes != RECORD.itemsize:
        raise TraceFormatError(f"{path}: trace version {version} with {record_bytes}-byte "
                               f"records; this reader knows version {VERSION} "
                               f"({RECORD.itemsize} bytes)")
    if data[-8:] != END_MAGIC:
        raise TraceFormatError(f"{path}: no trailer: the trace was not finished (the process "
                               "ended inside record_trace?)")
    (json_bytes,) = struct.unpack_from("<Q", data, len(data) - TRAILER_FIXED_BYTES)
    trailer_start = len(data) - TRAILER_FIXED_BYTES - json_bytes
    trailer = json.loads(data[trailer_start:len(data) - TRAILER_FIXED_BYTES])
    body = data[HEADER_BYTES:trailer_start]
    if len(body) != trailer["events"] * RECORD.itemsize:
        raise TraceFormatError(f"{path}: {len(body)} bytes of records for "
                               f"{trailer['events']} events")
    return Trace(np.frombuffer(body, dtype=RECORD), ["-", *trailer["ops"]],
                 trailer["dropped"], trailer["max_bytes"])


def report_dropped(summary: dict[str, Any]) -> None:
    """Warns, with what to do, when a trace reached its size cap."""
    if summary["dropped"]:
        warnings.warn(
            f"the LMS trace {summary['path']} reached its cap of "
            f"{summary['max_bytes'] / (1 << 20):.1f} MiB after {summary['events']:,} events; "
            f"{summary['dropped']:,} later events were not recorded. Record fewer steps or "
            "raise max_mb.", RuntimeWarning, stacklevel=3)


def check_max_mb(max_mb: Any) -> int:
    """A trace's size cap `max_mb` (MiB) in bytes; ValueError naming max_mb and its
    value unless it is a positive finite number.

    Example:
        >>> check_max_mb(0.5)
        524288
        >>> check_max_mb(-1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: max_mb=-1: the trace's size cap must be a positive finite number of MiB ...
    """
    if isinstance(max_mb, bool) or not isinstance(max_mb, numbers.Real) \
            or not math.isfinite(max_mb) or max_mb <= 0:
        raise ValueError(f"max_mb={max_mb!r}: the trace's size cap must be a positive finite "
                         f"number of MiB (default {DEFAULT_MAX_MB}); recording stops there "
                         "with a warning")
    return int(max_mb * (1 << 20))


@contextlib.contextmanager
def record_engine(engine: Any, path: str | Path,
                  max_mb: float = DEFAULT_MAX_MB) -> Iterator[None]:
    """Records `engine` (a tensorflow_lms_allocator.engine.Engine) inside the block.

    Raises ValueError unless `max_mb` is a positive finite number (check_max_mb).
    """
    engine.start_trace(str(path), check_max_mb(max_mb))
    try:
        yield
    finally:
        report_dropped(engine.stop_trace())
