"""The engine on a real GPU, with real kernels: `make gpu-check-engine`'s Python part.

Needs only the engine's own Python module (built by tests/gpu/gpu_check_engine.sh
into --build, no TensorFlow) and, on a GPU, CuPy. Steps, each reported
with PASS or FAIL and its numbers:

1. contract: 1.5x the device of patterned tensors (large, odd-sized and
   small) pinned in random groups, churned and freed; every byte checked;
   then again with evicted tensors unmapped.
2. bandwidth: evict and page-in GB/s of the engine beside cudaMemcpyAsync
   between pinned host memory and the device, measured in the same run.
3. kernels: CuPy kernels write and check LMS tensors on a stream registered
   with the engine (unpinned while still queued, then evicted) and on an
   unregistered one (synchronized before the unpin; reading and writing
   evicted tensors over the bus), while another thread evicts and pages in;
   then again with evicted tensors unmapped (TF_LMS_UNMAP_EVICTED), without
   the touches over the bus, which then fault by design.
4. overlap: kernels of a known duration on a registered stream, each
   pinning a tensor that is paged in for it while another is evicted: the
   step beside the same kernels with every tensor resident (compute alone)
   and the same moves with kernels of no duration (transfers alone); every
   word checked by each kernel and at the end; then again with evicted
   tensors unmapped.
5. create: the time to create (and destroy) a 64 GiB device.

With --dry-run the engine runs over the fake CUDA driver
(TF_LMS_CUDA_DRIVER_PATH) at small sizes: every line says DRY RUN, the
numbers are not a GPU's, and the CuPy steps (bandwidth baseline, kernels,
overlap) are not run; `make bench-gpu-model` runs the overlap step on the
fake driver's timing model. Exit status: 0 if every step passed, 1 otherwise.

Example:
    $ python tests/gpu/check_engine.py --build build/gpu-check-engine
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Protocol, Sequence

GIB = 1 << 30
MIB = 1 << 20
STEPS = ("contract", "bandwidth", "batch", "kernels", "overlap", "create")

# The engine's order of eviction in every check: LRU, under which the GPU figures of
# benchmarks/README.md were measured (the engine's default is the learned order).
POLICY = "lru"


@dataclass
class Sizes:
    """How big each step is: a real GPU's, or the dry run's."""

    contract_device: int
    throughput_device: int
    throughput_tensor: int
    kernel_device: int
    kernel_tensor: int
    created_device: int
    rounds: int
    overlap_tensor: int = 64 * MIB
    overlap_count: int = 32  # tensors; the device holds half of them
    granule: int = 2 * MIB  # asked for; the driver's wins if larger


GPU_SIZES = Sizes(contract_device=4 * GIB, throughput_device=4 * GIB,
                  throughput_tensor=64 * MIB, kernel_device=512 * MIB,
                  kernel_tensor=32 * MIB, created_device=64 * GIB, rounds=200)
DRY_SIZES = Sizes(contract_device=64 * MIB, throughput_device=64 * MIB,
                  throughput_tensor=4 * MIB, kernel_device=0, kernel_tensor=0,
                  created_device=1 * GIB, rounds=40)


class Check:
    """Prints each step's lines with the run's label and counts failures."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.failed: list[str] = []

    def say(self, text: str) -> None:
        print(f"gpu-check-engine{self.label}: {text}", flush=True)

    def step(self, name: str, body: Callable[[], None]) -> None:
        self.say(f"== {name}")
        try:
            body()
        except Exception:  # one step's failure must not hide the next ones
            self.failed.append(name)
            self.say(f"FAIL {name}:\n{traceback.format_exc()}")
            return
        self.say(f"PASS {name}")

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            raise AssertionError(what)


