"""`make demo`: ResNet-50 trains under a device-memory cap with LMS, and fails without it.

Runs examples/resnet50_lms.py twice, each in its own process, with the same
batch and the same emulated device memory (TF_LMS_CPU_DEVICE_MEMORY_MB):

  1. LMS on:  every step trains; the summary shows how far peak memory in use
     went past the device limit and how much LMS evicted and paged back in.
  2. LMS off: the same step runs out of device memory (ResourceExhaustedError).

Their output is streamed as it comes, then a short verdict. The exit status is
0 only if the LMS-on run completed with bytes reclaimed > 0 and the LMS-off
run failed with an out-of-memory error.

The defaults (batch 32 in 256 MiB, whose training step needs about 900 MiB)
were chosen from measurements on two cores: the whole demo takes about a minute
after TensorFlow is installed.

Example:
    .venv/bin/python examples/demo.py                     # what `make demo` runs
    .venv/bin/python examples/demo.py --batch-size 64 --device-memory-mb 384
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import _example_support as support  # examples/ is on sys.path

EXAMPLE = Path(__file__).resolve().with_name("resnet50_lms.py")

# TensorFlow prints these on every start, before its log level applies.
_STARTUP_NOISE = ("WARNING: All log messages before absl::InitializeLog()",
                  "oneDNN custom operations are on")
# The LMS allocator reports each failed allocation on stderr; after an
# out-of-memory error, the executor's remaining kernels fail too, so only the
# first is shown (the error line repeats its reason).
_ALLOCATION_FAILED = "tensorflow_lms_allocator: allocation of"


@dataclass
class Run:
    """The outcome of one resnet50_lms.py process."""

    returncode: int
    result: dict[str, Any] | None  # its --stats-json file, if written


def stream(command: list[str], timeout: float) -> int:
    """Runs `command`, printing its stdout and stderr lines as they come."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1, env=env)
    watchdog = threading.Timer(timeout, process.kill)
    watchdog.start()
    failed_allocations = 0
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if any(noise in line for noise in _STARTUP_NOISE):
                continue
            if line.startswith(_ALLOCATION_FAILED):
                failed_allocations += 1
                if failed_allocations > 1:
                    continue
            print("    " + line, end="", flush=True)
        returncode = process.wait()
        timed_out = not watchdog.is_alive()  # the timer fired and killed it
    finally:
        watchdog.cancel()
    if failed_allocations > 1:
        print(f"    ({failed_allocations - 1} more failed allocations reported by the "
              "allocator are not shown)")
    if returncode < 0:
        print(f"    (killed by signal {-returncode}"
              + (f" after the {timeout:.0f} s timeout" if timed_out else "") + ")")
    return returncode


def run_example(args: argparse.Namespace, lms: bool, workdir: Path) -> Run:
    result_path = workdir / f"lms_{'on' if lms else 'off'}.json"
    command = [sys.executable, str(EXAMPLE), "--batch-size", str(args.batch_size),
               "--device-memory-mb", str(args.device_memory_mb),
               "--steps", str(args.steps), "--lms" if lms else "--no-lms",
               "--stats-json", str(result_path)]
    print(f"$ {' '.join(['python', 'examples/resnet50_lms.py', *command[2:-2]])}",
          flush=True)
    returncode = stream(command, args.timeout)
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    return Run(returncode, result)


def verdict(args: argparse.Namespace, on: Run, off: Run) -> tuple[bool, list[str]]:
    """(success, lines saying what each run showed)."""
    lines: list[str] = []
    cap = f"{args.device_memory_mb} MiB of device memory"
    on_ok = on.returncode == 0 and on.result is not None
    reclaimed = on.result["statistics"]["bytes_reclaimed"] if on_ok else 0
    if on_ok and reclaimed > 0:
        s = on.result["statistics"]
        lines.append(
            f"PASS  LMS on:  batch {args.batch_size} trained {args.steps} steps in {cap}; "
            f"peak in use {s['peak_bytes_in_use'] / support.MIB:,.0f} MiB "
            f"({s['peak_bytes_in_use'] / s['bytes_limit']:.1f}x the device), "
            f"{reclaimed / support.MIB:,.0f} MiB evicted, "
            f"{s['bytes_paged_in'] / support.MIB:,.0f} MiB paged back in")
    elif on_ok:
        lines.append(f"FAIL  LMS on:  trained, but nothing was evicted (bytes reclaimed 0): "
                     f"batch {args.batch_size} fits in {cap}; raise --batch-size or lower "
                     "--device-memory-mb")
    else:
        lines.append(f"FAIL  LMS on:  the run failed (exit status {on.returncode}); see its "
                     "output above")
    off_oom = (off.returncode == support.EXIT_OUT_OF_MEMORY and off.result is not None
               and off.result["out_of_memory"])
    if off_oom:
        steps_done = len(off.result["step_seconds"])
        lines.append(f"PASS  LMS off: the same run stopped with ResourceExhaustedError in "
                     f"step {steps_done + 1} (out of device memory)")
    elif off.returncode == 0:
        lines.append(f"FAIL  LMS off: the run trained without LMS, so batch "
                     f"{args.batch_size} fits in {cap}; raise --batch-size or lower "
                     "--device-memory-mb")
    else:
        lines.append(f"FAIL  LMS off: the run failed, but not with an out-of-memory error "
                     f"(exit status {off.returncode}); see its output above")
    return on_ok and reclaimed > 0 and bool(off_oom), lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = support.example_parser(
        "Train ResNet-50 under an emulated device-memory cap with LMS on, then off.")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device-memory-mb", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds each run may take before it is killed")
    args = parser.parse_args(argv)
    support.check_minimums(parser, args, (("batch_size", 1), ("steps", 1)))
    support.check_memory_mb(parser, "--device-memory-mb", args.device_memory_mb)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        parser.error(f"--timeout {args.timeout:g}: must be a positive finite number of "
                     "seconds")

    with tempfile.TemporaryDirectory(prefix="lms-demo-") as tmp:
        print(f"== 1/2  LMS on: ResNet-50, batch {args.batch_size}, "
              f"{args.device_memory_mb} MiB of emulated device memory\n", flush=True)
        on = run_example(args, lms=True, workdir=Path(tmp))
        print("\n== 2/2  LMS off: the same model, batch and device memory\n", flush=True)
        off = run_example(args, lms=False, workdir=Path(tmp))
    success, lines = verdict(args, on, off)
    print("\n== Verdict")
    for line in lines:
        print("  " + line)
    print("  " + ("LMS trained a model that does not fit without it."
                  if success else "The demo did not show what it should (see FAIL above)."))
    return 0 if success else 1


if __name__ == "__main__":
    sys.exit(main())
