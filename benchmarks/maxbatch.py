"""Largest ResNet-50 batch that trains under a device-memory cap: TensorFlow's BFC allocator vs LMS.

ResNet-50 (keras.applications, weights=None, 10 classes) trains on synthetic
96x96 images with SGD + momentum, the training step of
examples/resnet50_lms.py. Every probe is a fresh subprocess that trains a few
steps at one batch size under one allocator:

  bfc      stock TensorFlow, its own BFC allocator capped at the same size
           (TF_CPU_ALLOCATOR_USE_BFC=true, TF_CPU_BFC_MEM_LIMIT_IN_MB); the LMS
           package is not imported at all
  lms      the emulated device (TF_LMS_CPU_DEVICE_MEMORY_MB) with LMS on
  lms-off  the emulated device with LMS off (a plain capped allocator)

Importing tensorflow_lms_allocator with an emulated device turns TensorFlow's
oneDNN kernels off (TF_ENABLE_ONEDNN_OPTS=0: they crash instead of raising OOM),
so the lms runs use TensorFlow's Eigen kernels while stock TensorFlow uses
oneDNN. The step-time comparison therefore also runs stock TensorFlow with
oneDNN off ("stock-eigen"): LMS off against stock-eigen is the cost of the
allocator itself, stock-eigen against stock the cost of the kernel choice.

A probe fits when every step completes; a non-zero exit, a signal (stock
TensorFlow may segfault under a too-small cap rather than raise OOM), a
ResourceExhaustedError or a timeout counts as "does not fit", and its reason is
recorded. The search doubles the batch until a probe fails, then bisects.

Part (c) then compares step time with LMS on and off at a batch that fits
without eviction (bytes reclaimed must be 0 in the LMS-on runs): both on the
emulated device with a generous cap, plus stock TensorFlow for reference;
the runs are interleaved (on, off, stock, on, off, stock, ...) so that drift in
machine load hits all of them alike, the first steps of each run are dropped,
and the medians are compared.

The last line is `max_batch_ratio R`: the LMS max batch over the BFC max batch.

Near its limit a probe is not deterministic: which kernels run at the same
time, and so how much memory is pinned at once, changes from run to run, so a
batch may fit in one run and fail in the next (BFC's max was 12 or 13 and LMS's
165 or 192 in runs on the same machine). The search reports what it saw;
--inter-op-threads 1 makes LMS runs steadier (one kernel pinned at a time).

Example:
    make bench-maxbatch                      # the defaults, about 15 minutes on 2 cores
    .venv/bin/python benchmarks/maxbatch.py --cap-mb 512 --timing-batch 16 --timing-runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import probe_process
from probe_process import run_probe_process
from training_probe import run_resnet50_probe

MIB = 1 << 20
MODES = ("bfc", "lms", "lms-off", "stock", "stock-eigen")
_PROBE_SETTINGS = ("TF_LMS_", "TF_CPU_ALLOCATOR_USE_BFC", "TF_CPU_BFC_MEM_LIMIT_IN_MB",
                   "TF_ENABLE_ONEDNN_OPTS", "TF_NUM_INTEROP_THREADS")


# --------------------------------------------------------------------------
# The probe: one subprocess, one allocator, one batch size.


def probe_environment(mode: str, cap_mb: int, inter_op_threads: int | None
                      ) -> dict[str, str]:
    """The environment a probe of `mode` runs with (set before Python starts).

    Settings inherited from this process that would change what is measured
    are dropped, so every probe of a mode runs alike.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PROBE_SETTINGS)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if inter_op_threads is not None:
        env["TF_NUM_INTEROP_THREADS"] = str(inter_op_threads)
    if mode == "stock-eigen":
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    if mode == "bfc":
        env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        env["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = str(cap_mb)
    elif mode in ("lms", "lms-off"):
        env["TF_LMS_CPU_DEVICE_MEMORY_MB"] = str(cap_mb)
        env["TF_LMS_ENABLED"] = "1" if mode == "lms" else "0"
    return env


def run_probe_in_this_process(mode: str, batch: int, steps: int, image_size: int,
                              result_path: Path) -> int:
    """Trains `steps` steps and writes {"step_seconds", "statistics"} as JSON."""
    if mode in ("lms", "lms-off"):
        import tensorflow_lms_allocator as lms  # before tensorflow
    else:
        lms = None
    return run_resnet50_probe(batch, steps, image_size, result_path, lms)


@dataclass
class Probe:
    """The outcome of one probe subprocess."""

    mode: str
    batch: int
    fits: bool
    seconds: float  # wall time of the subprocess
    reason: str = ""  # why it did not fit
    step_seconds: list[float] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)


