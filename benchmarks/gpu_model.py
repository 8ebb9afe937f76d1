#!/usr/bin/env python3
"""The engine on a modeled GPU: `make bench-gpu-model`.

Recorded TensorFlow steps replayed through the real engine over the CUDA
backend, on the fake CUDA driver with its timing model on (Note [Timing model]
in tests/fake_cuda/timing.h): every driver call costs the host what it cost
on our H200 (or H100), copies run on their own engines at the measured
pinned rate, and each kernel of the trace is a kernel of a stated duration on
the compute stream, which the engine fences as TensorFlow's. Nothing here
runs on a GPU: the figures are the model's, on the modeled clock (threads'
timing moves them a few percent from run to run).

1. Calibration: the bandwidth step of `make gpu-check-engine` (16 tensors of
   64 MiB evicted, then paged in, on a 4 GiB device) on the model, beside what
   the H200 measured with the same code's protocol; the model must reproduce
   it before its other figures mean anything.
2. Overlap: gpu-check-engine's overlap step (kernels of a known duration on
   a fenced stream, each pinning a tensor paged in for it while another is
   evicted) on the h100 preset, its kernels as long as the H100's were,
   beside the H100's step / max(compute, transfers).
3. Steps: ResNet-50, DenseNet121 and the Transformer of benchmarks/policy.py,
   recorded on the emulated device (3 steps), replayed at 1/2 and 1/4 of
   their peak and uncapped, under the learned policy. A kernel's duration is
   its recorded time on this machine's CPU over --gpu-speedup (100: an
   H100 running the same fp32 kernels 100 times faster than two cores); a
   launch costs the host 5 us, as every event call costs 2 (assumed). TensorFlow's own host
   time per op is not modeled (the host issues kernels as fast as the
   driver takes them), nor is the engine's own CPU time. The CUDA
   backend's unmap thread (Note [Unmaps on a thread of their own] in
   cc/backends/unmap_thread.h) charges clock 3, from the launching thread's
   time when it makes each call: its unmaps are in `remaps` and `host busy`,
   and the launching thread's waits for the driver behind them are in `drv
   wait`.

--prefetch USES pages in, after each launch, what the learned policy predicts
within USES uses (Engine::Prefetch, as TF_LMS_PREFETCH's helper thread does
after each kernel starts, lookahead 8), on the launching thread: its driver
calls are charged to the thread that launches the kernels
(docs/decisions/0003-prefetch-off-by-default.md). `--helper prefetch` makes
the same prefetch on a helper thread of its own.

--helper gives the engine a helper thread on a modeled clock of its own
(Helper): notified after each launch, it prefetches (`prefetch`), evicts
until 1/--ahead of the device is free (`evict-ahead`, Engine::EvictAhead),
or does both, the prefetch into the room (`both`).
The driver takes one VMM call at a time from either thread. By default the
helper holds the engine's lock for its whole call, as the engine does today;
--unlocked lets the launching thread go on meanwhile, waiting only for the
driver: the most that remaps outside the engine's lock could give. With a
helper, `remaps`, `host busy` and `host wait` count both threads' calls, the
floors mean nothing, and two more columns give the helper's time and its VMM
calls' (`remaps` less this and the unmap thread's is the launching thread's).

Two bounds, for what a helper that predicts perfectly could give (issue 52;
docs/decisions/0019-perfect-predictions-on-the-gpu-model.md):
--allocate-ahead charges every allocation's driver calls to a clock of their
own (2), as if a helper had mapped its memory ahead at the address it takes:
the launching thread never waits for them, though the driver still takes
them one at a time among the others. --foresee LAUNCHES makes the helper's
prefetch page in what the next LAUNCHES launches pin, read from the trace,
instead of what the learned policy predicts (a pin and an unpin each: such a
page-in evicts to make room, as a kernel's would). --free-vmm asks what a
step would take if some VMM calls cost nothing (fake_cuda_timing_free_vmm):
every one on device memory (`device`) or host memory (`host`), or host
memory's maps, grants and unmaps (`host-maps`: evicted tensors' host
mappings at their addresses) or its creates and releases (`host-creates`),
or every unmap (`unmaps`: the most unmaps made on a thread of their own,
outside the engine's lock, could give; they would still hold the driver).

The driver refuses to map a sub-range of a handle at an offset, as driver
580 did on an H100 (benchmarks/results/gpu-check-engine-h100-overlap.log):
device memory is then mapped a 2 MiB handle at a time and host runs whole.
--map-at-offsets models a driver that takes offsets (device memory in runs,
docs/decisions/0012-device-memory-in-runs.md).

Per case and step after the first: the step (the host's clock from the
step's first call until the compute stream has drained), compute (kernel
time), transfers (each copy engine's busy time), remaps (the host's time in
cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemCreate and cuMemRelease), GPU idle
(step - compute) and the part of it between kernels by what the next kernel
waited for: `copies` (its stream held by an event: LMS's copies) or `host`
(not launched yet: the host busy in driver calls, or waiting), host busy (the
host's time in every driver call: remaps, launches, events), host waits (the
host's time blocked before the step's end), `floor 1` and `floor N` (the
shortest step the same driver calls allow with one host thread making them
all, and with the VMM calls on threads of their own beside the launches,
which the driver still serialises: host_floors) and `gpu_step_vs_ideal` = step /
max(the same step without LMS, either copy engine's busy time): the step over
the least that the model's kernels and copies need (the step without LMS is
the kernels' time, or the launches' where the kernels are shorter than a
launch). The host's driver time for remaps is not in that floor: it is what
LMS adds, so it counts against it. `drv wait`: the VMM calls' waits for
the driver to end another thread's (the unmap thread's, a helper's; the
driver takes one at a time). `uncapped` also runs the same kernels with
no engine at all (LMS off): `lms_on_vs_off_uncapped` is on over off. The last
line is the worst case's `gpu_step_vs_ideal R`.

Example:
    make bench-gpu-model
    .venv/bin/python benchmarks/gpu_model.py --models transformer --preset h100
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MIB = 1 << 20
GIB = 1 << 30
MODELS = ("resnet50", "densenet121", "transformer")
# The H200's bandwidth step with host memory in runs (benchmarks/results/
# gpu-check-engine-h200-host-runs.log, "AFTER", best of 3): GB/s.
LOGGED = {"h200": (46.8, 40.7)}
# The H100's overlap step, 64 MiB tensors and 2 MiB granules, four runs on two
# machines (benchmarks/results/gpu-check-engine-h100-overlap.log): the first
# run's compute alone a kernel (ms), and per duration the range of step /
# max(compute, transfers) over the runs; transfers alone a step (ms), the range.
LOGGED_OVERLAP_KERNEL_MS = (104.6 / 64, 201.1 / 64, 394.0 / 64)
LOGGED_OVERLAP_VS_IDEAL = ((0.96, 1.09), (1.05, 1.11), (1.07, 1.09))
LOGGED_OVERLAP_TRANSFERS_MS = (167.5, 216.5)


class FakeTiming(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in (
        "host_now_ns", "compute_busy_ns", "copy_to_host_busy_ns", "copy_to_device_busy_ns",
        "copy_on_device_busy_ns", "host_remap_ns", "host_create_ns", "host_stream_ns",
        "host_work_ns", "host_wait_ns", "host_waits", "compute_idle_host_ns",
        "compute_idle_stream_ns", "driver_wait_ns")]


class FakeRange(ctypes.Structure):
    _fields_ = [("address", ctypes.c_ulonglong), ("bytes", ctypes.c_size_t),
                ("writes", ctypes.c_int)]


class FakeDriver:
    """The fake CUDA driver the engine loaded (the same instance: dlopen of one path)."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        self.lib.fake_cuda_timing_enable.argtypes = [ctypes.c_char_p]
        self.lib.fake_cuda_launch_kernel_for.argtypes = [
            ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.POINTER(FakeRange), ctypes.c_size_t]
        self.lib.fake_cuda_timing_use_clock.argtypes = [ctypes.c_int, ctypes.c_ulonglong]
        self.lib.fake_cuda_timing_clock.argtypes = [ctypes.c_int]
        self.lib.fake_cuda_timing_clock.restype = ctypes.c_ulonglong
        self.lib.fake_cuda_violations.restype = ctypes.c_void_p
        self.lib.fake_cuda_violation_count.restype = ctypes.c_size_t
        gpa = self.lib.cuGetProcAddress_v2
        gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                        ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
        self._gpa = gpa

    def call(self, name: str, *args: object) -> None:
        """Calls driver function `name` (every argument pointer-sized: handles, ints,
        pointers), raising on a CUresult other than CUDA_SUCCESS."""
        pfn = ctypes.c_void_p()
        status = ctypes.c_int()
        if self._gpa(name.encode(), ctypes.byref(pfn), 12000, 0, ctypes.byref(status)) != 0:
            raise RuntimeError(f"the fake driver has no {name}")
        fn = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * len(args))(pfn.value)
        r = fn(*[ctypes.cast(a, ctypes.c_void_p) if isinstance(a, ctypes._Pointer) else a
                 for a in args])
        if r != 0:
            raise RuntimeError(f"{name} failed: CUresult {r}")

    def stream(self) -> int:
        """A non-blocking stream in device 0's primary context, made current here."""
        device, context, stream = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
        self.call("cuInit", 0)
        self.call("cuDeviceGet", ctypes.pointer(device), 0)
        self.call("cuDevicePrimaryCtxRetain", ctypes.pointer(context), device.value)
        self.call("cuCtxSetCurrent", context.value)
        self.call("cuStreamCreate", ctypes.pointer(stream), 1)
        return stream.value

    def synchronize(self, stream: int) -> None:
        self.call("cuStreamSynchronize", stream)

    def enable(self, preset: str) -> None:
        if self.lib.fake_cuda_timing_enable(preset.encode()) != 0:
            raise SystemExit(f"--preset {preset}: not a preset of the fake driver (h200, h100)")

    def use_clock(self, clock: int, not_before_ns: int = 0) -> None:
        """This thread's later driver calls charge modeled thread `clock` (0: the one
        that launches kernels), moved first to `not_before_ns` if that is later."""
        if self.lib.fake_cuda_timing_use_clock(clock, not_before_ns) != 0:
            raise ValueError(f"clock {clock}: the fake driver models clocks 0-3")

    def clock(self, clock: int) -> int:
        return int(self.lib.fake_cuda_timing_clock(clock))

    def other_threads_clock(self, clock: int) -> None:
        """Threads that never chose a clock (the CUDA backend's unmap thread) charge
        `clock`, each call no sooner than clock 0's time then."""
        if self.lib.fake_cuda_timing_other_threads_clock(clock) != 0:
            raise ValueError(f"clock {clock}: the fake driver models clocks 0-3")

    def totals(self) -> FakeTiming:
        t = FakeTiming()
        self.lib.fake_cuda_timing_totals(ctypes.byref(t))
        return t

    def kernel(self, stream: int, ns: int, ranges: list[tuple[int, int]]) -> None:
        array = (FakeRange * max(len(ranges), 1))(*[FakeRange(a, b, 1) for a, b in ranges])
        r = self.lib.fake_cuda_launch_kernel_for(stream, ns, None, None, array, len(ranges))
        if r != 0:
            raise RuntimeError(f"fake_cuda_launch_kernel_for failed: CUresult {r}")

    def violations(self) -> int:
        return int(self.lib.fake_cuda_violation_count())

    def free_vmm(self, calls: str | None) -> None:
        """The model's what-if: these VMM calls cost nothing: "device" (every one on
        device memory), "host" (on host memory), "host-maps" (maps, grants and
        unmaps of host memory), "host-creates" (its creates and releases), "unmaps"
        (every unmap); None: every call as the preset says. Until the next enable."""
        self.lib.fake_cuda_timing_free_vmm(
            {None: 0, "device": 1, "host": 6, "host-maps": 2, "host-creates": 4,
             "unmaps": 8}[calls])

    def map_at_offsets(self, maps: bool) -> None:
        """Whether cuMemMap takes a nonzero offset into a handle (for engines made
        after this call: the backend asks once, at creation)."""
        self.lib.fake_cuda_set_map_offset_zero_only(0 if maps else 1)


