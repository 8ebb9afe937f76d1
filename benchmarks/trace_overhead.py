#!/usr/bin/env python3
"""What observing LMS costs a training step: `make bench-trace`, `make bench-profiler`.

Trains Keras ResNet-50 (weights=None, 10 classes, 96x96 synthetic images)
on the emulated device with LMS under a cap that makes it evict every step,
and times steps with and without the observer, interleaved in rounds in one
process (this machine is noisy: the comparison is side by side, never
against a stored figure):
  - `--observe trace` (the default): `tensorflow_lms_allocator.record_trace`;
    the table has trace bytes and events per step, the last line
    `trace_overhead_ratio R` (median recorded / median plain);
  - `--observe profiler`: TensorFlow's profiler
    (tf.profiler.experimental.start before a round's observed steps, stop
    after them, not timed), which records LMS's memory events and spans
    (docs/observing.md, "In TensorBoard's Profile tab"); the table has the
    capture's bytes per step, the last line `profiler_overhead_ratio R`.

Usage:
    python benchmarks/trace_overhead.py [--observe trace|profiler] [--cap-mb 160]
        [--batch 16] [--rounds 4] [--steps 3]

Example:
    $ .venv/bin/python benchmarks/trace_overhead.py --rounds 2
    ...
    trace_overhead_ratio 1.01
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--observe", choices=("trace", "profiler"), default="trace",
                   help="what the observed steps run under (see above)")
    p.add_argument("--cap-mb", type=int, default=160,
                   help="emulated device memory (MiB, even); ResNet-50 at batch 16 needs ~381")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=4, help="rounds of (plain, observed)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per side and round")
    args = p.parse_args(argv)
    for name in ("cap_mb", "batch", "rounds", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    if args.cap_mb % 2:
        p.error(f"--cap-mb {args.cap_mb}: must be even (whole 2 MiB granules)")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    os.environ["TF_LMS_CPU_DEVICE_MEMORY_MB"] = str(args.cap_mb)
    os.environ["TF_LMS_ENABLED"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow_lms_allocator as lms  # before tensorflow
    import numpy as np
    import tensorflow as tf
    from tensorflow_lms_allocator import trace

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(96, 96, 3), classes=10)
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 96, 96, 3), dtype=np.float32)
    y = rng.integers(0, 10, args.batch).astype(np.int32)
    print(f"ResNet-50 96x96 batch {args.batch} on a {args.cap_mb} MiB emulated device, LMS on; "
          f"{args.rounds} rounds of {args.steps} plain and {args.steps} steps under "
          f"{'an access trace' if args.observe == 'trace' else 'the profiler'}", flush=True)
    model.train_on_batch(x, y)  # traces the step function
    model.train_on_batch(x, y)

    def timed(n: int) -> list[float]:
        out = []
        for _ in range(n):
            start = time.perf_counter()
            model.train_on_batch(x, y)
            out.append(time.perf_counter() - start)
        return out

    def observed(directory: Path) -> tuple[list[float], str]:
        """The observed steps, and what they recorded a step."""
        if args.observe == "trace":
            path = directory / "steps.lmstrace"
            with lms.record_trace(path):
                q = timed(args.steps)
            t = trace.load(path)
            calls = int((~((t.records["flags"] & trace.LIVE_AT_START) != 0)).sum())
            return q, (f"{path.stat().st_size / args.steps / 1024:>15.0f} "
                       f"{calls // args.steps:>12}")
        tf.profiler.experimental.start(str(directory))
        try:
            q = timed(args.steps)
        finally:
            tf.profiler.experimental.stop()
        size = sum(f.stat().st_size for f in directory.rglob("*.xplane.pb"))
        return q, f"{size / args.steps / 1024:>16.0f}"

    plain: list[float] = []
    recorded: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'round':>5} {'plain s/step':>13} {'observed s/step':>16} "
              + (f"{'trace KiB/step':>15} {'events/step':>12}" if args.observe == "trace"
                 else f"{'capture KiB/step':>16}"))
        for r in range(args.rounds):
            p = timed(args.steps)
            directory = Path(tmp) / f"round{r}"
            directory.mkdir()
            q, recorded_per_step = observed(directory)
            plain += p
            recorded += q
            print(f"{r:>5} {statistics.median(p):>13.3f} {statistics.median(q):>16.3f} "
                  f"{recorded_per_step}", flush=True)
    reclaimed = lms.get_statistics(0)["bytes_reclaimed"]
    ratio = statistics.median(recorded) / statistics.median(plain)
    print(f"median step: plain {statistics.median(plain):.3f} s, observed "
          f"{statistics.median(recorded):.3f} s; {reclaimed / (1 << 20):,.0f} MiB reclaimed in "
          f"all (the cap makes it evict)")
    print(f"{args.observe}_overhead_ratio {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
