"""ConfigProto's gpu_options.experimental.lms_enabled on the stock wheel.

Prints ``RESULT <json>``.

Usage: python config_proto.py NAME
  python      the field in Python's ConfigProto: text, serialization, a
              Session configured with it
  gpu         GPU:0's allocator asked for as TensorFlow's GPU device factory
              asks, with the GPUOptions of a ConfigProto that sets the field
              (argv[2] "set") or not ("unset"), over the fake CUDA driver
"""

from __future__ import annotations

import ctypes
import json
import sys

MIB = 1 << 20


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def config(set_field: bool):  # -> tf.compat.v1.ConfigProto
    import tensorflow as tf

    proto = tf.compat.v1.ConfigProto()
    if set_field:
        proto.gpu_options.experimental.lms_enabled = True
    return proto


def python() -> None:
    import tensorflow_lms_allocator  # noqa: F401  (before tensorflow)
    import tensorflow as tf
    from google.protobuf import text_format

    proto = config(True)
    proto.gpu_options.experimental.lms_defrag_enabled = True
    text = text_format.MessageToString(proto)
    again = tf.compat.v1.ConfigProto.FromString(proto.SerializeToString())
    parsed = text_format.Parse(text, tf.compat.v1.ConfigProto())
    result = {"text": text, "serialized": proto.gpu_options.SerializeToString().hex(),
              "round_trip": [again.gpu_options.experimental.lms_enabled,
                             again.gpu_options.experimental.lms_defrag_enabled],
              "text_round_trip": parsed.gpu_options.experimental.lms_enabled}
    with tf.Graph().as_default():
        total = tf.constant([1.0, 2.0]) * 3
        with tf.compat.v1.Session(config=proto) as session:
            result["session"] = session.run(total).tolist()
    emit(result)


def gpu(which: str) -> None:
    import tensorflow_lms_allocator as lms
    from tensorflow_lms_allocator.overlay import activation

    lib = activation.adapter()
    options = config(which == "set").gpu_options.SerializeToString()
    message = ctypes.create_string_buffer(2048)
    code = lib.tf_lms_test_gpu_allocator(0, 64 * MIB, options, len(options), message,
                                         len(message))
    result = {"create": [lib.tf_lms_code_name(code).decode(), message.value.decode()],
              "names": lms.device_names()}
    if code == 0:
        pointers = []
        for _ in range(12):  # 96 MiB on a 64 MiB device: only with eviction
            ptr = ctypes.c_void_p()
            if lib.tf_lms_test_allocate_raw(b"GPU:0", 256, 8 * MIB, 1, ctypes.byref(ptr),
                                            message, len(message)) != 0:
                break
            pointers.append(ptr.value)
        result["allocated"] = len(pointers)
        stats = lms.get_statistics("GPU:0")
        # Allocations made outside kernels evict nothing: past the device
        # they are placed in host memory (Note [Writers outside kernels]).
        result["placed_in_host_memory"] = stats["num_born_evicted"]
        for ptr in pointers:
            lib.tf_lms_test_deallocate_raw(b"GPU:0", ptr)
    emit(result)


if __name__ == "__main__":
    if sys.argv[1] == "python":
        python()
    else:
        gpu(sys.argv[2])
