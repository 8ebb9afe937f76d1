"""Where the time of a swapped byte goes: LMS's step time over the copy floor.

For ResNet-50 (96x96, b32), DenseNet121 (64x64, b32) and the Transformer
encoder of benchmarks/mincap.py, one subprocess per case trains the model
uncapped (LMS on, nothing evicted), uncapped with LMS off (the fast path's
cost: `lms_on_vs_off_without_pressure`, the worst model's step time ratio,
printed before the last line), then at 1/2 and at 1/4 of its peak, the
cases of each model one after the other (interleaved, so a slow spell of the
machine touches all three). All of that is one round; `--rounds` (3) runs it
again, so that each case's step is the median of its rounds: on this
project's 2-core machines the same case's step moves by 10-30% from one
process to the next, which is more than LMS adds at 1/2 of the peak. The
single-thread memcpy bandwidth of this machine is measured in the same run.
Per case (a round's figure is the median of the steps after the first,
which traces the function; the case's, the median of its rounds):

  ratio      step time over the uncapped step (its rounds' range after it);
  moved      bytes copied per step (evictions and page-ins);
  floor      the copy floor: moved / memcpy bandwidth, what copying alone costs;
  the time LMS accounted per step (time_*_ns statistics): evicting, paging
  in, and their parts (copying, mapping, unmapping; waiting and fencing are
  0 on the emulated device), the copies' rate, the time threads waited for
  the engine's lock (held by evictions and page-ins as they copy) and for
  other threads' moves to end (a free or pin of a unit being copied), the
  time choosing victims (planning: the policy's bookkeeping), and
  accounted = (evicting + paging in) / copy floor: LMS's own time, free of
  the step's noise;
  overhead_vs_copy_floor = (LMS step - uncapped step) / copy floor.

The last line is the worst case: `overhead_vs_copy_floor R`.

`--paired` (benchmarks/overhead_paired.py) runs each model's uncapped, 1/2
and 1/4 steps in one process instead, taking the smaller devices by
tensorflow_lms_allocator.hold_device_memory, in `--blocks` blocks, and sets
each capped phase against the uncapped phase of its own block: the noise
between processes leaves the comparison.

The emulated device maps its memory in transparent huge pages as the machine
allows (posix_backend.h: by advice where
/sys/kernel/mm/transparent_hugepage/shmem_enabled lets shared memory have
them, else by MADV_COLLAPSE on Linux 6.1 and later); the `LMS serves` log
line says which, the first line here the machine's setting. `--huge-pages
both` runs every capped case with TF_LMS_HUGE_PAGES=off and then with auto,
side by side in each round, and prints both: the line before the last is
`overhead_vs_copy_floor_without_huge_pages R`, the last line the worst case
with them.

Example:
    make bench-overhead
    .venv/bin/python benchmarks/overhead.py --models transformer --steps 3 --rounds 1
    .venv/bin/python benchmarks/overhead.py --huge-pages both --rounds 2
    .venv/bin/python benchmarks/overhead.py --paired --blocks 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_probe import train_and_time  # noqa: E402
from mincap import GRANULE_MB, UNCAPPED_MB, build_model, run_probe_script  # noqa: E402

MIB = 1 << 20
MODELS = ("resnet50", "densenet121", "transformer")
FRACTIONS = (0.5, 0.25)
PARTS = ("copying", "mapping", "unmapping", "waiting", "fencing")  # of evicting and paging in
# Time outside evicting and paging in: waits, and the policy's choosing of victims.
WAITS = ("lock_waiting", "move_waiting", "planning")


def lms_settings(huge_pages: str | None = None, policy: str | None = None) -> dict[str, str]:
    """A probe's LMS settings: TF_LMS_HUGE_PAGES and TF_LMS_POLICY where given.

    Example:
        >>> lms_settings(policy="lru")
        {'TF_LMS_POLICY': 'lru'}
    """
    return {name: value for name, value in (("TF_LMS_HUGE_PAGES", huge_pages),
                                            ("TF_LMS_POLICY", policy)) if value}
SHMEM_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")


def tlb_shootdowns() -> int:
    """TLB shootdown interrupts this machine's CPUs took so far (0 where unreadable).

    Replacing a populated mapping (an eviction's or a page-in's remap) while
    another thread of the process last ran on another CPU makes the kernel
    interrupt that CPU to flush its TLB: in a virtual machine, an exit.

    Example:
        >>> tlb_shootdowns() >= 0
        True
    """
    try:
        with open("/proc/interrupts") as interrupts:
            for line in interrupts:
                name, _, counts = line.partition(":")
                if name.strip() == "TLB":
                    return sum(int(c) for c in counts.split() if c.isdigit())
    except OSError:
        pass
    return 0


def shmem_enabled() -> str:
    """The machine's shared-memory huge page setting (the bracketed word), or "unknown".

    Example:
        >>> shmem_enabled() in ("always", "within_size", "advise", "never", "deny", "force",
        ...                     "unknown")
        True
    """
    try:
        words = SHMEM_ENABLED.read_text().split()
    except OSError:
        return "unknown"
    return next((w[1:-1] for w in words if w.startswith("[")), "unknown")


def run_probe_in_this_process(model_name: str, steps: int, result_path: Path) -> int:
    """Trains `steps` steps; writes each step's seconds and the statistics after it."""
    import tensorflow_lms_allocator as lms  # before tensorflow

    model, inputs, labels = build_model(model_name)
    sample = lambda: {**lms.get_statistics(0), "tlb_shootdowns": tlb_shootdowns()}  # noqa: E731
    stats = [sample()]
    seconds = train_and_time(model, inputs, labels, steps,
                             after_step=lambda: stats.append(sample()))
    result_path.write_text(json.dumps({"step_seconds": seconds, "statistics": stats}))
    return 0


