"""The overlay's GPU path over the fake CUDA driver; prints ``RESULT <json>``.

No GPU exists here and TensorFlow's CPU wheel creates no GPU device, so these
programs ask for a GPU's allocator as TensorFlow's GPU device factory does
(tf_lms_test_gpu_allocator: GPUProcessState::GetGPUAllocator through the
interposer's hook), with TF_LMS_CUDA_DRIVER_PATH naming the fake driver.

Usage: python gpu_wiring.py NAME
  allocate   GPU:0's LMS device from a budget that is not whole granules;
             the physical memory it takes at once; allocations past the
             budget, statistics by name and index; a request device and
             host memory cannot hold is refused (no pageable host pointer)
  refused    asking for the GPU allocator when LMS cannot serve it; prints
             the C API's code and message, and tf_lms_check_gpu's
  split      two GPUs, each naming the other as its peer as TensorFlow does:
             each gets half of TF_GPU_HOST_MEM_LIMIT_IN_MB for evicted
             tensors, and both evict up to their half at once
  logical    one CUDA device as two logical GPUs (48 and 32 MiB), as
             tf.config.set_logical_device_configuration makes them: each
             swaps past its own memory_limit and answers for itself
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MIB = 1 << 20


def emit(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def fake_driver_violations() -> str:
    """The fake CUDA driver's record of broken driver rules ("" if none)."""
    fake = ctypes.CDLL(os.environ["TF_LMS_CUDA_DRIVER_PATH"])
    fake.fake_cuda_violations.restype = ctypes.c_void_p
    raw = fake.fake_cuda_violations()
    try:
        return ctypes.string_at(raw).decode()
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(raw))


def gpu_allocator(lib: ctypes.CDLL, total_bytes: int) -> tuple[int, str]:
    message = ctypes.create_string_buffer(2048)
    code = lib.tf_lms_test_gpu_allocator(0, total_bytes, None, 0, message, len(message))
    return code, message.value.decode()


def tensorflow_budgets(lib: ctypes.CDLL) -> list[int]:
    """The budgets TensorFlow's GetGPUAllocator (a stand-in here) was asked for."""
    out = (ctypes.c_size_t * 8)()
    count = lib.tf_lms_test_tensorflow_gpu_allocator_budgets(out, len(out))
    return list(out[:min(count, len(out))])