def failure_reason(returncode: int, stderr: str, timed_out: bool, timeout: float) -> str:
    """One line saying why a probe failed, from its exit status and stderr."""
    if timed_out:
        return f"timeout after {timeout:.0f} s"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("OOM when allocating"):
            return line.replace(" on /job:localhost/replica:0/task:0/device:", " on ")
    for line in lines:
        if "Check failed" in line:  # TensorFlow aborted (SIGABRT)
            return "aborted: " + line[line.index("Check failed"):]
    for line in reversed(lines):
        if "ResourceExhausted" in line or "out of memory" in line.lower():
            return line
    if returncode < 0:
        try:
            name = f" ({signal.Signals(-returncode).name})"
        except ValueError:
            name = ""
        return f"killed by signal {-returncode}{name}"
    tail = lines[-1] if lines else ""
    return f"exit status {returncode}: {tail}"


def run_probe(mode: str, batch: int, *, steps: int, cap_mb: int, image_size: int,
              timeout: float, inter_op_threads: int | None = None,
              estimate: float | None = None) -> Probe:
    with tempfile.TemporaryDirectory(prefix="maxbatch-") as tmp:
        result_path = Path(tmp) / "result.json"
        command = [sys.executable, "-X", "faulthandler", str(Path(__file__).resolve()),
                   "--probe", mode, "--batch", str(batch), "--steps", str(steps),
                   "--image-size", str(image_size), "--result", str(result_path)]
        done = run_probe_process(command, probe_environment(mode, cap_mb, inter_op_threads),
                                 timeout, f"{mode} batch {batch}", estimate)
        if done.returncode == 0 and result_path.exists():
            result = json.loads(result_path.read_text())
            return Probe(mode, batch, True, done.seconds, step_seconds=result["step_seconds"],
                         stats=result.get("statistics", {}))
        return Probe(mode, batch, False, done.seconds,
                     reason=failure_reason(done.returncode, done.stderr, done.timed_out,
                                           timeout))


def estimate_seconds(probes: list[Probe], mode: str, batch: int) -> float | None:
    """A guess at a probe's wall time: the last probe of `mode` that fitted, scaled
    by batch (an overestimate for small batches, where start-up dominates)."""
    fitted = [p for p in probes if p.mode == mode and p.fits]
    return fitted[-1].seconds * max(1.0, batch / fitted[-1].batch) if fitted else None


# --------------------------------------------------------------------------
# The search and the timing comparison.


