"""`overhead.py --paired`: each model's capped and uncapped steps in one process.

overhead.py runs every case in a process of its own, and on this project's
2-core machines the same case's step moves by 10-30% from one process to the
next: more than LMS adds at 1/2 of the peak. Here one process per model
trains on a device of 1.25x the model's peak (measured first, uncapped, in a
process of its own) and takes the smaller devices by
tensorflow_lms_allocator.hold_device_memory, which pins the rest of the
device away: blocks of uncapped steps, steps at 1/2 and steps at 1/4 of the
peak, `--blocks` times. The first step after each change of size is dropped
(it evicts or pages in what the change asks for). Each capped phase is set
against the uncapped phase of its own block, seconds apart:

  overhead_vs_copy_floor = (capped step - uncapped step) / copy floor

per block (medians of the block's steps; the floor is the phase's bytes
moved per step over the memcpy bandwidth), and the case's figure is the
median of its blocks. Each case also prints `uncapped spread`: how far its
uncapped blocks' steps lie apart, in floors. Where that is several times the
target, one run cannot tell a case that meets the target from one that
misses it: how far this machine's steps wander between blocks, not LMS,
decides the figure (learned moves fewer bytes than LRU, so its floors are
smaller and the same wandering weighs more). LMS on against LMS off without
pressure can only be two processes (the line before the last,
`lms_on_vs_off_without_pressure R`, as overhead.py's); the last line is the
worst case, as overhead.py's: `overhead_vs_copy_floor R`.

Example:
    .venv/bin/python benchmarks/overhead.py --paired
    .venv/bin/python benchmarks/overhead.py --paired --models densenet121 --blocks 2
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from mincap import GRANULE_MB, UNCAPPED_MB, build_model, run_probe_script
from overhead import FRACTIONS, MIB, PARTS, WAITS, lms_settings, run_case, tlb_shootdowns
from training_probe import make_train_step

# The probe's plan, passed in its environment (run_probe_script's command
# line is overhead.py's): the caps in MiB, blocks and steps per phase.
PLAN = "LMS_BENCH_PAIRED_PLAN"
DEVICE_OVER_PEAK = 1.25
COUNTED = ("bytes_copied", "num_evictions", "num_page_ins", "tlb_shootdowns",
           *(f"time_{name}_ns" for name in ("evicting", "paging_in", *PARTS, *WAITS)))


def run_probe_in_this_process(model_name: str, result_path: Path) -> int:
    """Trains the plan's blocks; writes each phase's kept steps per block as JSON."""
    import tensorflow_lms_allocator as lms  # before tensorflow

    plan = json.loads(os.environ[PLAN])
    model, inputs, labels = build_model(model_name)
    train_step = make_train_step(model, inputs, labels)
    float(train_step())  # traces the function
    device = lms.get_statistics(0)["bytes_limit"]
    phases: list[tuple[str, int]] = [("uncapped", 0)] + [
        (name, device - cap_mb * MIB) for name, cap_mb in plan["caps"].items()]
    sample = lambda: {**lms.get_statistics(0), "tlb_shootdowns": tlb_shootdowns()}  # noqa: E731
    blocks: dict[str, list[list[dict[str, float]]]] = {name: [] for name, _ in phases}
    for _ in range(plan["blocks"]):
        for name, hold in phases:
            kept = []
            with lms.hold_device_memory(hold) if hold else contextlib.nullcontext():
                for step in range(plan["steps"] + 1):
                    before = sample()
                    start = time.perf_counter()
                    float(train_step())
                    seconds = time.perf_counter() - start
                    after = sample()
                    if step > 0:  # the first step after a change of size is dropped
                        kept.append({"seconds": seconds,
                                     **{k: after[k] - before[k] for k in COUNTED}})
            blocks[name].append(kept)
    result_path.write_text(json.dumps({"device_bytes": device, "blocks": blocks}))
    return 0


def median_of(block: list[dict[str, float]], key: str) -> float:
    return statistics.median(step[key] for step in block)


def report_model(model: str, peak_mb: float, device_mb: int, caps: dict[str, int],
                 blocks: dict[str, list[list[dict[str, float]]]], bandwidth: float
                 ) -> list[float]:
    """Prints a model's lines; returns each capped case's overhead over the floor."""
    uncapped = blocks["uncapped"]
    base = [median_of(b, "seconds") for b in uncapped]
    stray = sum(step["num_evictions"] for b in uncapped for step in b)
    print(f"{model}: peak {peak_mb:.0f} MiB, device {device_mb} MiB; "
          f"uncapped step {statistics.median(base):.2f} s (blocks "
          + ", ".join(f"{s:.2f}" for s in base) + f"; evictions {stray:.0f})", flush=True)
    overheads = []
    for name, cap_mb in caps.items():
        capped = blocks[name]
        steps = [median_of(b, "seconds") for b in capped]
        moved = statistics.median(step["bytes_copied"] for b in capped for step in b)
        ms = {key: statistics.median(step[f"time_{key}_ns"] for b in capped for step in b) / 1e6
              for key in ("evicting", "paging_in", *PARTS, *WAITS)}
        floor = moved / bandwidth
        if floor <= 0:
            print(f"  {name} ({cap_mb} MiB): moved no bytes")
            continue
        per_block = [(s - u) / floor for s, u in zip(steps, base)]
        overheads.append(statistics.median(per_block))
        accounted = (ms["evicting"] + ms["paging_in"]) / 1e3 / floor
        # How far the reference itself moved between blocks, in floors: a
        # figure is only as certain as this (the module docstring).
        spread = (max(base) - min(base)) / floor
        print(f"  {name:>4} {cap_mb:>5} MiB  step {statistics.median(steps):5.2f} s (blocks "
              + ", ".join(f"{s / u:.2f}x" for s, u in zip(steps, base))
              + f")  moved {moved / MIB:6.1f} MiB  floor {floor * 1e3:6.1f} ms  evicting "
              f"{ms['evicting']:6.1f} ms  paging in {ms['paging_in']:6.1f} ms (copying "
              f"{ms['copying']:.1f}, mapping {ms['mapping']:.1f}, unmapping "
              f"{ms['unmapping']:.1f}; waiting for the lock {ms['lock_waiting']:.1f}, for "
              f"moves {ms['move_waiting']:.1f}; planning {ms['planning']:.1f})  "
              f"accounted {accounted:.1f}x  uncapped spread {spread:.1f} floors  per block "
              + ", ".join(f"{o:.1f}" for o in per_block)
              + f"  overhead_vs_copy_floor {overheads[-1]:.1f}", flush=True)
    return overheads


def main(models: Sequence[str], blocks: int, steps: int, timeout: float,
         bandwidth: float, policy: str | None = None) -> int:
    """Runs every model's paired probe (`policy`: TF_LMS_POLICY, None for
    LMS's default) and prints the report."""
    worst = -math.inf
    on_vs_off = []  # uncapped step, LMS on over LMS off, each in a process of its own
    for model in models:
        uncapped, off = (run_case(model, UNCAPPED_MB, steps, timeout, mode)
                         for mode in ("lms", "lms-off"))
        for case, mode in ((uncapped, ""), (off, " with LMS off")):
            if case.failed:
                print(f"{model}: does not train uncapped{mode}: {case.failed}")
                return 1
        on_vs_off.append(uncapped.step / off.step)
        print(f"{model}: without pressure, LMS on {uncapped.step:.2f} s, off {off.step:.2f} s "
              f"a step: {on_vs_off[-1]:.3f}x (processes of their own)", flush=True)
        peak = uncapped.peak_mb
        caps = {f"1/{round(1 / f)}": max(GRANULE_MB, int(peak * f) // GRANULE_MB * GRANULE_MB)
                for f in FRACTIONS}
        device_mb = math.ceil(peak * DEVICE_OVER_PEAK / GRANULE_MB) * GRANULE_MB
        plan = {"caps": caps, "blocks": blocks, "steps": steps}
        result, failed = run_probe_script(Path(__file__), model, device_mb, 0, timeout,
                                          settings={PLAN: json.dumps(plan),
                                                    **lms_settings(policy=policy)})
        if result is None:
            print(f"{model}: the paired run failed: {failed}")
            return 1
        worst = max([worst, *report_model(model, peak, device_mb, caps, result["blocks"], bandwidth)])
    if worst == -math.inf:
        print("no case moved bytes: no overhead to compare with a copy floor")
        return 1
    print(f"lms_on_vs_off_without_pressure {max(on_vs_off):.3f}")
    print(f"overhead_vs_copy_floor {worst:.1f}")
    return 0


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", required=True)
    parser.add_argument("--steps", type=int)  # run_probe_script's; the plan has the steps
    parser.add_argument("--result", type=Path, required=True)
    args: Any = parser.parse_args()
    sys.exit(run_probe_in_this_process(args.probe, args.result))
