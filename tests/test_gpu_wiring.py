"""LMS on a GPU, as the overlay wires it, over the fake CUDA driver.

TensorFlow's CPU wheel makes no GPU device, so the GPU's allocator is asked
for as TensorFlow's GPU device factory asks (GPUProcessState::GetGPUAllocator
through the interposer's hook), with TF_LMS_CUDA_DRIVER_PATH naming the fake
driver (built by `make fake-cuda`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tf_helpers import describe, log_severity, run_program

pytestmark = pytest.mark.gpu_wheel

MIB = 1 << 20
FAKE_DRIVER = Path(__file__).parents[1] / "build/fake_cuda/libfakecuda.so"



@pytest.fixture(autouse=True)
def _fake_driver_is_built() -> None:
    if not FAKE_DRIVER.exists():
        pytest.fail(f"{FAKE_DRIVER} is missing: run `make fake-cuda` (make test builds it)")


def fake_gpu(**env: str) -> dict[str, str]:
    return {"TF_LMS_CUDA_DRIVER_PATH": str(FAKE_DRIVER), "FAKE_CUDA_DEVICE_MB": "256",
            "FAKE_CUDA_HOST_MB": "512", "TF_GPU_HOST_MEM_LIMIT_IN_MB": "256", **env}


def test_a_gpu_gets_an_lms_device_from_tensorflows_budget_and_swaps_past_it():
    run = run_program("gpu_wiring.py", "allocate", env=fake_gpu(TF_LMS_ENABLED="1"))
    assert run.result, describe(run)
    r = run.result
    assert r["create"] == [0, ""] and r["again"] == [0, ""]
    # TensorFlow's own allocator is asked for too, on a budget of no device
    # memory (its GetGpuHostAllocator CHECK-fails when GetGPUAllocator made
    # none); TensorFlow makes it once and returns it again.
    assert r["tensorflow_budgets"] == [1 * MIB, 1 * MIB]
    # The device budget is taken at once (as TensorFlow's BFC allocator takes
    # it), and pinned host memory made ahead: TF_LMS_HOST_AHEAD_MB's 1024 MiB,
    # at most the host limit of 256.
    assert r["created"] == [64 * MIB, 256 * MIB]
    assert r["names"] == ["GPU:0"]
    # 64.5 MiB from TensorFlow: the engine takes whole 2 MiB granules.
    assert r["limit_by_name"] == r["limit_by_index"] == 64 * MIB
    assert r["nine_mib_allocated"] == 10 * MIB
    # TensorFlow sees device plus host budget as the GPU's memory, so that
    # Grappler's memory optimizer does not swap beside LMS (test_grappler.py).
    assert r["tensorflow_bytes_limit"] == (64 + 256) * MIB
    # An optional request on the full device: refused, nothing evicted for it.
    assert r["optional"] == ["RESOURCE_EXHAUSTED", 0, 0, 1]
    assert r["allocated"] == 12, r.get("allocate_error")
    assert r["during"]["bytes_in_use"] == 96 * MIB + r["scratch_bytes"]
    assert r["during"]["host_bytes_in_use"] >= 32 * MIB
    # A pageable host pointer is not device memory (the fake faults a copy to
    # one): what device and host memory cannot hold is refused on a GPU, as
    # TensorFlow's BFC allocator refuses it.
    assert r["too_large"] == ["RESOURCE_EXHAUSTED", 0]
    # Eigen's scratch buffer, allocated before any kernel pins and used
    # unpinned by every reduction, stayed on the device through the evictions.
    assert r["scratch_evicted"] == 0
    assert r["after"]["bytes_in_use"] == 0
    assert r["violations"] == ""


def test_a_gpu_takes_the_granule_tf_lms_granule_mb_asks_for():
    """The fake driver's granularity is 2 MiB; TF_LMS_GRANULE_MB=8 is larger,
    so it is the GPU's granule: a 9 MiB tensor takes two 8 MiB granules, and
    the 8 MiB tensors past the device are evicted and placed as before. With
    TF_LMS_HOST_AHEAD_MB=0 host memory is made only as tensors are evicted."""
    run = run_program("gpu_wiring.py", "allocate",
                      env=fake_gpu(TF_LMS_ENABLED="1", TF_LMS_GRANULE_MB="8",
                                   TF_LMS_HOST_AHEAD_MB="0"))
    assert run.result, describe(run)
    r = run.result
    assert r["create"] == [0, ""]
    assert r["created"] == [64 * MIB, 0]
    assert r["limit_by_name"] == 64 * MIB
    assert r["nine_mib_allocated"] == 16 * MIB
    assert r["allocated"] == 12, r.get("allocate_error")
    assert r["during"]["host_bytes_in_use"] >= 32 * MIB
    assert r["after"]["bytes_in_use"] == 0
    assert r["violations"] == ""


def test_allow_growth_creates_device_memory_as_it_is_used():
    run = run_program("gpu_wiring.py", "allocate",
                      env=fake_gpu(TF_LMS_ENABLED="1", TF_FORCE_GPU_ALLOW_GROWTH="true"))
    assert run.result, describe(run)
    # Host memory made ahead is TF_LMS_HOST_AHEAD_MB's, whatever allow_growth.
    assert run.result["created"] == [0, 256 * MIB]
    assert run.result["allocated"] == 12 and run.result["violations"] == ""


def test_logical_gpus_on_one_device_each_swap_past_their_own_memory_limit():
    """tf.config.set_logical_device_configuration makes one CUDA device several
    logical GPUs, each with its memory_limit: each gets an LMS device of its
    own and answers get_statistics for itself."""
    run = run_program("gpu_wiring.py", "logical", env=fake_gpu(TF_LMS_ENABLED="1"))
    assert run.result, describe(run)
    r = run.result
    assert r["mapped"] == 0 and r["create"] == [0, 0]
    assert r["names"] == ["GPU:0", "GPU:1"]
    assert r["held"] == {"GPU:0": 8, "GPU:1": 6}
    assert r["stats"]["GPU:0"]["bytes_limit"] == 48 * MIB
    assert r["stats"]["GPU:1"]["bytes_limit"] == 32 * MIB
    # Past each one's own limit, in host memory (outside kernels: born evicted).
    assert r["stats"]["GPU:0"]["bytes_in_use"] == 64 * MIB
    assert r["stats"]["GPU:0"]["host_bytes_in_use"] >= 16 * MIB
    assert r["stats"]["GPU:1"]["bytes_in_use"] == 48 * MIB
    assert r["stats"]["GPU:1"]["host_bytes_in_use"] >= 16 * MIB
    assert "GPU:2 has no LMS allocator" in r["unknown"]
    assert "LMS serves GPU:0, GPU:1" in r["unknown"]
    assert r["violations"] == ""


def test_with_lms_off_tensorflows_own_allocator_serves_the_gpu():
    run = run_program("gpu_wiring.py", "refused", env=fake_gpu())
    assert run.result, describe(run)
    assert run.result["create"][0] == "FAILED_PRECONDITION"
    assert "TensorFlow's own allocator" in run.result["create"][1]
    assert run.result["tensorflow_budgets"] == [64 * MIB]  # the whole budget
    assert run.result["stats_error"][0] == "ValueError"
    assert "LMS is not enabled" in run.result["stats_error"][1]


def test_strict_mode_on_a_gpu_is_a_clear_error():
    run = run_program("gpu_wiring.py", "refused",
                      env=fake_gpu(TF_LMS_ENABLED="1", TF_LMS_STRICT="1"))
    assert run.result, describe(run)
    code, message = run.result["create"]
    assert code == "FAILED_PRECONDITION"
    assert "TF_LMS_STRICT=1 is for the emulated device" in message and "GPU:0" in message
    assert run.result["stats_error"][0] == "RuntimeError"


@pytest.mark.parametrize("knob, value, names", [
    # The GPU, its driver version, and what LMS requires.
    ("FAKE_CUDA_HOST_VMM", "0", ["GPU 0", "driver 12.4", "12.2"]),
    # A driver too old to hand out the CUDA 12 functions cannot even name the
    # GPU: its version and the requirement.
    ("FAKE_CUDA_DRIVER_VERSION", "11080", ["CUDA 11.8", "too old", "12.2"]),
])
def test_a_gpu_without_what_lms_needs_is_refused_saying_why(knob, value, names):
    run = run_program("gpu_wiring.py", "refused",
                      env=fake_gpu(TF_LMS_ENABLED="1", **{knob: value}))
    assert run.result, describe(run)
    for code, message in (run.result["check"], run.result["create"]):
        assert code == "FAILED_PRECONDITION", message
        for name in names:
            assert name in message, (name, message)


def test_a_missing_driver_is_a_clear_error():
    run = run_program("gpu_wiring.py", "refused",
                      env=fake_gpu(TF_LMS_ENABLED="1",
                                   TF_LMS_CUDA_DRIVER_PATH="/nonexistent/libcuda.so.1"))
    assert run.result, describe(run)
    code, message = run.result["check"]
    assert code == "FAILED_PRECONDITION" and "/nonexistent/libcuda.so.1" in message


def test_two_gpus_split_the_host_memory_limit_and_each_can_use_its_half():
    # TensorFlow names every other GPU as a peer when it asks for a GPU's
    # allocator: each GPU's engine gets half of TF_GPU_HOST_MEM_LIMIT_IN_MB,
    # so the first GPU to evict cannot take the second one's half (before,
    # each assumed all of it: GPU:0 held 36 tensors, GPU:1 only its 4
    # resident ones, refused inside its evictions).
    run = run_program("gpu_wiring.py", "split",
                      env=fake_gpu(TF_LMS_ENABLED="1", FAKE_CUDA_DEVICE_COUNT="2",
                                   TF_CPP_MIN_LOG_LEVEL="0"))
    assert run.result and run.result["create"] == [0, 0], describe(run)
    served = [x for x in run.stderr.splitlines() if "LMS serves GPU:" in x]
    assert len(served) == 2, run.stderr
    for line in served:
        assert "host memory for evicted tensors 128.0 MiB" in line, line
        assert "(TF_GPU_HOST_MEM_LIMIT_IN_MB=256 split among 2 GPUs)" in line, line
        # TF_LMS_HOST_AHEAD_MB's 1024 by default, at most the GPU's share.
        assert "128.0 MiB (134217728 bytes) of it made ahead (TF_LMS_HOST_AHEAD_MB)" in line, line
    # 32 MiB resident and 128 MiB in host memory each, 8 MiB at a time.
    assert run.result["held"] == {"GPU:0": 20, "GPU:1": 20}
    assert run.result["host_bytes_in_use"] == {"GPU:0": 128 * MIB, "GPU:1": 128 * MIB}
    # TensorFlow's view of each GPU's memory: its device memory and its share.
    assert run.result["tensorflow_bytes_limit"] == {"GPU:0": 160 * MIB, "GPU:1": 160 * MIB}
    assert run.result["violations"] == ""


def test_the_gpu_lms_serves_is_logged_and_tf_gpu_allocator_is_said_to_be_ignored():
    run = run_program("gpu_wiring.py", "allocate",
                      env=fake_gpu(TF_LMS_ENABLED="1", TF_CPP_MIN_LOG_LEVEL="0",
                                   TF_GPU_ALLOCATOR="cuda_malloc_async"))
    assert run.result and run.result["allocated"] == 12, describe(run)
    served = [x for x in run.stderr.splitlines() if "LMS serves GPU:0" in x]
    assert len(served) == 1, run.stderr
    assert "device memory 64.0 MiB" in served[0] and "cuda backend" in served[0]
    assert "(TF_GPU_HOST_MEM_LIMIT_IN_MB)" in served[0]  # one GPU: all of it
    ignored = [x for x in run.stderr.splitlines()
               if "TF_GPU_ALLOCATOR=cuda_malloc_async is ignored for GPU:0" in x]
    assert len(ignored) == 1 and log_severity(ignored[0]) == "W", run.stderr
