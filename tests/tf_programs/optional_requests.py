"""What an optional request (TensorFlow's retry_on_failure off, as cuDNN's
autotuning asks for each algorithm's workspace) gets through TensorFlow's
allocator interface once the device is full of inactive tensors.

Fifteen 4 MiB tensors are made and read on CPU:0 (the emulated device), so
on a 64 MiB device they fill it; then workspaces are asked for as autotuning
asks, largest first (32, 16, 8, 4 MiB), each freed before the next. Prints one
line ``RESULT <json>``: per size, whether it was served and the bytes evicted
for it (Note [Optional requests] in engine.h), and the device's size.

Usage: python optional_requests.py   (TF_LMS_CPU_DEVICE_MEMORY_MB, TF_LMS_ENABLED)
"""

from __future__ import annotations

import ctypes
import json

import tensorflow_lms_allocator as lms  # before tensorflow
from tensorflow_lms_allocator.overlay import activation
import tensorflow as tf

MIB = 1 << 20


def main() -> None:
    with tf.device("CPU:0"):
        held = [tf.fill([MIB], i) for i in range(15)]  # 4 MiB of int32 each
        total = int(tf.add_n([t[:1] for t in held])[0])
    lib = activation.adapter()
    message = ctypes.create_string_buffer(1024)
    result: dict = {"held_sum_right": total == sum(range(15)), "requests": {}}
    for mib in (32, 16, 8, 4):
        before = lms.get_statistics("CPU:0")["bytes_evicted_for_optional"]
        ptr = ctypes.c_void_p()
        lib.tf_lms_test_allocate_raw(b"CPU:0", 256, mib * MIB, 0, ctypes.byref(ptr),
                                     message, len(message))
        evicted = lms.get_statistics("CPU:0")["bytes_evicted_for_optional"] - before
        result["requests"][str(mib)] = {"served": bool(ptr.value), "evicted": evicted}
        if ptr.value:
            lib.tf_lms_test_deallocate_raw(b"CPU:0", ptr)
    stats = lms.get_statistics("CPU:0")
    result["bytes_limit"] = stats["bytes_limit"]
    result["num_born_evicted"] = stats["num_born_evicted"]
    result["held_right"] = all(int(t[-1]) == i for i, t in enumerate(held))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