@dataclass
class Case:
    """One model at one device size, over its rounds: per-step medians after the first step."""

    model: str
    cap_mb: int
    steps: list[float]  # one per round
    per_step: dict[str, float]  # statistic deltas per step, median of the rounds
    peak_mb: float
    failed: str = ""

    @property
    def step(self) -> float:
        return statistics.median(self.steps)


def run_case(model: str, cap_mb: int, steps: int, timeout: float, mode: str = "lms",
             huge_pages: str | None = None, policy: str | None = None) -> Case:
    """One round of one case (`huge_pages`: TF_LMS_HUGE_PAGES, `policy`:
    TF_LMS_POLICY, None to leave either unset)."""
    settings = lms_settings(huge_pages, policy) or None
    result, failed = run_probe_script(Path(__file__), model, cap_mb, steps, timeout, mode,
                                      settings)
    if result is None:
        return Case(model, cap_mb, [], {}, 0, failed)
    stats = result["statistics"]
    later = range(2, len(stats))  # the deltas of the steps after the first
    per_step = {name: statistics.median(stats[i][name] - stats[i - 1][name] for i in later)
                for name in stats[-1]
                if name.startswith(("time_", "bytes_copied", "num_evictions", "tlb_"))}
    return Case(model, cap_mb, [statistics.median(result["step_seconds"][1:])], per_step,
                stats[-1]["peak_bytes_in_use"] / MIB)


def merge(rounds: list[Case]) -> Case:
    """One case from its rounds: the medians of their steps and statistics.

    Example:
        merge([run_case("resnet50", 444, 4, 900) for _ in range(3)]).step
    """
    failed = next((r for r in rounds if r.failed), None)
    if failed is not None:
        return failed
    names = rounds[0].per_step.keys()
    return Case(rounds[0].model, rounds[0].cap_mb, [s for r in rounds for s in r.steps],
                {name: statistics.median(r.per_step[name] for r in rounds) for name in names},
                max(r.peak_mb for r in rounds))


