"""LMS under TensorFlow's profiler; prints ``RESULT <json>``.

Usage: python profiler.py LOGDIR [--steps N]

Six 16 MiB tensors (96 MiB) are doubled and summed, each in turn, for N steps (3) under
tf.profiler.experimental.start(LOGDIR)/stop(), on whatever device the
environment gives (LMS's emulated device of 64 MiB in the tests: every step
pages tensors in and evicts others). The capture is read with the profile
plugin's own converter (xprof: the Memory Profile tool's data and the trace
viewer's events), and the result holds:
  - "memory": per allocator of the Memory Profile, its peak
    (peakBytesUsageLifetime), capacity and the number of snapshots;
  - "spans": per "LMS ..." span name in the trace viewer, how many and the
    sums of their "bytes" and "units" arguments;
  - "stats_before"/"stats_after": LMS's statistics around the capture (absent
    without LMS), and "memory_info": tf.config.experimental.get_memory_info
    (its error's text where the device keeps no statistics).
"""

from __future__ import annotations

import argparse
import glob
import json
import os

if os.environ.get("LMS_TEST_STOCK") != "1":
    import tensorflow_lms_allocator as lms  # noqa: F401  (before tensorflow)
else:
    lms = None
import tensorflow as tf

MIB = 1 << 20


def memory_profile(paths: list[str]) -> dict:
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data(paths, "memory_profile", {})
    profile = json.loads(data)
    out = {}
    for name, allocator in profile.get("memoryProfilePerAllocator", {}).items():
        summary = allocator["profileSummary"]
        out[name] = {"peak": int(summary.get("peakBytesUsageLifetime", 0)),
                     "capacity": int(summary.get("memoryCapacity", 0)),
                     "snapshots": len(allocator.get("memoryProfileSnapshots", []))}
    return out


def spans(paths: list[str]) -> dict:
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data(paths, "trace_viewer", {})
    trace = json.loads(data)
    out: dict[str, dict[str, int]] = {}
    for event in trace.get("traceEvents", []):
        name = event.get("name", "")
        if not name.startswith("LMS ") or event.get("ph") != "X":
            continue
        entry = out.setdefault(name, {"count": 0, "bytes": 0, "units": 0})
        args = event.get("args", {})
        entry["count"] += 1
        entry["bytes"] += int(args.get("bytes", 0))
        entry["units"] += int(args.get("units", 0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    held = [tf.fill((4 * MIB,), float(i)) for i in range(6)]  # 96 MiB of floats
    sums = []
    result: dict = {}
    if lms is not None:
        result["stats_before"] = lms.get_statistics(0)
    tf.profiler.experimental.start(args.logdir)
    for step in range(args.steps):
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1):
            # t * 2 is a 16 MiB temporary: an allocation inside the capture.
            sums.append([float(tf.reduce_sum(t * 2.0)) for t in held])
    tf.profiler.experimental.stop()
    if lms is not None:
        result["stats_after"] = lms.get_statistics(0)
    try:
        result["memory_info"] = tf.config.experimental.get_memory_info("CPU:0")
    except ValueError as e:  # stock TensorFlow's CPU allocator keeps no statistics
        result["memory_info"] = str(e)
    paths = sorted(glob.glob(os.path.join(args.logdir, "plugins/profile/*/*.xplane.pb")))
    result["xplanes"] = len(paths)
    result["sums_ok"] = all(s == [2.0 * i * 4 * MIB for i in range(6)] for s in sums)
    result["memory"] = memory_profile(paths)
    result["spans"] = spans(paths)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
