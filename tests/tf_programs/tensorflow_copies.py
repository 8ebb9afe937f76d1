"""TensorFlow's own copies under LMS (Note [TensorFlow's own copies]).

Runs tf_lms_test_tensorflow_copy, the copy hooks as a GPU wheel's TensorFlow
calls them with a stand-in for GPUUtil's function, for each kind of copy,
and prints ``RESULT <json>``.

Usage: python tensorflow_copies.py DEVICE
  CPU:0         the emulated device (TF_LMS_CPU_DEVICE_MEMORY_MB)
  GPU:0         a GPU's LMS device over the fake CUDA driver (TF_LMS_CUDA_DRIVER_PATH)
  GPU:0,GPU:1   two GPUs' LMS devices (FAKE_CUDA_DEVICE_COUNT=2): a
                device-to-device copy each way between them
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

MIB = 1 << 20
KINDS = ("device_to_host", "host_to_device", "within_device", "device_to_device")
FIELDS = ("enqueued", "done_code", "src_evicted", "src_pins", "dst_evicted", "dst_pins",
          "pins_in_flight", "pins_after", "bytes_equal", "page_ins")


def probe(lib: ctypes.CDLL, device: str, kind: int, fill_device: int,
          dst_device: str = "") -> dict:
    """fill_device: 0 no, 1 pinned memory nobody releases, 2 a running kernel's
    memory, released 200 ms later."""
    out = (ctypes.c_int64 * len(FIELDS))()
    message = ctypes.create_string_buffer(2048)
    code = lib.tf_lms_test_tensorflow_copy(device.encode(), dst_device.encode(), kind,
                                           4 * MIB, 200, fill_device, out, message,
                                           len(message))
    if code != 0:
        raise RuntimeError(f"{lib.tf_lms_code_name(code).decode()}: {message.value.decode()}")
    return {**dict(zip(FIELDS, out)), "message": message.value.decode()}


def on_an_event_thread(call) -> dict:
    """call() on a thread named as TensorFlow names its device event threads,
    with how long it took."""
    result: dict = {}

    def run() -> None:
        ctypes.CDLL(None).prctl(15, b"tf_Device_Event", 0, 0, 0)  # PR_SET_NAME
        start = time.monotonic()
        result.update(call())
        result["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return result


def main(device: str) -> None:
    from tensorflow_lms_allocator.overlay import activation
    import tensorflow as tf

    lib = activation.adapter()
    float(tf.reduce_sum(tf.ones([4])))  # TensorFlow makes its devices
    gpus = 2 if device == "GPU:0,GPU:1" else 1 if device.startswith("GPU") else 0
    for gpu in range(gpus):
        message = ctypes.create_string_buffer(2048)
        code = lib.tf_lms_test_gpu_allocator(gpu, 64 * MIB, None, 0, message, len(message))
        if code != 0:
            raise RuntimeError(message.value.decode())
    if gpus == 2:  # a copy between the GPUs, each way, both sides evicted first
        result = {"0_to_1": probe(lib, "GPU:0", 3, 0, "GPU:1"),
                  "1_to_0": probe(lib, "GPU:1", 3, 0, "GPU:0")}
    else:
        result = {name: probe(lib, device, kind, 0) for kind, name in enumerate(KINDS)}
        result["device_full"] = probe(lib, device, 0, 1)
        result["event_thread_kernel_holds"] = on_an_event_thread(lambda: probe(lib, device, 0, 2))
    if "TF_LMS_CUDA_DRIVER_PATH" in os.environ:
        from gpu_wiring import fake_driver_violations

        result["violations"] = fake_driver_violations()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
