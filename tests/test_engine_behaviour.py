"""The engine's observable behaviour through its Python binding: real memory,
real evictions and page-ins, statistics, and clear failures for bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tensorflow_lms_allocator.engine import (
    AllocationStateError,
    Engine,
    OutOfMemoryError,
    UnknownAllocationError,
    host_limit_from_env,
)
from conftest import GRANULE

pytestmark = pytest.mark.quick


@pytest.fixture
def make_engine(make_engine_each_backend):
    """Every engine test here runs on both backends (conftest.py)."""
    return make_engine_each_backend


def test_evicted_allocation_keeps_its_address_and_bytes(make_engine):
    engine = make_engine(8, 32)
    size = 5 * GRANULE + 17
    a = engine.allocate(size)
    engine.fill_pattern(a, size, 7)
    b = engine.allocate(6 * GRANULE)  # only 3 granules free: evicts a
    info = engine.inspect(a)
    assert info["evicted"] and info["address"] == a
    assert engine.verify_pattern(a, size, 7) == -1  # served from host memory
    engine.pin(a + 100)  # interior pointer; pages a in, evicting b
    assert not engine.inspect(a)["evicted"]
    assert engine.inspect(b)["evicted"]
    assert engine.verify_pattern(a, size, 7) == -1
    stats = engine.stats()
    assert stats["num_single_reclaims"] == 2
    assert stats["num_page_ins"] == 1
    assert stats["bytes_reclaimed"] == 12 * GRANULE
    assert stats["current_bytes_reclaimed"] == 6 * GRANULE
    assert stats["host_bytes_in_use"] == 6 * GRANULE


def test_writes_to_an_evicted_allocation_survive_page_in(make_engine):
    engine = make_engine(4, 16)
    a = engine.allocate(2 * GRANULE)
    engine.evict(a)
    engine.fill_pattern(a, 2 * GRANULE, 3)  # unpinned write goes to host memory
    allocation_id = engine.pin(a)
    assert engine.verify_pattern(a, 2 * GRANULE, 3) == -1
    engine.unpin(a, allocation_id)


def test_statistics_add_up(make_engine):
    engine = make_engine(16, 64)
    small = [engine.allocate(1000) for _ in range(10)]
    large = engine.allocate(3 * GRANULE, pin=True)
    inactive = engine.allocate(2 * GRANULE)
    stats = engine.stats()
    assert stats["num_allocs"] == 12
    assert stats["bytes_in_use"] == 10 * 1024 + 5 * GRANULE
    # Small objects nobody pins are inactive: their page may be evicted.
    assert stats["bytes_active"] == 3 * GRANULE
    assert stats["bytes_inactive"] == 10 * 1024 + 2 * GRANULE
    assert stats["bytes_limit"] == stats["bytes_reservable_limit"] == 16 * GRANULE
    assert stats["bytes_reserved"] == 6 * GRANULE  # 1 small-object page + 5
    assert stats["largest_alloc_size"] == 3 * GRANULE
    for p in small + [large, inactive]:
        engine.free(p)
    stats = engine.stats()
    assert stats["bytes_in_use"] == stats["bytes_active"] == stats["bytes_inactive"] == 0
    assert stats["peak_bytes_in_use"] == 10 * 1024 + 5 * GRANULE


TIME_PARTS = ("time_copying_ns", "time_waiting_ns", "time_fencing_ns",
              "time_creating_memory_ns", "time_mapping_ns", "time_unmapping_ns")


def test_time_in_evictions_and_page_ins_is_accounted_with_its_parts(make_engine):
    engine = make_engine(8, 64)
    before = engine.stats()
    assert all(before[name] == 0 for name in ("time_evicting_ns", "time_paging_in_ns",
                                              *TIME_PARTS))
    tensors = [engine.allocate(4 * GRANULE) for _ in range(4)]
    for i, t in enumerate(tensors):
        engine.fill_pattern(t, 4 * GRANULE, i)
    start = engine.stats()
    for t in tensors:
        engine.unpin(t, engine.pin(t))  # each pin evicts the other resident one
    end = engine.stats()
    delta = {name: end[name] - start[name] for name in end}
    assert delta["num_evictions"] >= 2 and delta["num_page_ins"] >= 2
    assert delta["time_evicting_ns"] > 0 and delta["time_paging_in_ns"] > 0
    assert delta["time_copying_ns"] > 0 and delta["time_mapping_ns"] > 0
    # The pins' reclaims chose their victims.
    assert delta["time_planning_ns"] > 0
    # One thread: nobody else ever held the engine's lock or moved a unit.
    assert end["time_lock_waiting_ns"] == end["time_move_waiting_ns"] == 0
    if engine.backend == "posix":
        # The emulated device copies on the CPU and maps with mmap; it never
        # waits, fences or creates memory on first use.
        assert delta["time_waiting_ns"] == delta["time_fencing_ns"] == 0
        assert delta["time_creating_memory_ns"] == 0
    else:
        # No fenced stream: nothing queued to wait for, only remaps.
        assert delta["time_unmapping_ns"] > 0
    # Every part happened inside an eviction or a page-in.
    assert sum(delta[name] for name in TIME_PARTS) <= (
        delta["time_evicting_ns"] + delta["time_paging_in_ns"])
    for i, t in enumerate(tensors):
        assert engine.verify_pattern(t, 4 * GRANULE, i) == -1
        engine.free(t)


def test_repeated_allocate_free_reuses_cached_granules(make_engine):
    engine = make_engine(16, 16)
    for _ in range(100):
        engine.free(engine.allocate(4 * GRANULE))
    assert engine.cached_granules == 4  # kept mapped: no mapping calls
    assert engine.device_granules_in_use == 4
    assert engine.stats()["peak_bytes_reserved"] == 4 * GRANULE


def test_defragmentation_avoids_eviction_on_a_fragmenting_pattern(make_engine):
    results = {}
    for defrag in (False, True):
        engine = make_engine(12, 64, defrag_enabled=defrag)
        # Interleave long-lived and short-lived allocations, free the short
        # ones: the free granules are scattered in 2-granule holes.
        keep, holes = [], []
        for i in range(6):
            (keep if i % 2 else holes).append(engine.allocate(2 * GRANULE))
        for p in keep:
            engine.fill_pattern(p, 2 * GRANULE, p)
        for p in holes:
            engine.free(p)
        engine.allocate(6 * GRANULE)
        for p in keep:
            assert engine.verify_pattern(p, 2 * GRANULE, p) == -1
        results[defrag] = engine.stats()
    assert results[False]["num_evictions"] > 0
    assert results[False]["num_defragmentations"] == 0
    assert results[True]["num_evictions"] == 0
    assert results[True]["num_defragmentations"] == 1
    assert results[True]["bytes_defragged"] == 6 * GRANULE


def test_lms_off_is_a_capped_allocator(make_engine):
    engine = make_engine(4, 16, lms_enabled=False)
    engine.allocate(3 * GRANULE)
    with pytest.raises(OutOfMemoryError, match="LMS is off"):
        engine.allocate(2 * GRANULE)
    engine.lms_enabled = True
    engine.allocate(2 * GRANULE)
    assert engine.stats()["num_evictions"] == 1


def test_zero_size_request_is_rejected(make_engine):
    with pytest.raises(ValueError, match="zero-size"):
        make_engine().allocate(0)


def test_impossible_request_is_out_of_memory_and_harms_nothing(make_engine):
    engine = make_engine(4, 4)
    a = engine.allocate(GRANULE)
    engine.fill_pattern(a, GRANULE, 1)
    with pytest.raises(OutOfMemoryError, match="exceeds the device memory.*TF_GPU_HOST_MEM"):
        engine.allocate(9 * GRANULE)  # more than device plus host
    with pytest.raises(OutOfMemoryError, match="exceeds the device memory.*TF_GPU_HOST_MEM"):
        engine.allocate(5 * GRANULE)  # more than the device, and than the host pool
    with pytest.raises(OutOfMemoryError, match="exceeds the device memory.*resident"):
        engine.allocate(5 * GRANULE, pin=True)  # a pin at birth needs it resident
    engine.lms_enabled = False
    with pytest.raises(OutOfMemoryError, match="exceeds the device memory.*LMS is off"):
        engine.allocate(2 * GRANULE + 5 * GRANULE)
    assert engine.verify_pattern(a, GRANULE, 1) == -1
    assert isinstance(OutOfMemoryError("x"), MemoryError)
    engine.check_invariants()


def test_request_larger_than_the_device_lives_in_host_memory_and_pins_in_place(make_engine):
    """With LMS on, an allocation nobody pins at birth may be larger than the
    device: it is born evicted, and a pin leaves it there (its user reads and
    writes it in place) instead of failing to page it in."""
    engine = make_engine(4, 16)
    big = engine.allocate(6 * GRANULE + 100, writer=True)
    info = engine.inspect(big)
    assert info["evicted"] and info["unclaimed"]
    engine.fill_pattern(big, 6 * GRANULE + 100, 7)
    unit = engine.pin(big + GRANULE)  # claims it; it stays in host memory
    info = engine.inspect(big)
    assert info["evicted"] and info["pin_count"] == 1 and not info["unclaimed"]
    engine.fill_pattern(big, 6 * GRANULE + 100, 8)  # written in place while pinned
    small = engine.allocate(3 * GRANULE, pin=True)  # the device is all free still
    assert not engine.inspect(small)["evicted"]
    engine.unpin(big, unit)
    assert engine.verify_pattern(big, 6 * GRANULE + 100, 8) == -1
    engine.check_invariants()
    stats = engine.stats()
    assert stats["num_born_evicted"] == 1 and stats["num_page_ins"] == 0


def test_a_pin_anywhere_in_a_born_evicted_small_object_claims_it(make_engine):
    """A small object made outside kernels when the device is full is born
    evicted, alone in its page. A kernel that reads it only through a slice
    pins an interior byte: that pin pages the page in, so it must claim the
    object (its writer handed it over); left unclaimed and resident, its page
    could never be evicted again. Found by the model-based test."""
    engine = make_engine(2, 16)
    full = engine.allocate(2 * GRANULE, pin=True)
    small = engine.allocate(GRANULE - 767, writer=True)
    info = engine.inspect(small)
    assert info["small"] and info["evicted"] and info["unclaimed"]
    engine.fill_pattern(small, GRANULE - 767, 7)
    engine.unpin(full, engine.inspect(full)["unit_id"])
    unit = engine.pin(small + 1)
    info = engine.inspect(small)
    assert not info["evicted"] and not info["unclaimed"]
    assert engine.stats()["bytes_unclaimed"] == 0
    assert engine.verify_pattern(small, GRANULE - 767, 7) == -1
    engine.unpin(small + 1, unit)
    engine.allocate(2 * GRANULE, pin=True)  # evicts the page it claimed
    assert engine.inspect(small)["evicted"]
    assert engine.verify_pattern(small, GRANULE - 767, 7) == -1
    engine.check_invariants()


def _page_of(engine, address: int) -> int:
    return engine.inspect(address)["unit_address"]


def test_small_objects_made_outside_kernels_pin_no_kernel_page(make_engine):
    """Note [Writer pages]: tf.data batches go to pages of their own, never
    into the holes of pages of inactive activations, so those stay evictable.
    Before, twelve 16 KiB batches made all twelve activation pages unclaimed
    and a kernel's request of 8 granules could evict nothing."""
    engine = make_engine(16, 64)
    activations = [engine.allocate(40 << 10) for _ in range(12)]  # a page each
    batches = [engine.allocate(16 << 10, writer=True) for _ in range(12)]
    activation_pages = {_page_of(engine, a) for a in activations}
    batch_pages = {_page_of(engine, b) for b in batches}
    assert len(activation_pages) == 12 and len(batch_pages) == 3
    assert not activation_pages & batch_pages
    assert engine.stats()["bytes_unclaimed"] == 12 * (16 << 10)
    for i, b in enumerate(batches):
        engine.fill_pattern(b, 16 << 10, 100 + i)
    kernel = engine.allocate(8 * GRANULE, pin=True)  # evicts activation pages only
    assert not engine.inspect(kernel)["evicted"]
    assert all(not engine.inspect(b)["evicted"] for b in batches)
    assert sum(engine.inspect(a)["evicted"] for a in activations) >= 7
    assert all(engine.verify_pattern(b, 16 << 10, 100 + i) == -1 for i, b in enumerate(batches))
    engine.check_invariants()


