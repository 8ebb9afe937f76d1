"""Trains a small convolutional model on the emulated device with LMS: one
step to trace the step function, then STEPS steps (default 1) recorded with
tensorflow_lms_allocator.record_trace, and prints ``RESULT <json>``: the
trace's counts and op names, how many pins ended under the op that took
them (a kernel pins its inputs and unpins them at its end), and the LMS statistics before and after the
recorded steps.

Usage: python trace_fit.py TRACE_PATH [MAX_MB [STEPS]]
"""

from __future__ import annotations

import json
import sys
import warnings

import tensorflow_lms_allocator as lms  # before tensorflow
import numpy as np
import tensorflow as tf

from models import small_cnn

from tensorflow_lms_allocator import replay, trace


def main() -> None:
    path = sys.argv[1]
    max_mb = float(sys.argv[2]) if len(sys.argv) > 2 else trace.DEFAULT_MAX_MB
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    tf.keras.utils.set_random_seed(1)
    model = small_cnn(conv_layers=8)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((32, 64, 64, 3), dtype=np.float32)
    labels = rng.integers(0, 10, 32).astype(np.int32)
    model.train_on_batch(images, labels)  # traces the step function
    before = lms.get_statistics(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with lms.record_trace(path, max_mb=max_mb):
            for _ in range(steps):
                model.train_on_batch(images, labels)
    after = lms.get_statistics(0)
    t = trace.load(path)
    ops = sorted({t.ops[int(i)] for i in np.unique(t.records["op"])})
    threads = len(np.unique(t.records["thread"]))
    live = (t.records["flags"] & trace.LIVE_AT_START) != 0
    calls = t.records[~live]
    # Each pin against the unpin that ends it: a kernel pins its inputs and
    # unpins them when it ends, both under its op.
    pin_ops: dict[int, int] = {}
    same_op = other_op = 0
    for e in replay.normalize(t).events:
        if e.kind == replay.PIN and e.pin >= 0 and not e.live_at_start:
            pin_ops[e.pin] = e.op
        elif e.kind == replay.UNPIN and e.pin in pin_ops:
            if pin_ops.pop(e.pin) == e.op:
                same_op += 1
            else:
                other_op += 1
    print("RESULT " + json.dumps({
        "counts": t.counts(), "snapshot": int(live.sum()),
        "snapshot_leads": bool(np.all(live[:int(live.sum())])),
        "call_counts": {trace.EVENT_NAMES[int(v)]: int(c) for v, c in
                        zip(*np.unique(calls["event"], return_counts=True))}, "ops": ops, "threads": threads, "dropped": t.dropped,
        "pins_ended_under_their_op": same_op, "pins_ended_under_another_op": other_op,
        "monotonic_per_thread": all(
            bool(np.all(np.diff(t.records["time_ns"][t.records["thread"] == th]) >= 0))
            for th in np.unique(t.records["thread"])),
        "before": before, "after": after,
        "warnings": [str(w.message) for w in caught]}), flush=True)


if __name__ == "__main__":
    main()
