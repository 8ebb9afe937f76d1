"""Model-based randomized test of the engine (a Hypothesis state machine).

Under a tight device capacity, random sequences of allocate / write / free /
pin / unpin / evict / defragmentation and LMS toggles run against the real
engine and real memory, large allocations and small objects (packed into
pages that are evicted and paged in whole) alike. After every step:
  - every byte of every live allocation is intact (read at its address,
    without a pin: an evicted allocation must still read right);
  - no allocation's address or id ever changed; every unit's pin count is
    the model's;
  - device granules in use never exceed the capacity;
  - the statistics add up: in use == live bytes, active == bytes of live
    allocations in pinned units, reclaimed now == host use == evicted units;
  - Engine.check_invariants() holds (granule accounting, cache, LRU, pages).
The examples are the same every run (derandomized: a coverage check below
must not depend on a draw); `LMS_MODEL_RANDOM=1` draws new ones.
It runs over both backends: POSIX, and CUDA over the fake driver (where
every byte is read through the backend's copies), and with both reclaim
policies (LRU, and the learned farthest-next-use order, whose predictions
the random sequence mostly defeats: it must still lose no byte).
With LMS on, a request nobody pins never fails (it is born evicted if the
device is full); a pinned one may fail only if it could not fit even after
evicting every inactive unit and remapping every cached granule.
Allocations made as a writer outside kernels would make them (Note [Writers
outside kernels]) are *unclaimed* until a pin names them (any byte of a large
one, a small one's first byte): meanwhile they
evict only while unclaimed memory holds at most half the device, and stay
where they were placed (resident, or born evicted) whatever else happens,
since their writer may still be writing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

from tensorflow_lms_allocator.engine import (Engine, OutOfMemoryError, UnknownAllocationError,
                                             set_thread_label)
from conftest import GRANULE

pytestmark = pytest.mark.quick

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
    unclaimed: bool = False
    born_evicted: bool = False  # where an unclaimed allocation was placed


@dataclass
class Token:
    """A pin held: what unpin needs, and the unit it counts on."""
    address: int
    unit_id: int
    unit_address: int


PICK = st.integers(0, 1 << 30)  # index into a list, modulo its length
TOTALS = {"steps": 0, "unclaimed_held": 0, "evictions": 0, "page_ins": 0, "defragmentations": 0,
          "cached_placements": 0, "born_evicted": 0, "small_evictions": 0, "learned_reclaims": 0,
          "predictions": 0, "prefetches": 0, "batched_page_ins": 0}


def has_live(machine: "EngineModel") -> bool:
    return bool(machine.live)


class EngineModel(RuleBasedStateMachine):
    BACKEND = "posix"  # the run's backend and policy: a subclass per run sets them
    POLICY = "lru"

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine(DEVICE_GRANULES * GRANULE,
                             host_bytes=HOST_GRANULES * GRANULE,
                             granule_bytes=GRANULE, backend=self.BACKEND, policy=self.POLICY)
        set_thread_label(None)
        self.live: dict[int, Live] = {}
        self.tokens: list[Token] = []
        self.unit_pins: dict[int, int] = defaultdict(int)  # unit address -> pins
        self.next_seed = 1

    def _pick(self, index: int) -> Live:
        # Allocation order, not address order: addresses differ between runs.
        return list(self.live.values())[index % len(self.live)]

    def teardown(self) -> None:
        stats = self.engine.stats()
        TOTALS["evictions"] += stats["num_evictions"]
        TOTALS["page_ins"] += stats["num_page_ins"]
        TOTALS["defragmentations"] += stats["num_defragmentations"]
        TOTALS["cached_placements"] += stats["num_cached_placements"]
        TOTALS["born_evicted"] += stats["num_born_evicted"]
        TOTALS["learned_reclaims"] += stats["num_learned_reclaims"]
        TOTALS["predictions"] += stats["num_predictions"]
        set_thread_label(None)
        # Destroyed now, not when the garbage collector finds the machine: a
        # CUDA engine's host granules count against the process's one pinned
        # host budget (pinned_host_budget.h) until it is destroyed, and the
        # next example's engine, made at once, would find it spent (a first
        # allocation refused in CI, with 16 of 16 MiB "made").
        self.engine = None

    def _unit(self, live: Live) -> dict:
        return self.engine.inspect(live.address)

    def _unclaimed_resident_granules(self) -> int:
        units = {}
        for x in self.live.values():
            info = self._unit(x)
            if x.unclaimed and not info["evicted"]:
                units[info["unit_address"]] = 1 if x.small else x.allocated // GRANULE
        return sum(units.values())

    def _held_granules(self) -> int:
        """Device granules nothing may evict: pinned units, and resident units
        holding an unclaimed allocation."""
        units = {}
        for x in self.live.values():
            info = self._unit(x)
            if info["pin_count"] > 0 or (x.unclaimed and not info["evicted"]):
                units[info["unit_address"]] = 1 if x.small else x.allocated // GRANULE
        # Empty pages held only by pins still hold a granule each.
        live_units = {self._unit(x)["unit_address"] for x in self.live.values()}
        extra = {t.unit_address for t in self.tokens} - live_units
        return sum(units.values()) + len(extra)

    @rule(lookahead=st.sampled_from([1, 8, 64]))
    def prefetch(self, lookahead: int):
        # With the learned policy, pages in what it predicts (a no-op with
        # LRU); whatever it moves, every byte must stay where it was.
        units = self.engine.prefetch(lookahead)
        assert units == 0 or self.POLICY == "learned"
        TOTALS["prefetches"] += units

    @rule(label=st.sampled_from([None, "conv", "matmul", "relu"]))
    def label_thread(self, label: str | None):
        # The "kernel" running: the learned policy keys allocations by it.
        set_thread_label(label)

    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(size=st.one_of(st.integers(1, 20_000),
                         st.integers(20_000, GRANULE - 1),
                         st.integers(GRANULE, 4 * GRANULE),
                         st.integers(GRANULE, 3 * GRANULE)),
          hold=st.sampled_from(["none", "pin", "writer"]),
          alignment=st.sampled_from([256, 256, 4096]))
    def allocate(self, size: int, hold: str, alignment: int):
        pin, writer = hold == "pin", hold == "writer"
        held_granules = self._held_granules()
        evictions = self.engine.stats()["num_evictions"]
        try:
            address = self.engine.allocate(size, pin=pin, alignment=alignment, writer=writer)
        except OutOfMemoryError:
            if self.engine.lms_enabled:
                assert pin, "a request nobody pins is born evicted, never refused"
                if self.engine.defrag_enabled:
                    needed = -(-size // GRANULE)
                    assert needed > DEVICE_GRANULES - held_granules
            return
        assert address not in self.live
        assert address % alignment == 0
        info = self.engine.inspect(address)
        assert info["requested_bytes"] == size
        live = Live(address, size, self.next_seed, info["id"], info["small"],
                    info["allocated_bytes"], writer, writer and info["evicted"])
        assert info["unclaimed"] == writer
        if writer and self.engine.stats()["num_evictions"] > evictions:
            # It displaced other memory only while unclaimed memory holds at
            # most half the device with it.
            assert 2 * self._unclaimed_resident_granules() <= DEVICE_GRANULES
        if pin:
            self.tokens.append(Token(address, info["unit_id"], info["unit_address"]))
            self.unit_pins[info["unit_address"]] += 1
        self.next_seed += 1
        self.engine.fill_pattern(address, size, live.seed)
        self.live[address] = live

    @precondition(has_live)
    @rule(index=PICK)
    def rewrite(self, index: int):
        live = self._pick(index)
        live.seed = self.next_seed
        self.next_seed += 1
        self.engine.fill_pattern(live.address, live.size, live.seed)

    @precondition(has_live)
    @rule(index=PICK)
    def free(self, index: int):
        live = self._pick(index)
        unit = self._unit(live)
        self.engine.free(live.address)
        del self.live[live.address]
        if not live.small:
            # Pins on a freed allocation die with it (a later unpin is NotFound).
            self.tokens = [t for t in self.tokens if t.unit_address != unit["unit_address"]]
            self.unit_pins.pop(unit["unit_address"], None)

    @precondition(has_live)
    @rule(index=PICK, offset=st.integers(0, 5 * GRANULE))
    def pin(self, index: int, offset: int):
        live = self._pick(index)
        address = live.address + offset % live.size
        names_it = self._pin_names_it(live, address)
        try:
            unit_id = self.engine.pin(address)
        except OutOfMemoryError:
            unit_id = 0
        # Claimed even when the page-in failed (its writer handed it over).
        live.unclaimed = live.unclaimed and not names_it
        self._pinned(live, address, unit_id)

    @precondition(has_live)
    @rule(picks=st.lists(st.tuples(PICK, st.integers(0, 5 * GRANULE)), min_size=1, max_size=4))
    def pin_all(self, picks: list[tuple[int, int]]):
        # A kernel's inputs, paged in together; the same unit may come twice.
        # It starts when the kernels before it have ended (every pin is
        # released), and evicted inputs come first, one after another from
        # the pick on: a batch pages several in at once.
        while self.tokens:
            self.unpin(0)
        evicted = [x for x in self.live.values() if self._unit(x)["evicted"]]
        pool = evicted if len(evicted) >= 2 else list(self.live.values())
        chosen = [pool[(picks[0][0] + j + (index % 2)) % len(pool)]
                  for j, (index, _) in enumerate(picks)]
        addresses = [live.address + offset % live.size
                     for live, (_, offset) in zip(chosen, picks)]
        names = [self._pin_names_it(live, a) for live, a in zip(chosen, addresses)]
        before = self.engine.stats()["num_page_ins"]
        unit_ids = self.engine.pin_all(addresses)
        if self.engine.stats()["num_page_ins"] - before >= 2:
            TOTALS["batched_page_ins"] += 1
        for live, names_it in zip(chosen, names):  # every claim, then the checks
            live.unclaimed = live.unclaimed and not names_it
        for live, address, unit_id in zip(chosen, addresses, unit_ids):
            self._pinned(live, address, unit_id)

    def _pin_names_it(self, live: Live, address: int) -> bool:
        # A pin claims it if it names it: any byte of a large allocation, a
        # small object's first byte, any byte of the one object of an evicted
        # page (born evicted for it) (Engine::Claim).
        return not live.small or address == live.address or self._unit(live)["evicted"]

    def _pinned(self, live: Live, address: int, unit_id: int) -> None:
        """Checks a pin of `address` in `live` that returned `unit_id` (0: out of memory)."""
        info = self._unit(live)
        if unit_id == 0:
            assert info["evicted"]
            return
        assert unit_id == info["unit_id"]
        assert not info["evicted"]
        assert info["unclaimed"] == live.unclaimed
        self.tokens.append(Token(address, unit_id, info["unit_address"]))
        self.unit_pins[info["unit_address"]] += 1

    @precondition(lambda self: bool(self.tokens))
    @rule(index=PICK)
    def unpin(self, index: int):
        token = self.tokens.pop(index % len(self.tokens))
        self.engine.unpin(token.address, token.unit_id)
        self.unit_pins[token.unit_address] -= 1
        if self.unit_pins[token.unit_address] == 0:
            del self.unit_pins[token.unit_address]
            # An empty page is released now: its address may host a new unit.
            if not any(self._unit(x)["unit_address"] == token.unit_address
                       for x in self.live.values()):
                try:
                    self.engine.unpin(token.address, token.unit_id)
                    raise AssertionError("an empty page outlived its last pin")
                except UnknownAllocationError:
                    pass

    @precondition(has_live)
    @rule(index=PICK)
    def evict(self, index: int):
        live = self._pick(index)
        info = self._unit(live)
        if info["pin_count"] > 0 or info["evicted"]:
            return
        if any(x.unclaimed and self._unit(x)["unit_address"] == info["unit_address"]
               for x in self.live.values()):
            with pytest.raises(RuntimeError, match="outside any kernel"):
                self.engine.evict(live.address)
            return
        self.engine.evict(live.address)
        assert self._unit(live)["evicted"]
        if live.small:
            TOTALS["small_evictions"] += 1

    @rule(enabled=st.booleans())
    def set_defrag(self, enabled: bool):
        self.engine.defrag_enabled = enabled

    @rule(enabled=st.booleans())
    def set_lms(self, enabled: bool):
        self.engine.lms_enabled = enabled

    @invariant()
    def count_step(self):
        TOTALS["steps"] += 1
        # Steps where an unclaimed allocation stayed resident under pressure.
        if self.engine.stats()["num_evictions"] and any(
                x.unclaimed and not x.born_evicted for x in self.live.values()):
            TOTALS["unclaimed_held"] += 1

    @invariant()
    def every_byte_survives_at_the_same_address(self):
        for live in self.live.values():
            info = self.engine.inspect(live.address)
            assert info["address"] == live.address
            assert info["id"] == live.allocation_id
            assert info["pin_count"] == self.unit_pins.get(info["unit_address"], 0)
            assert self.engine.verify_pattern(live.address, live.size, live.seed) == -1

    @invariant()
    def unclaimed_allocations_stay_where_they_were_placed(self):
        for live in self.live.values():
            if live.unclaimed:
                info = self.engine.inspect(live.address)
                assert info["unclaimed"]
                assert info["evicted"] == live.born_evicted, "its writer may be writing it"

    @invariant()
    def device_granules_never_exceed_capacity(self):
        assert self.engine.device_granules_in_use <= DEVICE_GRANULES

    @invariant()
    def engine_invariants_hold(self):
        self.engine.check_invariants()

    @invariant()
    def statistics_add_up(self):
        stats = self.engine.stats()
        units = {}
        active = 0
        for x in self.live.values():
            info = self._unit(x)
            if info["evicted"]:
                units[info["unit_address"]] = GRANULE if x.small else x.allocated
            if info["pin_count"] > 0:
                active += x.allocated
        evicted = sum(units.values())
        assert stats["bytes_in_use"] == sum(x.allocated for x in self.live.values())
        assert stats["bytes_active"] + stats["bytes_inactive"] == stats["bytes_in_use"]
        assert stats["bytes_active"] == active
        assert stats["bytes_unclaimed"] == sum(x.allocated for x in self.live.values()
                                               if x.unclaimed)
        assert stats["current_bytes_reclaimed"] == evicted
        assert stats["host_bytes_in_use"] == evicted
        assert stats["bytes_reserved"] == self.engine.device_granules_in_use * GRANULE
        assert stats["peak_bytes_in_use"] >= stats["bytes_in_use"]


IN_CHILD = "LMS_MODEL_IN_CHILD"  # set in the process that runs the machine

# Examples per backend: the CUDA backend over the fake driver is slower (every
# verify_pattern is a driver copy), so it runs fewer.
EXAMPLES = {"posix": int(os.environ.get("LMS_MODEL_EXAMPLES", "300")),
            "cuda": int(os.environ.get("LMS_MODEL_EXAMPLES_CUDA", "100"))}


@pytest.mark.parametrize("backend,policy", [("posix", "lru"), ("cuda", "lru"),
                                            ("posix", "learned")])
def test_engine_matches_its_model_under_random_use(backend, policy, request):
    # A process of its own: the fake driver's memory and the pinned host
    # budget are the process's, so files run before this one in a pytest
    # worker changed its course (a clean-clone CI run of the same examples
    # over the fake driver took 9,125 steps and never defragmented; alone,
    # every time, 8,763 steps and 78 defragmentations). Its checks run in
    # the child; this process checks that the child passed.
    if os.environ.get(IN_CHILD) != "1":
        child = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
            cwd=request.config.rootpath, env={**os.environ, IN_CHILD: "1"},
            capture_output=True, text=True, timeout=1800)
        assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-2000:]
        return
    if backend == "cuda":
        request.getfixturevalue("fake_cuda")
    for key in TOTALS:
        TOTALS[key] = 0
    model = type(f"EngineModel_{backend}_{policy}", (EngineModel,),
                 {"BACKEND": backend, "POLICY": policy})
    run_state_machine_as_test(model, settings=settings(
        max_examples=EXAMPLES[backend],
        stateful_step_count=100,
        deadline=None,
        database=None,
        # The same examples every run, so CI is never at the mercy of a draw in
        # which a rare path (defragmentation over the fake driver) did not
        # happen; LMS_MODEL_RANDOM=1 draws new ones (explore, then fix the seed).
        derandomize=os.environ.get("LMS_MODEL_RANDOM") != "1",
        suppress_health_check=[HealthCheck.too_slow],
    ))
    # The run must have exercised what it claims to check.
    assert TOTALS["evictions"] > 0 and TOTALS["page_ins"] > 0, TOTALS
    assert TOTALS["small_evictions"] > 0 and TOTALS["born_evicted"] > 0, TOTALS
    assert TOTALS["defragmentations"] > 0, TOTALS
    if backend == "posix":
        # Over the fake driver the 100 examples defragment about once: in a
        # clean-clone CI run that once placed nothing, while this file run
        # alone here did place units (cause not found). tests/cc/engine_test.cc
        # checks the placement over the fake driver (LMS_TEST_BACKEND=cuda).
        assert TOTALS["cached_placements"] > 0, TOTALS
    assert TOTALS["unclaimed_held"] > 0, TOTALS
    assert TOTALS["batched_page_ins"] > 0, TOTALS
    if policy == "learned":
        assert TOTALS["learned_reclaims"] > 0 and TOTALS["predictions"] > 0, TOTALS
    else:
        assert TOTALS["learned_reclaims"] == 0, TOTALS
