#!/usr/bin/env python3
"""Small-object size classes, side by side: `make bench-small-pages`.

Tensors under a granule share 2 MiB small-object pages; tensors under 4 KiB
(scalars, shapes, loop counters) share pages only with each other (Note [Size
classes] in cc/engine/small_pages.h). This benchmark measures what that
changes:

1. Records an access trace of `--steps` training steps (after one that traces
   the step function) of each model on a roomy emulated device (models from
   benchmarks/mincap.py: `rnn` is the Embedding+LSTM+GRU model whose many small
   tensors motivated the classes; `transformer` has few).
2. Replays each trace with the real engine (LRU) at several fractions of its
   peak, once with the size classes (the engine's default) and once with one
   class for all small objects (`tiny_object_threshold=0`), and prints the
   bytes swapped (out plus in) per step of each and their ratio.

The last line is `one_class_over_size_classes R`: the geometric mean, over
the cases where both fit, of one class's swap bytes over the size classes'
(above 1: the classes swap less); the line before it names the worst case.

Example:
    make bench-small-pages
    .venv/bin/python benchmarks/small_pages.py --models rnn --steps 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import policy  # noqa: E402  (its --child records a trace)

MIB = 1 << 20
GRANULE = 2 * MIB
FRACTIONS = (0.25, 0.3, 0.45, 0.6)


def swap_per_step(result) -> float:
    return statistics.mean(s.copied for s in result.steps)


def compare(name: str, path: Path, steps: int) -> list[tuple]:
    """Rows (model, MiB, fits with classes, fits with one, swap with classes, swap with one)."""
    from tensorflow_lms_allocator import replay, trace

    events = replay.normalize(trace.load(path))
    peak = replay.lower_bound(events, 0, GRANULE)
    rows = []
    for fraction in FRACTIONS:
        device = max(int(peak * fraction) // GRANULE, 1) * GRANULE
        classes = replay.run(events, device, "lru", steps)
        one = replay.run(events, device, "lru", steps, tiny_object_threshold=0)
        rows.append((name, device // MIB, classes.fits, one.fits,
                     swap_per_step(classes), swap_per_step(one)))
        print(f"  replayed {name} at {device // MIB} MiB ({fraction:.2f} of its peak)", flush=True)
    return rows


def describe(fits: bool, swap: float) -> str:
    return f"{swap / MIB:,.0f} MiB" if fits else "does not fit"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["rnn", "transformer"],
                        choices=["rnn", "transformer", "resnet50", "densenet121"])
    parser.add_argument("--steps", type=int, default=3, help="steps recorded (default 3)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds allowed to record one model's trace")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: record at least 1 step")
    rows = []
    with tempfile.TemporaryDirectory(prefix="small-pages-") as tmp:
        for name in args.models:
            path = Path(tmp) / f"{name}.lmstrace"
            policy.run_child(["record", name, str(path), str(args.steps)],
                             policy.subprocess_env(policy.ROOMY_MB, True, "lru"),
                             f"recording {name}", args.timeout)
            rows += compare(name, path, args.steps)
    print()
    print(f"  {'model':<12} {'device':>8} {'size classes':>14} {'one class':>14} {'ratio':>7}")
    ratios, both = [], []
    for name, mb, fits_classes, fits_one, swap_classes, swap_one in rows:
        ratio = ""
        if fits_classes and fits_one and swap_classes > 0:
            ratios.append(swap_one / swap_classes)
            both.append((name, mb))
            ratio = f"{ratios[-1]:.2f}"
        print(f"  {name:<12} {mb:>5} MiB {describe(fits_classes, swap_classes):>14} "
              f"{describe(fits_one, swap_one):>14} {ratio:>7}")
    print("  (swap bytes per step, out plus in; ratio: one class / size classes)")
    if not ratios:
        print("no case fits both ways", file=sys.stderr)
        return 1
    worst = min(range(len(ratios)), key=ratios.__getitem__)
    print(f"worst case: {ratios[worst]:.2f} ({both[worst][0]} at {both[worst][1]} MiB)")
    print(f"one_class_over_size_classes {statistics.geometric_mean(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
