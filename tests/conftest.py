"""Shared fixtures: engines over emulated device memory with small granules.

Tests use 64 KiB granules so that "device memory" of a few MiB holds enough
granules for eviction, fragmentation and page-in to happen often and fast.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tensorflow_lms_allocator.engine import Engine

GRANULE = 64 << 10


@pytest.fixture
def make_engine() -> Callable[..., Engine]:
    """Returns a factory: make_engine(device_granules, host_granules, **options).

    Example:
        def test_x(make_engine):
            engine = make_engine(8, 32, defrag_enabled=True)
    """

    def factory(device_granules: int = 16, host_granules: int = 64,
                **options: object) -> Engine:
        return Engine(device_granules * GRANULE, host_bytes=host_granules * GRANULE,
                      granule_bytes=GRANULE, **options)

    return factory
