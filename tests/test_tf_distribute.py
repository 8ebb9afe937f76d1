"""LMS under tf.distribute, on the emulated device.

- MirroredStrategy over two logical devices of one emulated device (both
  replicas allocate from the same LMS allocator): trains under a cap it
  cannot train under without LMS, with the weights of stock TensorFlow.
- MultiWorkerMirroredStrategy with two worker processes on loopback
  (examples/multi_worker.py launches them, TF_CONFIG with free ports), each
  with its own capped emulated device: both workers evict, and the weights
  after N steps are bit-identical to an uncapped run without LMS (one
  intra-op and one inter-op thread per worker, op determinism). Under
  TF_LMS_STRICT=1 the collectives' transfers make no unpinned touch of
  evicted memory (the gradients they send are the inputs of the running
  collective kernel, so they are pinned).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tf_helpers import describe, run_program

ROOT = Path(__file__).resolve().parent.parent
CAP_MIB = 48  # both models peak at about 100-160 MiB


@pytest.fixture(scope="module")
def mirrored_stock() -> dict:
    run = run_program("mirrored.py", env={"LMS_TEST_STOCK": "1"})
    assert run.result and run.result["error"] is None, describe(run)
    return run.result


def test_mirrored_strategy_on_two_logical_devices_trains_under_a_cap_with_lms(
        mirrored_stock):
    run = run_program("mirrored.py", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": str(CAP_MIB),
                                          "TF_LMS_ENABLED": "1"})
    assert run.result and run.result["error"] is None, describe(run)
    assert run.result["replicas"] == 2
    stats = run.result["stats"]
    assert stats["peak_bytes_in_use"] > stats["bytes_limit"] == CAP_MIB << 20
    assert stats["bytes_reclaimed"] > 0 and stats["num_page_ins"] > 0
    assert run.result["losses"] == mirrored_stock["losses"]
    assert run.result["weights"] == mirrored_stock["weights"]


def test_mirrored_strategy_with_concurrent_kernels_under_pressure_trains_with_short_waits():
    # Four inter-op threads run both replicas' kernels at once on a 32 MiB
    # device; asynchronous kernels (collectives, function calls) count as
    # blocked for the deadlock rule (Note [Asynchronous kernels wait for
    # others] in kernel_pins.h). Before, a request waited out the 10 s retry
    # budget and the step failed with an out-of-memory error; measured since:
    # the longest wait 0.5 s on an idle machine, 0.8 s beside another build
    # (a wait for a running kernel's release lasts as long as that kernel).
    run = run_program("mirrored.py", "--steps", "4",
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "32", "TF_LMS_ENABLED": "1",
                           "LMS_TEST_INTER_OP_THREADS": "4"})
    assert run.result and run.result["error"] is None, describe(run)
    stats = run.result["stats"]
    assert stats["bytes_reclaimed"] > 0 and stats["num_kernel_waits"] > 0
    print("longest wait for other kernels:", stats["time_longest_kernel_wait_ns"] / 1e9, "s")
    assert stats["time_longest_kernel_wait_ns"] < 3e9


def test_a_kernel_that_cannot_fit_beside_a_waiting_collective_is_served_at_once():
    # A's CollectiveReduceV2 waits for B holding 16 MiB pinned; the main
    # thread's kernel needs 40 MiB of a 48 MiB device. Only B's arrival would
    # release A's memory, and the main thread brings B after: before, the
    # request waited the whole 10 s budget and failed (OOM); now A counts as
    # blocked, the wait is seen to be a deadlock, and the output is placed in
    # host memory.
    run = run_program("collective_pressure.py", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "48",
                                                     "TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    r = run.result
    assert r["error"] is None and r["large_right"], r
    assert r["active_while_waiting"] == 16 << 20 and r["a_still_waiting"]
    assert r["seconds"] < 3.0, r["seconds"]  # measured 0.6 s; 10 s and an OOM before
    assert r["stats"]["time_longest_kernel_wait_ns"] < 1e9
    assert r["stats"]["num_overflow_placements"] >= 1
    assert r["a_right"] and r["b_right"]


def test_mirrored_strategy_runs_out_of_memory_under_the_cap_without_lms():
    run = run_program("mirrored.py", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": str(CAP_MIB),
                                          "TF_LMS_ENABLED": "0"})
    assert run.result and run.result["error"], describe(run)
    assert run.result["error"]["type"] == "ResourceExhaustedError"


def launch_workers(tmp_path: Path, name: str, *args: str) -> tuple[list[dict], Path, str]:
    """Runs examples/multi_worker.py (2 workers, 4 steps); their results, weights dir, output."""
    results, weights = tmp_path / f"{name}.json", tmp_path / name
    proc = subprocess.run(
        ["nice", sys.executable, str(ROOT / "examples" / "multi_worker.py"), "--workers", "2",
         "--steps", "4", "--deterministic", "--force-emulated-device",
         "--weights-out", str(weights), "--results-json", str(results), *args],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(results.read_text()), weights, proc.stdout


def load_weights(directory: Path, worker: int) -> list[np.ndarray]:
    with np.load(directory / f"worker{worker}.npz") as arrays:
        return [arrays[key] for key in sorted(arrays.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def uncapped(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    results, weights, _ = launch_workers(tmp_path_factory.mktemp("uncapped"), "uncapped",
                                         "--no-lms", "--device-memory-mb", "1024")
    return results, weights


def test_multi_worker_strategy_trains_with_lms_on_capped_workers_and_same_weights(
        uncapped, tmp_path):
    results, weights, stdout = launch_workers(tmp_path, "capped",
                                              "--device-memory-mb", str(CAP_MIB))
    assert "weights: the same on every worker" in stdout
    base_results, base_weights = uncapped
    for worker in (0, 1):
        stats = results[worker]["result"]["statistics"]
        assert stats["bytes_limit"] == CAP_MIB << 20
        assert stats["peak_bytes_in_use"] > stats["bytes_limit"]  # it needed more
        assert stats["bytes_reclaimed"] > 0, f"worker {worker} evicted nothing"
        assert base_results[worker]["result"]["statistics"]["bytes_reclaimed"] == 0
        assert results[worker]["result"]["losses"] == base_results[worker]["result"]["losses"]
        capped, reference = load_weights(weights, worker), load_weights(base_weights, worker)
        assert len(capped) == len(reference) > 0
        for a, b in zip(capped, reference):
            np.testing.assert_array_equal(a, b)


def test_multi_worker_collectives_make_no_unpinned_touch_in_strict_mode(uncapped, tmp_path):
    results, weights, stdout = launch_workers(tmp_path, "strict", "--strict",
                                              "--device-memory-mb", str(CAP_MIB))
    for worker in (0, 1):
        result = results[worker]["result"]
        assert result["statistics"]["bytes_reclaimed"] > 0
        assert result["touches"] == [], f"worker {worker}: {result['touches']}"
        assert f"[worker {worker}] strict mode: 0 unpinned touches" in stdout
        for a, b in zip(load_weights(weights, worker), load_weights(uncapped[1], worker)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("strict", ["0", "1"])
def test_an_asynchronous_collective_keeps_its_tensors_pinned_until_done(strict):
    # NcclAllReduce on a GPU is the same kind of kernel (AsyncOpKernel): NCCL
    # runs on its own stream, never fenced, and calls done only once its
    # kernel finished there, so what the kernel pinned must stay pinned
    # until then, whatever the pressure meanwhile.
    run = run_program("collectives.py", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "48",
                                             "TF_LMS_ENABLED": "1", "TF_LMS_STRICT": strict})
    assert run.result, describe(run)
    r = run.result
    assert r["active_before"] == 0 and r["a_still_waiting"]
    # A's input and output (8 MiB each) stay pinned while A waits for B...
    assert r["active_while_waiting"] == r["active_under_pressure"] == 16 << 20
    assert r["evictions_while_waiting"] > 0  # ...through evictions of the rest
    assert r["pressure_sum"] == sum(range(12))
    assert r["a_right"] and r["b_right"]  # every element of both results
    assert r["active_after"] == 0 and r["unpinned_touches"] == 0


def test_a_request_on_tensorflows_event_threads_never_waits_for_other_kernels():
    # On a GPU, Where and the segment reductions allocate their outputs in
    # callbacks on the device's two event threads ("tf_Device_Event"); a
    # wait there would hold up every later callback of the device. Any other
    # thread's request waits for the running kernel (a collective waiting for
    # its peer) to release memory, as TensorFlow's own allocator retries: on
    # main this one did too, until the 10 s budget ran out.
    run = run_program("event_threads.py", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "48",
                                               "TF_GPU_HOST_MEM_LIMIT_IN_MB": "8",
                                               "TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    event = run.result["tf_Device_Event"]
    assert event["seconds"] < 1.0 and run.result["kernel_still_running"]
    # It fits neither device nor host memory: the emulated device serves it
    # from ordinary host memory (a GPU would refuse it).
    assert event["code"] == "OK" and event["served"]