def contract(check: Check, lms: ModuleType, sizes: Sizes, unmap_evicted: bool = False) -> None:
    """1.5x the device of patterned tensors: every byte survives any pins (with
    unmap_evicted, evictions leave the addresses unmapped: TF_LMS_UNMAP_EVICTED)."""
    rng = random.Random(7)
    device = sizes.contract_device
    engine = lms.Engine(device, host_bytes=2 * device, granule_bytes=sizes.granule,
                        backend="cuda", policy=POLICY, unmap_evicted=unmap_evicted)
    granule = engine.granule_bytes
    tensors: dict[int, tuple[int, int]] = {}  # address -> (bytes, seed)
    seed = 0

    def make() -> None:
        nonlocal seed
        kind = rng.random()
        if kind < 0.25:
            size = rng.randrange(1, granule // 4)  # small: packed in pages
        elif kind < 0.5:
            size = rng.randrange(granule, 8 * granule) + rng.randrange(1, 4096)
        else:
            size = rng.randrange(1, 16) * granule
        address = engine.allocate(size)
        seed += 1
        engine.fill_pattern(address, size, seed)
        tensors[address] = (size, seed)

    while sum(size for size, _ in tensors.values()) < device * 3 // 2:
        make()
    for round_ in range(sizes.rounds):
        group = rng.sample(sorted(tensors), k=min(len(tensors), rng.randrange(1, 12)))
        pins = []
        held = 0
        for address in group:
            size = tensors[address][0]
            if held + size > device // 3:
                continue
            held += size
            pins.append((address, engine.pin(address)))
        address, _ = rng.choice(pins) if pins else (group[0], 0)
        size, s = tensors[address]
        check.expect(engine.verify_pattern(address, size, s) == -1,
                     f"round {round_}: a tensor of {size} bytes lost bytes")
        for address, unit in pins:
            engine.unpin(address, unit)
        if round_ % 10 == 9:  # churn: one freed, one made
            gone = rng.choice(sorted(tensors))
            engine.free(gone)
            del tensors[gone]
            make()
    bad = [a for a, (size, s) in tensors.items() if engine.verify_pattern(a, size, s) != -1]
    engine.check_invariants()
    stats = engine.stats()
    total = sum(size for size, _ in tensors.values())
    label = "contract, evicted tensors unmapped" if unmap_evicted else "contract"
    check.say(f"{label}: {len(tensors)} tensors, {total / MIB:.0f} MiB on a "
              f"{device / MIB:.0f} MiB device (granule {granule >> 10} KiB), "
              f"{stats['num_evictions']} evictions, {stats['num_page_ins']} page-ins, "
              f"{stats['bytes_copied'] / GIB:.2f} GiB copied, {len(bad)} tensors wrong")
    check.expect(not bad, f"{len(bad)} of {len(tensors)} tensors lost bytes")
    check.expect(stats["num_evictions"] > 0 and stats["num_page_ins"] > 0,
                 "nothing was evicted or paged in: the check proved nothing")
    for address in list(tensors):
        engine.free(address)


BACKEND_TIMES = ("copying", "waiting", "fencing", "creating_memory", "mapping", "unmapping")
REMAP_TIMES = ("creating_memory", "mapping", "unmapping")


def breakdown(before: dict[str, int], after: dict[str, int], total: str, count: int) -> str:
    """Microseconds per tensor of `total` (a time_*_ns statistic) and its parts."""
    def per(name: str) -> float:
        return (after[f"time_{name}_ns"] - before[f"time_{name}_ns"]) / count / 1e3

    parts = {name: per(name) for name in BACKEND_TIMES}
    other = per(total) - sum(parts.values())
    return (f"{per(total):.0f} us a tensor: " +
            ", ".join(f"{name} {us:.0f}" for name, us in parts.items()) +
            f", the rest {other:.0f}")


def engine_throughput(check: Check, lms: ModuleType, sizes: Sizes) -> tuple[float, float]:
    """Evict and page-in GB/s of whole tensors, best of three passes."""
    engine = lms.Engine(sizes.throughput_device, host_bytes=sizes.throughput_device,
                        granule_bytes=sizes.granule, backend="cuda", policy=POLICY)
    count = sizes.throughput_device // 4 // sizes.throughput_tensor
    tensors = [engine.allocate(sizes.throughput_tensor) for _ in range(count)]
    for i, address in enumerate(tensors):
        engine.fill_pattern(address, sizes.throughput_tensor, 100 + i)
    total = count * sizes.throughput_tensor
    best_out = best_in = 0.0
    for round_ in range(3):
        stats = [engine.stats()]
        start = time.perf_counter()
        for address in tensors:
            engine.evict(address)
        evicted = engine.stats()
        engine.wait_for_copies()  # the evictions' copies run on after the remaps
        best_out = max(best_out, total / (time.perf_counter() - start) / 1e9)
        stats.append(engine.stats())
        out_waited = (stats[1]["time_waiting_ns"] - evicted["time_waiting_ns"]) / count / 1e3
        start = time.perf_counter()
        for address in tensors:
            engine.unpin(address, engine.pin(address))
        stats.append(engine.stats())
        engine.verify_pattern(tensors[0], 1, 100)  # waits for every copy in flight
        best_in = max(best_in, total / (time.perf_counter() - start) / 1e9)
        waited = (engine.stats()["time_waiting_ns"] - stats[2]["time_waiting_ns"]) / count / 1e3
        check.say(f"pass {round_ + 1}: evict {breakdown(stats[0], evicted, 'evicting', count)}; "
                  f"then waiting for the copies {out_waited:.0f} us a tensor")
        check.say(f"pass {round_ + 1}: page-in "
                  f"{breakdown(stats[1], stats[2], 'paging_in', count)}; then waiting for "
                  f"the copies {waited:.0f} us a tensor")
    bad = [i for i, a in enumerate(tensors)
           if engine.verify_pattern(a, sizes.throughput_tensor, 100 + i) != -1]
    check.expect(not bad, f"tensors {bad} lost bytes")
    for address in tensors:
        engine.free(address)
    check.say(f"engine: evict {best_out:.1f} GB/s, page-in {best_in:.1f} GB/s "
              f"({count} tensors of {sizes.throughput_tensor // MIB} MiB, best of 3)")
    return best_out, best_in


def pinned_bandwidth(check: Check, cupy: Any) -> tuple[float, float]:
    """cudaMemcpyAsync between pinned host memory and the device, best of 3."""
    import cupyx
    import numpy

    n = GIB
    host = cupyx.empty_pinned((n,), dtype=numpy.uint8)
    device = cupy.empty((n,), dtype=cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    runtime = cupy.cuda.runtime
    result = []
    for dst, src, kind in ((host.ctypes.data, device.data.ptr, runtime.memcpyDeviceToHost),
                           (device.data.ptr, host.ctypes.data, runtime.memcpyHostToDevice)):
        best = 0.0
        for _ in range(3):
            begin, end = cupy.cuda.Event(), cupy.cuda.Event()
            begin.record(stream)
            runtime.memcpyAsync(dst, src, n, kind, stream.ptr)
            end.record(stream)
            end.synchronize()
            best = max(best, n / (cupy.cuda.get_elapsed_time(begin, end) / 1e3) / 1e9)
        result.append(best)
    del host, device
    cupy.get_default_memory_pool().free_all_blocks()
    check.say(f"cudaMemcpyAsync pinned: device->host {result[0]:.1f} GB/s, "
              f"host->device {result[1]:.1f} GB/s (1 GiB, best of 3)")
    return result[0], result[1]


def bandwidth(check: Check, lms: ModuleType, sizes: Sizes, cupy: Any | None) -> None:
    out, in_ = engine_throughput(check, lms, sizes)
    if cupy is None:
        check.say("bandwidth baseline: not measured in a dry run (no GPU for CuPy)")
        return
    d2h, h2d = pinned_bandwidth(check, cupy)
    check.say(f"ratio: evict/pinned device->host {out / d2h:.2f}, "
              f"page-in/pinned host->device {in_ / h2d:.2f}")


def batch(check: Check, lms: ModuleType, sizes: Sizes, cupy: Any | None) -> None:
    """A kernel's evicted inputs paged in one by one (a pin each) and together
    (pin_all): the time from the first pin until a kernel queued after the pins
    on the fenced stream has read every input (in a dry run: until the copies
    are done), and the host waits each way. Every byte is checked after."""
    tensor, count = sizes.throughput_tensor, 8
    engine = lms.Engine(2 * count * tensor, host_bytes=2 * count * tensor,
                        granule_bytes=sizes.granule, backend="cuda", policy=POLICY)
    kernel = Kernels(cupy) if cupy is not None else None
    stream = cupy.cuda.Stream(non_blocking=True) if cupy is not None else None
    if stream is not None:
        engine.add_fenced_stream(stream.ptr)
    inputs = [engine.allocate(tensor) for _ in range(count)]
    for i, address in enumerate(inputs):  # the pattern the reader checks
        if kernel is None:
            engine.fill_pattern(address, tensor, 300 + i)
            continue
        unit = engine.pin(address)
        kernel.fill(stream, address, tensor, 300 + i)
        stream.synchronize()
        engine.unpin(address, unit)
    best = {"one by one": float("inf"), "together": float("inf")}
    waits: dict[str, int] = {}
    wrong = 0
    for _ in range(3):
        for way in best:
            for address in inputs:
                engine.evict(address)
            before = engine.stats()["num_host_waits"]
            start = time.perf_counter()
            if way == "together":
                units = engine.pin_all(inputs)
            else:
                units = [engine.pin(address) for address in inputs]
            waits[way] = engine.stats()["num_host_waits"] - before
            if kernel is not None:
                for i, address in enumerate(inputs):
                    kernel.check(stream, address, tensor, 300 + i)
                stream.synchronize()
            else:
                engine.verify_pattern(inputs[0], 1, 300)  # waits for every copy
            best[way] = min(best[way], time.perf_counter() - start)
            for i, (address, unit) in enumerate(zip(inputs, units)):
                check.expect(unit != 0, f"{way}: input {i} was not pinned")
                wrong += (kernel.wrong_words(stream, address, tensor, 300 + i) > 0
                          if kernel is not None
                          else engine.verify_pattern(address, tensor, 300 + i) != -1)
                engine.unpin(address, unit)
    for address in inputs:
        engine.free(address)
    one, together = best["one by one"], best["together"]
    check.say(f"batch: {count} evicted inputs of {tensor // MIB} MiB, pinned, then read by a "
              f"kernel: one by one {one * 1e3:.1f} ms ({waits['one by one']} host waits), "
              f"together {together * 1e3:.1f} ms ({waits['together']} host waits): "
              f"{one / together:.2f}x faster (best of 3); {wrong} inputs read wrong")
    check.expect(wrong == 0, f"{wrong} inputs read wrong after their page-in")


KERNELS = r"""
__device__ unsigned int Word(unsigned int seed, unsigned long long i) {
  unsigned int x = static_cast<unsigned int>(i) * 2654435761u ^ seed ^
                   static_cast<unsigned int>(i >> 32);
  x ^= x >> 16; x *= 0x45d9f3bu; x ^= x >> 16;
  return x;
}
// Spins `spin` clock cycles first, so that it is still queued or running
// when the host unpins its tensor.
extern "C" __global__ void fill(unsigned int* p, unsigned long long n, unsigned int seed,
                                long long spin) {
  const long long start = clock64();
  while (clock64() - start < spin) {}
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    p[i] = Word(seed, i);
  }
}
// Spins `spin` clock cycles (a kernel of a known duration), then checks
// that the words hold `old` and writes `seed` over them.
extern "C" __global__ void update(unsigned int* p, unsigned long long n, unsigned int old,
                                  unsigned int seed, long long spin, unsigned long long* bad) {
  const long long start = clock64();
  while (clock64() - start < spin) {}
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    if (p[i] != Word(old, i)) atomicAdd(bad, 1ull);
    p[i] = Word(seed, i);
  }
}
extern "C" __global__ void check(const unsigned int* p, unsigned long long n,
                                 unsigned int seed, unsigned long long* bad) {
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x) {
    if (p[i] != Word(seed, i)) atomicAdd(bad, 1ull);
  }
}
"""


class Kernels:
    """fill and check over LMS memory, launched on a given CuPy stream."""

    def __init__(self, cupy: Any) -> None:
        import numpy

        self.cupy, self.numpy = cupy, numpy
        module = cupy.RawModule(code=KERNELS)
        self._fill = module.get_function("fill")
        self._check = module.get_function("check")
        self._update = module.get_function("update")
        self._bad = cupy.zeros(1, dtype=cupy.uint64)

    def fill(self, stream: Any, address: int, size: int, seed: int, spin: int = 0) -> None:
        np = self.numpy
        with stream:
            self._fill((264,), (256,), (np.uint64(address), np.uint64(size // 4),
                                        np.uint32(seed), np.int64(spin)))

    def update(self, stream: Any, address: int, size: int, old: int, seed: int, spin: int,
               bad: Any) -> None:
        """After `spin` clock cycles, adds the words not of `old` to `bad` (a CuPy
        counter) and writes `seed`'s, on `stream`, without waiting."""
        np = self.numpy
        with stream:
            self._update((264,), (256,), (np.uint64(address), np.uint64(size // 4),
                                          np.uint32(old), np.uint32(seed), np.int64(spin),
                                          bad))

    def check(self, stream: Any, address: int, size: int, seed: int) -> None:
        """Counts the wrong words into the counter, on `stream`, without waiting."""
        np = self.numpy
        with stream:
            self._bad.fill(0)
            self._check((264,), (256,), (np.uint64(address), np.uint64(size // 4),
                                         np.uint32(seed), self._bad))

    def counted(self, stream: Any) -> int:
        """Waits for `stream`: the wrong words its last check counted."""
        stream.synchronize()
        return int(self._bad.get()[0])

    def wrong_words(self, stream: Any, address: int, size: int, seed: int) -> int:
        """Checks on `stream` and waits for it: the number of wrong words."""
        self.check(stream, address, size, seed)
        return self.counted(stream)


def cuda_graph(check: Check, engine: Any, kernel: Kernels, cupy: Any, src: int, dst: int,
               size: int, seed: int) -> None:
    """A CUDA graph recorded over two LMS tensors, relaunched after they were
    evicted and after they were paged in: LMS keeps their addresses, so the
    graph's kernels reach them wherever they are (XLA's command buffers are
    such graphs, re-recorded only when an address changes)."""
    stream = cupy.cuda.Stream(non_blocking=True)
    stream.begin_capture()  # recorded, not run: no engine call meanwhile
    kernel.fill(stream, dst, size, 777)
    kernel.check(stream, src, size, seed)
    graph = stream.end_capture()
    engine.add_fenced_stream(stream.ptr)
    results = {}
    for state in ("resident and pinned", "evicted, unpinned", "paged in again"):
        units = []
        if state == "evicted, unpinned":
            for address in (src, dst):
                if not engine.inspect(address)["evicted"]:
                    engine.evict(address)
        else:
            units = [(address, engine.pin(address)) for address in (src, dst)]
        kernel.fill(stream, dst, size, 1)  # overwritten by the graph's fill
        graph.launch(stream=stream)
        wrong_src = kernel.counted(stream)
        results[state] = (wrong_src, kernel.wrong_words(stream, dst, size, 777),
                          engine.inspect(src)["evicted"])
        for address, unit in units:
            engine.unpin(address, unit)
    engine.remove_fenced_stream(stream.ptr)
    check.say("kernels (d) a CUDA graph over LMS tensors, wrong words read and written "
              "(source evicted while it ran): " +
              "; ".join(f"{k}: {r[0]} and {r[1]} ({r[2]})" for k, r in results.items()))
    check.expect(all(r[0] == 0 and r[1] == 0 for r in results.values()),
                 f"a graph launch lost or misread words: {results}")
    check.expect(results["evicted, unpinned"][2], "the source was not evicted")


def pinned_wrong_words(engine: Any, kernel: Kernels, stream: Any, addresses: list[int],
                       size: int, seeds: dict[int, int]) -> int:
    """Each tensor pinned (paged in), checked on `stream` against its seed, unpinned."""
    wrong = 0
    for address in addresses:
        unit = engine.pin(address)
        wrong += kernel.wrong_words(stream, address, size, seeds[address])
        engine.unpin(address, unit)
    return wrong


def over_the_bus(check: Check, engine: Any, kernel: Kernels, cupy: Any, mine: list[int],
                 size: int, seeds: dict[int, int]) -> None:
    """kernels (b): evicted tensors read and written over the bus by an unpinned
    kernel on a stream the engine does not know (synchronized before the engine
    is called again), and pinned ones written there, synchronized before the
    unpin. The engine orders only fenced streams after its copies: this one
    waits for them (wait_for_copies) after each evict and pin."""
    unfenced = cupy.cuda.Stream(non_blocking=True)
    wrong = 0
    for i, address in enumerate(mine[:8]):
        unit = engine.pin(address)
        engine.unpin(address, unit)
        engine.evict(address)
        engine.wait_for_copies()
        check.expect(engine.inspect(address)["evicted"], "evict left the tensor resident")
        if address in seeds:
            wrong += kernel.wrong_words(unfenced, address, size, seeds[address])
        seeds[address] = 5000 + i
        kernel.fill(unfenced, address, size, seeds[address])
        unfenced.synchronize()
        unit = engine.pin(address)  # pages in what the kernel wrote over the bus
        engine.wait_for_copies()
        wrong += kernel.wrong_words(unfenced, address, size, seeds[address])
        seeds[address] = 6000 + i
        kernel.fill(unfenced, address, size, seeds[address])
        unfenced.synchronize()
        engine.unpin(address, unit)
    for address in mine[:8]:
        engine.evict(address)
        engine.wait_for_copies()
        wrong += kernel.wrong_words(unfenced, address, size, seeds[address])
    check.say(f"kernels (b) unregistered stream, evicted tensors over the bus: {wrong} "
              "wrong words")
    check.expect(wrong == 0, f"{wrong} words wrong on the unregistered stream")


def kernels(check: Check, lms: ModuleType, sizes: Sizes, cupy: Any,
            unmap_evicted: bool = False) -> None:
    """Real kernels on registered and unregistered streams, under eviction. With
    unmap_evicted (TF_LMS_UNMAP_EVICTED) an evicted tensor's address maps
    nothing, and a kernel touching it unpinned would end the CUDA context: (b)
    and (d), which do that on purpose, do not run; (a) and (c) check that an
    eviction's unmap waits for the kernels still queued on the tensor."""
    kernel = Kernels(cupy)
    device, size = sizes.kernel_device, sizes.kernel_tensor
    engine = lms.Engine(device, host_bytes=4 * device, granule_bytes=sizes.granule,
                        backend="cuda", policy=POLICY, unmap_evicted=unmap_evicted)
    fenced = cupy.cuda.Stream(non_blocking=True)
    engine.add_fenced_stream(fenced.ptr)
    count = device * 3 // 2 // size
    mine = [engine.allocate(size) for _ in range(count)]
    seeds = {}
    rng = random.Random(11)
    # (a) fenced: each fill is unpinned while still queued (it spins ~1-5 ms
    # first), and the next pins evict it: the eviction's copy must wait.
    for step in range(4 * count):
        address = rng.choice(mine)
        unit = engine.pin(address)
        seeds[address] = 1000 + step
        kernel.fill(fenced, address, size, seeds[address], spin=rng.choice((0, 2_000_000,
                                                                          10_000_000)))
        engine.unpin(address, unit)
    fenced.synchronize()
    wrong = pinned_wrong_words(engine, kernel, fenced, [a for a in mine if a in seeds], size,
                               seeds)
    stats = engine.stats()
    check.say(f"kernels (a) fenced stream, unpinned while queued: {4 * count} fills, "
              f"{stats['num_evictions']} evictions, {stats['num_page_ins']} page-ins, "
              f"{stats['num_fences']} fences, {wrong} wrong words")
    check.expect(wrong == 0, f"{wrong} words written by queued kernels were lost")
    check.expect(stats["num_evictions"] > 0, "nothing was evicted")
    if unmap_evicted:
        check.say("kernels (b) and (d) not run: with evicted tensors unmapped, a kernel "
                  "touching one unpinned faults by design")
    else:
        over_the_bus(check, engine, kernel, cupy, mine, size, seeds)
    # (c) two threads: fenced fills unpinned while queued, and another
    # thread pinning, checking and evicting its own tensors meanwhile.
    theirs = [engine.allocate(size) for _ in range(count // 2)]
    for i, address in enumerate(theirs):
        engine.fill_pattern(address, size, 9000 + i)
    errors: list[str] = []

    def other() -> None:
        other_rng = random.Random(13)
        try:
            for _ in range(6 * count):
                i = other_rng.randrange(len(theirs))
                unit = engine.pin(theirs[i])
                if engine.verify_pattern(theirs[i], size, 9000 + i) != -1:
                    errors.append(f"tensor {i} of the other thread lost bytes")
                engine.unpin(theirs[i], unit)
                try:
                    engine.evict(theirs[other_rng.randrange(len(theirs))])
                except lms.AllocationStateError:
                    pass  # already evicted, by the other thread's pins
        except Exception as error:  # reported by the main thread
            errors.append(repr(error))

    thread = threading.Thread(target=other)
    thread.start()
    for step in range(6 * count):
        address = rng.choice(mine)
        unit = engine.pin(address)
        seeds[address] = 20000 + step
        kernel.fill(fenced, address, size, seeds[address], spin=rng.choice((0, 2_000_000)))
        engine.unpin(address, unit)
    thread.join()
    fenced.synchronize()
    wrong = pinned_wrong_words(engine, kernel, fenced, mine, size, seeds)
    stats = engine.stats()
    check.say(f"kernels (c) two threads: {stats['num_evictions']} evictions, "
              f"{stats['num_page_ins']} page-ins in all, {wrong} wrong words, "
              f"{len(errors)} errors in the other thread")
    check.expect(wrong == 0 and not errors, f"{wrong} wrong words; {errors[:3]}")
    fenced.synchronize()
    if not unmap_evicted:
        cuda_graph(check, engine, kernel, cupy, mine[0], mine[1], size, seeds[mine[0]])
    engine.remove_fenced_stream(fenced.ptr)
    for address in mine + theirs:
        engine.free(address)


class Launcher(Protocol):
    """Where the overlap step's kernels run: a GPU (GpuLauncher) or the fake
    driver's timing model (benchmarks/gpu_model.py)."""

    stream: int  # the CUstream the kernels run on, fenced by each engine

    def fill(self, engine: Any, address: int, size: int, seed: int) -> None:
        """Writes `seed`'s pattern over the tensor (pinned meanwhile)."""

    def kernel(self, address: int, size: int, old: int, seed: int, ns: float) -> int:
        """Queues a kernel of about `ns` over the pinned tensor that holds `old`'s
        pattern, without waiting: the seed whose pattern it holds afterwards."""

    def finish(self) -> None:
        """Waits until every kernel queued has run."""

    def clock(self, engine: Any) -> tuple[float, float, float]:
        """Seconds: the clock a step is timed by, and the host's time so far
        waiting for the GPU and in driver calls that remap or make memory."""

    def wrong(self, engine: Any, address: int, size: int, seed: int) -> int:
        """Words (or, where words are not counted, 1) of the tensor not of `seed`'s
        pattern, read pinned; plus those the kernels found wrong so far."""


class GpuLauncher:
    """The overlap step's kernels on a GPU: `update` on one CuPy stream, a
    kernel's duration its spin in clock cycles at the rate measured here."""

    def __init__(self, kernel: Kernels, cupy: Any) -> None:
        self.kernels, self.cupy = kernel, cupy
        self._stream = cupy.cuda.Stream(non_blocking=True)
        self.stream = self._stream.ptr
        self._bad = cupy.zeros(1, dtype=cupy.uint64)
        self.cycles_per_ns = self._clock()

    def _clock(self) -> float:
        """Clock cycles a nanosecond of `update`'s spin: kernels of 0 and 2e7 cycles
        over a scratch buffer, timed by events, best of 3 each."""
        cupy, spin = self.cupy, 20_000_000
        scratch, bad = cupy.zeros(264 * 256, dtype=cupy.uint32), cupy.zeros(1, cupy.uint64)
        best = {}
        for cycles in (0, spin):
            best[cycles] = float("inf")
            for _ in range(3):
                begin, end = cupy.cuda.Event(), cupy.cuda.Event()
                begin.record(self._stream)
                self.kernels.update(self._stream, scratch.data.ptr, scratch.nbytes, 0, 0,
                                    cycles, bad)
                end.record(self._stream)
                end.synchronize()
                best[cycles] = min(best[cycles], cupy.cuda.get_elapsed_time(begin, end))
        return spin / ((best[spin] - best[0]) * 1e6)

    def fill(self, engine: Any, address: int, size: int, seed: int) -> None:
        unit = engine.pin(address)
        self.kernels.fill(self._stream, address, size, seed)
        self._stream.synchronize()
        engine.unpin(address, unit)

    def kernel(self, address: int, size: int, old: int, seed: int, ns: float) -> int:
        self.kernels.update(self._stream, address, size, old, seed,
                            int(ns * self.cycles_per_ns), self._bad)
        return seed

    def finish(self) -> None:
        self._stream.synchronize()

    def clock(self, engine: Any) -> tuple[float, float, float]:
        stats = engine.stats()
        return (time.perf_counter(), stats["time_waiting_ns"] / 1e9,
                sum(stats[f"time_{name}_ns"] for name in REMAP_TIMES) / 1e9)

    def wrong(self, engine: Any, address: int, size: int, seed: int) -> int:
        unit = engine.pin(address)
        words = self.kernels.wrong_words(self._stream, address, size, seed)
        engine.unpin(address, unit)
        with self._stream:  # ordered before the next kernels' counts
            found = int(self._bad.get()[0])
            self._bad.fill(0)
        return words + found


def overlap_run(lms: Any, launcher: Launcher, device: int, tensor: int, count: int,
                ns: float, granule: int, steps: int = 3,
                unmap_evicted: bool = False) -> dict[str, float]:
    """`count` tensors on an engine of `device` bytes, pinned in turn (twice each
    a step) by a kernel of `ns` on the launcher's fenced stream, unpinned while
    it is queued. Each figure is the median of `steps` steps after a first one
    (which makes the host memory): the step in seconds (until the stream and
    every copy are done), the seconds the host waited for the GPU and remapped
    while it queued the step (Launcher.clock), and its evictions, page-ins
    and host waits meanwhile; `wrong` counts wrong words (or tensors).
    `unmap_evicted`: evictions leave the addresses unmapped (TF_LMS_UNMAP_EVICTED)."""
    engine = lms.Engine(device, host_bytes=count * tensor, granule_bytes=granule,
                        backend="cuda", policy=POLICY, unmap_evicted=unmap_evicted)
    engine.add_fenced_stream(launcher.stream)
    tensors = [engine.allocate(tensor) for _ in range(count)]
    seeds = {}
    for i, address in enumerate(tensors):
        launcher.fill(engine, address, tensor, 1 + i)
        seeds[address] = 1 + i
    seed = count + 1
    rows: list[dict[str, float]] = []
    for step in range(steps + 1):
        before, clock = engine.stats(), launcher.clock(engine)
        for k in range(2 * count):
            address = tensors[k % count]
            unit = engine.pin(address)
            seeds[address] = launcher.kernel(address, tensor, seeds[address], seed, ns)
            seed += 1
            engine.unpin(address, unit)
        queued, after = launcher.clock(engine), engine.stats()
        launcher.finish()
        engine.wait_for_copies()
        rows.append({"step": launcher.clock(engine)[0] - clock[0],
                     "waited": queued[1] - clock[1], "remaps": queued[2] - clock[2],
                     "evictions": after["num_evictions"] - before["num_evictions"],
                     "page_ins": after["num_page_ins"] - before["num_page_ins"],
                     "waits": after["num_host_waits"] - before["num_host_waits"]})
    wrong = sum(launcher.wrong(engine, address, tensor, seeds[address]) for address in tensors)
    engine.remove_fenced_stream(launcher.stream)
    for address in tensors:
        engine.free(address)
    del engine
    median = {key: sorted(row[key] for row in rows[1:])[steps // 2] for key in rows[0]}
    median["wrong"] = wrong
    return median


def overlap(check: Check, lms: Any, sizes: Sizes, launcher: Launcher,
            kernel_ns: Sequence[float] | None = None,
            unmap_evicted: bool = False) -> list[dict[str, float]]:
    """Moves under compute: kernels of a known duration, 0.5x, 1x and 2x the
    moves' time a kernel (or each of `kernel_ns`), each pinning a tensor that
    is paged in for it while the least recently used is evicted. Per duration,
    the step beside compute alone (every tensor resident) and transfers alone
    (the same moves, kernels of no duration): `vs_ideal` = step / max(compute,
    transfers) (1: the moves hidden under the kernels, or the kernels under the
    moves), `hidden` = (compute + transfers - step) / min(compute, transfers)
    (1: all of the shorter hidden, 0: none). Returns a row per duration.
    `unmap_evicted`: the runs that move leave evicted tensors' addresses
    unmapped (TF_LMS_UNMAP_EVICTED)."""
    name = "overlap unmapped" if unmap_evicted else "overlap"
    tensor, count = sizes.overlap_tensor, sizes.overlap_count
    small, roomy = count // 2 * tensor, (count + 2) * tensor
    moves = overlap_run(lms, launcher, small, tensor, count, 0, sizes.granule,
                        unmap_evicted=unmap_evicted)
    kernels_a_step = 2 * count
    per_kernel = moves["step"] / kernels_a_step
    check.say(f"{name}: {count} tensors of {tensor // MIB} MiB on a {small // MIB} MiB device, "
              f"{kernels_a_step} kernels a step on a fenced stream, each pinning one "
              f"(unpinned while queued): transfers alone {moves['step'] * 1e3:.1f} ms a step "
              f"({per_kernel * 1e3:.2f} ms a kernel; {moves['evictions']:.0f} evictions, "
              f"{moves['page_ins']:.0f} page-ins, {moves['waits']:.0f} host waits of "
              f"{moves['waited'] * 1e3:.1f} ms, remapping {moves['remaps'] * 1e3:.1f} ms)")
    check.expect(moves["page_ins"] >= kernels_a_step // 2, "too few page-ins: nothing overlapped")
    durations = kernel_ns or [ratio * per_kernel * 1e9 for ratio in (0.5, 1.0, 2.0)]
    rows = []
    wrong = moves["wrong"]
    for ns in durations:
        alone = overlap_run(lms, launcher, roomy, tensor, count, ns, sizes.granule)
        both = overlap_run(lms, launcher, small, tensor, count, ns, sizes.granule,
                           unmap_evicted=unmap_evicted)
        check.expect(alone["evictions"] == 0, "compute alone evicted: the device is too small")
        compute, transfers, step = alone["step"], moves["step"], both["step"]
        row = {"kernel_ms": ns / 1e6, "compute_ms": compute * 1e3,
               "transfers_ms": transfers * 1e3, "step_ms": step * 1e3,
               "vs_ideal": step / max(compute, transfers),
               "hidden": (compute + transfers - step) / min(compute, transfers),
               "waits": both["waits"], "waited_ms": both["waited"] * 1e3,
               "remaps_ms": both["remaps"] * 1e3}
        rows.append(row)
        wrong += alone["wrong"] + both["wrong"]
        check.say(f"{name}: kernels of {row['kernel_ms']:.2f} ms: compute alone "
                  f"{row['compute_ms']:.1f} ms, transfers alone {row['transfers_ms']:.1f}, "
                  f"together {row['step_ms']:.1f}: {row['vs_ideal']:.2f} of max(compute, "
                  f"transfers), {row['hidden']:.2f} of the shorter hidden; "
                  f"{row['waits']:.0f} host waits of {row['waited_ms']:.1f} ms, remapping "
                  f"{row['remaps_ms']:.1f} ms")
    check.say(f"{name}: {wrong} wrong words")
    check.expect(wrong == 0, f"{wrong} words wrong after moves under compute")
    return rows


def create(check: Check, lms: ModuleType, sizes: Sizes, cupy: Any | None) -> None:
    """Creating and destroying a device of sizes.created_device bytes."""
    device = sizes.created_device
    if cupy is not None:
        free, _ = cupy.cuda.runtime.memGetInfo()
        if free < device + 2 * GIB:
            check.say(f"only {free / GIB:.1f} GiB free: creating a smaller device")
            device = (free - 2 * GIB) // GIB * GIB
    start = time.perf_counter()
    engine = lms.Engine(device, host_bytes=GIB, granule_bytes=sizes.granule, backend="cuda",
                        policy=POLICY)
    made = time.perf_counter() - start
    address = engine.allocate(engine.granule_bytes * 3)
    engine.fill_pattern(address, engine.granule_bytes * 3, 5)
    check.expect(engine.verify_pattern(address, engine.granule_bytes * 3, 5) == -1,
                 "the created device lost bytes")
    engine.free(address)
    start = time.perf_counter()
    del engine
    gone = time.perf_counter() - start
    check.say(f"create: a {device / GIB:.0f} GiB device in {made:.2f} s "
              f"({made / (device // (2 * MIB)) * 1e6:.1f} us per 2 MiB granule), "
              f"destroyed in {gone:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", required=True, help="the folder holding _engine*.so")
    parser.add_argument("--dry-run", action="store_true",
                        help="over the fake CUDA driver (TF_LMS_CUDA_DRIVER_PATH)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"comma-separated, of {','.join(STEPS)} (default: all)")
    parser.add_argument("--granule-mib", type=int, default=2,
                        help="the granule every engine asks for (the driver's wins if larger)")
    parser.add_argument("--overlap-tensor-mib", type=int, default=64,
                        help="the size of the overlap step's tensors")
    args = parser.parse_args()
    if args.overlap_tensor_mib < 1:
        parser.error(f"--overlap-tensor-mib {args.overlap_tensor_mib}: 1 or more")
    if args.granule_mib < 1 or args.granule_mib & (args.granule_mib - 1):
        parser.error(f"--granule-mib {args.granule_mib}: a power of two, 1 or more")
    steps = args.steps.split(",")
    if unknown := sorted(set(steps) - set(STEPS)):
        parser.error(f"--steps {args.steps}: no step {', '.join(unknown)}; "
                     f"the steps are {','.join(STEPS)}")
    if args.dry_run and not os.environ.get("TF_LMS_CUDA_DRIVER_PATH"):
        parser.error("--dry-run needs TF_LMS_CUDA_DRIVER_PATH naming the fake driver")
    sys.path.insert(0, args.build)
    lms = importlib.import_module("_engine")
    check = Check(" DRY RUN against the fake CUDA driver, not a GPU" if args.dry_run else "")
    cupy = None if args.dry_run else importlib.import_module("cupy")
    sizes = dataclasses.replace(DRY_SIZES if args.dry_run else GPU_SIZES,
                                granule=args.granule_mib * MIB,
                                overlap_tensor=args.overlap_tensor_mib * MIB)
    if "contract" in steps:
        check.step("contract", lambda: contract(check, lms, sizes))
        check.step("contract unmapped", lambda: contract(check, lms, sizes, unmap_evicted=True))
    if "bandwidth" in steps:
        check.step("bandwidth", lambda: bandwidth(check, lms, sizes, cupy))
    if "batch" in steps:
        check.step("batch", lambda: batch(check, lms, sizes, cupy))
    if "kernels" in steps and cupy is None:
        check.say("kernels: not run in a dry run (CuPy kernels need a GPU)")
    elif "kernels" in steps:
        check.step("kernels", lambda: kernels(check, lms, sizes, cupy))
        check.step("kernels unmapped",
                   lambda: kernels(check, lms, sizes, cupy, unmap_evicted=True))
    if "overlap" in steps and cupy is None:
        check.say("overlap: not run in a dry run (CuPy kernels need a GPU); "
                  "make bench-gpu-model runs it on the fake driver's timing model")
    elif "overlap" in steps:
        check.step("overlap", lambda: overlap(check, lms, sizes,
                                              GpuLauncher(Kernels(cupy), cupy)))
        check.step("overlap unmapped",
                   lambda: overlap(check, lms, sizes, GpuLauncher(Kernels(cupy), cupy),
                                   unmap_evicted=True))
    if "create" in steps:
        check.step("create", lambda: create(check, lms, sizes, cupy))
    check.say("FAILED: " + ", ".join(check.failed) if check.failed else "all steps passed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
