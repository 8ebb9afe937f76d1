"""Access traces (tensorflow_lms_allocator.trace, Note [Access trace format]).

On the engine: a known sequence gives exactly its events, in order, with the
evictions and page-ins the statistics count; the size cap stops recording
with a warning that says what to do; broken files and misuse give clear
errors. In TensorFlow: `record_trace` around one Keras training step on the
emulated device records the step's allocations, pins and unpins with their
ops' names (a kernel's inputs pinned under its own), and as many evictions and page-ins as the statistics count.
"""

from __future__ import annotations

import math
import re
import threading
from pathlib import Path

import pytest

from tensorflow_lms_allocator import trace
from tensorflow_lms_allocator.engine import Engine
from tf_helpers import describe, run_program

pytestmark = pytest.mark.quick

MIB = 1 << 20


def small_engine() -> Engine:
    return Engine(device_bytes=8 * MIB, host_bytes=64 * MIB, granule_bytes=MIB, policy="lru")


def test_a_known_sequence_is_recorded_event_by_event(tmp_path: Path) -> None:
    engine = small_engine()
    path = tmp_path / "run.lmstrace"
    with trace.record_engine(engine, path):
        a = engine.allocate(6 * MIB)
        b = engine.allocate(6 * MIB)  # evicts a
        unit = engine.pin(a)          # pages a in, evicts b
        engine.unpin(a, unit)
        engine.free(b)
        engine.free(a)
        c = engine.allocate(MIB, pin=True)
    t = trace.load(path)
    got = [(e.name, e.address, e.bytes, e.unit_id) for e in t.events()]
    assert got == [
        ("allocate", a, 6 * MIB, 1), ("evict", a, 6 * MIB, 0), ("allocate", b, 6 * MIB, 2),
        ("pin", a, 0, 1), ("evict", b, 6 * MIB, 0), ("page_in", a, 6 * MIB, 0),
        ("unpin", a, 0, 1), ("free", b, 0, 0), ("free", a, 0, 0), ("allocate", c, MIB, 3),
    ]
    events = list(t.events())
    assert [e.born_pinned for e in events] == [False] * 9 + [True]
    assert {e.thread for e in events} == {threading.get_native_id()}
    assert {e.op for e in events} == {"-"}
    assert all(x.time_ns <= y.time_ns for x, y in zip(events, events[1:]))
    stats = engine.stats()
    assert t.counts()["evict"] == stats["num_evictions"] == 2
    assert t.counts()["page_in"] == stats["num_page_ins"] == 1
    assert t.dropped == 0


def test_a_trace_starts_with_what_is_live_and_records_only_the_block(tmp_path: Path) -> None:
    engine = small_engine()
    before = engine.allocate(MIB)
    pinned = engine.allocate(3 * MIB)
    small = engine.allocate(1000)  # a small object, in a page
    unit = engine.pin(pinned)
    engine.pin(pinned)
    with trace.record_engine(engine, tmp_path / "t"):
        inside = engine.allocate(MIB)
    engine.free(before)
    events = [(e.name, e.address, e.bytes, e.live_at_start)
              for e in trace.load(tmp_path / "t").events()]
    # The snapshot in address order, each unit's pins after it; then the calls.
    snapshot = sorted([("allocate", before, MIB, True), ("allocate", pinned, 3 * MIB, True),
                       ("allocate", small, 1000, True)], key=lambda e: e[1])
    at = [e[1] for e in snapshot].index(pinned) + 1
    snapshot[at:at] = [("pin", pinned, 0, True)] * 2
    assert events == snapshot + [("allocate", inside, MIB, False)]
    assert trace.load(tmp_path / "t").records["unit_id"][at] == unit


def test_the_size_cap_stops_recording_and_warns_what_to_do(tmp_path: Path) -> None:
    engine = small_engine()
    cap = 16 + 40 * 5  # the header and five events
    with pytest.warns(RuntimeWarning, match=r"reached its cap .* after 5 events; 15 later "
                                            r"events were not recorded.*raise max_mb"):
        with trace.record_engine(engine, tmp_path / "t", max_mb=cap / MIB):
            for _ in range(10):
                engine.free(engine.allocate(MIB))
    t = trace.load(tmp_path / "t")
    assert len(t.records) == 5 and t.dropped == 15 and t.max_bytes == cap