def allocate() -> None:
    import tensorflow_lms_allocator as lms
    from tensorflow_lms_allocator.overlay import activation
    import tensorflow as tf

    lib = activation.adapter()
    fake = ctypes.CDLL(os.environ["TF_LMS_CUDA_DRIVER_PATH"])
    fake.fake_cuda_pool_bytes_in_use.restype = ctypes.c_size_t
    result: dict = {"create": gpu_allocator(lib, 64 * MIB + MIB // 2)}
    # Physical memory right after the device was made: [device, host].
    result["created"] = [fake.fake_cuda_pool_bytes_in_use(0),
                         fake.fake_cuda_pool_bytes_in_use(1)]
    result["again"] = gpu_allocator(lib, 64 * MIB + MIB // 2)
    result["tensorflow_budgets"] = tensorflow_budgets(lib)
    result["names"] = lms.device_names()
    result["limit_by_name"] = tf.config.experimental.get_bytes_limit("GPU:0")
    result["limit_by_index"] = tf.config.experimental.get_bytes_limit(0)
    # What TensorFlow reads from the allocator and makes the GPU device's
    # memory (Note [The limit TensorFlow sees]).
    reported = ctypes.c_int64()
    lib.tf_lms_test_tensorflow_bytes_limit(b"GPU:0", ctypes.byref(reported))
    result["tensorflow_bytes_limit"] = reported.value
    message = ctypes.create_string_buffer(2048)
    # Eigen's scratch buffer, asked for as BaseGPUDevice::InitScratchBuffers
    # asks (kAllocatorAlignment, kGpuScratchSize + 4 bytes, default
    # attributes) from OpKernelContext's constructor, before any kernel pins:
    # every Eigen reduction then uses it unpinned, so it must never be evicted.
    scratch = ctypes.c_void_p()
    lib.tf_lms_test_allocate_raw(b"GPU:0", 64, 1024 + 4, 1, ctypes.byref(scratch),
                                 message, len(message))
    requested, allocated = ctypes.c_size_t(), ctypes.c_size_t()
    lib.tf_lms_test_allocation_sizes(b"GPU:0", scratch, ctypes.byref(requested),
                                     ctypes.byref(allocated))
    result["scratch_bytes"] = allocated.value
    # A 9 MiB tensor takes whole granules (TF_LMS_GRANULE_MB's, if larger
    # than the driver's): what the allocator says it allocated.
    nine = ctypes.c_void_p()
    lib.tf_lms_test_allocate_raw(b"GPU:0", 256, 9 * MIB, 1, ctypes.byref(nine),
                                 message, len(message))
    lib.tf_lms_test_allocation_sizes(b"GPU:0", nine, ctypes.byref(requested),
                                     ctypes.byref(allocated))
    result["nine_mib_allocated"] = allocated.value
    lib.tf_lms_test_deallocate_raw(b"GPU:0", nine)
    pointers = []
    for _ in range(12):  # 96 MiB of 8 MiB tensors on a 64 MiB device
        ptr = ctypes.c_void_p()
        code = lib.tf_lms_test_allocate_raw(b"GPU:0", 256, 8 * MIB, 1, ctypes.byref(ptr),
                                            message, len(message))
        if code != 0:
            result["allocate_error"] = message.value.decode()
            break
        pointers.append(ptr.value)
    result["allocated"] = len(pointers)
    stats = lms.get_statistics("GPU:0")
    result["during"] = {k: stats[k] for k in ("bytes_in_use", "host_bytes_in_use",
                                              "num_born_evicted", "num_evictions")
                        if k in stats}
    # An optional request (retry_on_failure off, as cuDNN's autotuning asks)
    # on a full device: refused at once, nothing evicted for it.
    ptr = ctypes.c_void_p()
    code = lib.tf_lms_test_allocate_raw(b"GPU:0", 256, 16 * MIB, 0, ctypes.byref(ptr),
                                        message, len(message))
    after_optional = lms.get_statistics("GPU:0")
    result["optional"] = [lib.tf_lms_code_name(code).decode(), ptr.value or 0,
                          after_optional["num_evictions"] - stats["num_evictions"],
                          after_optional["num_optional_refused"]]
    info = (ctypes.c_int64 * 5)()
    result["scratch_evicted"] = (info[3] if scratch.value and
                                 lib.tf_lms_inspect(scratch, info) == 0 else None)
    lib.tf_lms_test_deallocate_raw(b"GPU:0", scratch)
    # More than device and host memory together, outside any kernel: the
    # emulated device would serve pageable host memory, a GPU must refuse.
    ptr = ctypes.c_void_p()
    code = lib.tf_lms_test_allocate_raw(b"GPU:0", 256, 512 * MIB, 1, ctypes.byref(ptr),
                                        message, len(message))
    result["too_large"] = [lib.tf_lms_code_name(code).decode(), ptr.value or 0]
    for ptr in pointers:
        lib.tf_lms_test_deallocate_raw(b"GPU:0", ptr)
    stats = lms.get_statistics("GPU:0")
    result["after"] = {"bytes_in_use": stats["bytes_in_use"]}
    result["violations"] = fake_driver_violations()
    emit(result)


def logical() -> None:
    import tensorflow_lms_allocator as lms
    from tensorflow_lms_allocator.overlay import activation
    import tensorflow as tf  # noqa: F401  (the devices' statistics need it)

    lib = activation.adapter()
    message = ctypes.create_string_buffer(2048)
    result: dict = {"mapped": lib.tf_lms_test_map_gpu(1, 0, message, len(message))}
    result["create"] = [lib.tf_lms_test_gpu_allocator(gpu, budget, None, 0, message,
                                                      len(message))
                        for gpu, budget in ((0, 48 * MIB), (1, 32 * MIB))]
    result["names"] = lms.device_names()
    held: dict[str, list[int]] = {"GPU:0": [], "GPU:1": []}
    for name, count in (("GPU:0", 8), ("GPU:1", 6)):  # 64 MiB on 48, 48 on 32
        for _ in range(count):
            ptr = ctypes.c_void_p()
            if lib.tf_lms_test_allocate_raw(name.encode(), 256, 8 * MIB, 1, ctypes.byref(ptr),
                                            message, len(message)) == 0:
                held[name].append(ptr.value)
    result["held"] = {name: len(p) for name, p in held.items()}
    result["stats"] = {name: {k: v for k, v in lms.get_statistics(name).items()
                              if k in ("bytes_limit", "bytes_in_use", "host_bytes_in_use")}
                       for name in held}
    for name, pointers in held.items():
        for ptr in pointers:
            lib.tf_lms_test_deallocate_raw(name.encode(), ptr)
    try:
        lms.get_statistics("GPU:2")
        result["unknown"] = None
    except ValueError as error:
        result["unknown"] = str(error)
    result["violations"] = fake_driver_violations()
    emit(result)


def split() -> None:
    import tensorflow_lms_allocator as lms
    from tensorflow_lms_allocator.overlay import activation

    lib = activation.adapter()
    message = ctypes.create_string_buffer(2048)
    lib.tf_lms_test_set_gpu_count(2)
    result: dict = {"create": [lib.tf_lms_test_gpu_allocator(gpu, 32 * MIB, None, 0, message,
                                                             len(message))
                               for gpu in (0, 1)]}
    # GPU:0 holds as much as it can (8 MiB at a time, 32 MiB of device
    # memory), then GPU:1: what is not resident is in each one's share of
    # host memory, whatever the other took first.
    held: dict[str, list[int]] = {"GPU:0": [], "GPU:1": []}
    for name, pointers in held.items():
        for _ in range(40):
            ptr = ctypes.c_void_p()
            if lib.tf_lms_test_allocate_raw(name.encode(), 256, 8 * MIB, 1, ctypes.byref(ptr),
                                            message, len(message)) == 0:
                pointers.append(ptr.value)
    result["held"] = {name: len(p) for name, p in held.items()}
    result["host_bytes_in_use"] = {name: lms.get_statistics(name)["host_bytes_in_use"]
                                   for name in held}
    limit = ctypes.c_int64()
    result["tensorflow_bytes_limit"] = {}
    for name in held:
        lib.tf_lms_test_tensorflow_bytes_limit(name.encode(), ctypes.byref(limit))
        result["tensorflow_bytes_limit"][name] = limit.value
    for name, pointers in held.items():
        for ptr in pointers:
            lib.tf_lms_test_deallocate_raw(name.encode(), ptr)
    result["violations"] = fake_driver_violations()
    emit(result)


def refused() -> None:
    from tensorflow_lms_allocator.overlay import activation
    import tensorflow_lms_allocator as lms

    lib = activation.adapter()
    message = ctypes.create_string_buffer(2048)
    check = lib.tf_lms_check_gpu(0, message, len(message))
    result = {"check": [lib.tf_lms_code_name(check).decode(), message.value.decode()]}
    code, text = gpu_allocator(lib, 64 * MIB)
    result["create"] = [lib.tf_lms_code_name(code).decode(), text]
    result["tensorflow_budgets"] = tensorflow_budgets(lib)
    try:
        lms.get_statistics("GPU:0")
        result["stats_error"] = None
    except Exception as error:  # noqa: BLE001 - the type is what is checked
        result["stats_error"] = [type(error).__name__, str(error)]
    emit(result)


if __name__ == "__main__":
    {"allocate": allocate, "refused": refused, "logical": logical,
     "split": split}[sys.argv[1]]()