class Search:
    """Largest batch that fits, by doubling from `start` and then bisecting.

    Bisection stops when the bracket is at most `resolution` of the lower end
    (and always at one batch), so big batches take no more probes than small.
    """

    def __init__(self, mode: str, run: Any, probes: list[Probe], resolution: float) -> None:
        self.mode, self.run, self.probes, self.resolution = mode, run, probes, resolution

    def _try(self, batch: int) -> bool:
        probe = self.run(self.mode, batch)
        self.probes.append(probe)
        print(format_probe(probe), flush=True)
        return probe.fits

    def largest(self, start: int, limit: int) -> tuple[int, int | None]:
        """(largest batch that fit, smallest that did not or None if limit fit)."""
        low, high = 0, None
        batch = start
        while high is None:
            if self._try(batch):
                low = batch
                if batch >= limit:
                    return low, None
                batch = min(batch * 2, limit)
            else:
                high = batch
                if batch == start and start > 1:  # nothing fitted yet: go down
                    low, high = self.largest(max(1, start // 2), start - 1)
                    return low, start if high is None else high
        while high - low > max(1, int(low * self.resolution)):
            middle = (low + high) // 2
            if self._try(middle):
                low = middle
            else:
                high = middle
        return low, high


def format_probe(p: Probe) -> str:
    outcome = "fits" if p.fits else "FAILS"
    detail = ""
    if p.fits:
        if len(p.step_seconds) > 1:
            detail = f"step {statistics.median(p.step_seconds[1:]):6.2f} s"
        if p.stats:
            s = p.stats
            detail += (f"  peak in use {s['peak_bytes_in_use'] / MIB:6,.0f} MiB"
                       f"  peak active {s['peak_bytes_active'] / MIB:5,.0f} MiB"
                       + ("(!)" if s["peak_bytes_active"] > s["bytes_limit"] else "")
                       + f"  evicted {s['bytes_reclaimed'] / MIB:7,.0f} MiB")
    else:
        detail = p.reason
    return f"  {p.mode:<11} batch {p.batch:4d}  {outcome:<5}  ({p.seconds:5.0f} s)  {detail}"


def median_after_warmup(runs: list[Probe], warmup: int) -> float:
    times = [t for run in runs for t in run.step_seconds[warmup:]]
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--cap-mb", type=int, default=512,
                        help="device memory cap for both allocators in the search, MiB")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--search-steps", type=int, default=3,
                        help="training steps a probe must complete to fit")
    parser.add_argument("--start-batch", type=int, default=8,
                        help="first batch of the BFC search (the LMS search starts at "
                             "twice the BFC result)")
    parser.add_argument("--max-batch", type=int, default=1024,
                        help="the search stops here even if it still fits")
    parser.add_argument("--resolution", type=float, default=1 / 32,
                        help="bisection stops when the bracket is within this share "
                             "of the batch")
    parser.add_argument("--timeout", type=float, default=420,
                        help="seconds a probe may take before it counts as failed")
    parser.add_argument("--timing-batch", type=int, default=16,
                        help="batch for the LMS on/off step-time comparison; it must "
                             "fit in --timing-cap-mb without eviction")
    parser.add_argument("--timing-cap-mb", type=int, default=4096,
                        help="device memory for the step-time comparison, MiB")
    parser.add_argument("--timing-runs", type=int, default=3,
                        help="interleaved runs per allocator in the step-time comparison")
    parser.add_argument("--timing-steps", type=int, default=8,
                        help="training steps per timing run")
    parser.add_argument("--timing-warmup", type=int, default=2,
                        help="first steps of each timing run left out of the median")
    parser.add_argument("--inter-op-threads", type=int, default=None,
                        help="TF_NUM_INTEROP_THREADS for every probe (default: "
                             "TensorFlow's choice); 1 runs one kernel at a time, so "
                             "fewer tensors are pinned at once")
    parser.add_argument("--skip-timing", action="store_true",
                        help="only search the max batches")
    parser.add_argument("--progress-every", type=float, default=30,
                        help="seconds between progress lines of a running probe")
    # The probe subprocess (internal).
    parser.add_argument("--probe", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return run_probe_in_this_process(args.probe, args.batch, args.steps,
                                         args.image_size, args.result)
    if args.timing_warmup >= args.timing_steps:
        parser.error(f"--timing-warmup ({args.timing_warmup}) must be less than "
                     f"--timing-steps ({args.timing_steps})")

    probe_process.progress_every = args.progress_every
    started = time.perf_counter()
    probes: list[Probe] = []

    def search_run(mode: str, batch: int) -> Probe:
        return run_probe(mode, batch, steps=args.search_steps, cap_mb=args.cap_mb,
                         image_size=args.image_size, timeout=args.timeout,
                         inter_op_threads=args.inter_op_threads,
                         estimate=estimate_seconds(probes, mode, batch))

    print(f"ResNet-50, {args.image_size}x{args.image_size} synthetic images, SGD+momentum; "
          f"device memory cap {args.cap_mb} MiB; a probe fits when "
          f"{args.search_steps} training steps complete\n")
    print("(a) TensorFlow's BFC allocator (TF_CPU_ALLOCATOR_USE_BFC=true, "
          f"TF_CPU_BFC_MEM_LIMIT_IN_MB={args.cap_mb})")
    bfc_max, bfc_fail = Search("bfc", search_run, probes, 0).largest(
        args.start_batch, args.max_batch)
    print(f"\n(b) LMS (TF_LMS_CPU_DEVICE_MEMORY_MB={args.cap_mb}, LMS on)")
    lms_max, lms_fail = Search("lms", search_run, probes, args.resolution).largest(
        max(1, 2 * bfc_max), args.max_batch)

    timing: dict[str, float] = {}
    timing_runs: dict[str, list[Probe]] = {"lms": [], "lms-off": [], "stock-eigen": [],
                                           "stock": []}
    if not args.skip_timing:
        print(f"\n(c) step time at batch {args.timing_batch}, {args.timing_runs} interleaved "
              f"runs of {args.timing_steps} steps each, first {args.timing_warmup} left "
              f"out; emulated device of {args.timing_cap_mb} MiB for lms / lms-off; "
              "stock-eigen is stock TensorFlow with oneDNN off, as the emulated "
              "device runs")
        for _ in range(args.timing_runs):
            for mode in timing_runs:
                probe = run_probe(mode, args.timing_batch, steps=args.timing_steps,
                                  cap_mb=args.timing_cap_mb, image_size=args.image_size,
                                  timeout=args.timeout,
                                  inter_op_threads=args.inter_op_threads,
                                  estimate=(timing_runs[mode][-1].seconds
                                            if timing_runs[mode] else None))
                print(format_probe(probe), flush=True)
                if not probe.fits:
                    print(f"error: the {mode} timing run failed at batch "
                          f"{args.timing_batch} ({probe.reason}); lower --timing-batch "
                          "or raise --timing-cap-mb", file=sys.stderr)
                    return 1
                timing_runs[mode].append(probe)
        timing = {mode: median_after_warmup(runs, args.timing_warmup)
                  for mode, runs in timing_runs.items()}

    print_results(args, probes, bfc_max, bfc_fail, lms_max, lms_fail, timing,
                  timing_runs, time.perf_counter() - started)
    if bfc_max == 0:
        print("error: not even batch 1 trains under TensorFlow's BFC allocator at "
              f"{args.cap_mb} MiB; raise --cap-mb", file=sys.stderr)
        return 1
    print(f"max_batch_ratio {lms_max / bfc_max:.2f}")
    return 0


def print_results(args: argparse.Namespace, probes: list[Probe], bfc_max: int,
                  bfc_fail: int | None, lms_max: int, lms_fail: int | None,
                  timing: dict[str, float], timing_runs: dict[str, list[Probe]],
                  seconds: float) -> None:
    def first_failure(mode: str, batch: int | None) -> str:
        if batch is None:
            return f"(none up to --max-batch {args.max_batch})"
        reason = next(p.reason for p in probes if p.mode == mode and p.batch == batch)
        return f"{batch}: {reason}"

    print("\nAll probes (batch, fits, wall seconds):")
    print(f"  {'allocator':<12}{'batch':>6}  {'result':<6}{'seconds':>8}")
    for p in sorted(probes, key=lambda p: (p.mode, p.batch)):
        print(f"  {p.mode:<12}{p.batch:>6}  {'fits' if p.fits else 'FAILS':<6}"
              f"{p.seconds:>8.0f}")
    lms_probe = next((p for p in probes if p.mode == "lms" and p.batch == lms_max), None)
    threads = ("" if args.inter_op_threads is None
               else f", TF_NUM_INTEROP_THREADS={args.inter_op_threads}")
    print(f"\nResults (cap {args.cap_mb} MiB{threads}, {seconds / 60:.1f} minutes in all):")
    print(f"  {'TensorFlow BFC max batch':<34} {bfc_max}")
    print(f"  {'  first failure':<34} {first_failure('bfc', bfc_fail)}")
    print(f"  {'LMS max batch':<34} {lms_max}")
    print(f"  {'  first failure':<34} {first_failure('lms', lms_fail)}")
    if lms_probe is not None and lms_probe.stats:
        s = lms_probe.stats
        print(f"  {'  at the LMS max batch':<34} peak in use "
              f"{s['peak_bytes_in_use'] / MIB:,.0f} MiB "
              f"({s['peak_bytes_in_use'] / s['bytes_limit']:.1f}x the cap), "
              f"evicted {s['bytes_reclaimed'] / MIB:,.0f} MiB, paged in "
              f"{s['bytes_paged_in'] / MIB:,.0f} MiB, median step "
              f"{statistics.median(lms_probe.step_seconds[1:] or lms_probe.step_seconds):.1f} s")
    if any(p.stats and p.stats["peak_bytes_active"] > p.stats["bytes_limit"]
           for p in probes):
        print("  (!) peak bytes active above the cap: the engine counts a pinned "
              "allocation as active before paging it in, so at least one page-in "
              "failed and its kernel read that input from host memory (correct, "
              "but over the bus on a GPU)")
    if timing:
        reclaimed = max(p.stats["bytes_reclaimed"] for p in timing_runs["lms"])
        on, off = timing["lms"], timing["lms-off"]
        eigen, stock = timing["stock-eigen"], timing["stock"]
        print(f"  {'step time, batch ' + str(args.timing_batch) + ' (medians)':<34} "
              f"LMS on {on:.3f} s, LMS off {off:.3f} s, stock TensorFlow {stock:.3f} s "
              f"(oneDNN), {eigen:.3f} s (oneDNN off)")
        print(f"  {'  LMS on vs LMS off':<34} {100 * (on / off - 1):+.1f}% "
              "(target: within 5%)")
        print(f"  {'  LMS off vs stock, oneDNN off':<34} {100 * (off / eigen - 1):+.1f}% "
              "(the emulated device's allocator and kernel pins)")
        print(f"  {'  LMS on vs stock TensorFlow':<34} {100 * (on / stock - 1):+.1f}% "
              "(mostly Eigen instead of oneDNN kernels: stock oneDNN off vs on "
              f"{100 * (eigen / stock - 1):+.1f}%)")
        print(f"  {'  bytes reclaimed in LMS-on runs':<34} {reclaimed} "
              + ("(no eviction, as required)" if reclaimed == 0
                 else "(NOT zero: the timing batch evicts; lower --timing-batch)"))
    print(f"  {'max batch ratio (LMS / BFC)':<34} {lms_max / max(bfc_max, 1):.2f} "
          "(target: at least 4.7, goal beyond 5)")


if __name__ == "__main__":
    sys.exit(main())