def test_an_unclaimed_object_takes_a_claimed_page_only_within_the_bound(make_engine):
    """An unclaimed object in a page that held nothing unclaimed takes that page
    off the eviction list, so it goes there only while unclaimed memory then
    holds at most half the device (Note [Writer pages])."""
    engine = make_engine(8, 64)
    claimed = engine.allocate(16 << 10, writer=True)
    engine.unpin(claimed, engine.pin(claimed))  # claimed: its page is evictable
    unclaimed = [engine.allocate(3 * GRANULE, writer=True)]  # 3 of 8 granules unclaimed
    inside = engine.allocate(16 << 10, writer=True)  # 4 of 8: within the bound
    assert _page_of(engine, inside) == _page_of(engine, claimed)
    engine.unpin(inside, engine.pin(inside))
    unclaimed.append(engine.allocate(GRANULE, writer=True))  # 4 of 8 unclaimed
    beyond = engine.allocate(16 << 10, writer=True)  # 5 of 8 in that page: not there
    assert _page_of(engine, beyond) != _page_of(engine, claimed)
    engine.check_invariants()


def test_out_of_memory_names_the_bytes_made_outside_kernels_exactly(make_engine):
    """The message counts the unclaimed objects' own bytes, and apart from them
    the device memory their pages hold."""
    engine = make_engine(4, 64)
    batches = [engine.allocate(10 << 10, writer=True) for _ in range(3)]  # one page
    assert len({_page_of(engine, b) for b in batches}) == 1
    engine.allocate(3 * GRANULE, pin=True)
    with pytest.raises(OutOfMemoryError) as error:
        engine.allocate(2 * GRANULE, pin=True)
    message = str(error.value)
    assert "0.0 MiB (30720 bytes) allocated outside kernels" in message, message
    assert f"holding 0.1 MiB ({GRANULE} bytes) of device memory" in message, message


