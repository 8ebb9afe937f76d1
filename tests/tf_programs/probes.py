"""Small TensorFlow programs for the LMS tests; each prints ``RESULT <json>``.

Usage: python probes.py NAME
  strict_numpy     an evicted tensor read by .numpy() (no kernel pins it)
  fragment         allocations that leave free memory in scattered holes
  host_exhausted   training that needs more host swap space than allowed,
                   then work that fits
  api              the tf.config.experimental API's checks
  late_import      tensorflow_lms_allocator imported after tensorflow
  slice_pin        a kernel reading a slice of an evicted tensor
  wrong_version    the adapter asked to serve another TensorFlow version
  announce         the device's log line, then an out-of-memory error
  optional         optional requests (retry_on_failure off) on a full device
  serves           one op; whether LMS is enabled and the devices it serves
  logical_cpus     the CPU split into two logical devices: work on CPU:1 under
                   pressure, the statistics of each name, an unknown name
  reset_peaks      statistics before and after tf.config.experimental.reset_memory_stats
  handle_read      a 16 MiB variable evicted by six 16 MiB fills, then assigned, twice:
                   strict mode's report of each round
"""

from __future__ import annotations

import json
import os
import sys

MIB = 1 << 20


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def strict_numpy() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    import numpy as np

    a = tf.random.stateless_uniform((4 * MIB,), seed=(1, 2))  # 16 MiB
    others = [tf.fill((4 * MIB,), float(i)) for i in range(6)]  # evicts `a`
    stats = lms.get_statistics(0)
    seen = a.numpy()  # reads `a` in place, outside any kernel
    touches = [t.__dict__ for t in lms.unpinned_touches()]
    expected = tf.random.stateless_uniform((4 * MIB,), seed=(1, 2)).numpy()
    emit({"evictions": stats["num_evictions"], "intact": bool(np.array_equal(seen, expected)),
          "touches": touches, "kept": len(others)})


def fragment() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    blocks = [tf.fill((2 * MIB,), float(i)) for i in range(6)]  # 8 MiB each
    kept = blocks[1::2]
    del blocks
    big = tf.fill((6 * MIB,), 7.0)  # 24 MiB: fits only in the holes' memory
    ok = all(float(tf.reduce_min(k)) == float(2 * i + 1) for i, k in enumerate(kept))
    emit({"stats": lms.get_statistics(0), "values_ok": ok, "big": float(big[0])})


def announce() -> None:
    """The device's log line, then a request no memory can hold."""
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    a = tf.fill((6 * MIB,), 1.0)  # 24 MiB each
    b = tf.fill((6 * MIB,), 2.0)
    result = {"level": os.environ.get("TF_CPP_MIN_LOG_LEVEL")}
    try:
        # The kernel pins both inputs; its 24 MiB output fits neither the
        # device beside them nor host memory (run with a 16 MiB host limit).
        result["sum"] = float((a + b)[0])
        result["error"] = None
    except tf.errors.ResourceExhaustedError as error:
        result["error"] = error.message
    result["stats"] = lms.get_statistics(0)
    emit(result)


def serves() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    value = float(tf.reduce_sum(tf.fill((1024,), 2.0)))
    emit({"value": value, "enabled": lms.get_lms_enabled(), "names": lms.device_names()})


def logical_cpus() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    result: dict = {"logical": [d.name for d in tf.config.list_logical_devices("CPU")]}
    with tf.device("/CPU:1"):
        held = [tf.fill((4 * MIB,), float(i)) for i in range(6)]  # 16 MiB each
        result["sums"] = [float(tf.reduce_sum(t)) for t in held]
    result["names"] = lms.device_names()
    result["stats"] = {name: lms.get_statistics(name)
                       for name in ("CPU:0", "CPU:1", "/job:localhost/replica:0/task:0/device:CPU:1")}
    for name in ("CPU:2", "GPU:0"):
        try:
            lms.get_statistics(name)
            result[name] = None
        except ValueError as error:
            result[name] = str(error)
    emit(result)