def test_misuse_and_broken_files_give_clear_errors(tmp_path: Path) -> None:
    engine = small_engine()
    with pytest.raises(Exception, match="no trace is being recorded"):
        engine.stop_trace()
    engine.start_trace(str(tmp_path / "t"), MIB)
    with pytest.raises(Exception, match="a trace is already being recorded"):
        engine.start_trace(str(tmp_path / "u"), MIB)
    engine.free(engine.allocate(MIB))
    engine.stop_trace()
    with pytest.raises(Exception, match="cannot create the trace file .*/missing/t"):
        engine.start_trace(str(tmp_path / "missing" / "t"), MIB)
    with pytest.raises(Exception, match="cannot hold one event"):
        engine.start_trace(str(tmp_path / "v"), 20)
    data = (tmp_path / "t").read_bytes()
    (tmp_path / "cut").write_bytes(data[:-4])
    with pytest.raises(trace.TraceFormatError, match="was not finished"):
        trace.load(tmp_path / "cut")
    (tmp_path / "text").write_text("not a trace at all, just some text here")
    with pytest.raises(trace.TraceFormatError, match="not an LMS access trace"):
        trace.load(tmp_path / "text")


@pytest.mark.parametrize("max_mb", [-1, 0, -0.5, math.nan, math.inf, "10", None])
def test_a_size_cap_that_is_not_a_positive_finite_number_is_refused(
        tmp_path: Path, max_mb: object) -> None:
    import tensorflow_lms_allocator

    message = re.escape(f"max_mb={max_mb!r}") + r".*positive finite number of MiB"
    # Refused before anything is recorded (TensorFlow's devices are not touched).
    with pytest.raises(ValueError, match=message):
        with tensorflow_lms_allocator.record_trace(tmp_path / "t", max_mb=max_mb):
            pass
    with pytest.raises(ValueError, match=message):
        with trace.record_engine(small_engine(), tmp_path / "u", max_mb=max_mb):
            pass
    assert not (tmp_path / "t").exists() and not (tmp_path / "u").exists()


def test_record_trace_in_tensorflow_records_a_training_step_with_op_names(
        tmp_path: Path) -> None:
    run = run_program("trace_fit.py", str(tmp_path / "step.lmstrace"),
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "96", "TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    r = run.result
    before, after = r["before"], r["after"]
    counts = r["call_counts"]  # without the snapshot of what was live (the weights)
    assert r["snapshot"] > 0 and r["snapshot_leads"]
    assert counts["allocate"] == after["num_allocs"] - before["num_allocs"] > 0
    assert counts["evict"] == after["num_evictions"] - before["num_evictions"] > 0
    assert counts["page_in"] == after["num_page_ins"] - before["num_page_ins"] > 0
    assert counts["pin"] > 0 and counts["unpin"] >= counts["pin"]
    # Kernels' pins and allocations carry their ops' names.
    assert any(op.startswith("gradient_tape/") or "Conv2D" in op for op in r["ops"]), r["ops"]
    # A kernel's inputs are pinned under its op, as they are unpinned at its
    # end (replay.kernel_floor counts them in its set). The trace pairs a pin
    # with an unpin by allocation, so two kernels running at once that pin
    # one tensor (a gradient read by Conv2DBackpropInput and ...Filter) may
    # cross: a few, never most.
    same, other = r["pins_ended_under_their_op"], r["pins_ended_under_another_op"]
    assert same > 100 and other * 10 < same, (same, other)
    assert r["monotonic_per_thread"] and r["dropped"] == 0 and r["warnings"] == []


def test_record_trace_in_tensorflow_warns_at_its_cap(tmp_path: Path) -> None:
    run = run_program("trace_fit.py", str(tmp_path / "step.lmstrace"), "0.001",
                      env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "96", "TF_LMS_ENABLED": "1"})
    assert run.result, describe(run)
    assert run.result["dropped"] > 0
    assert len(run.result["warnings"]) == 1
    assert "reached its cap of 0.0 MiB" in run.result["warnings"][0]
