#!/usr/bin/env python3
"""Replays an LMS access trace at any device size: will it fit, and what will it move?

Record a trace of a few training steps first:

    with tensorflow_lms_allocator.record_trace("steps.lmstrace"):
        model.fit(x, y, epochs=1, steps_per_epoch=3)

then replay it (tensorflow_lms_allocator/replay.py says what each policy and
the lower bound mean):

    python stats_tools/lms_replay.py steps.lmstrace --device-mb 256 --steps 3
    python stats_tools/lms_replay.py steps.lmstrace --device-mb 256 --steps 3 --policy belady
    # projected step time on a GPU (a model): 25 GB/s link, 120 ms of compute per step
    python stats_tools/lms_replay.py steps.lmstrace --device-mb 256 --steps 3 \\
        --link-gbps 25 --gpu-step-ms 120
    # the smallest device whose projected overhead stays within 10%
    python stats_tools/lms_replay.py steps.lmstrace --steps 3 --link-gbps 25 \\
        --gpu-step-ms 120 --find-min-device --max-overhead-pct 10

Steps: the calls after the trace's starting snapshot are split into --steps
runs of equal length (training repeats one sequence per step), so pass the
number of steps recorded. The last line is ``NAME VALUE``:
``bytes_swapped_per_step`` (swapped out plus paged in, per step) or, with
--find-min-device, ``min_device_mb``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensorflow_lms_allocator import replay, trace  # noqa: E402

MIB = 1 << 20


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a file written by tensorflow_lms_allocator.record_trace")
    p.add_argument("--device-mb", type=float, help="device memory to replay at (MiB)")
    p.add_argument("--policy", default="lru", choices=replay.POLICIES)
    p.add_argument("--steps", type=int, default=1, help="training steps in the trace")
    p.add_argument("--link-gbps", type=float,
                   help="host<->device bandwidth in GB/s (gigabytes; PCIe 4.0 x16: about 25)")
    p.add_argument("--gpu-step-ms", type=float, help="compute time of one step on the GPU")
    p.add_argument("--find-min-device", action="store_true",
                   help="search the smallest device within --max-overhead-pct")
    p.add_argument("--max-overhead-pct", type=float, default=10.0)
    args = p.parse_args(argv)
    projecting = args.link_gbps is not None or args.gpu_step_ms is not None
    if projecting and (args.link_gbps is None or args.gpu_step_ms is None):
        p.error("--link-gbps and --gpu-step-ms go together (the projection needs both)")
    if args.find_min_device and not (args.link_gbps and args.gpu_step_ms):
        p.error("--find-min-device needs --link-gbps and --gpu-step-ms")
    if not args.find_min_device and args.device_mb is None:
        p.error("--device-mb is required (or --find-min-device)")
    return args


def mib(n: float) -> str:
    return f"{n / MIB:,.1f}"


def print_table(result: replay.Result) -> None:
    print(f"policy {result.policy}, device {mib(result.device_bytes)} MiB: "
          + ("fits" if result.fits else f"DOES NOT FIT ({result.failure})"))
    projected = any(s.projected_ms is not None for s in result.steps)
    print(f"{'step':>4} {'swapped out MiB':>16} {'(born evicted)':>15} {'paged in MiB':>13} "
          f"{'reclaims':>9} {'peak live MiB':>14}" + (f" {'model ms':>9}" if projected else ""))
    for k, s in enumerate(result.steps):
        print(f"{k:>4} {mib(s.swapped_out):>16} {mib(s.born_evicted):>15} {mib(s.paged_in):>13} "
              f"{s.reclaims:>9} {mib(s.peak_live):>14}"
              + (f" {s.projected_ms:>9.1f}" if projected else ""))
    print(f"lower bound: at least {mib(result.lower_bound)} MiB must leave the device "
          "(the largest excess of live bytes over it)")


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        events = replay.normalize(trace.load(args.trace))
    except (OSError, trace.TraceFormatError) as error:
        print(f"lms_replay: {args.trace}: {error}", file=sys.stderr)
        return 2
    print(f"{args.trace}: {len(events.events):,} events, {len(events.sizes):,} allocations, "
          f"{args.steps} step(s)")
    try:
        if args.find_min_device:
            print(f"searching the smallest device within {args.max_overhead_pct:g}% of "
                  f"{args.gpu_step_ms:g} ms per step ({args.policy}, {args.link_gbps:g} GB/s; "
                  "projections are a model):", flush=True)
            size, result = replay.find_min_device(
                events, args.policy, args.steps, args.link_gbps, args.gpu_step_ms,
                args.max_overhead_pct, progress=lambda line: print(line, flush=True))
            print_table(result)
            print(f"min_device_mb {size // MIB}")
            return 0
        result = replay.run(events, int(args.device_mb * MIB), args.policy, args.steps)
        if args.link_gbps is not None and result.fits:
            replay.project(events, result, args.steps, args.link_gbps, args.gpu_step_ms)
            print("(model ms: projected step time on a GPU with one copy stream, not measured)")
    except replay.ReplayError as error:
        print(f"lms_replay: {error}", file=sys.stderr)
        return 2
    print_table(result)
    per_step = (result.swapped_out + result.paged_in) / max(len(result.steps), 1)
    print(f"bytes_swapped_per_step {per_step:.0f}")
    return 0 if result.fits else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
