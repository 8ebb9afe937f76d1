"""`make gpu-check` where there is no GPU, and what of it runs over the fake driver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "benchmarks/gpu_check.py"
FAKE_DRIVER = ROOT / "build/fake_cuda/libfakecuda.so"


def gpu_check(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_CUDA_")}
    full_env.update(env)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, env=full_env, timeout=600)


@pytest.fixture(autouse=True)
def _fake_driver_is_built() -> None:
    if not FAKE_DRIVER.exists():
        pytest.fail(f"{FAKE_DRIVER} is missing: run `make fake-cuda` (make test builds it)")


def test_without_a_driver_it_says_so_and_exits_2():
    run = gpu_check("--driver", "/nonexistent/libcuda.so.1")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "no NVIDIA driver" in run.stdout and "nothing was run" in run.stdout


def test_a_driver_with_no_gpu_says_so_and_exits_2():
    run = gpu_check("--driver", str(FAKE_DRIVER), FAKE_CUDA_DEVICE_COUNT="0")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "cuInit failed: no usable GPU" in run.stdout


def test_it_finds_the_gpu_and_its_driver_through_cugetprocaddress():
    run = gpu_check("--driver", str(FAKE_DRIVER), "--gpu-only")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "GPU 0: Fake CUDA Device 0, driver 12.4" in run.stdout


def test_the_engine_contract_part_passes_over_the_fake_driver():
    run = gpu_check("--driver", str(FAKE_DRIVER), "--contract-only")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "12 tensors of 8 MiB on a 64 MiB device: 12 intact" in run.stdout
    assert " 0 evictions" not in run.stdout and " 0 page-ins" not in run.stdout