class FakeLauncher:
    """gpu-check-engine's overlap step (tests/gpu/check_engine.py) on the timing
    model: each kernel one of the stated duration declaring its tensor; the
    bytes are the engine's pattern, which the kernels leave as they are."""

    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver
        self.stream = driver.stream()

    def fill(self, engine: object, address: int, size: int, seed: int) -> None:
        engine.fill_pattern(address, size, seed)

    def kernel(self, address: int, size: int, old: int, seed: int, ns: float) -> int:
        self.driver.kernel(self.stream, int(ns), [(address, size)])
        return old

    def finish(self) -> None:
        self.driver.synchronize(self.stream)

    def clock(self, engine: object) -> tuple[float, float, float]:
        t = self.driver.totals()
        return (t.host_now_ns / 1e9, t.host_wait_ns / 1e9,
                (t.host_remap_ns + t.host_create_ns) / 1e9)

    def wrong(self, engine: object, address: int, size: int, seed: int) -> int:
        return int(engine.verify_pattern(address, size, seed) != -1)

    def close(self) -> None:
        self.driver.call("cuStreamDestroy", self.stream)


def delta(a: FakeTiming, b: FakeTiming) -> dict[str, int]:
    return {name: getattr(b, name) - getattr(a, name) for name, _ in FakeTiming._fields_}


