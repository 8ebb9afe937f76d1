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
    # a trace recorded with TF_LMS_GRANULE_MB=8, replayed as it ran
    python stats_tools/lms_replay.py steps.lmstrace --device-mb 256 --steps 3 --granule-mb 8

Steps: the calls after the trace's starting snapshot are split into --steps
runs of equal length (training repeats one sequence per step), so pass the
number of steps recorded; more steps than the trace has calls is refused.
--device-mb is whole granules (--granule-mb, TF_LMS_GRANULE_MB's values: a trace
holds requested sizes, so any granule replays it; the default 2 MiB is LMS's) of
any size whose bookkeeping fits in this machine's memory (the replay runs a real
engine of that size, whose tables take about 26 MiB per TiB of device at 2 MiB
granules; the device's memory itself is never touched).
Bad options exit 2 with the option, its value and the accepted range on stderr. The last line is ``NAME VALUE``:
``bytes_swapped_per_step`` (swapped out plus paged in, per step) or, with
--find-min-device, ``min_device_mb``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensorflow_lms_allocator import replay, trace  # noqa: E402

MIB = 1 << 20


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a file written by tensorflow_lms_allocator.record_trace")
    p.add_argument("--device-mb", type=float,
                   help="device memory to replay at (MiB): whole granules, larger than "
                        "this machine if need be")
    p.add_argument("--granule-mb", type=int, default=2,
                   help="the engine's granule (MiB), as TF_LMS_GRANULE_MB: a power of two "
                        "from 2 to 1024 (default 2)")
    p.add_argument("--policy", default="lru", choices=replay.POLICIES)
    p.add_argument("--steps", type=int, default=1,
                   help="training steps in the trace: at least 1, at most the trace's "
                        "calls after its starting snapshot (each step needs one)")
    p.add_argument("--link-gbps", type=float,
                   help="host<->device bandwidth in GB/s (gigabytes; PCIe 4.0 x16: about "
                        "25), a positive finite number")
    p.add_argument("--gpu-step-ms", type=float,
                   help="compute time of one step on the GPU (ms), a positive finite number")
    p.add_argument("--find-min-device", action="store_true",
                   help="search the smallest device within --max-overhead-pct")
    p.add_argument("--max-overhead-pct", type=float, default=10.0,
                   help="a finite number, at least 0 (default 10)")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parses `argv`; exits 2 (argparse's usage error) naming a bad option and its value.

    Example:
        >>> parse(make_parser(), ["t.lmstrace", "--device-mb", "nan"])  # doctest: +SKIP
        lms_replay.py: error: --device-mb nan: must be a finite number of MiB, ...
    """
    args = p.parse_args(argv)
    check_numbers(p, args)
    projecting = args.link_gbps is not None or args.gpu_step_ms is not None
    if projecting and (args.link_gbps is None or args.gpu_step_ms is None):
        p.error("--link-gbps and --gpu-step-ms go together (the projection needs both)")
    if args.find_min_device and not (args.link_gbps and args.gpu_step_ms):
        p.error("--find-min-device needs --link-gbps and --gpu-step-ms")
    if not args.find_min_device and args.device_mb is None:
        p.error("--device-mb is required (or --find-min-device)")
    return args


def check_numbers(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exits 2 for a number out of its option's range (NaN and infinity included).

    Whole granules and a step count the trace can hold are checked once the
    trace is read (replay.run and replay.check_steps).
    """
    g = args.granule_mb
    if not (2 <= g <= 1024 and g & (g - 1) == 0):
        p.error(f"--granule-mb {g}: must be a power of two from 2 to 1024 (MiB), as "
                "TF_LMS_GRANULE_MB")
    if args.device_mb is not None:
        if not (math.isfinite(args.device_mb) and args.device_mb >= g):
            p.error(f"--device-mb {args.device_mb:g}: must be a finite number of MiB, at "
                    f"least {g} (one {g} MiB granule)")
    if args.steps < 1:
        p.error(f"--steps {args.steps}: at least 1")
    for option, value in (("--link-gbps", args.link_gbps), ("--gpu-step-ms", args.gpu_step_ms)):
        if value is not None and not (math.isfinite(value) and value > 0):
            p.error(f"{option} {value:g}: must be a positive finite number")
    if not (math.isfinite(args.max_overhead_pct) and args.max_overhead_pct >= 0):
        p.error(f"--max-overhead-pct {args.max_overhead_pct:g}: must be a finite number, "
                "at least 0 (percent)")


def mib(n: float) -> str:
    return f"{n / MIB:,.1f}"


def print_table(result: replay.Result) -> None:
    print(f"policy {result.policy}, device {mib(result.device_bytes)} MiB: "
          + ("fits" if result.fits else f"DOES NOT FIT ({result.failure})"))
    projected = any(s.projected_ms is not None for s in result.steps)
    print(f"{'step':>4} {'swapped out MiB':>16} {'(born evicted)':>15} {'paged in MiB':>13} "
          f"{'copied MiB':>11} {'reclaims':>9} {'peak live MiB':>14}"
          + (f" {'model ms':>9}" if projected else ""))
    for k, s in enumerate(result.steps):
        print(f"{k:>4} {mib(s.swapped_out):>16} {mib(s.born_evicted):>15} {mib(s.paged_in):>13} "
              f"{mib(s.copied):>11} {s.reclaims:>9} {mib(s.peak_live):>14}"
              + (f" {s.projected_ms:>9.1f}" if projected else ""))
    print(f"lower bound: at least {mib(result.lower_bound)} MiB must leave the device "
          "(the largest excess of live bytes over it)")


def main(argv: list[str]) -> int:
    p = make_parser()
    args = parse(p, argv)
    try:
        events = replay.normalize(trace.load(args.trace))
    except (OSError, trace.TraceFormatError) as error:
        print(f"lms_replay: {args.trace}: {error}", file=sys.stderr)
        return 2
    try:
        replay.check_steps(events, args.steps)
    except replay.ReplayError as error:
        p.error(str(error))
    granule = args.granule_mb * MIB
    print(f"{args.trace}: {len(events.events):,} events, {len(events.sizes):,} allocations, "
          f"{args.steps} step(s), {args.granule_mb} MiB granules")
    try:
        if args.find_min_device:
            floor, op = replay.pinned_floor(events, granule)
            print(f"the floor: {floor / MIB:.1f} MiB pinned at once, the last of it by {op} "
                  "(no smaller device runs this from device memory)")
            print(f"searching the smallest device within {args.max_overhead_pct:g}% of "
                  f"{args.gpu_step_ms:g} ms per step ({args.policy}, {args.link_gbps:g} GB/s; "
                  "projections are a model):", flush=True)
            size, result = replay.find_min_device(
                events, args.policy, args.steps, args.link_gbps, args.gpu_step_ms,
                args.max_overhead_pct, granule, progress=lambda line: print(line, flush=True))
            print_table(result)
            print(f"min_device_mb {size // MIB}")
            return 0
        result = replay.run(events, int(args.device_mb * MIB), args.policy, args.steps, granule)
        if args.link_gbps is not None and result.fits:
            replay.project(events, result, args.steps, args.link_gbps, args.gpu_step_ms)
            print("(model ms: projected step time on a GPU with one copy stream, not measured)")
    except replay.ReplayError as error:
        print(f"lms_replay: {error}", file=sys.stderr)
        return 2
    except MemoryError as error:
        p.error(f"--device-mb {args.device_mb:g}: too large to replay on this machine: the "
                f"engine's tables for a device that size do not fit in its memory ({error})")
    print_table(result)
    per_step = (result.swapped_out + result.paged_in) / max(len(result.steps), 1)
    print(f"bytes_swapped_per_step {per_step:.0f}")
    return 0 if result.fits else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
