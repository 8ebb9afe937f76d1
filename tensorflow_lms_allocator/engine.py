"""The LMS engine over the POSIX backend (or a GPU's), for tests, benchmarks and tools.

The engine is the allocator that the TensorFlow adapter wraps; here it runs
over "emulated device memory" (a memfd of the given size) so its behaviour can
be observed without a GPU.

Example:
    >>> from tensorflow_lms_allocator.engine import Engine
    >>> engine = Engine(device_bytes=8 << 20, host_bytes=64 << 20,
    ...                 granule_bytes=1 << 20)
    >>> a = engine.allocate(6 << 20)
    >>> engine.fill_pattern(a, 6 << 20, seed=1)
    >>> b = engine.allocate(6 << 20)          # evicts `a` to host memory
    >>> engine.inspect(a)["evicted"]
    True
    >>> engine.verify_pattern(a, 6 << 20, seed=1)  # still readable in place
    -1

The same engine runs on a GPU with ``backend="cuda"`` (the NVIDIA driver
through its virtual memory API; ``BackendUnavailableError`` says what is
missing where it cannot). Device memory is not readable by the host, so
``fill_pattern`` and ``verify_pattern`` go through the backend's copies:

    >>> gpu = Engine(device_bytes=64 << 20, backend="cuda")  # doctest: +SKIP
"""

from __future__ import annotations

from tensorflow_lms_allocator._engine import (
    AllocationStateError,
    BackendUnavailableError,
    STATISTICS,
    Engine,
    OutOfMemoryError,
    UnknownAllocationError,
    host_limit_from_env,
    set_thread_label,
)

__all__ = [
    "AllocationStateError",
    "BackendUnavailableError",
    "Engine",
    "OutOfMemoryError",
    "STATISTICS",
    "UnknownAllocationError",
    "host_limit_from_env",
    "set_thread_label",
]
