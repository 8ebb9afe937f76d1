"""Replaying an access trace at another device size, under a chosen policy.

A trace (``tensorflow_lms_allocator.trace``) records what TensorFlow asked of
the LMS engine: allocations, frees, and kernels' pins and unpins, starting
with a snapshot of what was live. Replay asks the same of a new engine of any
size and reports what it would move:

- ``lru``: the real engine (POSIX backend), whose policy evicts the least
  recently used inactive unit when memory runs out; every number comes from
  its statistics.
- ``learned``: the real engine with its learned policy (Note [Learned
  eviction] in ``cc/engine/learned_policy.h``): each event runs labelled with
  its recorded op, as in TensorFlow, so allocations get the same keys.
- ``oracle``: the real engine ordering its victims as the learned policy
  does, but by each unit's true next use (the trace's next pin of any
  allocation on it, a page's objects included) instead of a learned guess:
  what perfect predictions would move with the engine's own units and
  pages, so ``learned`` over ``oracle`` is what the predictions cost and
  ``oracle`` over ``belady`` what 2 MiB pages cost (a page copies its live
  objects only, but takes a whole granule of device memory while any of
  them is resident).
- ``belady``: an offline simulation with knowledge of the whole trace: on a
  shortfall it evicts the inactive allocation whose next pin is farthest
  ahead. Allocations are modelled one by one (small objects rounded to 256
  bytes instead of sharing 2 MiB pages, as the engine packs them), and
  address fragmentation is ignored (the engine's defragmentation remaps it
  away without moving data). With sizes that vary this is not a proven
  optimum, so a lower bound is reported too.
- the lower bound: at any moment, live bytes above the device's capacity are
  off the device, so the largest such excess over the trace must have left
  the device at least once. No policy moves fewer bytes off the device.

"Swapped out" is device bytes freed by evictions plus bytes placed in host
memory at birth (the engine's born-evicted allocations); "paged in" is device
bytes filled again. "Copied" is what the moves copied, out and in: a large
allocation's requested bytes, a small object's (a page copies its live objects
and the short gaps between them: Note [Live bytes only] in
``cc/engine/engine.h``). That is what takes time, and what policies are
compared by.

With a link bandwidth and a compute time per step, ``project`` models the
step time on a GPU with one copy stream (a model, not a measurement): the
host runs one kernel ahead of the GPU and issues that kernel's copies then
(evictions, then page-ins, one at a time on the copy stream); a kernel
starts once the previous one ended and its own copies completed. A kernel is
a run of consecutive events of one op; the step's compute time is split
across kernels in proportion to their recorded durations.

Example:
    >>> from tensorflow_lms_allocator import replay, trace
    >>> events = replay.normalize(trace.load("step.lmstrace"))  # doctest: +SKIP
    >>> result = replay.run(events, device_bytes=64 << 20, policy="lru", steps=2)  # doctest: +SKIP
    >>> result.fits, result.steps[0].swapped_out  # doctest: +SKIP
    (True, 50331648)
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tensorflow_lms_allocator import trace as trace_module

ALLOC, FREE, PIN, UNPIN = "allocate", "free", "pin", "unpin"
SMALL_UNIT = 256
POLICIES = ("lru", "learned", "oracle", "belady")


class ReplayError(ValueError):
    """The trace cannot be replayed (it says why)."""


@dataclass(frozen=True)
class Event:
    kind: str  # ALLOC, FREE, PIN or UNPIN
    allocation: int  # index into Events.sizes
    offset: int  # where in the allocation a pin points
    time_ns: int
    op: int  # index into the trace's op table
    born_pinned: bool = False
    live_at_start: bool = False
    unclaimed: bool = False  # made outside kernels: not evictable until its first pin
    # A pin (or born-pinned allocation) and the unpin that ends it share a
    # number (-1: none, an unpin the trace shows no pin for).
    pin: int = -1


@dataclass
class Events:
    """A trace as allocation indices instead of addresses."""

    events: list[Event]
    sizes: list[int]  # requested bytes per allocation
    ops: list[str]
    skipped: int  # pins/unpins/frees at no traced allocation (should be 0)
    recorded_evicted: int  # what the recorded run evicted (for reference)


@dataclass
class StepResult:
    evicted: int = 0
    born_evicted: int = 0
    paged_in: int = 0
    reclaims: int = 0
    peak_live: int = 0
    copied: int = 0
    projected_ms: float | None = None

    @property
    def swapped_out(self) -> int:
        return self.evicted + self.born_evicted


@dataclass
class Result:
    policy: str
    device_bytes: int
    fits: bool
    failure: str = ""  # why it does not fit: the event that failed
    steps: list[StepResult] = field(default_factory=list)
    lower_bound: int = 0  # bytes that must leave the device at least once
    # Unpins of freed small objects whose page the replay had already
    # released (small objects are packed differently at another size).
    unmatched: int = 0
    # Bytes copied per event index (evictions, page-ins), for the projection.
    evicted_at: dict[int, int] = field(default_factory=dict)
    paged_in_at: dict[int, int] = field(default_factory=dict)

    @property
    def swapped_out(self) -> int:
        return sum(s.swapped_out for s in self.steps)

    @property
    def paged_in(self) -> int:
        return sum(s.paged_in for s in self.steps)


def normalize(t: trace_module.Trace) -> Events:
    """Resolves every address of `t` to the allocation containing it.

    Raises ReplayError if the trace does not start with its snapshot (an older
    trace format) and pins memory it never allocated.
    """
    starts: list[int] = []  # sorted starts of the live allocations
    live: dict[int, tuple[int, int]] = {}  # start -> (allocation index, bytes)
    # Freed allocations, for unpins after a free: a kernel may free an object
    # it allocated and unpin it when it ends, which unpins the object's page.
    dead_starts: list[int] = []
    dead: dict[int, tuple[int, int]] = {}
    sizes: list[int] = []
    # (address, unit id) -> the pins at it not yet unpinned: an unpin ends the
    # pin its kernel made, at the same address of the same unit, even if the
    # object it pinned was freed since and another now starts there.
    open_pins: dict[tuple[int, int], list[Event]] = {}
    events: list[Event] = []
    skipped = recorded_evicted = 0
    names = trace_module.EVENT_NAMES
    for r in t.records:
        kind = names.get(int(r["event"]), "")
        address, time_ns, op = int(r["address"]), int(r["time_ns"]), int(r["op"])
        flags = int(r["flags"])
        start_of_snapshot = bool(flags & trace_module.LIVE_AT_START)
        if kind == "evict":
            recorded_evicted += int(r["bytes"])
            continue
        if kind == ALLOC:
            index = len(sizes)
            sizes.append(int(r["bytes"]))
            bisect.insort(starts, address)
            live[address] = (index, int(r["bytes"]))
            born_pinned = bool(flags & trace_module.BORN_PINNED)
            events.append(Event(ALLOC, index, 0, time_ns, op, born_pinned, start_of_snapshot,
                                bool(flags & trace_module.UNCLAIMED),
                                pin=len(events) if born_pinned else -1))
            if born_pinned:
                open_pins.setdefault((address, int(r["unit_id"])), []).append(events[-1])
            continue
        if kind not in (FREE, PIN, UNPIN):
            continue  # page-ins: what the recorded policy did
        key = (address, int(r["unit_id"]))
        if kind == UNPIN and open_pins.get(key):
            pinned = open_pins[key].pop()
            events.append(Event(UNPIN, pinned.allocation, pinned.offset, time_ns, op,
                                live_at_start=start_of_snapshot, pin=pinned.pin))
            continue
        found = _containing(starts, live, address)
        if found is None and kind == UNPIN:
            found = _containing(dead_starts, dead, address)
        if found is None:
            skipped += 1
            continue
        start, index = found
        events.append(Event(kind, index, address - start, time_ns, op,
                            live_at_start=start_of_snapshot,
                            pin=len(events) if kind == PIN else -1))
        if kind == PIN:
            open_pins.setdefault(key, []).append(events[-1])
        if kind == FREE:
            if start not in dead:
                bisect.insort(dead_starts, start)
            dead[start] = live.pop(start)
            starts.remove(start)
    return Events(events, sizes, t.ops, skipped, recorded_evicted)


def _containing(starts: list[int], table: dict[int, tuple[int, int]],
                address: int) -> tuple[int, int] | None:
    """(start, allocation index) of the allocation in `table` containing `address`."""
    i = bisect.bisect_right(starts, address) - 1
    if i < 0:
        return None
    index, size = table[starts[i]]
    return (starts[i], index) if address < starts[i] + max(size, 1) else None


def _first_call(events: Events) -> int:
    """The index of the first event after the trace's starting snapshot."""
    return next((i for i, e in enumerate(events.events) if not e.live_at_start),
                len(events.events))


