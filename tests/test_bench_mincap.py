"""benchmarks/mincap.py's verdict on a probe that trained.

A probe fits only if no kernel's request went to host memory; its later steps
fit if none went there after the first step (which traces the tf.function).
Checked on results of known counts, without TensorFlow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import mincap  # noqa: E402

pytestmark = pytest.mark.quick


def result(overflows: int, in_first_step: int) -> dict:
    return {"step_seconds": [2.8, 0.7, 0.6], "overflows_in_first_step": in_first_step,
            "statistics": {"num_overflow_placements": overflows}}


def test_a_probe_with_no_request_in_host_memory_fits_in_every_step() -> None:
    probe = mincap.judge(16, result(0, 0))
    assert probe.fits and probe.later_steps_fit
    assert probe.step_time == pytest.approx(0.65)


def test_requests_in_host_memory_in_the_first_step_only_fail_the_probe_but_not_its_later_steps(
) -> None:
    probe = mincap.judge(14, result(2, 2))
    assert not probe.fits
    assert probe.later_steps_fit
    assert "2 kernel requests placed in host memory" in probe.reason
    assert "all in the first step, none after it" in probe.reason


def test_a_request_in_host_memory_after_the_first_step_fails_the_later_steps_too() -> None:
    probe = mincap.judge(12, result(5, 2))
    assert not probe.fits
    assert not probe.later_steps_fit
    assert "3 after the first step" in probe.reason