def test_unknown_and_double_free_are_errors(make_engine):
    engine = make_engine()
    with pytest.raises(UnknownAllocationError, match="no live allocation"):
        engine.free(0x1000)
    for size in (100, 3 * GRANULE):
        p = engine.allocate(size)
        engine.free(p)
        with pytest.raises(UnknownAllocationError, match="already freed"):
            engine.free(p)
    keep = engine.allocate(2 * GRANULE)
    with pytest.raises(UnknownAllocationError):
        engine.free(keep + 256)  # inside, not the start
    assert engine.inspect(keep)["address"] == keep


def test_unpin_without_pin_and_stale_unpin_are_errors(make_engine):
    engine = make_engine()
    a = engine.allocate(2 * GRANULE)
    with pytest.raises(AllocationStateError, match="without a matching pin"):
        engine.unpin(a)
    allocation_id = engine.pin(a)
    engine.free(a)
    b = engine.allocate(2 * GRANULE)  # reuses the address
    assert b == a
    with pytest.raises(UnknownAllocationError, match="was freed"):
        engine.unpin(b, allocation_id)
    assert engine.inspect(b)["pin_count"] == 0


def test_host_pool_exhausted_while_evicting_names_the_setting(make_engine):
    engine = make_engine(4, 2)
    a = engine.allocate(4 * GRANULE)
    engine.fill_pattern(a, 4 * GRANULE, 5)
    with pytest.raises(OutOfMemoryError, match="TF_GPU_HOST_MEM_LIMIT_IN_MB"):
        engine.allocate(GRANULE, pin=True)  # a kernel's: it needs device memory
    assert engine.verify_pattern(a, 4 * GRANULE, 5) == -1
    assert not engine.inspect(a)["evicted"]
    engine.free(a)
    engine.allocate(GRANULE)