def max_steps(events: Events) -> int:
    """The most steps `events` can be split into: each needs one call after the snapshot.

    Example:
        >>> max_steps(replay.normalize(trace.load("step.lmstrace")))  # doctest: +SKIP
        5310
    """
    return max(len(events.events) - _first_call(events), 1)


def check_steps(events: Events, steps: int) -> None:
    """Raises ReplayError unless 1 <= `steps` <= max_steps(events)."""
    most = max_steps(events)
    if steps < 1:
        raise ReplayError(f"--steps {steps}: at least 1")
    if steps > most:
        raise ReplayError(f"--steps {steps}: the trace has {most:,} calls after its starting "
                          f"snapshot, and each step needs one, so at most {most}; pass the "
                          "number of training steps recorded")


def step_bounds(events: Events, steps: int) -> list[int]:
    """Event indices where each step begins: the calls after the snapshot,
    split into `steps` runs of equal length (training repeats one sequence)."""
    first = _first_call(events)
    calls = len(events.events) - first
    return [first + (calls * k) // steps for k in range(steps)] + [len(events.events)]


def modelled_size(requested: int, granule: int) -> int:
    """An allocation's device bytes as the engine rounds it (a small object to 256 bytes)."""
    if requested < granule:
        return max(SMALL_UNIT, -(-requested // SMALL_UNIT) * SMALL_UNIT)
    return -(-requested // granule) * granule


def lower_bound(events: Events, device_bytes: int, granule: int) -> int:
    """The largest excess of live bytes over the device: bytes that must leave it."""
    live = worst = 0
    for e in events.events:
        if e.kind == ALLOC:
            live += modelled_size(events.sizes[e.allocation], granule)
            worst = max(worst, live - device_bytes)
        elif e.kind == FREE:
            live -= modelled_size(events.sizes[e.allocation], granule)
    return max(worst, 0)


def pinned_floor(events: Events, granule: int = 2 << 20) -> tuple[int, str]:
    """The most bytes pinned at once, and the op that pinned (or allocated) the last of them.

    No device smaller than that runs the trace from device memory: what kernels
    hold pinned must be resident together (one cuDNN RNN kernel for a whole
    sequence, a convolution's workspace). A lower bound: the engine pins a small
    object's whole page.

    Example:
        >>> floor, op = pinned_floor(normalize(trace.load("step.lmstrace")))  # doctest: +SKIP
    """
    counts: dict[int, int] = {}
    pinned = worst = 0
    worst_op = "-"
    for e in events.events:
        size = modelled_size(events.sizes[e.allocation], granule)
        if e.kind == PIN or (e.kind == ALLOC and e.born_pinned):
            counts[e.allocation] = counts.get(e.allocation, 0) + 1
            if counts[e.allocation] == 1:
                pinned += size
                if pinned > worst:
                    worst, worst_op = pinned, events.ops[e.op]
        elif e.kind == UNPIN and counts.get(e.allocation, 0) > 0:
            counts[e.allocation] -= 1
            if counts[e.allocation] == 0:
                pinned -= size
        elif e.kind == FREE and counts.pop(e.allocation, 0) > 0:
            pinned -= size
    return worst, worst_op


def kernel_floor(events: Events, granule: int = 2 << 20,
                 small_in_pages: bool = False) -> tuple[int, str]:
    """The most bytes one kernel holds pinned at once, and that kernel's op.

    pinned_floor counts every kernel running at once; this counts each kernel's
    own set (its inputs, outputs and temporaries while it holds them, grouped by
    the op that pinned them; a pin outside any kernel, op "-", alone): the
    floor when kernels take turns, the physical limit of a device that runs
    the trace from device memory. Each allocation counts in whole granules, a
    small object in 256-byte units; with `small_in_pages`, a kernel's small
    objects together in whole granules (as tightly as pages of a granule can
    hold them: the floor of any allocator that maps and evicts a granule at a
    time, as a GPU's does).

    Example:
        >>> floor, op = kernel_floor(normalize(trace.load("step.lmstrace")))  # doctest: +SKIP
    """
    unlabelled = events.ops.index("-") if "-" in events.ops else -1
    held: dict[int, tuple[object, int, int]] = {}  # pin -> (kernel, allocation, size)
    pins_of: dict[int, set[int]] = {}  # allocation -> its pins held
    counts: dict[object, dict[int, int]] = {}  # kernel -> {allocation: pins}
    held_bytes: dict[object, int] = {}  # large allocations' bytes
    small_bytes: dict[object, int] = {}  # small objects' bytes (in pages: rounded up)

    def total(kernel: object) -> int:
        small = small_bytes.get(kernel, 0)
        if small_in_pages:
            small = -(-small // granule) * granule
        return held_bytes.get(kernel, 0) + small

    def add(kernel: object, size: int, sign: int) -> None:
        table = small_bytes if size < granule else held_bytes
        table[kernel] = table.get(kernel, 0) + sign * size

    worst, worst_op = 0, "-"
    for i, e in enumerate(events.events):
        if e.kind == PIN or (e.kind == ALLOC and e.born_pinned):
            size = modelled_size(events.sizes[e.allocation], granule)
            kernel: object = e.op if e.op != unlabelled else ("-", i)
            mine = counts.setdefault(kernel, {})
            mine[e.allocation] = mine.get(e.allocation, 0) + 1
            if mine[e.allocation] == 1:
                add(kernel, size, 1)
                if total(kernel) > worst:
                    worst, worst_op = total(kernel), events.ops[e.op]
            if e.pin >= 0:
                held[e.pin] = (kernel, e.allocation, size)
                pins_of.setdefault(e.allocation, set()).add(e.pin)
        elif (e.kind == UNPIN and e.pin in held) or e.kind == FREE:
            ended = [e.pin] if e.kind == UNPIN else list(pins_of.pop(e.allocation, ()))
            for pin in ended:
                kernel, allocation, size = held.pop(pin)
                pins_of.get(allocation, set()).discard(pin)
                mine = counts[kernel]
                mine[allocation] -= 1
                if mine[allocation] == 0:
                    del mine[allocation]
                    add(kernel, size, -1)
    return worst, worst_op


def _fill_steps(result: Result, bounds: list[int], per_event: Callable[[int], tuple]) -> None:
    """Sums per-event figures into result.steps (per_event(i) gives the step deltas)."""
    for step in range(len(bounds) - 1):
        s = StepResult()
        for i in range(bounds[step], bounds[step + 1]):
            ev, born, paged, reclaims, live, copied = per_event(i)
            s.evicted += ev
            s.born_evicted += born
            s.paged_in += paged
            s.reclaims += reclaims
            s.peak_live = max(s.peak_live, live)
            s.copied += copied
        result.steps.append(s)


def replay_engine(events: Events, device_bytes: int, granule: int, steps: int,
                  policy: str = "lru", tiny_object_threshold: int | None = None) -> Result:
    """Drives the real engine through `events`; every figure is its statistics."""
    from tensorflow_lms_allocator.engine import Engine, OutOfMemoryError, set_thread_label

    total = sum(modelled_size(s, granule) for s in events.sizes)
    options = {} if tiny_object_threshold is None else {
        "tiny_object_threshold": tiny_object_threshold}
    engine = Engine(device_bytes, host_bytes=-(-max(total, granule) // granule) * granule,
                    granule_bytes=granule, policy="learned" if policy == "oracle" else policy,
                    **options)
    foresight = _Foresight(events, engine) if policy == "oracle" else None
    addresses: dict[int, int] = {}  # freed ones stay: a later unpin names its page
    pinned: dict[int, tuple[int, int]] = {}  # open pin -> (address, unit id) it pinned
    freed: set[int] = set()
    rows: list[tuple] = []
    result = Result(policy, device_bytes, True)
    last = engine.stats()
    labels = [None if op == "-" else op for op in events.ops]
    current = -1  # the op whose label is set: a new label starts a new kernel run
    try:  # events run labelled with their op, as TensorFlow's kernels do
        for i, e in enumerate(events.events):
            born = 0
            if e.op != current:
                set_thread_label(labels[e.op])
                current = e.op
            try:
                if e.kind == ALLOC:
                    address = engine.allocate(events.sizes[e.allocation], pin=e.born_pinned,
                                              writer=e.unclaimed)
                    addresses[e.allocation] = address
                    info = engine.inspect(address)
                    born = info["allocated_bytes"] if info["evicted"] else 0
                    if e.pin >= 0:
                        pinned[e.pin] = (address, info["unit_id"])
                elif e.kind == PIN:
                    address = addresses[e.allocation] + e.offset
                    pinned[e.pin] = (address, engine.pin(address))
                elif e.kind == UNPIN and e.pin in pinned:
                    engine.unpin(*pinned.pop(e.pin))
                elif e.kind == UNPIN:
                    try:
                        engine.unpin(addresses[e.allocation] + e.offset)
                    except (LookupError, RuntimeError):
                        if e.allocation not in freed:
                            raise
                        result.unmatched += 1  # its page was packed differently here
                else:
                    engine.free(addresses[e.allocation])
                    freed.add(e.allocation)
                if foresight:
                    foresight.after(i, e, addresses)
            except (OutOfMemoryError, RuntimeError, LookupError) as error:
                result.fits = False
                result.failure = (f"event {i} ({e.kind} of {events.sizes[e.allocation]:,} bytes, "
                                  f"op {events.ops[e.op]}): {error}")
                break
            now = engine.stats()
            evicted = now["bytes_reclaimed"] - last["bytes_reclaimed"]
            paged = now["bytes_paged_in"] - last["bytes_paged_in"]
            copied_out = now["bytes_copied_out"] - last["bytes_copied_out"]
            copied_in = now["bytes_copied_in"] - last["bytes_copied_in"]
            reclaims = (now["num_single_reclaims"] + now["num_full_reclaims"]
                        - last["num_single_reclaims"] - last["num_full_reclaims"])
            rows.append((evicted, born, paged, reclaims, now["bytes_in_use"],
                         copied_out + copied_in))
            if copied_out:
                result.evicted_at[i] = copied_out
            if copied_in:
                result.paged_in_at[i] = copied_in
            last = now
    finally:
        set_thread_label(None)
    rows += [(0, 0, 0, 0, 0, 0)] * (len(events.events) - len(rows))
    _fill_steps(result, step_bounds(events, steps), lambda i: rows[i])
    return result


def _uses(events: Events) -> dict[int, list[int]]:
    """Each allocation's uses (its pins, and its birth if born pinned), by event index."""
    uses: dict[int, list[int]] = {}
    for i, e in enumerate(events.events):
        if e.kind == PIN or (e.kind == ALLOC and e.born_pinned):
            uses.setdefault(e.allocation, []).append(i)
    return uses


def _next_use(uses: dict[int, list[int]], a: int, now: int) -> float:
    """The index of allocation `a`'s first use after event `now`, or infinity."""
    u = uses.get(a, [])
    k = bisect.bisect_right(u, now)
    return u[k] if k < len(u) else math.inf


class _Foresight:
    """Tells the engine each unit's true next use (replay's ``oracle``).

    A unit's next use is the soonest next pin of the live allocations on it
    (a page holds many). It changes only when one of them is allocated,
    pinned or freed, so only that unit is told again, at that event.
    """

    def __init__(self, events: Events, engine) -> None:
        self.engine = engine
        self.uses = _uses(events)
        self.unit: dict[int, int] = {}  # live allocation -> its unit's id
        self.next: dict[int, float] = {}  # live allocation -> its next use
        self.heaps: dict[int, list[tuple[float, int]]] = {}  # unit -> (next use, allocation)

    def after(self, i: int, e: Event, addresses: dict[int, int]) -> None:
        a = e.allocation
        if e.kind == FREE:
            unit = self.unit.pop(a, None)
            self.next.pop(a, None)
        elif e.kind in (ALLOC, PIN):
            if e.kind == ALLOC:
                self.unit[a] = self.engine.inspect(addresses[a])["unit_id"]
            unit = self.unit.get(a)
            self.next[a] = _next_use(self.uses, a, i)
            if unit is not None:
                heapq.heappush(self.heaps.setdefault(unit, []), (self.next[a], a))
        else:
            return
        if unit is None:
            return
        heap = self.heaps.get(unit, [])
        while heap and (self.unit.get(heap[0][1]) != unit or self.next.get(heap[0][1]) != heap[0][0]):
            heapq.heappop(heap)  # freed, moved on, or of the unit's earlier life
        if heap:  # else the unit went with its last allocation
            soonest = heap[0][0]
            self.engine.foresee(i, addresses[heap[0][1]],
                                None if soonest == math.inf else int(soonest))


def replay_belady(events: Events, device_bytes: int, granule: int, steps: int) -> Result:
    """Offline: on a shortfall, evicts the inactive allocation pinned farthest ahead."""
    sizes = [modelled_size(s, granule) for s in events.sizes]
    # What a move copies: a large allocation's requested bytes, a small
    # object's (the engine copies a page's live objects, and the gaps under a
    # 32nd of a granule between them: Note [Live bytes only]).
    copied = [s if s >= granule else m for s, m in zip(events.sizes, sizes)]
    uses = _uses(events)
    resident: set[int] = set()
    unclaimed: set[int] = set()  # Note [Writers outside kernels]: never evicted
    pins: dict[int, int] = {}
    used = live = 0
    result = Result("belady", device_bytes, True)
    rows: list[tuple] = []

    def make_room(need: int, now: int) -> tuple[int, int]:
        """Evicts until `need` bytes are free: (device bytes freed, bytes copied)."""
        nonlocal used
        freed = moved = 0
        while device_bytes - used < need:
            candidates = [a for a in resident if pins.get(a, 0) == 0 and a not in unclaimed]
            if not candidates:
                raise ReplayError("pinned and unclaimed memory exceeds the device")
            victim = max(candidates, key=lambda a: (_next_use(uses, a, now), sizes[a]))
            resident.discard(victim)
            used -= sizes[victim]
            freed += sizes[victim]
            moved += copied[victim]
        return freed, moved

    for i, e in enumerate(events.events):
        a = e.allocation
        evicted = paged = moved_out = moved_in = 0
        try:
            if e.kind == ALLOC:
                evicted, moved_out = make_room(sizes[a], i)
                resident.add(a)
                used += sizes[a]
                live += sizes[a]
                pins[a] = 1 if e.born_pinned else 0
                if e.unclaimed:
                    unclaimed.add(a)
            elif e.kind == PIN:
                unclaimed.discard(a)
                if a not in resident:
                    evicted, moved_out = make_room(sizes[a], i)
                    resident.add(a)
                    used += sizes[a]
                    paged, moved_in = sizes[a], copied[a]
                pins[a] = pins.get(a, 0) + 1
            elif e.kind == UNPIN:
                pins[a] = max(pins.get(a, 0) - 1, 0)
            else:
                if a in resident:
                    resident.discard(a)
                    used -= sizes[a]
                live -= sizes[a]
                pins.pop(a, None)
                unclaimed.discard(a)
        except ReplayError as error:
            result.fits = False
            result.failure = f"event {i} ({e.kind}, op {events.ops[e.op]}): {error}"
            break
        rows.append((evicted, 0, paged, 1 if evicted else 0, live, moved_out + moved_in))
        if moved_out:
            result.evicted_at[i] = moved_out
        if moved_in:
            result.paged_in_at[i] = moved_in
    rows += [(0, 0, 0, 0, 0, 0)] * (len(events.events) - len(rows))
    _fill_steps(result, step_bounds(events, steps), lambda i: rows[i])
    return result


def run(events: Events, device_bytes: int, policy: str = "lru", steps: int = 1,
        granule: int = 2 << 20, tiny_object_threshold: int | None = None) -> Result:
    """Replays `events` on a device of `device_bytes` (whole granules) under `policy`.

    `tiny_object_threshold` overrides the engine's (Engine's argument of that
    name: 0 packs tiny and larger small objects into the same pages).
    """
    if policy not in POLICIES:
        raise ReplayError(f"--policy {policy!r}: use one of {', '.join(POLICIES)}")
    if device_bytes < granule or device_bytes % granule:
        raise ReplayError(f"--device-mb {device_bytes / (1 << 20):g}: the device must be whole "
                          f"{granule >> 20} MiB granules (a multiple of {granule >> 20} MiB, at least "
                          f"{granule >> 20})")
    check_steps(events, steps)
    if policy == "belady":
        result = replay_belady(events, device_bytes, granule, steps)
    else:
        result = replay_engine(events, device_bytes, granule, steps, policy,
                               tiny_object_threshold)
    result.lower_bound = lower_bound(events, device_bytes, granule)
    return result


def kernels(events: Events) -> list[tuple[int, int]]:
    """(first event index, end) of each kernel: runs of consecutive events of one op."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, e in enumerate(events.events):
        if e.live_at_start:
            continue
        if start is None or e.op != events.events[start].op:
            if start is not None:
                spans.append((start, i))
            start = i
    if start is not None:
        spans.append((start, len(events.events)))
    return spans


def project(events: Events, result: Result, steps: int, link_gb_per_s: float,
            step_ms: float) -> list[float]:
    """Models each step's time on a GPU with one copy stream (see the module docstring)."""
    if not (math.isfinite(link_gb_per_s) and link_gb_per_s > 0):
        raise ReplayError(f"--link-gbps {link_gb_per_s:g}: must be a positive finite number "
                          "(GB/s)")
    if not (math.isfinite(step_ms) and step_ms > 0):
        raise ReplayError(f"--gpu-step-ms {step_ms:g}: must be a positive finite number "
                          "(milliseconds)")
    bytes_per_ms = link_gb_per_s * 1e9 / 1e3
    spans = kernels(events)
    bounds = step_bounds(events, steps)
    times = [events.events[i].time_ns for i, _ in spans] + [events.events[-1].time_ns]
    out: list[float] = []
    compute_end = link_free = previous_start = 0.0
    for step in range(steps):
        mine = [k for k, (first, _) in enumerate(spans)
                if bounds[step] <= first < bounds[step + 1]]
        recorded = np.array([max(times[k + 1] - times[k], 0) for k in mine], dtype=float)
        share = recorded / recorded.sum() if recorded.sum() > 0 else \
            np.full(len(mine), 1 / max(len(mine), 1))
        step_start = compute_end
        for k, d in zip(mine, share * step_ms):
            first, end = spans[k]
            evict = sum(result.evicted_at.get(i, 0) for i in range(first, end))
            page = sum(result.paged_in_at.get(i, 0) for i in range(first, end))
            ready = previous_start
            if evict:
                link_free = max(ready, link_free) + evict / bytes_per_ms
                ready = link_free
            if page:
                link_free = max(ready, link_free) + page / bytes_per_ms
                ready = link_free
            start = max(compute_end, ready if (evict or page) else 0.0)
            compute_end = start + d
            previous_start = start
        out.append(compute_end - step_start)
    for s, ms in zip(result.steps, out):
        s.projected_ms = ms
    return out


def find_min_device(events: Events, policy: str, steps: int, link_gb_per_s: float,
                    step_ms: float, max_overhead_pct: float, granule: int = 2 << 20,
                    progress: Callable[[str], None] = print) -> tuple[int, Result]:
    """The smallest device (whole granules) whose projected overhead stays within
    `max_overhead_pct` of `step_ms`, by bisection; returns (bytes, its Result)."""
    if not (math.isfinite(max_overhead_pct) and max_overhead_pct >= 0):
        raise ReplayError(f"--max-overhead-pct {max_overhead_pct:g}: must be a finite number, "
                          "at least 0 (percent)")

    def overhead(result: Result) -> float:
        projected = project(events, result, steps, link_gb_per_s, step_ms)
        return 100 * (max(projected) - step_ms) / step_ms

    def ok(granules: int) -> tuple[bool, Result]:
        result = run(events, granules * granule, policy, steps, granule)
        pct = overhead(result) if result.fits else math.inf
        good = pct <= max_overhead_pct
        progress(f"  {granules * granule >> 20:>6} MiB: "
                 + (f"overhead {pct:6.1f}%" if result.fits else "does not fit")
                 + (" ok" if good else ""))
        return good, result

    # Start from the modelled peak (no swapping needed, unless the engine's
    # pages of small objects need more), doubling until it meets the limit.
    peak = lower_bound(events, 0, granule)
    total = max(-(-sum(modelled_size(s, granule) for s in events.sizes) // granule), 1)
    hi = min(max(-(-peak // granule), 1), total)
    good, best = ok(hi)
    while not good and hi < total:
        hi = min(hi * 2, total)
        good, best = ok(hi)
    if not good:
        raise ReplayError(f"even {hi * granule >> 20} MiB (every allocation resident) does "
                          f"not meet {max_overhead_pct:g}%")
    lo = 0  # lo never meets the limit, hi always does
    while hi - lo > 1:
        mid = (lo + hi) // 2
        good, result = ok(mid)
        if good:
            hi, best = mid, result
        else:
            lo = mid
    return hi * granule, best