def memcpy_bandwidth() -> float:
    """Bytes per second of one thread copying 256 MiB (best of 5)."""
    import numpy as np

    source = np.ones(256 * MIB, dtype=np.uint8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return source.nbytes / best


def report(case: Case, uncapped: Case, bandwidth: float) -> float | None:
    """Prints one case's line; returns its overhead over the copy floor (None if none)."""
    if case.failed:
        print(f"  {case.model:<12} {case.cap_mb:>6} MiB  FAILED: {case.failed[:120]}")
        return None
    moved = case.per_step.get("bytes_copied", 0)
    floor = moved / bandwidth
    ms = {name: case.per_step.get(f"time_{name}_ns", 0) / 1e6
          for name in ("evicting", "paging_in", *PARTS, *WAITS)}
    overhead = (case.step - uncapped.step) / floor if floor > 0 else None
    accounted = (ms["evicting"] + ms["paging_in"]) / 1e3 / floor if floor > 0 else None
    copy_rate = moved / (ms["copying"] / 1e3) / 1e9 if ms["copying"] > 0 else 0.0
    print(f"  {case.model:<12} {case.cap_mb:>6} MiB  step {case.step:6.2f} s "
          f"({case.step / uncapped.step:4.2f}x, {spread(case, uncapped)})  "
          f"moved {moved / MIB:7.1f} MiB  "
          f"floor {floor * 1e3:7.1f} ms  evicting {ms['evicting']:7.1f} ms  "
          f"paging in {ms['paging_in']:7.1f} ms  (copying {ms['copying']:.1f} at "
          f"{copy_rate:.1f} GB/s, mapping {ms['mapping']:.1f}, unmapping "
          f"{ms['unmapping']:.1f}, waiting {ms['waiting']:.1f}; waiting for the lock "
          f"{ms['lock_waiting']:.1f}, for moves {ms['move_waiting']:.1f}; planning "
          f"{ms['planning']:.1f}; evictions {case.per_step.get('num_evictions', 0):.0f}, "
          f"abandoned {case.per_step.get('num_evictions_abandoned', 0):.0f}; TLB shootdowns "
          f"{case.per_step.get('tlb_shootdowns', 0):.0f})"
          + (f"  accounted {accounted:.1f}x" if accounted is not None else "")
          + (f"  overhead_vs_copy_floor {overhead:.1f}" if overhead is not None else ""),
          flush=True)
    return overhead


def spread(case: Case, uncapped: Case) -> str:
    """The range of the case's rounds over the uncapped median: how far noise reaches."""
    if len(case.steps) < 2:
        return "one round"
    return (f"rounds {min(case.steps) / uncapped.step:.2f}-"
            f"{max(case.steps) / uncapped.step:.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--steps", type=int,
                        help="training steps per case (>= 3; 4), with --paired per phase "
                             "after its first (3)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times every case runs, interleaved (>= 1; each case's step "
                             "is the median of its rounds)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per case")
    parser.add_argument("--huge-pages", choices=("machine", "both"), default="machine",
                        help="machine: as this machine allows; both: every capped case "
                             "with TF_LMS_HUGE_PAGES=off and then auto")
    parser.add_argument("--paired", action="store_true",
                        help="each model's caps in one process, by holding device memory "
                             "(benchmarks/overhead_paired.py); --steps per phase, --blocks")
    parser.add_argument("--blocks", type=int, default=5,
                        help="with --paired: times each model's uncapped, 1/2 and 1/4 "
                             "phases run in turn (>= 1)")
    parser.add_argument("--policy", choices=("learned", "lru"),
                        help="TF_LMS_POLICY of the capped cases (default: LMS's, learned)")
    parser.add_argument("--probe", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return run_probe_in_this_process(args.probe, args.steps, args.result)
    if args.steps is None:
        args.steps = 3 if args.paired else 4
    if args.steps < 3:
        parser.error(f"--steps {args.steps}: at least 3 (the first traces the function, "
                     "and a per-step figure needs two steps after it)")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    if args.blocks < 1:
        parser.error(f"--blocks {args.blocks}: at least 1")
    if args.paired and args.huge_pages != "machine":
        parser.error("--paired runs as this machine allows: leave out --huge-pages")
    # The capped cases' TF_LMS_HUGE_PAGES values: None leaves it unset.
    settings: list[str | None] = [None] if args.huge_pages == "machine" else ["off", "auto"]
    bandwidth = memcpy_bandwidth()
    print(f"single-thread memcpy: {bandwidth / 1e9:.1f} GB/s (256 MiB, best of 5); shared "
          f"memory huge pages: {shmem_enabled()} (shmem_enabled)", flush=True)
    if args.paired:
        import overhead_paired

        return overhead_paired.main(args.models, args.blocks, args.steps, args.timeout,
                                    bandwidth, args.policy)
    return run_rounds(args, settings, bandwidth)


def run_rounds(args: argparse.Namespace, settings: list[str | None], bandwidth: float) -> int:
    """Runs the rounds of every case and prints the report (main's second half)."""
    # runs[model][case]: that case's rounds so far ("uncapped", "off", and each
    # capped case as (cap's name, TF_LMS_HUGE_PAGES value)); the caps come from
    # the first round's uncapped peak.
    runs: dict[str, dict[object, list[Case]]] = {m: {} for m in args.models}
    caps: dict[str, dict[str, int]] = {}
    for round_index in range(args.rounds):
        print(f"round {round_index + 1} of {args.rounds}", flush=True)
        for model in args.models:
            cases = runs[model]
            for name, mode in (("uncapped", "lms"), ("off", "lms-off")):
                case = run_case(model, UNCAPPED_MB, args.steps, args.timeout, mode)
                if case.failed:
                    print(f"{model}: does not train uncapped{' with LMS off' * (mode != 'lms')}: "
                          f"{case.failed}")
                    return 1
                cases.setdefault(name, []).append(case)
            if model not in caps:
                peak = cases["uncapped"][0].peak_mb
                caps[model] = {f"1/{round(1 / f)}": max(GRANULE_MB, int(peak * f) // GRANULE_MB
                                                          * GRANULE_MB) for f in FRACTIONS}
            for name, cap in caps[model].items():
                for setting in settings:
                    cases.setdefault((name, setting), []).append(
                        run_case(model, cap, args.steps, args.timeout, huge_pages=setting,
                                 policy=args.policy))
    worst: dict[str | None, float] = {}
    on_vs_off: list[float] = []  # uncapped step, LMS on over LMS off
    for model, cases in runs.items():
        uncapped, off = merge(cases["uncapped"]), merge(cases["off"])
        on_vs_off.append(uncapped.step / off.step)
        lock_ms = uncapped.per_step.get("time_lock_waiting_ns", 0) / 1e6
        print(f"{model}: peak {uncapped.peak_mb:.0f} MiB, step {uncapped.step:.2f} s uncapped "
              f"({spread(uncapped, uncapped)}; waiting for the lock {lock_ms:.1f} ms; TLB "
              f"shootdowns {uncapped.per_step.get('tlb_shootdowns', 0):.0f}; "
              f"{off.step:.2f} s with LMS off: {on_vs_off[-1]:.3f}x)", flush=True)
        for name in caps[model]:
            for setting in settings:
                if setting is not None:
                    print(f"  TF_LMS_HUGE_PAGES={setting}:")
                overhead = report(merge(cases[(name, setting)]), uncapped, bandwidth)
                if overhead is not None:
                    worst[setting] = max(worst.get(setting, overhead), overhead)
    if len(worst) < len(settings):
        print("no case moved bytes: no overhead to compare with a copy floor")
        return 1
    print(f"lms_on_vs_off_without_pressure {max(on_vs_off):.3f}")
    if "off" in worst:
        print(f"overhead_vs_copy_floor_without_huge_pages {worst['off']:.1f}")
    print(f"overhead_vs_copy_floor {worst[settings[-1]]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