@pytest.mark.parametrize("value", ["abc", "-5", "0", "1.5", "99999999999999"])
def test_invalid_host_limit_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", value)
    with pytest.raises(ValueError, match=f"TF_GPU_HOST_MEM_LIMIT_IN_MB='{value}'"):
        host_limit_from_env()
    with pytest.raises(ValueError, match="TF_GPU_HOST_MEM_LIMIT_IN_MB"):
        Engine(8 * GRANULE, granule_bytes=GRANULE)


def test_host_limit_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "3")
    assert host_limit_from_env() == 3 << 20
    assert Engine(8 * GRANULE, granule_bytes=GRANULE).host_granules == 48
    monkeypatch.delenv("TF_GPU_HOST_MEM_LIMIT_IN_MB")
    assert host_limit_from_env() == 64 << 30


def test_bad_engine_options_are_clear_errors():
    with pytest.raises(ValueError, match="granule size"):
        Engine(8 << 20, host_bytes=0, granule_bytes=3000)
    with pytest.raises(ValueError, match="smaller than one granule"):
        Engine(1 << 20, host_bytes=0, granule_bytes=2 << 20)


def test_strict_mode_reports_each_unpinned_touch(make_posix_engine):
    engine = make_posix_engine(8, 32, strict=True)
    a = engine.allocate(3 * GRANULE)
    engine.fill_pattern(a, 3 * GRANULE, 9)
    engine.evict(a)
    # verify_pattern reads every granule without a pin: three reports, and the
    # bytes are still right.
    assert engine.verify_pattern(a, 3 * GRANULE, 9) == -1
    touches = engine.unpinned_touches()
    assert [t["address"] for t in touches] == [a, a + GRANULE, a + 2 * GRANULE]
    assert {t["allocation_id"] for t in touches} == {engine.inspect(a)["id"]}
    assert all(t["allocation_bytes"] == 3 * GRANULE for t in touches)
    engine.clear_unpinned_touches()
    engine.pin(a)
    assert engine.verify_pattern(a, 3 * GRANULE, 9) == -1
    assert engine.unpinned_touches() == []


