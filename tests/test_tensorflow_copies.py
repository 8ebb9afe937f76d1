"""TensorFlow's own copies pin what they read and write (Note [TensorFlow's own copies]).

On a GPU, TensorFlow moves tensors outside kernels with GPUUtil's copies,
which only enqueue and complete later. The interposer hands each to the
adapter, which pins the copy's LMS buffers (paging them in) before the
enqueue and unpins them in the copy's `done`. There is no GPU here, so the
hooks run through tf_lms_test_tensorflow_copy with a stand-in for GPUUtil's
function that completes the copy 200 ms later on another thread, over the
emulated device and over a GPU's LMS device on the fake CUDA driver.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tf_helpers import describe, run_program

pytestmark = pytest.mark.gpu_wheel

FAKE_DRIVER = Path(__file__).parents[1] / "build/fake_cuda/libfakecuda.so"
KINDS = ("device_to_host", "host_to_device", "within_device", "device_to_device")
RESOURCE_EXHAUSTED = 8  # absl::StatusCode


def run_copies(device: str) -> dict:
    if device == "CPU:0":
        env = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_ENABLED": "1"}
    else:
        if not FAKE_DRIVER.exists():
            pytest.fail(f"{FAKE_DRIVER} is missing: run `make fake-cuda` (make test builds it)")
        env = {"TF_LMS_ENABLED": "1", "TF_LMS_CUDA_DRIVER_PATH": str(FAKE_DRIVER),
               "FAKE_CUDA_DEVICE_MB": "256", "FAKE_CUDA_HOST_MB": "512",
               "FAKE_CUDA_DEVICE_COUNT": "2", "TF_GPU_HOST_MEM_LIMIT_IN_MB": "256"}
    run = run_program("tensorflow_copies.py", device, env=env)
    assert run.result, describe(run)
    return run.result


@pytest.fixture(scope="module", params=["CPU:0", "GPU:0"])
def copies(request: pytest.FixtureRequest) -> tuple[str, dict]:
    return request.param, run_copies(request.param)


def test_every_copy_pages_its_evicted_tensors_in_and_holds_them_pinned_until_done(copies):
    device, result = copies
    for kind in KINDS:
        r = result[kind]
        assert r["enqueued"] == 1 and r["done_code"] == 0, (device, kind, r)
        # The LMS side of the copy (both sides within a device or between
        # devices) was evicted before the copy; when the copy was enqueued it
        # was resident and pinned once.
        lms_sides = [side for side in ("src", "dst") if r[f"{side}_evicted"] != -1]
        assert lms_sides == {"device_to_host": ["src"], "host_to_device": ["dst"]}.get(
            kind, ["src", "dst"]), (device, kind, r)
        for side in lms_sides:
            assert r[f"{side}_evicted"] == 0 and r[f"{side}_pins"] == 1, (device, kind, side, r)
        assert r["page_ins"] == len(lms_sides), (device, kind, r)
        # Still pinned while the copy is in flight, released by its done.
        assert r["pins_in_flight"] == 1 and r["pins_after"] == 0, (device, kind, r)
        assert r["bytes_equal"] == 1, (device, kind, r)
    if device == "GPU:0":  # the fake driver's checker: no mapping changed under queued work
        assert result["violations"] == ""


def test_a_copy_whose_tensor_cannot_be_paged_in_fails_its_done_and_is_not_enqueued(copies):
    device, result = copies
    r = result["device_full"]
    assert r["enqueued"] == 0 and r["done_code"] == RESOURCE_EXHAUSTED, (device, r)
    assert "LMS could not page in the 4194304-byte tensor for TensorFlow's device-to-host " \
           "copy" in r["message"], r["message"]
    assert "out of device memory" in r["message"]
    assert r["pins_after"] == 0



def test_a_copy_on_an_event_thread_that_must_wait_is_handed_to_a_thread_that_may(copies):
    # Note [Copies from event threads]: a running kernel fills the device and
    # ends 200 ms later. On TensorFlow's event threads nothing waits, and a
    # copy's pin failed its done at once (RESOURCE_EXHAUSTED); now the copy
    # is handed to LMS's own thread, which waits for the kernel, pages the
    # source in, enqueues the copy and runs done.
    device, result = copies
    r = result["event_thread_kernel_holds"]
    assert r["enqueued"] == 1 and r["done_code"] == 0, (device, r)
    assert r["src_evicted"] == 0 and r["src_pins"] == 1, (device, r)
    assert r["bytes_equal"] == 1 and r["pins_after"] == 0, (device, r)
    assert r["seconds"] >= 0.2, (device, r)  # it waited for the kernel


def test_a_copy_between_two_gpus_pins_both_sides_on_their_own_devices():
    """GPUUtil::DeviceToDeviceCopy between two LMS GPUs, each way: the source
    is paged in and pinned on its GPU, the destination on the other (each by
    its own engine), both until `done`; every byte arrives; the fake driver
    sees no mapping change under queued work."""
    result = run_copies("GPU:0,GPU:1")
    for way in ("0_to_1", "1_to_0"):
        r = result[way]
        assert r["enqueued"] == 1 and r["done_code"] == 0, (way, r)
        assert (r["src_evicted"], r["src_pins"], r["dst_evicted"], r["dst_pins"]) == \
            (0, 1, 0, 1), (way, r)
        assert r["page_ins"] == 2, (way, r)  # one on each GPU
        assert r["pins_in_flight"] == 1 and r["pins_after"] == 0, (way, r)
        assert r["bytes_equal"] == 1, (way, r)
    assert result["violations"] == ""
