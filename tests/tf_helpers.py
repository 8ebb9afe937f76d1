"""Running real TensorFlow programs in subprocesses.

Each TensorFlow process creates its devices once, with the allocator the
environment chose, so every configuration runs in a process of its own. The
programs in tests/tf_programs print one line ``RESULT <json>``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROGRAMS = Path(__file__).parent / "tf_programs"


def log_severity(line: str) -> str | None:
    """The severity letter (I, W, E, F) of a TensorFlow C++ log line, or None.

    TensorFlow writes absl's format, "W1126 12:41:31.406029 1234 file.cc:29] ...",
    and, to 2.20, its own for most lines, "2026-11-26 12:41:31.406029: W file.cc:29] ...".
    """
    match = re.match(r"([IWEF])\d{4} |\d{4}-\d\d-\d\d [\d:.]+: ([IWEF]) ", line)
    return None if match is None else match.group(1) or match.group(2)


@dataclass
class Run:
    returncode: int
    result: dict | None
    stderr: str
    stdout: str


def run_program(name: str, *args: str, env: dict[str, str] | None = None,
                timeout: float = 300, python: str = sys.executable) -> Run:
    """Runs tests/tf_programs/<name> with `env` added to a clean LMS environment.

    `python` is the interpreter (another virtual environment's, for example).

    Example:
        run = run_program("train.py", "fit", env={"TF_LMS_CPU_DEVICE_MEMORY_MB": "128"})
        assert run.result["error"] is None
    """
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("TF_LMS_", "TF_GPU_HOST_MEM", "TF_CPU_"))}
    full_env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0",
                     "PYTHONUNBUFFERED": "1"})
    full_env.update(env or {})
    proc = subprocess.run([python, str(PROGRAMS / name), *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return Run(proc.returncode, result, proc.stderr, proc.stdout)


def describe(run: Run) -> str:
    """What to print when a run did not do what a test expected."""
    return f"exit {run.returncode}\nstdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
