"""`make gpu-check` where there is no GPU, and what of it runs over the fake driver."""

from __future__ import annotations

import os
import re
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


ENGINE_CHECK = ROOT / "tests/gpu/gpu_check_engine.sh"


def gpu_check_engine(**env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("FAKE_CUDA_", "TF_LMS_", "LMS_TEST_"))}
    full_env.update(PYTHON=sys.executable, BUILD_DIR=str(ROOT / "build/gpu-check-engine"),
                    PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env)
    return subprocess.run(["bash", str(ENGINE_CHECK)], capture_output=True, text=True,
                          env=full_env, timeout=600)


def test_gpu_check_engine_without_a_gpu_says_so_and_exits_2():
    run = gpu_check_engine(LMS_GPU_CHECK_DRIVER="/nonexistent/libcuda.so.1")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "no NVIDIA driver (/nonexistent/libcuda.so.1" in run.stderr
    assert "no GPU here, nothing checked" in run.stderr
    assert run.stdout == ""  # nothing built, nothing run


@pytest.mark.slow
def test_gpu_check_engine_dry_run_runs_its_steps_over_the_fake_driver_labelled():
    run = gpu_check_engine(LMS_GPU_CHECK_DRY_RUN=str(FAKE_DRIVER))
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("gpu-check-engine")]
    assert lines and all("DRY RUN against the fake CUDA driver, not a GPU" in line
                         for line in lines)
    for step in ("engine_test on the CUDA backend", "concurrency_test on the CUDA backend",
                 "driver_timing", "contract", "contract unmapped", "bandwidth", "batch", "create",
                 "check_engine.py"):
        assert f"PASS {step}" in run.stdout, step
    # Both C++ suites ran whole: their summaries say so, with no failure.
    summaries = re.findall(r"^(\d+) passed, (\d+) failed$", run.stdout, re.MULTILINE)
    assert len(summaries) == 2 and all(int(p) > 0 and f == "0" for p, f in summaries)
    assert "0 tensors wrong" in run.stdout and "kernels: not run in a dry run" in run.stdout
    assert re.search(r"contract, evicted tensors unmapped: .* 0 tensors wrong", run.stdout)
    assert re.search(r"batch: 8 evicted inputs .* 0 inputs read wrong", run.stdout)
    for location in ("device", "host"):
        assert re.search(rf"driver_timing {location} +2 MiB handles +unmap, one call the run",
                         run.stdout), location
    assert re.search(r"driver_timing copy +device->host", run.stdout)
    # Device memory in runs and host memory made ahead: whether a sub-range
    # maps at an offset, and its cost.
    for location in ("device", "host"):
        assert re.search(rf"driver_timing {location} \d+ MiB handle, a sub-range at a nonzero "
                         "offset: mapped", run.stdout), location
        assert re.search(rf"driver_timing {location} +64 MiB sub-ranges +map at offset \+ access",
                         run.stdout), location
    # An eviction's time, in its parts, for every pass.
    assert len(re.findall(r"pass \d: evict \d+ us a tensor: copying \d+, waiting \d+",
                          run.stdout)) == 3
    assert run.stdout.rstrip().endswith("every step passed")


@pytest.mark.slow
def test_gpu_check_engine_fails_when_a_step_fails():
    # A granule the backend refuses: the C++ tests abort, and the run says so.
    run = gpu_check_engine(LMS_GPU_CHECK_DRY_RUN=str(FAKE_DRIVER), LMS_TEST_GRANULE="12345")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL engine_test on the CUDA backend" in run.stdout
    assert "FAILED: engine_test on the CUDA backend concurrency_test" in run.stdout
