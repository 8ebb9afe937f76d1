"""Nothing written outside a kernel is lost: tf.data pipelines under pressure
(tests/tf_programs/tf_data.py; Note [Writers outside kernels] in engine.h).

tf.data allocates each batch on its own threads, outside any kernel, and
copies the elements into it there. Before the fix, the main thread's
allocations evicted a batch while it was being filled and lost the writes
that fell between the eviction's copy and its remap: 1-4 of 40 batches wrong
in every run (up to 705,552 values zero or another element's), seen the same
by kernels and by .numpy(), and with TF_LMS_STRICT=1 the program died with
SIGSEGV.
"""

from __future__ import annotations

import pytest

from tf_helpers import describe, run_program

pytestmark = pytest.mark.tensorflow


def device(cap_mib: int, strict: bool) -> dict[str, str]:
    return {"TF_LMS_CPU_DEVICE_MEMORY_MB": str(cap_mib), "TF_LMS_ENABLED": "1",
            "TF_LMS_STRICT": "1" if strict else "0"}


@pytest.mark.parametrize("strict", [False, True], ids=["plain", "strict"])
@pytest.mark.parametrize("cap_mib", [32, 40])
def test_every_byte_of_every_batch_survives_pressure(cap_mib, strict):
    run = run_program("tf_data.py", "pipeline", "--runs", "2", env=device(cap_mib, strict))
    assert run.returncode == 0 and run.result, describe(run)  # no SIGSEGV in strict mode
    for r in run.result["runs"]:
        assert r["batches"] == 40
        assert r["bad_batches"] == [], describe(run)
        assert r["numpy_bad_values"] == 0 and r["kernel_bad_values"] == 0
    stats = run.result["stats"]
    # Under pressure for real: batches were placed in host memory, other
    # tensors evicted and paged in.
    assert stats["num_evictions"] > 0 and stats["num_page_ins"] > 0, stats
    assert stats["num_born_evicted"] > 0, stats
    if strict:
        # Reading a batch placed in host memory without a pin is reported,
        # never a crash.
        assert run.result["unpinned_touches"] > 0


@pytest.mark.slow
def test_keras_fit_on_a_tf_data_pipeline_is_bit_identical_under_eviction():
    stock = run_program("tf_data.py", "fit", env={"LMS_TEST_STOCK": "1"})
    lms = run_program("tf_data.py", "fit", env=device(40, strict=False))
    assert stock.result and lms.result, describe(lms)
    assert lms.result["stats"]["peak_bytes_in_use"] > 3 * (40 << 20)  # well over the device
    assert lms.result["stats"]["num_evictions"] > 0
    assert lms.result["losses"] == stock.result["losses"]
    assert lms.result["weights"] == stock.result["weights"]


@pytest.mark.slow
@pytest.mark.parametrize("model, cap_mib", [("mlp", 20), ("mobilenet", 36)])
def test_batches_made_outside_kernels_cost_no_more_overflow_than_kernel_made(model, cap_mib):
    """Note [Writer pages]: tf.data's batches (made outside kernels, unclaimed
    until a kernel uses them) no longer sit in the holes of pages of
    activations, which kept those pages from being evicted. Before: 17 (the
    MLP) and 2-6 (MobileNetV3Small) kernels' requests placed in host memory,
    none with the same batches made by a kernel."""
    runs = {made: run_program("tf_data.py", "batches", model, made,
                              env=device(cap_mib, strict=False))
            for made in ("outside", "kernel")}
    for run in runs.values():
        assert run.returncode == 0 and run.result, describe(run)
    outside, kernel = runs["outside"].result, runs["kernel"].result
    assert outside["stats"]["num_evictions"] > 0  # under pressure for real
    assert (outside["stats"]["num_overflow_placements"]
            <= kernel["stats"]["num_overflow_placements"]), (outside["stats"], kernel["stats"])
    assert outside["stats"]["num_failed_pins"] <= kernel["stats"]["num_failed_pins"]
    assert outside["loss"] == kernel["loss"]  # x + 0.0 is x: the same training