def overlap_beside_the_gpu(driver: FakeDriver, lms: object, unmap_evicted: bool = False) -> None:
    """gpu-check-engine's overlap step on the h100 preset, its kernels as long as
    the H100's were, beside what the H100 measured. With `unmap_evicted`, also
    its `overlap unmapped` step, which no GPU has run yet: the model's
    prediction alone."""
    sys.path.insert(0, str(ROOT / "tests/gpu"))
    import check_engine  # noqa: E402

    driver.enable("h100")
    check = check_engine.Check(" on the model (h100)")
    launcher = FakeLauncher(driver)
    kernel_ns = [ms * 1e6 for ms in LOGGED_OVERLAP_KERNEL_MS]
    try:
        rows = check_engine.overlap(check, lms, check_engine.GPU_SIZES, launcher, kernel_ns)
        unmapped = (check_engine.overlap(check, lms, check_engine.GPU_SIZES, launcher,
                                         kernel_ns, unmap_evicted=True)
                    if unmap_evicted else [])
    finally:
        launcher.close()
    low, high = LOGGED_OVERLAP_TRANSFERS_MS
    print(f"== Overlap step: transfers alone {rows[0]['transfers_ms']:.1f} ms a step on the "
          f"model, {low}-{high} on the H100; step / max(compute, transfers), model vs H100: " +
          ", ".join(f"kernels of {row['kernel_ms']:.2f} ms {row['vs_ideal']:.2f} vs "
                    f"{lo:.2f}-{hi:.2f}"
                    for row, (lo, hi) in zip(rows, LOGGED_OVERLAP_VS_IDEAL)), flush=True)
    if unmapped:
        print(f"== Overlap step with evicted tensors unmapped, the model's prediction (no GPU "
              f"has run it): transfers alone {unmapped[0]['transfers_ms']:.1f} ms a step; "
              "step / max(compute, transfers): " +
              ", ".join(f"kernels of {row['kernel_ms']:.2f} ms {row['vs_ideal']:.2f}"
                        for row in unmapped), flush=True)