def test_strict_mode_reports_no_touch_of_memory_its_writer_holds(make_posix_engine):
    """Note [Strict access follows holders]: an allocation made outside kernels
    and placed in host memory is filled by its writer unpinned, by design; only
    once a pin has claimed it and nobody holds it is a touch reported."""
    engine = make_posix_engine(4, 32, strict=True)
    full = engine.allocate(4 * GRANULE, pin=True)  # the device is full and pinned
    batch = engine.allocate(2 * GRANULE, writer=True)  # a tf.data batch
    assert engine.inspect(batch)["evicted"] and engine.inspect(batch)["unclaimed"]
    engine.fill_pattern(batch, 2 * GRANULE, 3)  # its writer fills it
    assert engine.unpinned_touches() == []
    engine.unpin(full, engine.inspect(full)["unit_id"])
    engine.pin(batch)  # claimed (and paged in)
    engine.unpin(batch, engine.inspect(batch)["unit_id"])
    engine.evict(batch)
    assert engine.verify_pattern(batch, 2 * GRANULE, 3) == -1
    assert [t["address"] for t in engine.unpinned_touches()] == [batch, batch + GRANULE]
    engine.check_invariants()


def test_strict_mode_reports_no_touch_of_a_unit_pinned_in_host_memory(make_posix_engine):
    """A unit larger than the device is pinned where it is, in host memory: its
    pinner's touches are not reported, and after the last unpin they are."""
    engine = make_posix_engine(2, 32, strict=True)
    big = engine.allocate(3 * GRANULE, writer=True)  # born evicted, claimed below
    engine.fill_pattern(big, 3 * GRANULE, 4)
    engine.pin(big)
    assert engine.inspect(big)["evicted"]
    assert engine.verify_pattern(big, 3 * GRANULE, 4) == -1
    assert engine.unpinned_touches() == []
    engine.unpin(big, engine.inspect(big)["unit_id"])
    assert engine.verify_pattern(big, 3 * GRANULE, 4) == -1
    assert len(engine.unpinned_touches()) == 3
    engine.check_invariants()


