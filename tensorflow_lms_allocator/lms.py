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
index), a device name in any form TensorFlow prints or accepts (``"CPU:0"``,
``"/device:CPU:0"``, ``"/job:localhost/replica:0/task:0/device:CPU:0"``), or
a device object from ``tf.config.list_logical_devices()`` /
``list_physical_devices()``. The LMS devices are the GPUs TensorFlow creates
while LMS is enabled (``"GPU:0"``, ...) and the emulated device that
``TF_LMS_CPU_DEVICE_MEMORY_MB`` puts on ``CPU:0``; index ``i`` is
``device_names()[i]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from tensorflow_lms_allocator import trace
from tensorflow_lms_allocator.overlay import activation

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


def check_gpus(tf_module) -> None:
    """Raises RuntimeError if a GPU TensorFlow sees cannot run LMS, saying why.

    Called when LMS is enabled (``set_lms_enabled(True)``, or
    ``TF_LMS_ENABLED=1`` at import), so an unsupported driver or GPU is an
    error then, naming the GPU, the driver version and what LMS needs, not a
    failure at the first op.

    Example:
        >>> check_gpus(tf)  # doctest: +SKIP
    """
    for ordinal, _ in enumerate(tf_module.config.list_physical_devices("GPU")):
        message = activation.message_buffer()
        code = activation.adapter().tf_lms_check_gpu(ordinal, message, len(message))
        if code != 0:
            raise RuntimeError(
                message.value.decode(errors="replace") + ". Disable LMS "
                "(TF_LMS_ENABLED=0) to run on TensorFlow's own allocator, or hide "
                "this GPU (CUDA_VISIBLE_DEVICES).")


def _as_bool(value: Any, function: str) -> bool:
    """`value` as a bool, accepting what TensorFlow's config setters accept.

    True/False, NumPy booleans (``np.bool_``) and the integers 0 and 1 (Python
    or NumPy); anything else is a TypeError, in particular strings, since
    ``bool("false")`` is True.

    Example:
        >>> _as_bool(np.bool_(True), "set_lms_enabled")  # doctest: +SKIP
        True
    """
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(int(value))
    raise TypeError(f"{function} takes True or False (or 1/0, or a NumPy bool), "
                    f"not {value!r}")


def _set_flag(setting: bytes, enabled: Any, function: str) -> None:
    flag = _as_bool(enabled, function)
    if flag and setting == b"lms_enabled":
        import tensorflow as tf

        check_gpus(tf)
    message = activation.message_buffer()
    code = activation.adapter().tf_lms_set_flag(setting, int(flag), message, len(message))
    if code != 0:
        raise activation.error(code, message)


def _get_flag(setting: bytes) -> bool:
    message = activation.message_buffer()
    value = ctypes.c_int(0)
    code = activation.adapter().tf_lms_get_flag(setting, ctypes.byref(value), message,
                                               len(message))
    if code != 0:
        raise activation.error(code, message)
    return bool(value.value)


def set_lms_enabled(enabled: bool) -> None:
    """Turns Large Model Support on or off; call it before the first op.

    `enabled` is a bool, a NumPy bool or 0/1, as TensorFlow's own config
    setters take.

    Example:
        >>> tf.config.experimental.set_lms_enabled(True)  # doctest: +SKIP

    Raises RuntimeError once TensorFlow has created its devices (use the
    environment variable TF_LMS_ENABLED=1 to set it before any code runs).
    """
    _set_flag(b"lms_enabled", enabled, "set_lms_enabled")


def get_lms_enabled() -> bool:
    """Whether LMS is on. Example: ``tf.config.experimental.get_lms_enabled()``."""
    return _get_flag(b"lms_enabled")


def set_lms_defrag_enabled(enabled: bool) -> None:
    """Lets LMS remap free memory where a request needs it (no tensor moves).

    Without it, memory freed at one address range serves only requests placed
    there, and LMS evicts tensors instead. Call it before the first op.

    Example:
        >>> tf.config.experimental.set_lms_defrag_enabled(True)  # doctest: +SKIP
    """
    _set_flag(b"lms_defrag_enabled", enabled, "set_lms_defrag_enabled")


def get_lms_defrag_enabled() -> bool:
    """Whether LMS defragmentation is on."""
    return _get_flag(b"lms_defrag_enabled")


def device_names() -> list[str]:
    """The LMS devices TensorFlow created: the emulated ``"CPU:0"`` first, then GPUs.

    Index ``i`` of the statistics functions is ``device_names()[i]``.

    Example:
        >>> tensorflow_lms_allocator.device_names()  # doctest: +SKIP
        ['GPU:0', 'GPU:1']
    """
    import tensorflow as tf

    tf.config.list_logical_devices()  # creates the devices if they are not yet
    lib = activation.adapter()
    raw = lib.tf_lms_device_names()
    try:
        return ctypes.string_at(raw).decode().split()
    finally:
        lib.tf_lms_free_string(raw)