def calibrate(driver: FakeDriver, lms: object, tensor: int = 64 * MIB,
              host_ahead: int = 0) -> dict[str, float]:
    """gpu-check-engine's bandwidth step on the model: 1 GiB of `tensor`-byte
    tensors on a 4 GiB device evicted, then paged in, three rounds, with
    `host_ahead` bytes of host memory made at the engine's creation. GB/s:
    the first round's eviction (`first_out`, the one that makes host memory
    made at eviction), the best round's each way, and the first round's
    eviction over its copies alone (`first_out_vs_copy`)."""
    device = 4 * GIB
    engine = lms.Engine(device, host_bytes=device, granule_bytes=2 * MIB, backend="cuda",
                        policy="lru", host_ahead_bytes=host_ahead)
    tensors = [engine.allocate(tensor) for _ in range(device // 4 // tensor)]
    for i, address in enumerate(tensors):
        engine.fill_pattern(address, tensor, 100 + i)
    total = len(tensors) * tensor
    result = {"best_out": 0.0, "best_in": 0.0}
    for round_ in range(3):
        before = driver.totals()
        for address in tensors:
            engine.evict(address)
        engine.wait_for_copies()
        middle = driver.totals()
        for address in tensors:
            engine.unpin(address, engine.pin(address))
        engine.wait_for_copies()
        end = driver.totals().host_now_ns
        out = total / (middle.host_now_ns - before.host_now_ns)
        if round_ == 0:
            result["first_out"] = out
            copying = middle.copy_to_host_busy_ns - before.copy_to_host_busy_ns
            result["first_out_vs_copy"] = copying / (middle.host_now_ns - before.host_now_ns)
        result["best_out"] = max(result["best_out"], out)
        result["best_in"] = max(result["best_in"], total / (end - middle.host_now_ns))
    bad = [i for i, a in enumerate(tensors) if engine.verify_pattern(a, tensor, 100 + i) != -1]
    if bad:
        raise SystemExit(f"calibration: tensors {bad} lost bytes")
    for address in tensors:
        engine.free(address)
    del engine
    return result


@dataclass
class Case:
    model: str
    label: str
    device_mib: int
    steps: list[dict[str, float]] = field(default_factory=list)
    failure: str = ""


@dataclass
class Helper:
    """A helper thread of the engine on a modeled clock of its own (clock 1).

    After each launch it is notified, as TF_LMS_PREFETCH's thread is at each
    kernel's start, and calls `what`: "prefetch" (Engine::Prefetch, `uses`
    ahead), "evict-ahead" (Engine::EvictAhead of `room` bytes) or "both" (the
    room, then the prefetch into it: every move made ahead). It starts at
    the launching thread's clock; a notify that finds it still busy on its
    clock is dropped (the next one runs it). The driver takes one VMM call at
    a time from either clock (Note [Timing model]). `locked`: the helper holds
    the engine's lock for its whole call, as both calls do today, so the
    launching thread's next engine call starts after it ends; unlocked, the
    launching thread waits only for the driver: what remaps outside the
    engine's lock (issue 52, item 2) would allow at most. `allocate_ahead`
    and `foresee`: the bounds of perfect predictions (the module's doc).
    """

    what: str
    uses: int = 8
    room: int = 0
    locked: bool = True
    allocate_ahead: bool = False  # allocations' calls on clock 2 (made ahead)
    foresee: int = 0  # prefetch: what the next this many launches pin, from the trace
    busy_ns: int = 0  # the helper's calls, from start to end
    vmm_ns: int = 0  # the helper's VMM calls
    lock_free_ns: int = 0  # when the launching thread may next take the lock

    def notify(self, driver: "FakeDriver", engine: object,
               upcoming: Sequence[int] = ()) -> None:
        now = driver.clock(0)
        if driver.clock(1) > now:
            return
        before = driver.totals()
        driver.use_clock(1, now)
        if self.what in ("evict-ahead", "both"):
            engine.evict_ahead(self.room)
        if self.what in ("prefetch", "both") and not self.foresee:
            engine.prefetch(self.uses)
        elif self.what in ("prefetch", "both"):
            for address in upcoming:  # what the next launches pin
                if engine.inspect(address)["evicted"]:
                    engine.unpin(address, engine.pin(address))
        end = driver.clock(1)
        driver.use_clock(0)
        after = driver.totals()
        self.busy_ns += end - now
        self.vmm_ns += (after.host_remap_ns + after.host_create_ns
                        - before.host_remap_ns - before.host_create_ns)
        if self.locked:
            self.lock_free_ns = end

    def allocate(self, driver: "FakeDriver", engine: object, size: int, **kw: bool) -> int:
        """engine.allocate on the launching thread; with allocate_ahead, its
        driver calls on clock 2 from the launching thread's now, clock 0 unmoved."""
        if not self.allocate_ahead:
            return engine.allocate(size, **kw)
        driver.use_clock(2, driver.clock(0))
        try:
            return engine.allocate(size, **kw)
        finally:
            driver.use_clock(0)

    def take_lock(self, driver: "FakeDriver") -> None:
        """Before the launching thread's engine call: the lock once the helper let go."""
        if self.lock_free_ns:
            driver.use_clock(0, self.lock_free_ns)
            self.lock_free_ns = 0


def replay_timed(driver: FakeDriver, lms: object | None, events: object, device: int,
                 steps: int, speedup: float, prefetch: int = 0,
                 helper: Helper | None = None,
                 host_ahead: int = 0, unmap_evicted: bool = False) -> list[dict[str, float]]:
    """Replays `events` through an engine of `device` bytes (None: no engine, LMS off),
    each kernel a timed kernel on a fenced stream; per-step figures (ns). The
    engine makes `host_ahead` bytes of host memory ahead, as TensorFlow's does
    (TF_LMS_HOST_AHEAD_MB), where the driver maps at an offset, and with
    `unmap_evicted` leaves evicted tensors' addresses unmapped. With
    `prefetch`, the engine prefetches that many uses ahead after each launch, on
    the launching thread; with `helper`, the helper does its work after each
    launch on a clock of its own."""
    from tensorflow_lms_allocator import replay

    stream = driver.stream()
    engine = None
    if lms is not None:
        total = sum(replay.modelled_size(s, 2 * MIB) for s in events.sizes)
        engine = lms.Engine(device, host_bytes=max(total, 2 * MIB), granule_bytes=2 * MIB,
                            backend="cuda", policy="learned", host_ahead_bytes=host_ahead,
                            unmap_evicted=unmap_evicted)
        engine.add_fenced_stream(stream)
    spans = replay.kernels(events)
    bounds = replay.step_bounds(events, steps)
    times = [events.events[i].time_ns for i, _ in spans] + [events.events[-1].time_ns]
    addresses: dict[int, int] = {}
    fake_next = [1 << 40]  # LMS off: addresses of our own, never touched
    pinned: dict[int, tuple[int, int]] = {}
    out: list[dict[str, float]] = []
    labels = [None if op == "-" else op for op in events.ops]

    def run(i: int, touched: list[tuple[int, int]] | None) -> None:
        """Event i through the engine; what a kernel pins is added to `touched`."""
        e = events.events[i]
        size = events.sizes[e.allocation]
        if helper is not None:
            helper.take_lock(driver)
        if e.kind == replay.ALLOC:
            if engine is None:
                addresses[e.allocation] = fake_next[0]
                fake_next[0] += size
                return
            how = {"pin": e.born_pinned, "writer": e.unclaimed}
            address = (helper.allocate(driver, engine, size, **how) if helper is not None
                       else engine.allocate(size, **how))
            addresses[e.allocation] = address
            if e.pin >= 0:
                pinned[e.pin] = (address, engine.inspect(address)["unit_id"])
                if touched is not None:
                    touched.append((address, size))
        elif engine is None:
            return
        elif e.kind == replay.PIN:
            address = addresses[e.allocation] + e.offset
            pinned[e.pin] = (address, engine.pin(address))
            if touched is not None:
                touched.append((addresses[e.allocation], size))
        elif e.kind == replay.UNPIN and e.pin in pinned:
            engine.unpin(*pinned.pop(e.pin))
        elif e.kind == replay.FREE:
            engine.free(addresses[e.allocation])

    # What the trace holds before its first kernel (live at its start).
    for i, e in enumerate(events.events):
        if e.live_at_start:
            run(i, None)
    # Per launch of the step: the kernel's duration and the host's driver
    # time before it, the VMM calls' apart (host_floors).
    launches: list[tuple[int, int, int]] = []

    def launch(duration: int, touched: list[tuple[int, int]]) -> None:
        driver.kernel(stream, duration, touched if engine is not None else [])
        t = driver.totals()
        launches.append((duration, t.host_remap_ns + t.host_create_ns, t.host_stream_ns))

    def upcoming(k: int) -> list[int]:
        """The addresses the next helper.foresee launches after span k pin, allocated now."""
        out: list[int] = []
        for first, end in spans[k + 1:k + 1 + helper.foresee]:
            for i in range(first, end):
                e = events.events[i]
                if e.kind == replay.PIN and e.allocation in addresses:
                    out.append(addresses[e.allocation])
        return out

    def after_launch(k: int) -> None:
        if engine is None:
            return
        if prefetch:
            engine.prefetch(prefetch)
        if helper is not None:
            helper.notify(driver, engine, upcoming(k) if helper.foresee else ())

    k = 0
    for step in range(steps):
        before = driver.totals()
        helper_before = (helper.busy_ns, helper.vmm_ns) if helper is not None else (0, 0)
        launches.clear()
        compute = 0
        while k < len(spans) and spans[k][0] < bounds[step + 1]:
            first, end = spans[k]
            duration = int(max(times[k + 1] - times[k], 0) / speedup)
            touched: list[tuple[int, int]] = []
            launched = False
            if engine is not None:
                lms.set_thread_label(labels[events.events[first].op])
            for i in range(first, end):
                if events.events[i].live_at_start:
                    continue
                if events.events[i].kind == replay.UNPIN and not launched:
                    # Enqueued while its inputs and outputs are pinned, as a
                    # kernel's Compute enqueues its work.
                    launch(duration, touched)
                    compute += duration
                    launched = True
                    after_launch(k)
                run(i, touched)
            if not launched:
                launch(duration, touched)
                compute += duration
                after_launch(k)
            k += 1
        queued = driver.totals()  # before the step's end waits for the GPU
        driver.synchronize(stream)
        d = delta(before, driver.totals())
        d["host_wait_ns"] = queued.host_wait_ns - before.host_wait_ns
        d["kernel_ns"] = compute
        d["helper_ns"] = helper.busy_ns - helper_before[0] if helper is not None else 0
        d["helper_vmm_ns"] = helper.vmm_ns - helper_before[1] if helper is not None else 0
        d.update(host_floors(launches, before.host_remap_ns + before.host_create_ns,
                             before.host_stream_ns))
        out.append(d)
    if engine is not None:
        lms.set_thread_label(None)
        engine.remove_fenced_stream(stream)
        del engine
    driver.call("cuStreamDestroy", stream)
    return out


def host_floors(launches: Sequence[tuple[int, int, int]], vmm_at_start: int,
                stream_at_start: int) -> dict[str, int]:
    """The shortest steps the same driver calls allow, whatever the threads.

    `launches`: per kernel in launch order, (its duration, the host's time in
    VMM calls (remaps, cuMemCreate, cuMemRelease) before its launch, the
    host's time in the other driver calls (launches, events) before it),
    cumulative as driver totals are. The GPU runs the kernels one at a time,
    kernel k no sooner than the host has made every call before its launch,
    and the host never waits (copies are left out: a lower bound):
    end_k = max(end_(k-1), host_k) + duration_k.
      - `floor_one_thread_ns`: host_k = VMM + other calls, one thread making
        them all in turn (as the model does without --helper).
      - `floor_any_threads_ns`: host_k = max(VMM, other calls): the VMM calls
        on threads of their own, overlapping the launches; the driver
        serialises VMM calls (remapping from several threads is no faster:
        our H200 runs, docs/gpu.md), so no threading of the same calls does
        better. What remaps outside the engine's lock and helper threads
        could win at most is the step over this floor.

    Example:
        >>> host_floors([(10, 0, 5), (10, 30, 10)], 0, 0)
        {'floor_one_thread_ns': 50, 'floor_any_threads_ns': 40}
    """
    one = anywhere = 0
    for duration, vmm, other in launches:
        v, o = vmm - vmm_at_start, other - stream_at_start
        one = max(one, v + o) + duration
        anywhere = max(anywhere, max(v, o)) + duration
    return {"floor_one_thread_ns": one, "floor_any_threads_ns": anywhere}


def figures(d: dict[str, float], off_step: float) -> dict[str, float]:
    """A step's figures (ns) and its ratio to the ideal: the step without LMS or
    either copy engine's busy time, whichever is longer."""
    step = d["host_now_ns"]
    compute = d["compute_busy_ns"]
    ideal = max(off_step, d["copy_to_host_busy_ns"], d["copy_to_device_busy_ns"])
    return {"step": step, "compute": compute, "to_host": d["copy_to_host_busy_ns"],
            "to_device": d["copy_to_device_busy_ns"],
            "remaps": d["host_remap_ns"] + d["host_create_ns"],
            "host_busy": d["host_remap_ns"] + d["host_create_ns"] + d["host_stream_ns"],
            "idle": max(step - compute, 0), "idle_copies": d["compute_idle_stream_ns"],
            "idle_host": d["compute_idle_host_ns"], "waits": d["host_wait_ns"],
            "floor_one": d["floor_one_thread_ns"], "floor_any": d["floor_any_threads_ns"],
            "helper": d["helper_ns"], "helper_vmm": d["helper_vmm_ns"],
            "driver_waits": d["driver_wait_ns"],
            "ideal": ideal, "ratio": step / ideal if ideal else 1.0}


def record(models: Sequence[str], directory: Path, steps: int, timeout: float) -> None:
    sys.path.insert(0, str(HERE))
    import policy  # noqa: E402  (benchmarks/policy.py: the models and their recording)

    for name in models:
        path = directory / f"{name}.lmstrace"
        if path.exists():
            print(f"using {path}", flush=True)
            continue
        print(f"recording {name} ({steps} steps on the emulated device)", flush=True)
        policy.run_child(["record", name, str(path), str(steps)],
                         policy.subprocess_env(policy.ROOMY_MB, True, "lru"),
                         f"record {name}", timeout)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--preset", default="h200", choices=("h200", "h100"))
    p.add_argument("--gpu-speedup", type=float, default=100.0,
                   help="a kernel's recorded CPU time over this is its GPU time")
    p.add_argument("--traces", type=Path, default=None,
                   help="a folder of MODEL.lmstrace to use (recorded there if missing)")
    p.add_argument("--map-at-offsets", action="store_true",
                   help="model a driver that maps a sub-range of a handle at an offset "
                        "(driver 580 refused it on an H100): device memory in runs")
    p.add_argument("--prefetch", type=int, default=0, metavar="USES",
                   help="after each launch, page in what the learned policy predicts "
                        "within USES uses (the adapter's prefetcher asks 8; 0: off)")
    p.add_argument("--helper", choices=("prefetch", "evict-ahead", "both"), default=None,
                   help="a helper thread on a clock of its own, notified after each launch: "
                        "prefetch (--prefetch USES ahead, 8 if 0), evict-ahead (keep "
                        "1/--ahead of the device free) or both")
    p.add_argument("--ahead", type=int, default=16, metavar="N",
                   help="evict-ahead keeps 1/N of the device free (default 16)")
    p.add_argument("--unlocked", action="store_true",
                   help="the helper's calls do not hold the engine's lock: the launching "
                        "thread waits only for the driver (what remaps outside the lock "
                        "would allow at most)")
    p.add_argument("--allocate-ahead", action="store_true",
                   help="every allocation's driver calls on a clock of their own, as if "
                        "made ahead (the most mapping ahead could give)")
    p.add_argument("--foresee", type=int, default=0, metavar="LAUNCHES",
                   help="the helper's prefetch pages in what the next LAUNCHES launches "
                        "pin, read from the trace (a perfect prediction)")
    p.add_argument("--free-vmm",
                   choices=("device", "host", "host-maps", "host-creates", "unmaps"),
                   default=None,
                   help="a what-if of the model: these VMM calls cost nothing (every one on "
                        "device or host memory, host memory's maps or creates alone, or every "
                        "unmap); the calibration lines then mean nothing")
    p.add_argument("--unmap-evicted", action="store_true",
                   help="evicted tensors leave their addresses unmapped, their host memory "
                        "reached only by their page-in's copy (Note [Evicted tensors "
                        "unmapped]): no host map at an eviction, no unmap at a page-in")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, metavar="STEPS",
                   help="the first STEPS steps are not counted (default 1; the host pool "
                        "still grows in the second step: record --steps 8 for a steady "
                        "state)")
    p.add_argument("--timeout", type=float, default=1800)
    args = p.parse_args(argv)
    if args.ahead < 1:
        p.error(f"--ahead {args.ahead}: at least 1 (1/N of the device)")
    if args.unlocked and args.helper is None:
        p.error("--unlocked models the helper's lock: name a --helper")
    if args.allocate_ahead and args.helper is None:
        p.error("--allocate-ahead models a helper's maps ahead: name a --helper")
    if args.foresee < 0:
        p.error(f"--foresee {args.foresee}: a number of launches, 0 or more")
    if args.foresee and args.helper not in ("prefetch", "both"):
        p.error("--foresee replaces the helper's prefetch: --helper prefetch or both")
    if not (args.gpu_speedup > 0):
        p.error(f"--gpu-speedup {args.gpu_speedup}: must be positive")
    if not 1 <= args.warmup < args.steps:
        p.error(f"--warmup {args.warmup} with --steps {args.steps}: at least 1, and fewer "
                "than the steps (the first is not counted)")
    driver_path = os.environ.get("TF_LMS_CUDA_DRIVER_PATH", "")
    if not driver_path or not Path(driver_path).exists():
        raise SystemExit("set TF_LMS_CUDA_DRIVER_PATH to build/fake_cuda/libfakecuda.so "
                         "(make bench-gpu-model does)")
    sys.path.insert(0, str(ROOT))
    import tensorflow_lms_allocator.engine as lms  # noqa: E402
    from tensorflow_lms_allocator import replay, trace  # noqa: E402

    driver = FakeDriver(driver_path)
    driver.map_at_offsets(args.map_at_offsets)
    overlap_beside_the_gpu(driver, lms, args.unmap_evicted)
    driver.enable(args.preset)
    driver.free_vmm(args.free_vmm)
    # This thread launches (clock 0); the backend's unmap thread is clock 3.
    driver.use_clock(0)
    driver.other_threads_clock(3)
    from tensorflow_lms_allocator import _engine  # noqa: E402

    ahead_mib = int({name: default for name, default, _ in _engine.settings_table()}[
        "TF_LMS_HOST_AHEAD_MB"])
    # Each size with host memory made at eviction and made ahead (Note [Host
    # memory made ahead] in engine.h); the calibration is the 64 MiB run made
    # at eviction, as gpu-check-engine's bandwidth step makes it.
    runs = {(tensor, ahead): calibrate(driver, lms, tensor, ahead * MIB)
            for tensor in (64 * MIB, 8 * MIB) for ahead in (0, ahead_mib)}
    out_gbs, in_gbs = runs[(64 * MIB, 0)]["best_out"], runs[(64 * MIB, 0)]["best_in"]
    logged = LOGGED.get(args.preset)
    print(f"== Calibration ({args.preset}): 16 tensors of 64 MiB, evict {out_gbs:.1f} GB/s, "
          f"page-in {in_gbs:.1f} GB/s" +
          (f"; measured on the GPU {logged[0]} / {logged[1]} GB/s "
           f"(model/measured {out_gbs / logged[0]:.2f} / {in_gbs / logged[1]:.2f})"
           if logged else ""), flush=True)
    worst_first = 1.0
    for tensor in (64 * MIB, 8 * MIB):
        made, ahead = runs[(tensor, 0)], runs[(tensor, ahead_mib)]
        print(f"== First eviction, {tensor // MIB} MiB tensors: {ahead['first_out']:.1f} GB/s "
              f"({ahead['first_out_vs_copy']:.2f} of its copies) with "
              f"TF_LMS_HOST_AHEAD_MB={ahead_mib}, "
              f"{made['first_out']:.1f} GB/s ({made['first_out_vs_copy']:.2f}) with 0",
              flush=True)
        worst_first = min(worst_first, ahead["first_out_vs_copy"])

    with tempfile.TemporaryDirectory() as tmp:
        directory = args.traces or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        record(args.models, directory, args.steps, args.timeout)
        cases: list[tuple[str, str, dict[str, float]]] = []
        on_vs_off: list[float] = []
        for name in args.models:
            events = replay.normalize(trace.load(directory / f"{name}.lmstrace"))
            peak = replay.lower_bound(events, 0, 2 * MIB)
            off = replay_timed(driver, None, events, 0, args.steps, args.gpu_speedup)
            off_step = sum(s["host_now_ns"] for s in off[args.warmup:]) / (len(off) - args.warmup)
            for label, fraction in (("uncapped", 1), ("1/2", 2), ("1/4", 4)):
                device = max(peak // fraction // (2 * MIB), 1) * 2 * MIB + (
                    64 * MIB if fraction == 1 else 0)
                print(f"replaying {name} at {label} ({device // MIB} MiB)", flush=True)
                helper = None if args.helper is None else Helper(
                    args.helper, uses=args.prefetch or 8, room=device // args.ahead,
                    locked=not args.unlocked, allocate_ahead=args.allocate_ahead,
                    foresee=args.foresee)
                steps = replay_timed(driver, lms, events, device, args.steps,
                                     args.gpu_speedup,
                                     args.prefetch if helper is None else 0, helper,
                                     ahead_mib * MIB, args.unmap_evicted)
                per = [figures(s, off_step) for s in steps[args.warmup:]]
                mean = {key: sum(f[key] for f in per) / len(per) for key in per[0]}
                mean["ratio"] = mean["step"] / mean["ideal"] if mean["ideal"] else 1.0
                cases.append((name, label, mean))
                if fraction == 1:
                    on_vs_off.append(mean["step"] / off_step)
                    cases.append((name, "LMS off", {"step": off_step}))
    print(f"\n{'model':<12} {'case':<9} {'step ms':>8} {'compute':>8} {'to host':>8} "
          f"{'to dev':>8} {'remaps':>8} {'host busy':>9} {'GPU idle':>8} {'copies':>8} "
          f"{'host':>8} {'host wait':>9} {'floor 1':>8} {'floor N':>8} "
          f"{'gpu_step_vs_ideal':>18} {'drv wait':>8}" +
          (f" {'helper':>8} {'its VMM':>8}" if args.helper else ""))
    worst = ("", "", 0.0)
    floors: list[tuple[float, str]] = []
    for name, label, m in cases:
        if label == "LMS off":
            print(f"{name:<12} {label:<9} {m['step'] / 1e6:>8.2f}")
            continue
        print(f"{name:<12} {label:<9} {m['step'] / 1e6:>8.2f} {m['compute'] / 1e6:>8.2f} "
              f"{m['to_host'] / 1e6:>8.2f} {m['to_device'] / 1e6:>8.2f} "
              f"{m['remaps'] / 1e6:>8.2f} {m['host_busy'] / 1e6:>9.2f} {m['idle'] / 1e6:>8.2f} "
              f"{m['idle_copies'] / 1e6:>8.2f} {m['idle_host'] / 1e6:>8.2f} "
              f"{m['waits'] / 1e6:>9.2f} {m['floor_one'] / 1e6:>8.2f} "
              f"{m['floor_any'] / 1e6:>8.2f} {m['ratio']:>18.3f} "
              f"{m['driver_waits'] / 1e6:>8.2f}" +
              (f" {m['helper'] / 1e6:>8.2f} {m['helper_vmm'] / 1e6:>8.2f}"
               if args.helper else ""))
        if label != "uncapped" and m["ratio"] > worst[2]:
            worst = (name, label, m["ratio"])
        if label != "uncapped":
            floors.append((m["floor_any"] / m["ideal"], f"{name} at {label}"))
    floor, where = max(floors)
    print(f"\nfloor N / ideal, the best any threading of these driver calls could do: "
          f"worst {floor:.3f} ({where})")
    print(f"violations recorded by the fake driver: {driver.violations()}")
    print(f"lms_on_vs_off_uncapped {max(on_vs_off):.3f}")
    print(f"first_eviction_vs_copy {worst_first:.3f}")
    print(f"worst: {worst[0]} at {worst[1]}")
    print(f"gpu_step_vs_ideal {worst[2]:.3f}")
    return 0 if driver.violations() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