def reset_peaks() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    held = [tf.fill((4 * MIB,), float(i)) for i in range(6)]  # 96 MiB on 64
    del held[1:]
    before = lms.get_statistics(0)
    tf.config.experimental.reset_memory_stats("CPU:0")
    emit({"before": before, "after": lms.get_statistics(0)})


def handle_read() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    n = 4 * MIB  # 16 MiB of floats
    v = tf.Variable(tf.zeros((n,)))
    rounds = []
    for _ in range(2):
        fills = [tf.fill((n,), float(i)) for i in range(6)]  # evict the variable
        v.assign(tf.ones((n,)) * 3.0)
        rounds.append({"touches": [t.__dict__ for t in lms.unpinned_touches()],
                       "values": [float(v[0]), float(v[-1])]})
        lms.clear_unpinned_touches()
        del fills
    emit({"rounds": rounds})


def host_exhausted() -> None:
    import tensorflow_lms_allocator as lms  # noqa: F401
    import tensorflow as tf

    result = {}
    try:
        tensors = [tf.fill((4 * MIB,), float(i)) for i in range(24)]  # 384 MiB
        result["first"] = "completed"
        del tensors
    except tf.errors.ResourceExhaustedError as error:
        result["first"] = error.message
    # The process keeps working: smaller work, and what survived, still run.
    small = [tf.fill((4 * MIB,), float(i)) for i in range(4)]
    result["after"] = [float(tf.reduce_sum(t)) for t in small]
    emit(result)


def api() -> None:
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    result = {"names": sorted(n for n in dir(tf.config.experimental) if "lms" in n or
                              n.startswith("get_bytes") or n.startswith("get_num_")),
              "ibm_names": hasattr(tf.experimental, "get_bytes_reclaimed")}
    result["before"] = {"lms": tf.config.experimental.get_lms_enabled(),
                        "defrag": tf.config.experimental.get_lms_defrag_enabled()}
    tf.config.experimental.set_lms_enabled(True)
    tf.config.experimental.set_lms_defrag_enabled(False)
    tf.reduce_sum(tf.ones((256, 256)))  # creates the devices
    errors = {}
    for name, call in {
        "late_enable": lambda: tf.config.experimental.set_lms_enabled(False),
        "late_defrag": lambda: tf.config.experimental.set_lms_defrag_enabled(True),
        "gpu_device": lambda: tf.config.experimental.get_bytes_in_use("GPU:0"),
        "bad_index": lambda: tf.config.experimental.get_bytes_in_use(3),
        "bad_type": lambda: tf.config.experimental.get_bytes_in_use(1.5),
        "bad_flag": lambda: lms.set_lms_enabled("yes"),
    }.items():
        try:
            call()
            errors[name] = None
        except Exception as error:  # the test checks type and message
            errors[name] = [type(error).__name__, str(error)]
    result["errors"] = errors
    result["same_value_ok"] = tf.config.experimental.set_lms_enabled(True) is None
    result["after"] = {"lms": tf.config.experimental.get_lms_enabled(),
                       "defrag": tf.config.experimental.get_lms_defrag_enabled()}
    result["stats"] = {
        "index": tf.config.experimental.get_bytes_limit(0),
        "cpu": tf.config.experimental.get_bytes_limit("CPU:0"),
        "device": tf.config.experimental.get_bytes_limit("/device:CPU:0"),
        "ibm": tf.experimental.get_bytes_limit(0),
    }
    emit(result)


def slice_pin() -> None:
    import numpy as np
    import tensorflow_lms_allocator as lms
    import tensorflow as tf

    a = tf.random.stateless_uniform((4 * MIB,), seed=(3, 4))  # 16 MiB
    tail = a[MIB:]  # a dim-0 slice shares a's buffer: its data is inside a
    others = [tf.fill((4 * MIB,), float(i)) for i in range(6)]  # evicts a
    evicted = lms.get_statistics(0)["current_bytes_reclaimed"]
    total = float(tf.reduce_sum(tf.cast(tail, tf.float64)))  # pins a through tail
    expected = float(np.sum(tf.random.stateless_uniform((4 * MIB,), seed=(3, 4))
                            .numpy()[MIB:].astype(np.float64)))
    emit({"evicted": evicted, "page_ins": lms.get_statistics(0)["num_page_ins"],
          "total": total, "expected": expected, "kept": len(others),
          "touches": [t.__dict__ for t in lms.unpinned_touches()]})


