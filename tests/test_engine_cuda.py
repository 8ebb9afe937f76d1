"""The engine over the CUDA backend from Python, on the fake CUDA driver.

Device memory of the fake cannot be touched by the host at its address, as on
a GPU, so every fill_pattern / verify_pattern here goes through the backend's
copies; inspect and stats work as on the emulated device; errors of the CUDA
backend arrive as Python exceptions that say what is missing.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tensorflow_lms_allocator.engine import (
    BackendUnavailableError,
    Engine,
    OutOfMemoryError,
)
from conftest import GRANULE

CUDA_ERROR_UNKNOWN = 999
ROOT = Path(__file__).resolve().parent.parent


def load(name: str, folder: str = "benchmarks") -> ModuleType:
    """Imports module `name` from `folder` of the repository (benchmarks/gpu_model.py)."""
    sys.path.insert(0, str(ROOT / folder))
    try:
        return importlib.import_module(name)
    finally:
        del sys.path[0]


def cuda_engine(device_granules: int, host_granules: int, **options: object) -> Engine:
    options.setdefault("policy", "lru")  # the tests name victims by order of use
    return Engine(device_granules * GRANULE, host_bytes=host_granules * GRANULE,
                  granule_bytes=GRANULE, backend="cuda", **options)


def live_objects(fake: ctypes.CDLL) -> tuple[int, ...]:
    gc.collect()
    return tuple(getattr(fake, f"fake_cuda_live_{what}")()
                 for what in ("handles", "mappings", "reservations", "streams", "events"))


@pytest.fixture
def fake(fake_cuda: ctypes.CDLL):
    """The fake driver; each test must leave no violation and leak nothing."""
    fake_cuda.fake_cuda_clear_violations()
    before = live_objects(fake_cuda)
    yield fake_cuda
    assert live_objects(fake_cuda) == before
    assert fake_cuda.fake_cuda_violation_count() == 0


def test_patterns_inspect_and_stats_work_on_a_gpu_backend(fake):
    engine = cuda_engine(8, 32)
    assert engine.backend == "cuda"
    assert engine.granule_bytes == GRANULE
    size = 5 * GRANULE + 17
    a = engine.allocate(size)
    engine.fill_pattern(a, size, 7)
    b = engine.allocate(6 * GRANULE, pin=True)  # only 3 granules free: evicts a
    info = engine.inspect(a)
    assert info["evicted"] and info["address"] == a
    assert engine.verify_pattern(a, size, 7) == -1  # read from the host pool
    engine.fill_pattern(a, 100, 8)  # an unpinned write lands in host memory
    engine.unpin(b, engine.inspect(b)["unit_id"])
    unit = engine.pin(a + 100)  # pages a in, evicting b
    assert not engine.inspect(a)["evicted"]
    assert engine.verify_pattern(a, 100, 8) == -1
    assert engine.verify_pattern(a + 104, size - 104, 7) != -1  # other seed there
    engine.unpin(a, unit)
    stats = engine.stats()
    assert stats["num_evictions"] == 2 and stats["num_page_ins"] == 1
    assert stats["num_copies"] >= 3
    assert stats["bytes_copied"] >= size + 6 * GRANULE
    assert stats["num_fences"] == 0  # no TensorFlow stream registered
    engine.check_invariants()
    engine.free(a)
    engine.free(b)
    del engine


def test_the_emulated_device_never_fences_or_waits():
    engine = Engine(4 * GRANULE, host_bytes=16 * GRANULE, granule_bytes=GRANULE, policy="lru")
    a = engine.allocate(3 * GRANULE)
    engine.evict(a)
    stats = engine.stats()
    assert stats["num_fences"] == 0 and stats["num_host_waits"] == 0
    assert stats["num_copies"] == 1 and stats["bytes_copied"] == 3 * GRANULE


def test_a_gpu_without_host_vmm_raises_naming_gpu_driver_and_requirement(fake):
    fake.fake_cuda_set_host_vmm_supported(0)
    try:
        with pytest.raises(BackendUnavailableError,
                           match=r"\(GPU 0\), driver 12\.4 .*CUDA 12\.2"):
            cuda_engine(4, 4)
    finally:
        fake.fake_cuda_set_host_vmm_supported(1)


def test_a_too_old_driver_raises(fake):
    fake.fake_cuda_set_driver_version(11080)
    try:
        with pytest.raises(BackendUnavailableError, match=r"CUDA 11\.8: too old"):
            cuda_engine(4, 4)
    finally:
        fake.fake_cuda_set_driver_version(12040)


def test_a_missing_gpu_or_driver_raises(fake, monkeypatch):
    with pytest.raises(BackendUnavailableError, match="GPU 3 does not exist"):
        cuda_engine(4, 4, device_ordinal=3)
    monkeypatch.setenv("TF_LMS_CUDA_DRIVER_PATH", "/nonexistent/libcuda.so.1")
    with pytest.raises(BackendUnavailableError, match="no NVIDIA driver"):
        cuda_engine(4, 4)


def test_a_failed_pool_creation_raises_and_leaks_nothing(fake):
    # The first cuMemCreate probes host memory (the fake's default 12.4 driver
    # cannot report host-located VMM support), the next two whether the driver
    # maps device and host memory at an offset; then the device pool, one
    # piece of its 8 granules.
    fake.fake_cuda_fail_nth_mem_create(4)
    with pytest.raises(OutOfMemoryError,
                       match="cuMemCreate of device granule 0 and the 7 after it"):
        cuda_engine(8, 8)
    engine = cuda_engine(8, 8)  # the next one is whole
    engine.check_invariants()
    del engine


def test_bad_backend_names_and_strict_mode_on_a_gpu_are_value_errors(fake):
    with pytest.raises(ValueError, match='use "posix" or "cuda"'):
        Engine(4 * GRANULE, backend="rocm")
    with pytest.raises(ValueError, match="TF_LMS_STRICT"):
        cuda_engine(4, 4, strict=True)


def test_an_injected_driver_failure_raises_and_loses_no_byte(fake):
    engine = cuda_engine(4, 8)
    a = engine.allocate(3 * GRANULE)
    engine.fill_pattern(a, 3 * GRANULE, 9)
    fake.fake_cuda_fail_nth_mem_map(2, CUDA_ERROR_UNKNOWN)  # evicting a
    with pytest.raises(RuntimeError, match="cuMemMap"):
        engine.allocate(2 * GRANULE, pin=True)
    assert not engine.inspect(a)["evicted"]
    assert engine.verify_pattern(a, 3 * GRANULE, 9) == -1
    engine.check_invariants()
    b = engine.allocate(2 * GRANULE, pin=True)  # works again: evicts a
    assert engine.inspect(a)["evicted"]
    assert engine.verify_pattern(a, 3 * GRANULE, 9) == -1
    with pytest.raises(OutOfMemoryError):
        engine.allocate(3 * GRANULE, pin=True)  # b is pinned, a too big
    engine.free(a)
    engine.free(b)
    del engine


def test_time_in_the_drivers_calls_is_accounted_inside_evictions_and_page_ins(fake):
    engine = cuda_engine(8, 32)
    tensors = [engine.allocate(4 * GRANULE) for _ in range(3)]
    for i, t in enumerate(tensors):
        engine.fill_pattern(t, 4 * GRANULE, i)
    start = engine.stats()
    for t in tensors:
        engine.unpin(t, engine.pin(t))
    end = engine.stats()
    delta = {name: end[name] - start[name] for name in end}
    assert delta["num_evictions"] >= 2 and delta["num_page_ins"] >= 2
    parts = ("time_copying_ns", "time_fencing_ns", "time_creating_memory_ns",
             "time_mapping_ns", "time_unmapping_ns")
    # Issuing copies, ordering the page-ins' copies, mapping and unmapping all
    # happened; host memory was first made by these evictions (it is created
    # as it is used). Nothing waited: with no fenced stream no work is queued
    # on the tensors, and no move waits for its own copies.
    for name in parts:
        assert delta[name] > 0, name
    assert delta["time_waiting_ns"] == 0
    assert sum(delta[name] for name in (*parts, "time_waiting_ns")) <= (
        delta["time_evicting_ns"] + delta["time_paging_in_ns"])
    for i, t in enumerate(tensors):
        assert engine.verify_pattern(t, 4 * GRANULE, i) == -1
        engine.free(t)
    del engine


@pytest.mark.parametrize("unmap_evicted", [False, True], ids=["mapped", "unmapped"])
def test_moves_run_while_the_kernels_of_a_fenced_stream_run_on_the_timing_model(
        fake, unmap_evicted):
    """gpu-check-engine's overlap steps (tests/gpu/check_engine.py: overlap, and
    overlap unmapped with TF_LMS_UNMAP_EVICTED) on the fake driver's H100
    timing model: kernels of a known duration on a fenced stream, each pinning
    a tensor paged in for it while the least recently used one is evicted. The step together is well under compute alone plus transfers alone
    (a host drain of the stream before each move would make it their sum), and
    the bytes the engine moved survive (the model's kernels write none; the
    fake's checker faults a remap under a kernel still running)."""
    from dataclasses import replace

    import tensorflow_lms_allocator.engine as lms

    check_engine, gpu_model = load("check_engine", "tests/gpu"), load("gpu_model")
    driver = gpu_model.FakeDriver(os.environ["TF_LMS_CUDA_DRIVER_PATH"])
    driver.enable("h100")
    launcher = gpu_model.FakeLauncher(driver)
    try:
        sizes = replace(check_engine.GPU_SIZES, overlap_tensor=16 * GRANULE, overlap_count=8,
                        granule=GRANULE)
        # Kernels of 0.5x, 1x and 2x the moves' time a kernel; a wrong byte
        # raises AssertionError.
        rows = check_engine.overlap(check_engine.Check(" (test)"), lms, sizes, launcher,
                                    unmap_evicted=unmap_evicted)
    finally:
        launcher.close()
        fake.fake_cuda_timing_disable()
    for row in rows:
        assert row["hidden"] > 0.5, row
        assert row["step_ms"] < 0.8 * (row["compute_ms"] + row["transfers_ms"]), row


def test_the_floors_of_a_step_put_the_gpu_behind_the_host_calls_before_each_launch():
    """benchmarks/gpu_model.py's host_floors: the GPU runs kernels one at a time,
    each no sooner than the driver calls before its launch are made. With one
    host thread those calls add up; with the VMM calls on threads of their own
    they overlap the launches, never each other (the driver serialises them)."""
    gpu_model = load("gpu_model")
    # Kernels longer than every call: the kernels alone, on either floor.
    busy = [(100, 10, 5), (100, 20, 10), (100, 30, 15)]
    assert gpu_model.host_floors(busy, 0, 0) == {
        "floor_one_thread_ns": 315, "floor_any_threads_ns": 310}
    # The second kernel waits for 60 of VMM calls and 12 of launches made
    # before it: in turn 72, side by side 60; the totals are cumulative, so
    # what was made before the step (1000 and 500) is not the step's.
    late = [(5, 1000, 502), (5, 1060, 512)]
    assert gpu_model.host_floors(late, 1000, 500) == {
        "floor_one_thread_ns": 77, "floor_any_threads_ns": 65}


@pytest.fixture
def modeled(fake):
    """benchmarks/gpu_model.py, its FakeDriver on the H200 model, a fenced stream
    and an engine of 8 granules over 32 of host memory."""
    gpu_model = load("gpu_model")
    driver = gpu_model.FakeDriver(os.environ["TF_LMS_CUDA_DRIVER_PATH"])
    stream = driver.stream()
    e = cuda_engine(8, 32)
    e.add_fenced_stream(stream)
    # A list, emptied at the end: pytest keeps the value until after `fake`
    # has counted what leaked.
    held = [gpu_model, driver, stream, e]
    try:
        driver.enable("h200")
        # As the benchmark does: this thread on clock 0, the backend's unmap
        # thread on a clock of its own, so that its calls (made whenever that
        # thread runs) never move the clocks these tests compare.
        driver.use_clock(0)
        driver.other_threads_clock(3)
        yield held
    finally:
        fake.fake_cuda_timing_disable()
        e.remove_fenced_stream(stream)
        held.clear()
        del e
        driver.call("cuStreamDestroy", stream)


def test_a_helper_on_a_clock_of_its_own_holds_the_lock_or_lets_the_launcher_go_on(modeled):
    """benchmarks/gpu_model.py's Helper on the timing model: a helper thread's
    evictions ahead (Engine::EvictAhead) are charged to a clock of its own, not
    to the thread that launches kernels. Holding the engine's lock (as it does
    today), the launching thread's next engine call waits until the helper ends;
    with the lock modeled away it goes on at once. The room is made ahead: the
    request after it evicts nothing, and every byte survives."""
    gpu_model, driver, stream, e = modeled
    for locked in (True, False):
        tensors = [e.allocate(2 * GRANULE) for _ in range(4)]
        for seed, t in enumerate(tensors):
            e.fill_pattern(t, 2 * GRANULE, seed)
        driver.kernel(stream, 1_000_000, [])
        launched = driver.clock(0)
        helper = gpu_model.Helper("evict-ahead", room=4 * GRANULE, locked=locked)
        helper.notify(driver, e)
        assert helper.busy_ns > 0
        assert driver.clock(0) == launched  # the helper's calls are not charged here
        assert driver.clock(1) == launched + helper.busy_ns
        assert e.stats()["num_evictions"] == 2 * (1 + (not locked))
        helper.take_lock(driver)
        # Locked, its next engine call starts when the helper let go;
        # unlocked, at once (the driver orders its VMM calls: the fake's
        # own test, TimingGivesEachThreadAClockAndTheDriverOneVmmCallAtATime).
        assert driver.clock(0) == (driver.clock(1) if locked else launched)
        new = e.allocate(4 * GRANULE, pin=True)
        assert e.stats()["num_evictions"] == 2 * (1 + (not locked))  # no eviction
        e.unpin(new, e.inspect(new)["unit_id"])
        e.free(new)
        for seed, t in enumerate(tensors):
            assert e.verify_pattern(t, 2 * GRANULE, seed) == -1
            e.free(t)
    driver.synchronize(stream)


def test_the_bounds_of_perfect_predictions_leave_the_launching_thread_its_clock(modeled):
    """benchmarks/gpu_model.py's two bounds of perfect predictions on the timing
    model: with allocate_ahead an allocation's maps are charged to clock 2
    (made ahead), not to the thread that launches kernels, which they cost
    without it; with foresee, the helper pages in exactly the addresses the next
    launches pin, on its own clock, every byte intact."""
    gpu_model, driver, stream, e = modeled
    made: list[int] = []
    for ahead in (False, True):
        helper = gpu_model.Helper("both", allocate_ahead=ahead)
        launcher, clock2 = driver.clock(0), driver.clock(2)
        made.append(helper.allocate(driver, e, 2 * GRANULE, pin=False, writer=False))
        # Its maps are charged to clock 2 made ahead, to the launcher otherwise.
        assert (driver.clock(0) == launcher) == ahead
        assert (driver.clock(2) > clock2) == ahead
    for seed, t in enumerate(made):
        e.fill_pattern(t, 2 * GRANULE, seed)
    e.evict(made[0])
    assert e.inspect(made[0])["evicted"] and not e.inspect(made[1])["evicted"]
    driver.kernel(stream, 1_000_000, [])
    launched = driver.clock(0)
    helper = gpu_model.Helper("prefetch", foresee=1, locked=False)
    helper.notify(driver, e, [made[0], made[1]])
    assert not e.inspect(made[0])["evicted"]
    assert driver.clock(0) == launched and driver.clock(1) == launched + helper.busy_ns
    assert helper.vmm_ns > 0  # the page-in remapped on the helper's clock
    assert e.stats()["num_evictions"] == 1  # room enough: it evicted nothing
    for seed, t in enumerate(made):
        assert e.verify_pattern(t, 2 * GRANULE, seed) == -1
        e.free(t)
    driver.synchronize(stream)

def test_an_eviction_left_unmapped_maps_nothing_and_waits_for_the_tensors_last_kernel(fake):
    """Note [Evicted tensors unmapped] on the H200 timing model. Without
    unmap_evicted an eviction maps host memory at the tensor's address (a
    cuMemMap a host run, beside the host memory's own maps into its window);
    with it, it maps nothing there. A tensor a kernel still reads on a fenced stream is
    evicted too: its device mapping goes only once that kernel is done (the
    fake records a violation for an unmap under a running kernel, which the
    fixture fails on). The page-ins bring every byte back."""
    gpu_model = load("gpu_model")
    driver = gpu_model.FakeDriver(os.environ["TF_LMS_CUDA_DRIVER_PATH"])
    stream = driver.stream()
    fake.fake_cuda_call_count.argtypes = [ctypes.c_char_p]
    fake.fake_cuda_call_count.restype = ctypes.c_ulonglong
    maps: list[int] = []
    try:
        driver.enable("h200")
        for unmap in (False, True):
            e = cuda_engine(8, 32, unmap_evicted=unmap)
            e.add_fenced_stream(stream)
            idle, busy = e.allocate(2 * GRANULE), e.allocate(2 * GRANULE)
            e.fill_pattern(idle, 2 * GRANULE, 7)
            e.fill_pattern(busy, 2 * GRANULE, 8)
            # The open epoch ended and waited for (the C++ tests' CompleteAnEpoch:
            # a granule's eviction, whose copy waits for the epoch, a host wait
            # for that copy, and the free), so idle's last use is known done
            # and nothing is deferred: a stream synchronize alone leaves its
            # epoch open, and the eviction's poll may find it still running.
            scratch = e.allocate(GRANULE)
            e.evict(scratch)
            e.wait_for_copies()
            e.free(scratch)
            before = fake.fake_cuda_call_count(b"cuMemMap")
            e.evict(idle)
            maps.append(fake.fake_cuda_call_count(b"cuMemMap") - before)
            unit = e.pin(busy)
            driver.kernel(stream, 50_000_000, [(busy, 2 * GRANULE)])  # 50 ms, still running
            e.unpin(busy, unit)
            e.evict(busy)
            assert e.inspect(idle)["evicted"] and e.inspect(busy)["evicted"]
            assert fake.fake_cuda_violation_count() == 0
            units = [e.pin(t) for t in (idle, busy)]  # the page-ins
            for seed, t in ((7, idle), (8, busy)):
                assert not e.inspect(t)["evicted"]
                assert e.verify_pattern(t, 2 * GRANULE, seed) == -1
            driver.synchronize(stream)
            for t, u in zip((idle, busy), units):
                e.unpin(t, u)
                e.free(t)
            e.remove_fenced_stream(stream)
            del e
    finally:
        fake.fake_cuda_timing_disable()
        driver.call("cuStreamDestroy", stream)
    # Host memory's own maps into its window are the same either way; without
    # the option, at least one more (the address's, a mapping a host run).
    assert maps[0] > maps[1] >= 1, maps
