"""A request on TensorFlow's event threads never waits for other kernels' releases.

On a GPU, Where, segment reductions, DynamicPartition and Unique allocate
their outputs in callbacks on the device's event threads (named
"tf_Device_Event"); a wait there would hold up every later callback of the
device. Here a CollectiveReduceV2 waiting for its peer holds memory pinned
(a running kernel that will release it), and a thread outside any kernel,
named as an event thread, asks for more than device and host memory hold
(any other thread waits for the kernel's release, up to 10 s). Prints one
line ``RESULT <json>``: the request's code, whether it was served (on the
emulated device, from ordinary host memory), how long it took, and whether
the kernel was still running when it returned.

Usage: python event_threads.py   (TF_LMS_CPU_DEVICE_MEMORY_MB, TF_GPU_HOST_MEM_LIMIT_IN_MB)
"""

from __future__ import annotations

import ctypes
import json
import threading
import time

from collectives import reduce, two_participants  # imports the overlay first
from tensorflow_lms_allocator.overlay import activation
import tensorflow as tf

MIB = 1 << 20
PR_SET_NAME = 15
REQUEST_MIB = 96  # more than the device (48 MiB) and host memory (8 MiB) together


def timed_request(thread_name: str, results: dict[str, dict]) -> None:
    ctypes.CDLL(None).prctl(PR_SET_NAME, thread_name.encode(), 0, 0, 0)
    lib = activation.adapter()
    ptr = ctypes.c_void_p()
    message = ctypes.create_string_buffer(1024)
    start = time.monotonic()
    code = lib.tf_lms_test_allocate_raw(b"CPU:0", 256, REQUEST_MIB * MIB, 1,
                                        ctypes.byref(ptr), message, len(message))
    results[thread_name] = {"code": lib.tf_lms_code_name(code).decode(),
                                       "served": bool(ptr.value),
                                       "seconds": time.monotonic() - start}
    if ptr.value:
        lib.tf_lms_test_deallocate_raw(b"CPU:0", ptr)


def main() -> None:
    a, b = two_participants()
    out: dict[str, tf.Tensor] = {}
    waiting = threading.Thread(target=reduce, args=("CPU:0", a, out, "a"))
    waiting.start()
    time.sleep(1.0)  # A's kernel runs, holding its input and output pinned
    results: dict[str, dict] = {}
    request = threading.Thread(target=timed_request, args=("tf_Device_Event", results))
    request.start()
    request.join(timeout=30)
    results["kernel_still_running"] = waiting.is_alive()
    reduce("CPU:1", b, out, "b")  # A ends, and releases what it held
    waiting.join()
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