def _device_name(device: Any) -> str:
    """The LMS device `device` names ("CPU:0", "GPU:1"), as TensorFlow names devices.

    Example:
        >>> _device_name("/job:localhost/replica:0/task:0/device:GPU:1")  # doctest: +SKIP
        'GPU:1'
    """
    import numpy as np

    if isinstance(device, numbers.Integral) and not isinstance(device, (bool, np.bool_)):
        names = device_names()
        if not 0 <= int(device) < len(names):
            listed = ", ".join(f"{i} ({n})" for i, n in enumerate(names)) or "none"
            raise ValueError(f"no LMS device with index {device}; the LMS devices are: "
                             f"{listed}. Enable LMS (TF_LMS_ENABLED=1) for GPUs, or set "
                             "TF_LMS_CPU_DEVICE_MEMORY_MB for the emulated device")
        return names[int(device)]
    # A LogicalDevice or PhysicalDevice names itself in .name.
    name = device if isinstance(device, str) else getattr(device, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"device must be an index like 0, a device name like 'GPU:0' or "
                        f"'/job:localhost/replica:0/task:0/device:GPU:0', or a device "
                        f"from tf.config.list_logical_devices(), not {device!r}")
    import tensorflow as tf

    try:
        spec = tf.DeviceSpec.from_string(name.replace("/physical_device:", "/device:"))
    except ValueError as error:
        raise ValueError(f"{device!r} is not a device name; use 0, 'GPU:0', 'CPU:0' or "
                         "'/job:localhost/replica:0/task:0/device:GPU:0'") from error
    kind = (spec.device_type or "").upper()
    index = spec.device_index or 0
    local = (spec.job in (None, "localhost") and spec.replica in (None, 0)
             and spec.task in (None, 0))
    if kind == "GPU" and local:
        return f"GPU:{index}"  # each logical GPU has an LMS device of its own
    # Every logical CPU device shares the CPU's one allocator: the emulated
    # device, CPU:0's LMS device.
    if kind in ("CPU", "XLA_CPU") and local and (index == 0 or index in _logical_cpus()):
        return "CPU:0"
    raise ValueError(f"unknown device {device!r}: {_served_devices()}")


def _logical_cpus() -> list[int]:
    """The indices of TensorFlow's logical CPU devices (CPU:0, CPU:1, ...)."""
    import tensorflow as tf

    return sorted(tf.DeviceSpec.from_string(d.name).device_index or 0
                  for d in tf.config.list_logical_devices("CPU"))


def _served_devices() -> str:
    """What LMS serves in this process, in words, for error messages.

    Example:
        >>> _served_devices()  # doctest: +SKIP
        'LMS serves CPU:0 (also as CPU:1: logical devices of the CPU share its memory)'
    """
    served = []
    for name in device_names():
        also = [f"CPU:{i}" for i in _logical_cpus() if i != 0] if name == "CPU:0" else []
        served.append(name + (f" (also as {', '.join(also)}: logical devices of the CPU "
                              "share its memory)" if also else ""))
    if not served:
        return ("LMS serves no device in this process (no GPU with LMS enabled, and "
                "TF_LMS_CPU_DEVICE_MEMORY_MB is not set)")
    return "LMS serves " + ", ".join(served)


def get_statistics(device: int | str | Any = 0) -> dict[str, int]:
    """Every LMS statistic of `device` as a dict (engine names).

    `device` is an index into device_names(), a name or a device from
    tf.config.list_logical_devices(). The logical CPU devices
    (tf.config.set_logical_device_configuration) share one emulated device:
    each answers with its figures. Each logical GPU has an LMS device of its
    own, with its own memory_limit.

    Example:
        >>> stats = tensorflow_lms_allocator.get_statistics("GPU:0")  # doctest: +SKIP
        >>> stats["num_page_ins"]  # doctest: +SKIP
        42
    """
    name = _device_name(device)
    import tensorflow as tf

    tf.config.list_logical_devices()  # creates the devices if they are not yet
    lib = activation.adapter()
    count = lib.tf_lms_num_statistics()
    values = (ctypes.c_int64 * count)()
    message = activation.message_buffer()
    code = lib.tf_lms_get_statistics(name.encode(), values, count, message, len(message))
    if code != 0:
        raise activation.error(code, message)
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


