"""TensorFlow programs for tests/test_settings.py; each prints ``RESULT <json>``.

Usage: python settings_probes.py NAME
  import_outcome      import the package with the environment given (and,
                      with an argument, that many GiB of address space); the
                      exception (type, message) or the device's limits
  retry_import        a bad TF_LMS_CPU_DEVICE_MEMORY_MB, corrected in
                      os.environ, then imported again (argument "ops": run a
                      TensorFlow op between the two imports)
  device_unavailable  the address space shrinks (RLIMIT_AS) after import, so
                      the emulated device cannot be created at the first op
  device_names        statistics by every device name TensorFlow uses, and
                      bool-likes for set_lms_enabled
  strict_faulthandler faulthandler.enable() after the devices exist (argument
                      "before_eviction" or "after_eviction"), then an
                      unpinned touch; argument "crash" then a real NULL read
  aligned             AllocateRaw with alignment 4096 for 1000 bytes: sizes,
                      address, and strict mode's report after eviction
  no_retry            AllocateRaw with retry_on_failure false/true while
                      another kernel holds pinned memory
  oom_logging         an allocation that does not fit (for TF_CPP_MIN_LOG_LEVEL)
  error_codes         C API calls that fail, and the exception each raises
  granule             the allocation of a 9 MiB tensor (rounded up to the granule)
  refused_values      an import for each VARIABLE=VALUE given (each refused)
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

MIB = 1 << 20


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def describe_error(error: BaseException) -> list[str]:
    return [type(error).__name__, str(error)]


def import_outcome() -> None:
    if sys.argv[2:]:  # the process's address-space limit, in GiB (ulimit -v)
        import resource

        limit = int(sys.argv[2]) << 30
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    try:
        import tensorflow_lms_allocator as lms
        import tensorflow as tf
    except Exception as error:  # the test checks type and message
        emit({"error": describe_error(error)})
        return
    total = float(tf.reduce_sum(tf.ones((256, 256))))
    emit({"error": None, "total": total, "bytes_limit": lms.get_statistics(0)["bytes_limit"]})


def granule() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    tensor = tf.zeros((9 * MIB // 4,), tf.float32)  # 9 MiB, the largest allocation
    emit({"largest_alloc_size": lms.get_statistics(0)["largest_alloc_size"],
          "sum": float(tf.reduce_sum(tensor))})


def refused_values() -> None:
    """Imports once for each VARIABLE=VALUE given (argv[2:], all refused),
    the variable set over the environment given and put back after: a failed
    import can be retried (retry_import), so one TensorFlow import serves them
    all."""
    outcomes = {}
    for assignment in sys.argv[2:]:
        variable, value = assignment.split("=", 1)
        before = os.environ.get(variable)
        os.environ[variable] = value
        try:
            import tensorflow_lms_allocator  # noqa: F401
            outcomes[assignment] = None
        except Exception as error:
            outcomes[assignment] = describe_error(error)
        if before is None:
            del os.environ[variable]
        else:
            os.environ[variable] = before
    emit({"outcomes": outcomes})


def retry_import() -> None:
    result = {}
    os.environ["TF_LMS_CPU_DEVICE_MEMORY_MB"] = "1"
    try:
        import tensorflow_lms_allocator  # noqa: F401
        result["first"] = None
    except Exception as error:
        result["first"] = describe_error(error)
    os.environ["TF_LMS_CPU_DEVICE_MEMORY_MB"] = "64"
    if sys.argv[2:] == ["ops"]:
        import tensorflow as tf

        tf.reduce_sum(tf.ones((4,)))  # creates the devices, without LMS
    try:
        import tensorflow_lms_allocator as lms
        import tensorflow as tf

        result["second"] = None
        result["total"] = float(tf.reduce_sum(tf.ones((256, 256))))
        result["bytes_limit"] = lms.get_statistics(0)["bytes_limit"]
    except Exception as error:
        result["second"] = describe_error(error)
    emit(result)


def device_unavailable() -> None:
    import resource

    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    with open("/proc/self/status") as status:
        vm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize"))
    # Room for TensorFlow's threads, not for the device's address ranges.
    resource.setrlimit(resource.RLIMIT_AS, ((vm_kb << 10) + (2 << 30), resource.RLIM_INFINITY))
    result = {}
    for name, op in {"first_op": lambda: tf.fill((1024, 1024), 1.0),
                     "second_op": lambda: tf.reduce_sum(tf.ones((4,))),
                     "statistics": lambda: lms.get_statistics(0),
                     "session": lambda: tf.compat.v1.Session()}.items():
        try:
            op()
            result[name] = None  # ran: would mean uncapped, without LMS
        except Exception as error:
            result[name] = describe_error(error)
    emit(result)


def device_names() -> None:
    import numpy as np
    import tensorflow_lms_allocator as lms  # noqa: F401
    import tensorflow as tf

    flags = {}
    for name, value in {"np_true": np.bool_(True), "int_1": 1, "np_int_1": np.int64(1),
                        "np_false": np.bool_(False), "int_0": 0, "true": True}.items():
        tf.config.experimental.set_lms_enabled(value)
        flags[name] = tf.config.experimental.get_lms_enabled()
    refused = {}
    for name, value in {"string": "false", "two": 2, "none": None, "float": 1.0}.items():
        try:
            tf.config.experimental.set_lms_enabled(value)
            refused[name] = None
        except Exception as error:
            refused[name] = describe_error(error)
    logical = tf.config.list_logical_devices("CPU")[0]
    physical = tf.config.list_physical_devices("CPU")[0]
    printed = tf.ones((1,)).device  # the name TensorFlow prints for a tensor
    limits = {}
    for name, device in {"full": "/job:localhost/replica:0/task:0/device:CPU:0",
                         "printed": printed, "logical": logical, "physical": physical,
                         "logical_name": logical.name, "physical_name": physical.name,
                         "short": "CPU:0", "lower": "cpu:0", "legacy": "/cpu:0",
                         "index": 0, "np_index": np.int64(0)}.items():
        try:
            limits[name] = tf.config.experimental.get_bytes_limit(device)
        except Exception as error:
            limits[name] = describe_error(error)
    bad = {}
    for name, device in {"gpu_full": "/job:localhost/replica:0/task:0/device:GPU:0",
                         "other_task": "/job:localhost/replica:0/task:1/device:CPU:0",
                         "cpu1": "CPU:1", "bool": True, "garbage": "not a device"}.items():
        try:
            tf.config.experimental.get_bytes_limit(device)
            bad[name] = None
        except Exception as error:
            bad[name] = describe_error(error)
    emit({"flags": flags, "refused": refused, "printed": printed, "limits": limits,
          "bad": bad})


def strict_faulthandler() -> None:
    import faulthandler

    import numpy as np
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    when = sys.argv[2]
    a = tf.random.stateless_uniform((4 * MIB,), seed=(1, 2))  # 16 MiB; creates the devices
    if when == "before_eviction":
        faulthandler.enable()
    others = [tf.fill((4 * MIB,), float(i)) for i in range(6)]  # evicts `a`
    if when in ("after_eviction", "crash"):
        faulthandler.enable()
    seen = a.numpy()  # an unpinned touch of evicted memory
    expected = tf.random.stateless_uniform((4 * MIB,), seed=(1, 2)).numpy()
    emit({"touches": len(lms.unpinned_touches()), "intact": bool(np.array_equal(seen, expected)),
          "faulthandler": faulthandler.is_enabled(), "kept": len(others)})
    if when == "crash":
        ctypes.string_at(0)  # a real crash must still crash, with faulthandler's dump
        emit({"survived_null_read": True})


def _adapter():
    from tensorflow_lms_allocator.overlay import activation

    return activation


def _allocate(alignment: int, num_bytes: int, retry: bool) -> tuple[int | None, str]:
    overlay = _adapter()
    ptr = ctypes.c_void_p()
    message = overlay.message_buffer()
    overlay.adapter().tf_lms_test_allocate_raw(b"CPU:0", alignment, num_bytes, int(retry),
                                               ctypes.byref(ptr), message, len(message))
    return ptr.value, message.value.decode()


def _sizes(ptr: int) -> tuple[int, int]:
    requested, allocated = ctypes.c_size_t(), ctypes.c_size_t()
    _adapter().adapter().tf_lms_test_allocation_sizes(b"CPU:0", ptr, ctypes.byref(requested),
                                                      ctypes.byref(allocated))
    return requested.value, allocated.value


def aligned() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    tf.reduce_sum(tf.ones((4,)))  # creates the devices
    result = {}
    kept = 0

    def kernel_allocates():
        # Inside a kernel (EagerPyFunc), as TensorFlow's kernels allocate: the
        # kept one is unpinned when the kernel ends, and may be evicted (one
        # made outside any kernel would stay put until a kernel used it).
        nonlocal kept
        for alignment in (64, 256, 4096, 2 * MIB):
            ptr, message = _allocate(alignment, 1000, retry=True)
            requested, allocated = _sizes(ptr)
            result[str(alignment)] = {"aligned": ptr % alignment == 0, "requested": requested,
                                      "allocated": allocated}
            if alignment != 4096:
                _adapter().adapter().tf_lms_test_deallocate_raw(b"CPU:0", ptr)
            else:
                kept = ptr
        ctypes.memset(kept, 0x5A, 1000)
        return tf.constant(0.0)

    tf.py_function(kernel_allocates, [], tf.float32)
    # 32 tensors of one granule fill the 64 MiB device: the least recently
    # used granule-sized allocation, `kept`, is evicted first.
    others = [tf.fill((MIB // 2,), float(i)) for i in range(32)]
    evicted = lms.get_statistics(0)["current_bytes_reclaimed"]
    seen = ctypes.string_at(kept, 1000)  # an unpinned touch: strict mode reports it
    touches = [t.__dict__ for t in lms.unpinned_touches()
               if t.allocation_address == kept]
    result["evicted"] = evicted
    result["intact"] = seen == b"\x5a" * 1000
    result["touches"] = touches
    result["kept"] = len(others)
    emit(result)


def no_retry() -> None:
    import tensorflow_lms_allocator  # noqa: F401
    import tensorflow as tf

    held = tf.fill((12 * MIB,), 1.0)  # 48 MiB of a 64 MiB device
    started = threading.Event()

    def hold(x):
        started.set()
        time.sleep(3.0)  # the kernel (EagerPyFunc) runs, its input pinned
        return tf.reduce_sum(x)

    def other_kernel():
        tf.py_function(hold, [held], tf.float32)

    result = {}
    for retry in (False, True):
        started.clear()
        worker = threading.Thread(target=other_kernel)
        worker.start()
        started.wait()
        time.sleep(0.2)
        outcome = {}

        def kernel_allocates():
            # Inside a kernel (EagerPyFunc): a kernel's request needs device
            # memory; one made outside any kernel would be born evicted.
            begin = time.monotonic()
            ptr, message = _allocate(64, 32 * MIB, retry=retry)  # fits once `held` is unpinned
            outcome.update(ok=ptr is not None, seconds=time.monotonic() - begin,
                           message=message)
            if ptr is not None:
                _adapter().adapter().tf_lms_test_deallocate_raw(b"CPU:0", ptr)
            return tf.constant(0.0)

        tf.py_function(kernel_allocates, [], tf.float32)
        result[str(retry)] = outcome
        worker.join()
    emit(result)


def oom_logging() -> None:
    import tensorflow_lms_allocator  # noqa: F401
    import tensorflow as tf

    try:
        tf.fill((32 * MIB,), 1.0)  # 128 MiB on a 64 MiB device
        emit({"error": None})
    except tf.errors.ResourceExhaustedError as error:
        emit({"error": describe_error(error)})


def error_codes() -> None:
    from tensorflow_lms_allocator.overlay import activation
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    lib = activation.adapter()
    result = {"names": {code: lib.tf_lms_code_name(code).decode()
                        for code in (0, 3, 5, 8, 9, 13, 99)}}
    # The exception type follows the code, whatever the message says.
    misleading = ctypes.create_string_buffer(b"TF_LMS_ENABLED='x' is not a boolean")
    result["by_code"] = {str(code): type(activation.error(code, misleading)).__name__
                         for code in (3, 5, 8, 9, 13)}
    message = activation.message_buffer()
    code = lib.tf_lms_set_flag(b"no_such_setting", 1, message, len(message))
    result["unknown_setting"] = [lib.tf_lms_code_name(code).decode(), message.value.decode()]
    errors = {}
    tf.reduce_sum(tf.ones((4,)))  # creates the devices
    for name, call in {"late_enable": lambda: lms.set_lms_enabled(True),
                       "no_device": lambda: lms.get_statistics(0)}.items():
        try:
            call()
            errors[name] = None
        except Exception as error:
            errors[name] = describe_error(error)
    result["errors"] = errors
    emit(result)


if __name__ == "__main__":
    {"import_outcome": import_outcome, "retry_import": retry_import,
     "device_unavailable": device_unavailable, "device_names": device_names,
     "strict_faulthandler": strict_faulthandler, "aligned": aligned, "no_retry": no_retry,
     "oom_logging": oom_logging, "error_codes": error_codes,
     "granule": granule, "refused_values": refused_values}[sys.argv[1]]()
