"""What LMS tells TensorFlow a device holds, and Grappler's swapping (issue: GPU-only paths).

On a GPU, TensorFlow takes the allocator's bytes_limit as the device's memory,
and Grappler's memory optimizer swaps tensors to host memory with copy nodes
of its own when a graph's estimated peak exceeds it: a second swapper next to
LMS. These run Grappler on a virtual GPU (no GPU here) of the memory the
emulated device's allocator reports.
"""

from __future__ import annotations

from tf_helpers import describe, run_program

MIB = 1 << 20
ENV = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_GPU_HOST_MEM_LIMIT_IN_MB": "1024"}


def test_with_lms_on_tensorflow_sees_device_plus_host_and_grappler_does_not_swap():
    run = run_program("grappler.py", env={**ENV, "TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    r = run.result
    assert r["code"] == 0 and r["lms_enabled"]
    assert r["device"] == 64 * MIB  # the statistic stays the device's capacity
    assert r["reported"] == (64 + 1024) * MIB
    # The graph's peak (~300 MiB) is above the device: at the device's
    # capacity Grappler would add swap nodes that fight LMS; at what LMS
    # holds it adds none.
    assert r["swaps_at_device"] > 0
    assert r["swaps_at_reported"] == 0


def test_with_lms_off_tensorflow_sees_the_device_alone():
    run = run_program("grappler.py", env={**ENV, "TF_LMS_ENABLED": "0"})
    assert run.result, describe(run)
    r = run.result
    assert r["code"] == 0 and not r["lms_enabled"]
    assert r["reported"] == r["device"] == 64 * MIB
    assert r["swaps_at_reported"] > 0  # TensorFlow's own behaviour, untouched