def wrong_version() -> None:
    import ctypes

    from tensorflow_lms_allocator.overlay import activation

    # Another version than the one the package was built for (2.16-2.21 all build).
    other = "2.19.1" if activation.built_for_tensorflow() == "2.20.0" else "2.20.0"
    error = ctypes.create_string_buffer(512)
    code = activation.adapter().tf_lms_configure(other.encode(), error, len(error))
    emit({"code": activation.adapter().tf_lms_code_name(code).decode(),
          "message": error.value.decode(), "built_for": activation.built_for_tensorflow(),
          "other": other})


def late_import() -> None:
    import tensorflow as tf

    result = {}
    try:
        import tensorflow_lms_allocator
        from tensorflow_lms_allocator import engine, replay, trace
    except ImportError as error:
        emit({"error": str(error)})
        return
    result["error"] = None
    # The tools work: the engine over POSIX memory, and a trace of it replayed.
    tool = engine.Engine(device_bytes=4 * MIB, host_bytes=16 * MIB)
    result["engine_allocates"] = tool.allocate(MIB) > 0
    result["tools"] = [module.__name__ for module in (trace, replay)]
    for name, call in (("package", tensorflow_lms_allocator.get_lms_enabled),
                       ("tf_config", tf.config.experimental.set_lms_enabled),
                       ("statistics", tf.config.experimental.get_bytes_in_use)):
        try:
            call(*([True] if name == "tf_config" else ["CPU:0"] if name == "statistics" else []))
            result[name] = None
        except RuntimeError as error:
            result[name] = str(error)
    emit(result)


def optional() -> None:
    """Through TensorFlow's allocator interface (AllocateRaw with attributes)."""
    import ctypes

    import tensorflow_lms_allocator as lms
    from tensorflow_lms_allocator.overlay import activation
    import tensorflow as tf

    tf.config.experimental.get_bytes_limit("CPU:0")  # makes the devices
    lib = activation.adapter()
    message = ctypes.create_string_buffer(1024)

    def allocate(mib: int, retry: int) -> tuple[int, int]:
        ptr = ctypes.c_void_p()
        code = lib.tf_lms_test_allocate_raw(b"CPU:0", 256, mib * MIB, retry,
                                            ctypes.byref(ptr), message, len(message))
        return code, ptr.value or 0

    held = [allocate(8, 1)[1] for _ in range(8)]  # the 64 MiB device, full
    before = lms.get_statistics("CPU:0")
    code, refused = allocate(16, 0)
    after = lms.get_statistics("CPU:0")
    code_needed, needed = allocate(16, 1)
    emit({"held": sum(p != 0 for p in held),
          "optional": [lib.tf_lms_code_name(code).decode(), refused],
          "evicted_for_it": after["num_evictions"] - before["num_evictions"],
          "refused": after["num_optional_refused"] - before["num_optional_refused"],
          "needed": [lib.tf_lms_code_name(code_needed).decode(), needed != 0],
          "evicted_for_needed": lms.get_statistics("CPU:0")["num_evictions"]
          - after["num_evictions"]})


if __name__ == "__main__":
    {"strict_numpy": strict_numpy, "fragment": fragment, "host_exhausted": host_exhausted,
     "announce": announce, "optional": optional,
     "api": api, "late_import": late_import, "slice_pin": slice_pin,
     "wrong_version": wrong_version, "serves": serves,
     "logical_cpus": logical_cpus, "reset_peaks": reset_peaks,
     "handle_read": handle_read}[sys.argv[1]]()