def test_strict_mode_does_not_hide_real_crashes(tmp_path):
    """A fault outside evicted memory still kills the process as before."""
    script = (
        "import ctypes\n"
        "from tensorflow_lms_allocator.engine import Engine\n"
        f"e = Engine(8 * {GRANULE}, host_bytes=8 * {GRANULE}, granule_bytes={GRANULE}, strict=True)\n"
        "ctypes.string_at(8)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert result.returncode == -11


def test_an_optional_request_evicts_within_a_sixteenth_of_the_device_a_step(make_engine):
    # TensorFlow's retry_on_failure=false: cuDNN's autotuning scratch and
    # workspaces, whose kernel can do without (it falls back to an algorithm
    # that needs none, cached for the whole run when autotuning was refused).
    # Note [Optional requests]: such a request evicts as any other, up to a
    # sixteenth of the device per TensorFlow step, and is never born evicted.
    engine = make_engine(32, 64)  # an allowance of 2 granules a step
    big = engine.allocate(3 * GRANULE)  # the least recently used
    held = [engine.allocate(2 * GRANULE) for _ in range(14)]  # 31 of 32 granules, inactive
    engine.fill_pattern(big, 3 * GRANULE, 99)
    for i, t in enumerate(held):
        engine.fill_pattern(t, 2 * GRANULE, i)
    before = engine.stats()
    # One granule short, but the victim would be 3 granules: over the
    # allowance, so nothing is evicted and the request is refused.
    with pytest.raises(OutOfMemoryError):
        engine.allocate(2 * GRANULE, pin=True, optional=True, step=1)
    assert engine.stats()["num_evictions"] == before["num_evictions"]
    engine.unpin(big, engine.pin(big))  # now the most recently used
    # The victim is a 2-granule tensor: within the allowance.
    scratch = [engine.allocate(2 * GRANULE, pin=True, optional=True, step=1)]
    after = engine.stats()
    assert after["num_evictions"] - before["num_evictions"] == 1
    assert after["bytes_evicted_for_optional"] == 2 * GRANULE
    # The step's allowance is spent: refused, with nothing evicted or born evicted.
    with pytest.raises(OutOfMemoryError):
        engine.allocate(2 * GRANULE, pin=True, optional=True, step=1)
    scratch.append(engine.allocate(GRANULE, pin=True))  # the last free granule
    with pytest.raises(OutOfMemoryError):
        engine.allocate(1000, pin=True, optional=True, step=1)  # a small one needs a page
    refused = engine.stats()
    assert refused["num_optional_refused"] - before["num_optional_refused"] == 3  # so far
    assert refused["num_evictions"] == after["num_evictions"]
    assert refused["num_born_evicted"] == before["num_born_evicted"]
    # The next step has its own allowance...
    scratch.append(engine.allocate(2 * GRANULE, pin=True, optional=True, step=2))
    assert engine.stats()["bytes_evicted_for_optional"] == 4 * GRANULE
    # ...and an interleaved request of step 1 finds step 1's spent, not a new one.
    with pytest.raises(OutOfMemoryError):
        engine.allocate(2 * GRANULE, pin=True, optional=True, step=1)
    assert sum(engine.inspect(t)["evicted"] for t in held) == 2
    assert not engine.inspect(big)["evicted"]
    assert engine.verify_pattern(big, 3 * GRANULE, 99) == -1
    for i, t in enumerate(held):
        assert engine.verify_pattern(t, 2 * GRANULE, i) == -1
    for p in scratch:
        assert not engine.inspect(p)["evicted"]
        engine.unpin(p, engine.inspect(p)["unit_id"])
        engine.free(p)
    for t in [big, *held]:
        engine.free(t)


def test_the_learned_order_gives_way_to_lrus_and_back_while_learning_goes_on(make_engine):
    engine = make_engine(8, 64, policy="learned")
    tensors = [engine.allocate(4 * GRANULE) for _ in range(4)]
    for i, t in enumerate(tensors):
        engine.fill_pattern(t, 4 * GRANULE, i)

    def a_round() -> tuple[int, int]:
        """Pins each tensor in turn (each pin evicts): (evictions, learned reclaims)."""
        before = engine.stats()
        for t in tensors:
            engine.unpin(t, engine.pin(t))
        after = engine.stats()
        return (after["num_evictions"] - before["num_evictions"],
                after["num_learned_reclaims"] - before["num_learned_reclaims"])

    evictions, learned = a_round()
    assert evictions >= 2 and learned == evictions
    engine.set_learned_order(False)
    predictions = engine.stats()["num_predictions"]
    evictions, learned = a_round()
    assert evictions >= 2 and learned == 0
    assert engine.stats()["num_predictions"] > predictions  # it went on learning
    engine.set_learned_order(True)
    evictions, learned = a_round()
    assert evictions >= 2 and learned == evictions
    for i, t in enumerate(tensors):
        assert engine.verify_pattern(t, 4 * GRANULE, i) == -1
    with pytest.raises(RuntimeError, match="TF_LMS_POLICY=learned"):
        make_engine(8, 64).set_learned_order(False)
