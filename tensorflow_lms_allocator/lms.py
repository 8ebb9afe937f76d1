"""The LMS API that ``import tensorflow_lms_allocator`` adds to TensorFlow.

Every function here is also reachable as ``tf.config.experimental.<name>``
and, for IBM TFLMS compatibility, ``tf.experimental.<name>``.

Example:
    >>> import tensorflow_lms_allocator  # before tensorflow
    >>> import tensorflow as tf
    >>> tf.config.experimental.set_lms_enabled(True)
    >>> # ... build and train a model ...
    >>> tf.config.experimental.get_bytes_reclaimed(0)  # doctest: +SKIP
    123731968

Statistics take a device: ``0`` (the first LMS device, as IBM's took a GPU
index) or a device string such as ``"GPU:0"`` or ``"CPU:0"``. Without a GPU
backend, the only LMS device is the emulated one that
``TF_LMS_CPU_DEVICE_MEMORY_MB`` puts on ``CPU:0``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable

from tensorflow_lms_allocator import _overlay

_LMS, _DEFRAG = 0, 1

# Public statistic name -> the engine's name for it.
STATISTICS: dict[str, str] = {
    "get_num_allocs": "num_allocs",
    "get_bytes_in_use": "bytes_in_use",
    "get_peak_bytes_in_use": "peak_bytes_in_use",
    "get_largest_alloc_size": "largest_alloc_size",
    "get_bytes_limit": "bytes_limit",
    "get_bytes_reserved": "bytes_reserved",
    "get_peak_bytes_reserved": "peak_bytes_reserved",
    "get_bytes_reservable_limit": "bytes_reservable_limit",
    "get_bytes_inactive": "bytes_inactive",
    "get_bytes_active": "bytes_active",
    "get_peak_bytes_active": "peak_bytes_active",
    "get_bytes_reclaimed": "bytes_reclaimed",
    "get_current_bytes_reclaimed": "current_bytes_reclaimed",
    "get_peak_bytes_reclaimed": "peak_bytes_reclaimed",
    "get_num_single_reclaims": "num_single_reclaims",
    "get_num_full_reclaims": "num_full_reclaims",
    "get_num_defragmentations": "num_defragmentations",
    "get_bytes_defragged": "bytes_defragged",
    "get_gpu_host_bytes_in_use": "host_bytes_in_use",
    "get_gpu_host_peak_bytes_in_use": "host_peak_bytes_in_use",
}


def check_no_gpu(tf_module) -> None:
    """Raises NotImplementedError if TensorFlow sees a GPU: LMS cannot run there yet."""
    if tf_module.config.list_physical_devices("GPU"):
        raise NotImplementedError(
            "LMS on a GPU needs the CUDA backend, which this build of "
            "tensorflow_lms_allocator does not have yet; LMS runs on the "
            "emulated device (TF_LMS_CPU_DEVICE_MEMORY_MB) only. Unset "
            "TF_LMS_ENABLED or hide the GPUs (CUDA_VISIBLE_DEVICES=).")


def _set_flag(which: int, enabled: bool, setting: str) -> None:
    if not isinstance(enabled, bool):
        raise TypeError(f"{setting} takes True or False, not {enabled!r}")
    if enabled and which == _LMS:
        import tensorflow as tf

        check_no_gpu(tf)
    error = ctypes.create_string_buffer(512)
    if _overlay.adapter().tf_lms_set_flag(which, int(enabled), error, len(error)) != 0:
        raise RuntimeError(error.value.decode())


def set_lms_enabled(enabled: bool) -> None:
    """Turns Large Model Support on or off; call it before the first op.

    Example:
        >>> tf.config.experimental.set_lms_enabled(True)  # doctest: +SKIP

    Raises RuntimeError once TensorFlow has created its devices (use the
    environment variable TF_LMS_ENABLED=1 to set it before any code runs).
    """
    _set_flag(_LMS, enabled, "set_lms_enabled")


def get_lms_enabled() -> bool:
    """Whether LMS is on. Example: ``tf.config.experimental.get_lms_enabled()``."""
    return bool(_overlay.adapter().tf_lms_get_flag(_LMS))


def set_lms_defrag_enabled(enabled: bool) -> None:
    """Lets LMS remap free memory where a request needs it (no tensor moves).

    Without it, memory freed at one address range serves only requests placed
    there, and LMS evicts tensors instead. Call it before the first op.

    Example:
        >>> tf.config.experimental.set_lms_defrag_enabled(True)  # doctest: +SKIP
    """
    _set_flag(_DEFRAG, enabled, "set_lms_defrag_enabled")


def get_lms_defrag_enabled() -> bool:
    """Whether LMS defragmentation is on."""
    return bool(_overlay.adapter().tf_lms_get_flag(_DEFRAG))


def _check_device(device: int | str) -> None:
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise TypeError(f"device must be an index like 0 or a string like 'GPU:0', "
                        f"not {device!r}")
    if isinstance(device, int):
        if device != 0:
            raise ValueError(f"no LMS device with index {device}: this build has one, "
                             "the emulated device (index 0, 'CPU:0')")
        return
    name = device.upper().replace("/DEVICE:", "").lstrip("/")
    if name.startswith("GPU:"):
        raise ValueError(f"no LMS allocator on {device!r}: this build has no GPU "
                         "backend yet; its LMS device is the emulated 'CPU:0'")
    if name not in ("CPU:0", "XLA_CPU:0"):
        raise ValueError(f"unknown device {device!r}; use 0, 'CPU:0' or 'GPU:0'")


def get_statistics(device: int | str = 0) -> dict[str, int]:
    """Every LMS statistic of `device` as a dict (engine names).

    Example:
        >>> stats = tensorflow_lms_allocator.get_statistics("CPU:0")  # doctest: +SKIP
        >>> stats["num_page_ins"]  # doctest: +SKIP
        42
    """
    _check_device(device)
    import tensorflow as tf

    tf.config.list_logical_devices()  # creates the devices if they are not yet
    lib = _overlay.adapter()
    count = lib.tf_lms_num_statistics()
    values = (ctypes.c_int64 * count)()
    if lib.tf_lms_get_statistics(values, count) != 0:
        device_error = lib.tf_lms_device_error()
        if device_error:
            raise RuntimeError(device_error.decode())
        raise ValueError(
            f"{device!r} has no LMS allocator: set TF_LMS_CPU_DEVICE_MEMORY_MB=<MiB> "
            "before starting Python to run the CPU device as an emulated GPU")
    return {lib.tf_lms_statistic_name(i).decode(): values[i] for i in range(count)}


def _statistic(public: str, engine_name: str) -> Callable[[int | str], int]:
    def getter(device: int | str = 0) -> int:
        return get_statistics(device)[engine_name]

    getter.__name__ = public
    getter.__qualname__ = public
    getter.__doc__ = (f"LMS statistic {engine_name} of `device` (0 or a device string).\n\n"
                      f"Example:\n    >>> tf.config.experimental.{public}(0)  "
                      "# doctest: +SKIP\n    0\n")
    return getter


for _public, _engine_name in STATISTICS.items():
    globals()[_public] = _statistic(_public, _engine_name)


@dataclass(frozen=True)
class UnpinnedTouch:
    """A read or write of evicted memory that no kernel pinned (strict mode)."""

    address: int
    allocation_id: int
    allocation_address: int
    allocation_bytes: int
    op: str  # the op running on the touching thread, or "-"


def unpinned_touches() -> list[UnpinnedTouch]:
    """Strict mode's report (TF_LMS_STRICT=1): unpinned touches of evicted memory.

    Example:
        >>> for touch in tensorflow_lms_allocator.unpinned_touches():  # doctest: +SKIP
        ...     print(touch.op, touch.allocation_bytes)
    """
    lib = _overlay.adapter()
    raw = lib.tf_lms_unpinned_touches()
    if not raw:
        return []
    try:
        text = ctypes.string_at(raw).decode()
    finally:
        lib.tf_lms_free_string(raw)
    touches = []
    for line in text.splitlines():
        address, allocation_id, allocation_address, size, op = line.split(" ", 4)
        touches.append(UnpinnedTouch(int(address, 16), int(allocation_id),
                                     int(allocation_address, 16), int(size), op))
    return touches


def clear_unpinned_touches() -> None:
    """Empties strict mode's report."""
    _overlay.adapter().tf_lms_clear_unpinned_touches()


PUBLIC = ["set_lms_enabled", "get_lms_enabled", "set_lms_defrag_enabled",
          "get_lms_defrag_enabled", *STATISTICS]


def attach(tf_module) -> None:
    """Adds the API to tf.config.experimental and tf.experimental."""
    for name in PUBLIC:
        function = globals()[name]
        setattr(tf_module.config.experimental, name, function)
        setattr(tf_module.experimental, name, function)