@contextlib.contextmanager
def record_trace(path: str | Path, device: int | str = 0,
                 max_mb: float = trace.DEFAULT_MAX_MB) -> Iterator[None]:
    """Records every allocate, free, pin, unpin, eviction and page-in of the LMS
    device inside the block into `path` (read it with tensorflow_lms_allocator.trace.load).

    Recording stops at `max_mb` of file, with a RuntimeWarning saying how many
    events were dropped. A `max_mb` that is not a positive finite number is a
    ValueError naming it, raised when the block is entered.

    Example:
        >>> with tensorflow_lms_allocator.record_trace("step.lmstrace"):  # doctest: +SKIP
        ...     model.fit(x, y, epochs=1, steps_per_epoch=3)
        >>> tensorflow_lms_allocator.trace.load("step.lmstrace").counts()  # doctest: +SKIP
    """
    trace.check_max_mb(max_mb)  # before any device is touched
    name = _device_name(device)
    import tensorflow as tf

    tf.config.list_logical_devices()  # creates the devices if they are not yet
    lib = activation.adapter()
    message = activation.message_buffer()
    code = lib.tf_lms_start_trace(name.encode(), str(path).encode(),
                                  int(max_mb * (1 << 20)), message, len(message))
    if code != 0:
        raise activation.error(code, message)
    try:
        yield
    finally:
        events, dropped, cap = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        code = lib.tf_lms_stop_trace(name.encode(), ctypes.byref(events), ctypes.byref(dropped),
                                     ctypes.byref(cap), message, len(message))
        if code != 0:
            raise activation.error(code, message)
        trace.report_dropped({"path": str(path), "events": events.value,
                              "dropped": dropped.value, "max_bytes": cap.value})


@contextlib.contextmanager
def hold_device_memory(num_bytes: int, device: int | str | Any = 0) -> Iterator[None]:
    """Inside the block, `device` trains as if it had `num_bytes` less memory.

    The bytes (rounded up to whole granules) are taken from the device and
    pinned there, so nothing else can use them; what was live is evicted to
    make room. Given back when the block ends. For trying a model on a smaller
    GPU than this one, and for comparing steps with and without memory
    pressure in one process (`make bench-overhead PAIRED=1`). `num_bytes` must be a
    positive integer no larger than the device (a ValueError naming it
    otherwise); a hold that what is pinned now leaves no room for is a
    MemoryError, raised when the block is entered.

    Example:
        >>> device_bytes = tf.config.experimental.get_bytes_limit(0)  # doctest: +SKIP
        >>> with tensorflow_lms_allocator.hold_device_memory(device_bytes // 2):  # doctest: +SKIP
        ...     model.fit(x, y, epochs=1)  # as on a device half this size
    """
    if (not isinstance(num_bytes, numbers.Integral) or isinstance(num_bytes, bool)
            or num_bytes <= 0):
        raise ValueError(f"hold_device_memory(num_bytes={num_bytes!r}): num_bytes must be a "
                         "positive whole number of bytes")
    name = _device_name(device)
    import tensorflow as tf

    tf.config.list_logical_devices()  # creates the devices if they are not yet
    lib = activation.adapter()
    message = activation.message_buffer()
    held = ctypes.c_void_p()
    code = lib.tf_lms_hold_device_memory(name.encode(), int(num_bytes), ctypes.byref(held),
                                         message, len(message))
    if code != 0:
        raise activation.error(code, message)
    try:
        yield
    finally:
        code = lib.tf_lms_release_device_memory(name.encode(), held, message, len(message))
        if code != 0:
            raise activation.error(code, message)


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
    lib = activation.adapter()
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
    activation.adapter().tf_lms_clear_unpinned_touches()


PUBLIC = ["set_lms_enabled", "get_lms_enabled", "set_lms_defrag_enabled",
          "get_lms_defrag_enabled", *STATISTICS]


def activate(tf_module) -> None:
    """Once TensorFlow is imported: adds the API to it and, where LMS serves the
    process, patches Keras (Note [XLA under LMS]) and checks the GPUs if LMS is on.

    Example:
        >>> activate(tf)  # doctest: +SKIP  (the package does it)
    """
    attach(tf_module)
    if not activation.active():
        return
    from tensorflow_lms_allocator.overlay import keras_jit

    keras_jit.install(get_lms_enabled)  # jit_compile="auto" under LMS: Note [XLA under LMS]
    if get_lms_enabled():
        check_gpus(tf_module)  # TF_LMS_ENABLED=1 with a GPU LMS cannot serve: say so now


def attach(tf_module) -> None:
    """Adds the API to tf.config.experimental and tf.experimental."""
    for name in PUBLIC:
        function = globals()[name]
        setattr(tf_module.config.experimental, name, function)
        setattr(tf_module.experimental, name, function)
