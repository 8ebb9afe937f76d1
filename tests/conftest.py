"""Shared fixtures: engines over emulated device memory with small granules,
and over the CUDA backend on the fake CUDA driver (tests/fake_cuda).

Tests use 64 KiB granules so that "device memory" of a few MiB holds enough
granules for eviction, fragmentation and page-in to happen often and fast.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tensorflow_lms_allocator.engine import Engine

GRANULE = 64 << 10


def engine_factory(request: pytest.FixtureRequest, backend: str) -> Callable[..., Engine]:
    """make_engine's factory for `backend` ("posix" or "cuda")."""
    if backend == "cuda":
        request.getfixturevalue("fake_cuda")

    def factory(device_granules: int = 16, host_granules: int = 64,
                **options: object) -> Engine:
        # LRU unless a test asks for another policy: the engine's tests name
        # the units a reclaim takes by their order of use.
        options.setdefault("policy", "lru")
        return Engine(device_granules * GRANULE, host_bytes=host_granules * GRANULE,
                      granule_bytes=GRANULE, backend=backend, **options)

    return factory


@pytest.fixture
def make_engine(request: pytest.FixtureRequest) -> Callable[..., Engine]:
    """Returns a factory: make_engine(device_granules, host_granules, **options).

    Engines over emulated device memory. A module whose tests hold on every
    backend overrides it with make_engine_each_backend.

    The policy is LRU unless `policy` is given (the engine's default is
    learned, as TF_LMS_POLICY's).

    Example:
        def test_x(make_engine):
            engine = make_engine(8, 32, defrag_enabled=True)
    """
    return engine_factory(request, "posix")


@pytest.fixture
def make_posix_engine(request: pytest.FixtureRequest) -> Callable[..., Engine]:
    """make_engine on the emulated device, for tests of what only it has
    (strict mode: the CUDA backend refuses it, as test_engine_cuda.py checks)."""
    return engine_factory(request, "posix")


@pytest.fixture(params=["posix", "cuda"])
def make_engine_each_backend(request: pytest.FixtureRequest) -> Callable[..., Engine]:
    """make_engine, once on the emulated device and once on the CUDA backend
    over the fake CUDA driver. Strict mode exists only on the emulated device
    (the GPU refuses it: test_engine_cuda.py)."""
    return engine_factory(request, request.param)


# The fake driver `make fake-cuda` builds; TF_LMS_CUDA_DRIVER_PATH, if set,
# names another build of it (the sanitizer variants).
FAKE_CUDA = Path(__file__).resolve().parent.parent / "build" / "fake_cuda" / "libfakecuda.so"


def load_fake_cuda() -> ctypes.CDLL:
    """Points the CUDA backend at the fake driver and returns its library.

    The backend reads TF_LMS_CUDA_DRIVER_PATH each time an engine is made, so
    setting it here, before the first cuda engine, is enough; ctypes loads the
    same library (same path, same handle) to reach the fake's test knobs.
    Nothing of the fake may be alive on the first call (the granularity is
    set to the tests' granule then).
    """
    path = os.environ.setdefault("TF_LMS_CUDA_DRIVER_PATH", str(FAKE_CUDA))
    if not Path(path).is_file():
        pytest.fail(f"the fake CUDA driver {path} is missing: run `make fake-cuda`")
    lib = ctypes.CDLL(path)
    if not getattr(load_fake_cuda, "granule_set", False):
        gc.collect()
        assert lib.fake_cuda_set_granularity(ctypes.c_size_t(GRANULE)) == 0, (
            "fake CUDA objects are alive before the first cuda engine")
        load_fake_cuda.granule_set = True
    return lib


@pytest.fixture(scope="module")
def fake_cuda() -> Iterator[ctypes.CDLL]:
    """The fake CUDA driver, ready for Engine(..., backend="cuda").

    TF_LMS_CUDA_DRIVER_PATH is restored after the module, so that no later
    test (nor the TensorFlow programs they start) sees the fake.
    """
    saved = os.environ.get("TF_LMS_CUDA_DRIVER_PATH")
    yield load_fake_cuda()
    if saved is None:
        os.environ.pop("TF_LMS_CUDA_DRIVER_PATH", None)
    else:
        os.environ["TF_LMS_CUDA_DRIVER_PATH"] = saved
