"""LMS in TensorFlow's profiler and memory queries (docs/observing.md, "In
TensorBoard's Profile tab"): a capture of capped steps under
tf.profiler.experimental.start/stop, read with the profile plugin's own
converters (xprof), shows LMS's device in the Memory Profile with LMS's peak,
and its evictions and page-ins as spans in the trace viewer, adding up to
LMS's own statistics."""

from __future__ import annotations

import pytest

from tf_helpers import describe, run_program

pytestmark = [pytest.mark.tensorflow]

MIB = 1 << 20
CAPPED = {"TF_LMS_CPU_DEVICE_MEMORY_MB": "64", "TF_LMS_ENABLED": "1"}


def test_a_profile_shows_lms_in_the_memory_profile_and_its_moves_in_the_trace_viewer(tmp_path):
    run = run_program("profiler.py", str(tmp_path / "logs"), env=CAPPED)
    assert run.result, describe(run)
    r = run.result
    assert r["sums_ok"] and r["xplanes"] == 1, describe(run)
    before, after = r["stats_before"], r["stats_after"]
    # Every step evicts and pages in: 96 MiB held on a 64 MiB device.
    evictions = after["num_evictions"] - before["num_evictions"]
    page_ins = after["num_page_ins"] - before["num_page_ins"]
    assert evictions > 0 and page_ins > 0, (before, after)

    # The Memory Profile tool's data: LMS's device, with LMS's peak (all
    # allocated bytes, resident or evicted: above the device's 64 MiB).
    memory = r["memory"]
    assert list(memory) == ["lms_emulated_device"], memory
    device = memory["lms_emulated_device"]
    assert device["peak"] == after["peak_bytes_in_use"] > 64 * MIB
    # Its capacity is the limit TensorFlow sees: the device and the host budget.
    assert device["capacity"] > after["bytes_limit"] + after["host_bytes_in_use"]

    # The trace viewer: each eviction batch and page-in a span, their units
    # and bytes those of LMS's statistics over the capture (one thread: no
    # eviction is abandoned); every eviction here is a reclaim's (a reclaim
    # whose planning finds nothing is a span without one).
    spans = r["spans"]
    assert spans["LMS eviction"]["units"] == evictions, spans
    assert spans["LMS eviction"]["bytes"] == after["bytes_reclaimed"] - before["bytes_reclaimed"]
    assert spans["LMS page-in"]["units"] == page_ins, spans
    assert spans["LMS reclaim"]["count"] >= spans["LMS eviction"]["count"], spans

    # tf.config.experimental.get_memory_info: LMS's bytes_in_use and peak,
    # evicted bytes included.
    assert r["memory_info"] == {"current": after["bytes_in_use"],
                                "peak": after["peak_bytes_in_use"]}
    assert after["bytes_in_use"] > after["bytes_limit"]


def test_without_lms_the_same_capture_shows_tensorflows_own_allocator(tmp_path):
    """The reference: stock TensorFlow's allocator in the same tool, and no LMS spans."""
    run = run_program("profiler.py", str(tmp_path / "logs"), "--steps", "1",
                      env={"LMS_TEST_STOCK": "1", "TF_ENABLE_ONEDNN_OPTS": "1"})
    assert run.result, describe(run)
    assert run.result["sums_ok"], describe(run)
    assert run.result["memory"] and "lms_emulated_device" not in run.result["memory"]
    assert run.result["spans"] == {}
