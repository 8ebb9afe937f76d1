"""Model-based randomized test of the engine (a Hypothesis state machine).

Under a tight device capacity, random sequences of allocate / write / free /
pin / unpin / evict / defragmentation and LMS toggles run against the real
engine and real memory. After every step:
  - every byte of every live allocation is intact (read at its address,
    without a pin: an evicted allocation must still read right);
  - no allocation's address ever changed;
  - device granules in use never exceed the capacity;
  - the statistics add up: in use == live bytes, active + inactive == in use,
    active == pinned + small bytes, reclaimed now == evicted bytes == host use.
With defragmentation and LMS on, a large request may fail only if it could not
fit even after evicting every inactive allocation and remapping every cached
granule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tensorflow_lms_allocator.engine import Engine, OutOfMemoryError
from conftest import GRANULE

DEVICE_GRANULES = 8
HOST_GRANULES = 256
MAX_LIVE = 24


@dataclass
class Live:
    address: int
    size: int
    seed: int
    allocation_id: int
    small: bool
    allocated: int
    pins: int = 0


PICK = st.integers(0, 1 << 30)  # index into the live allocations, modulo their count
TOTALS = {"steps": 0, "evictions": 0, "page_ins": 0, "defragmentations": 0}


def has_live(machine: "EngineModel") -> bool:
    return bool(machine.live)


class EngineModel(RuleBasedStateMachine):

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine(DEVICE_GRANULES * GRANULE,
                             host_bytes=HOST_GRANULES * GRANULE,
                             granule_bytes=GRANULE)
        self.live: dict[int, Live] = {}
        self.next_seed = 1

    def _pick(self, index: int) -> Live:
        # Allocation order, not address order: addresses differ between runs.
        return list(self.live.values())[index % len(self.live)]

    def teardown(self) -> None:
        stats = self.engine.stats()
        TOTALS["evictions"] += stats["num_evictions"]
        TOTALS["page_ins"] += stats["num_page_ins"]
        TOTALS["defragmentations"] += stats["num_defragmentations"]

    def _granules(self, live: Live) -> int:
        return live.allocated // GRANULE

    def _small_region_granules(self) -> int:
        resident = sum(self._granules(x) for x in self.live.values()
                       if not x.small and not self.engine.inspect(x.address)["evicted"])
        return self.engine.device_granules_in_use - resident - self.engine.cached_granules

    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(size=st.one_of(st.integers(1, 20_000),
                         st.integers(GRANULE, 4 * GRANULE),
                         st.integers(GRANULE, 3 * GRANULE)),
          pin=st.booleans())
    def allocate(self, size: int, pin: bool):
        pinned_granules = sum(self._granules(x) for x in self.live.values()
                              if x.pins > 0 and not x.small)
        small_granules = self._small_region_granules()
        try:
            address = self.engine.allocate(size, pin=pin)
        except OutOfMemoryError:
            if (size >= GRANULE and self.engine.defrag_enabled
                    and self.engine.lms_enabled):
                needed = -(-size // GRANULE)
                assert needed > DEVICE_GRANULES - pinned_granules - small_granules
            return
        assert address not in self.live
        info = self.engine.inspect(address)
        live = Live(address, size, self.next_seed, info["id"], info["small"],
                    info["allocated_bytes"], pins=1 if pin and not info["small"] else 0)
        self.next_seed += 1
        self.engine.fill_pattern(address, size, live.seed)
        self.live[address] = live

    @precondition(has_live)
    @rule(index=PICK)
    def rewrite(self, index: int):
        live = self._pick(index)
        address = live.address
        live.seed = self.next_seed
        self.next_seed += 1
        self.engine.fill_pattern(address, live.size, live.seed)

    @precondition(has_live)
    @rule(index=PICK)
    def free(self, index: int):
        live = self._pick(index)
        self.engine.free(live.address)
        del self.live[live.address]

    @precondition(has_live)
    @rule(index=PICK, offset=st.integers(0, 5 * GRANULE))
    def pin(self, index: int, offset: int):
        live = self._pick(index)
        address = live.address
        try:
            allocation_id = self.engine.pin(address + offset % live.size)
        except OutOfMemoryError:
            assert self.engine.inspect(address)["evicted"]
            return
        if live.small:
            assert allocation_id == 0
            return
        assert allocation_id == live.allocation_id
        live.pins += 1
        assert not self.engine.inspect(address)["evicted"]

    @precondition(has_live)
    @rule(index=PICK)
    def unpin(self, index: int):
        live = self._pick(index)
        address = live.address
        if live.small or live.pins == 0:
            return
        self.engine.unpin(address, live.allocation_id)
        live.pins -= 1

    @precondition(has_live)
    @rule(index=PICK)
    def evict(self, index: int):
        live = self._pick(index)
        address = live.address
        if live.small or live.pins > 0 or self.engine.inspect(address)["evicted"]:
            return
        self.engine.evict(address)
        assert self.engine.inspect(address)["evicted"]

    @rule(enabled=st.booleans())
    def set_defrag(self, enabled: bool):
        self.engine.defrag_enabled = enabled

    @rule(enabled=st.booleans())
    def set_lms(self, enabled: bool):
        self.engine.lms_enabled = enabled

    @invariant()
    def count_step(self):
        TOTALS["steps"] += 1

    @invariant()
    def every_byte_survives_at_the_same_address(self):
        for live in self.live.values():
            info = self.engine.inspect(live.address)
            assert info["address"] == live.address
            assert info["id"] == live.allocation_id
            assert info["pin_count"] == live.pins
            assert self.engine.verify_pattern(live.address, live.size, live.seed) == -1

    @invariant()
    def device_granules_never_exceed_capacity(self):
        assert self.engine.device_granules_in_use <= DEVICE_GRANULES

    @invariant()
    def statistics_add_up(self):
        stats = self.engine.stats()
        evicted = sum(x.allocated for x in self.live.values()
                      if not x.small and self.engine.inspect(x.address)["evicted"])
        active = sum(x.allocated for x in self.live.values() if x.small or x.pins > 0)
        assert stats["bytes_in_use"] == sum(x.allocated for x in self.live.values())
        assert stats["bytes_active"] + stats["bytes_inactive"] == stats["bytes_in_use"]
        assert stats["bytes_active"] == active
        assert stats["current_bytes_reclaimed"] == evicted
        assert stats["host_bytes_in_use"] == evicted
        assert stats["bytes_reserved"] == self.engine.device_granules_in_use * GRANULE
        assert stats["peak_bytes_in_use"] >= stats["bytes_in_use"]


EngineModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("LMS_MODEL_EXAMPLES", "300")),
    stateful_step_count=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineModel = EngineModel.TestCase
