"""One benchmark probe in a subprocess, with progress lines while it runs.

A probe (a few training steps in a fresh TensorFlow process) takes from
seconds to minutes; the benchmarks print a line when it starts and one every
`progress_every` seconds while it runs, so minutes of work are never minutes of silence.

Example:
    >>> done = run_probe_process([sys.executable, "-c", "pass"], env=None, timeout=60,
    ...                          label="lms batch 64")  # doctest: +SKIP
      lms batch 64: running (elapsed 0:12:03 in all)
    >>> done.returncode  # doctest: +SKIP
    0
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

# When the benchmark started: progress lines show the elapsed time of the whole run.
STARTED = time.perf_counter()
# Seconds between the lines of a running probe (the benchmarks' --progress-every).
progress_every = 30.0


@dataclass
class Finished:
    returncode: int  # -9 after a timeout
    stderr: str
    timed_out: bool
    seconds: float


def clock(seconds: float) -> str:
    """Seconds as h:mm:ss."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run_probe_process(command: list[str], env: dict[str, str] | None, timeout: float,
                      label: str, estimate: float | None = None) -> Finished:
    """Runs `command`, printing progress; returns how it ended and its stderr.

    `estimate` (seconds, from earlier probes) is shown as a guess, if given.
    """
    start = time.perf_counter()
    guess = f", estimate ~{estimate:.0f} s" if estimate else ""
    print(f"  {label}: running{guess} (elapsed {clock(start - STARTED)} in all)", flush=True)
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    while True:
        running = time.perf_counter() - start
        try:
            _, stderr = process.communicate(timeout=min(progress_every, max(timeout - running, 0.1)))
            return Finished(process.returncode, stderr, False, time.perf_counter() - start)
        except subprocess.TimeoutExpired:
            running = time.perf_counter() - start
            if running >= timeout:
                process.kill()
                _, stderr = process.communicate()
                return Finished(-9, stderr, True, running)
            print(f"  {label}: still running, {running:.0f} s{guess}", flush=True)
