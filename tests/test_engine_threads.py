"""Python threads share one engine under pressure; the engine's calls release
the GIL, so they really run at once. Each thread checks its own bytes while it
holds them pinned. (The C++ concurrency test runs the same idea under TSan.)"""

from __future__ import annotations

import random
import threading

import pytest

from tensorflow_lms_allocator.engine import OutOfMemoryError
from conftest import GRANULE

pytestmark = pytest.mark.quick


@pytest.fixture
def make_engine(make_engine_each_backend):
    """Every engine test here runs on both backends (conftest.py)."""
    return make_engine_each_backend


def test_threads_under_pressure_lose_no_byte(make_engine):
    engine = make_engine(24, 512, defrag_enabled=True)
    failures: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        owned: list[tuple[int, int, int]] = []
        try:
            for step in range(600):
                if len(owned) < 6 and rng.random() < 0.5:
                    size = rng.choice([rng.randint(1, 30_000),
                                       rng.randint(GRANULE, 4 * GRANULE)])
                    try:
                        address = engine.allocate(size, pin=True)
                    except OutOfMemoryError:
                        continue  # every thread may hold pins at once
                    pattern = seed * 100_000 + step
                    engine.fill_pattern(address, size, pattern)
                    engine.unpin(address)
                    owned.append((address, size, pattern))
                elif owned and rng.random() < 0.8:
                    address, size, pattern = rng.choice(owned)
                    try:
                        allocation_id = engine.pin(address)
                    except OutOfMemoryError:
                        continue
                    if engine.verify_pattern(address, size, pattern) != -1:
                        failures.append(f"thread {seed}: bytes of {address:#x} changed")
                    engine.unpin(address, allocation_id)
                elif owned:
                    address, _, _ = owned.pop(rng.randrange(len(owned)))
                    engine.free(address)
            for address, _, _ in owned:
                engine.free(address)
        except Exception as error:  # reported below with the thread's seed
            failures.append(f"thread {seed}: {error!r}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    stats = engine.stats()
    assert stats["bytes_in_use"] == 0
    assert stats["num_evictions"] > 0 and stats["num_page_ins"] > 0
