"""The Makefile a new user drives everything with: its help and its self-containment.

`make help` lists every target (none forgotten as targets are added), and the one
C++ check that needs CUDA's cuda.h takes it from .venv, so a fresh machine without a
CUDA toolkit passes `make test`.

Example:
    $ .venv/bin/python -m pytest -q tests/test_makefile.py
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make(*args: str) -> str:
    done = subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def phony_targets() -> set[str]:
    """The targets the Makefile declares .PHONY (the ones users run)."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return {name for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for name in line.split()}


def test_make_help_lists_every_target_with_one_line():
    listed = {}
    for line in make("help").splitlines():
        match = re.match(r"make (\S+) +(\S.*)$", line)
        assert match, f"not 'make TARGET  what it does': {line!r}"
        listed[match.group(1)] = match.group(2)
    targets = phony_targets()
    assert {"test", "demo", "test-quick", "help", "patches"} <= targets
    assert targets <= set(listed), sorted(targets - set(listed))
    assert set(listed) <= targets, sorted(set(listed) - targets)


def test_the_cuda_abi_check_takes_cuda_h_from_the_venv_not_a_toolkit():
    """Dry-run the compile of tests/cc/cuda_abi_test.cc: its only include of CUDA is
    .venv's (nvidia-cuda-runtime's cuda.h), so /usr/local/cuda can be absent."""
    make(".venv/cuda_include/cuda.h")
    commands = make("-n", "-B", "build/cc/cuda_abi_test")
    compile_line = next(line for line in commands.splitlines() if "cuda_abi_test.cc -o" in line)
    assert "-isystem .venv/cuda_include" in compile_line, compile_line
    assert "/usr/local/cuda" not in commands
    cuda_h = ROOT / ".venv" / "cuda_include" / "cuda.h"
    assert cuda_h.resolve().parts[-4:] == ("nvidia", "cu13", "include", "cuda.h")
    assert "#define CUDA_VERSION 13000" in cuda_h.read_text()
    requirements = (ROOT / "requirements-dev.txt").read_text()
    assert re.search(r"^nvidia-cuda-runtime==13\.0\.\d+$", requirements, re.M)


def test_test_quick_builds_the_fake_driver_before_its_pytest_files():
    """The quick pytest files run the engine over the fake CUDA driver too (conftest's
    backends), so on a fresh clone `make test-quick` must build the driver first: it
    once did not, and 4 tests failed and 16 errored there."""
    commands = make("-n", "-B", "test-quick").splitlines()
    builds = [i for i, line in enumerate(commands)
              if line.endswith("-o build/fake_cuda/libfakecuda.so")]
    runs = [i for i, line in enumerate(commands) if " -m pytest " in line]
    assert builds, "make test-quick does not build build/fake_cuda/libfakecuda.so"
    assert runs and builds[0] < runs[0], commands
