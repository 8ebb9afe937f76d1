"""The first run of LMS on a real GPU: is it there, does the backend keep its contract, does it train past the GPU's memory.

For a user with an NVIDIA GPU (``make gpu-check``). Three parts:

  1. the GPU: libcuda.so.1 is loaded and asked for its devices, driver
     version and whether GPU 0 supports what LMS needs (virtual memory
     management, host-located VMM memory); without a GPU the check says so
     and exits 2, before anything large is installed;
  2. the engine's contract over the CUDA backend on the real driver: tensors
     filled with patterns on a device they overflow 1.5x, evicted and paged
     back, every byte checked (the C++ contract tests need the fake driver's
     observers and knobs, so they run in `make test`, not here);
  3. ResNet-50 (keras.applications, weights=None, 10 classes, 224x224,
     synthetic data) on GPU:0: the largest batch that trains without LMS
     (doubling, then bisection), then 2x and 4x that batch with LMS. Every
     probe is a fresh process. A table of batch, images/s, bytes evicted and
     paged in, host waits and fences, and a verdict.

Exit status: 0 if every part passed, 1 if a part failed, 2 without a GPU.
Needs TensorFlow with GPU support (the Makefile target installs
``tensorflow[and-cuda]==2.21.0`` into .venv-gpu).

Example:
    make gpu-check
    .venv-gpu/bin/python benchmarks/gpu_check.py --steps 5 --image-size 224
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
NO_GPU_EXIT = 2


def driver_functions(cuda: ctypes.CDLL, *names: str) -> list[Any]:
    """Driver functions through cuGetProcAddress_v2, as the CUDA backend gets them.

    Example:
        >>> init, = driver_functions(ctypes.CDLL("libcuda.so.1"), "cuInit")  # doctest: +SKIP
    """
    get = cuda.cuGetProcAddress_v2
    get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                    ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
    functions = []
    for name in names:
        pointer, status = ctypes.c_void_p(), ctypes.c_int(0)
        if get(name.encode(), ctypes.byref(pointer), 12000, 0, ctypes.byref(status)) != 0:
            raise OSError(f"the driver has no {name} for CUDA 12.0")
        functions.append(ctypes.CFUNCTYPE(ctypes.c_int)(pointer.value))
    return functions


def find_gpu(driver: str) -> tuple[bool, str]:
    """(whether a CUDA GPU is usable, a one-line description or why not).

    Example:
        >>> find_gpu("libcuda.so.1")  # doctest: +SKIP
        (True, '1 GPU(s); GPU 0: NVIDIA A100-SXM4-40GB, driver 12.4')
    """
    try:
        cuda = ctypes.CDLL(driver)
        init, get_count, get_version, get_device, get_name = driver_functions(
            cuda, "cuInit", "cuDeviceGetCount", "cuDriverGetVersion", "cuDeviceGet",
            "cuDeviceGetName")
    except (OSError, AttributeError) as error:
        return False, f"no NVIDIA driver: {driver} could not be loaded ({error})"
    if init(ctypes.c_uint(0)) != 0:
        return False, f"{driver} is loaded but cuInit failed: no usable GPU"
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    if get_count(ctypes.byref(count)) != 0 or count.value == 0:
        return False, "the NVIDIA driver sees no GPU (check CUDA_VISIBLE_DEVICES)"
    get_version(ctypes.byref(version))
    name = ctypes.create_string_buffer(256)
    device = ctypes.c_int(0)
    get_device(ctypes.byref(device), ctypes.c_int(0))
    get_name(name, ctypes.c_int(len(name)), device)
    v = version.value
    return True, (f"{count.value} GPU(s); GPU 0: {name.value.decode()}, "
                  f"driver {v // 1000}.{v % 1000 // 10}")


def engine_contract_in_this_process(device_mb: int) -> int:
    """The engine over the CUDA backend: every byte survives eviction and page-in.

    Allocates 1.5x the device in 8 MiB tensors, each filled with its own
    pattern (through the backend's copies: device memory is not readable by
    the host), pins each in turn (paging it in) and checks every byte; prints
    one line and returns 0 if all survived and tensors were evicted and paged
    in.
    """
    from tensorflow_lms_allocator.engine import Engine

    mib = 1 << 20
    engine = Engine(device_bytes=device_mb * mib, host_bytes=2 * device_mb * mib,
                    backend="cuda", policy="lru")  # as the contract was first checked
    tensors = [engine.allocate(8 * mib) for _ in range(device_mb * 3 // 16)]
    for seed, address in enumerate(tensors):
        engine.fill_pattern(address, 8 * mib, seed=seed)
    bad = []
    for seed, address in enumerate(tensors):
        unit = engine.pin(address)
        if engine.verify_pattern(address, 8 * mib, seed=seed) != -1:
            bad.append(seed)
        engine.unpin(address, unit)
    stats = engine.stats()
    for address in tensors:
        engine.free(address)
    ok = not bad and stats["num_evictions"] > 0 and stats["num_page_ins"] > 0
    print(f"{len(tensors)} tensors of 8 MiB on a {device_mb} MiB device: "
          f"{len(tensors) - len(bad)} intact, {stats['num_evictions']} evictions, "
          f"{stats['num_page_ins']} page-ins, {stats.get('num_host_waits', 0)} host waits",
          flush=True)
    return 0 if ok else 1


def run_contract_tests(driver: str) -> tuple[bool, str]:
    """Runs the engine's contract check over the CUDA backend on `driver`; (passed, summary)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_LMS_CUDA_DRIVER_PATH"}
    if driver != "libcuda.so.1":
        env["TF_LMS_CUDA_DRIVER_PATH"] = driver
    proc = subprocess.run([sys.executable, __file__, "--probe-engine", "64"], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines() or proc.stderr.strip().splitlines()
    return proc.returncode == 0, (lines or ["(no output)"])[-1]


def train_in_this_process(batch: int, steps: int, image_size: int, lms: bool,
                          result_path: Path) -> int:
    """Trains ResNet-50 on GPU:0; writes {"step_seconds", "statistics"} as JSON."""
    os.environ["TF_LMS_ENABLED"] = "1" if lms else "0"
    import tensorflow_lms_allocator as lms_package  # before tensorflow

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from training_probe import run_resnet50_probe

    return run_resnet50_probe(batch, steps, image_size, result_path,
                              lms_package if lms else None, device="GPU:0")


@dataclass
class Run:
    batch: int
    lms: bool
    fits: bool
    reason: str = ""
    step_seconds: list[float] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def images_per_second(self) -> float:
        steady = self.step_seconds[1:] or self.step_seconds
        return self.batch / (sum(steady) / len(steady)) if steady else 0.0


def train(batch: int, lms: bool, args: argparse.Namespace) -> Run:
    """One training probe in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        command = [sys.executable, __file__, "--probe", str(batch), "--steps",
                   str(args.steps), "--image-size", str(args.image_size),
                   "--result", str(result_path)] + (["--lms"] if lms else [])
        try:
            proc = subprocess.run(command, capture_output=True, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return Run(batch, lms, False, f"timeout after {args.timeout:.0f} s")
        if proc.returncode != 0 or not result_path.exists():
            lines = [l for l in proc.stderr.splitlines() if "Error" in l] or ["(no error line)"]
            return Run(batch, lms, False, f"exit {proc.returncode}: {lines[-1][:160]}")
        data = json.loads(result_path.read_text())
        return Run(batch, lms, True, "", data["step_seconds"], data.get("statistics", {}))


def largest_batch_without_lms(args: argparse.Namespace, runs: list[Run]) -> int:
    """Doubles the batch until a run fails, then bisects; 0 if batch 1 fails."""
    good, bad = 0, None
    batch = args.start_batch
    while bad is None and batch <= args.max_batch:
        run = train(batch, False, args)
        runs.append(run)
        print(f"  no LMS, batch {batch}: {'fits' if run.fits else run.reason}", flush=True)
        if run.fits:
            good, batch = batch, batch * 2
        else:
            bad = batch
    while bad is not None and bad - good > max(1, good // 16):
        batch = (good + bad) // 2
        run = train(batch, False, args)
        runs.append(run)
        print(f"  no LMS, batch {batch}: {'fits' if run.fits else run.reason}", flush=True)
        good, bad = (batch, bad) if run.fits else (good, batch)
    return good


def format_table(runs: list[Run]) -> str:
    rows = ["batch  LMS  fits  images/s  evicted MiB  paged-in MiB  host waits  fences"]
    for r in runs:
        s = r.stats
        rows.append(f"{r.batch:5d}  {'on ' if r.lms else 'off'}  {'yes' if r.fits else 'no '}"
                    f"  {r.images_per_second():8.1f}"
                    f"  {s.get('bytes_reclaimed', 0) / 2**20:11.0f}"
                    f"  {s.get('bytes_paged_in', 0) / 2**20:12.0f}"
                    f"  {s.get('num_host_waits', 0):10d}  {s.get('num_fences', 0):6d}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per probe")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--start-batch", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=4096)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per probe")
    parser.add_argument("--driver", default=os.environ.get("TF_LMS_CUDA_DRIVER_PATH",
                                                           "libcuda.so.1"),
                        help="the CUDA driver library (default libcuda.so.1)")
    parser.add_argument("--gpu-only", action="store_true",
                        help="only part 1: is there a GPU LMS can use")
    parser.add_argument("--contract-only", action="store_true",
                        help="only parts 1 and 2: the GPU and the backend's contract tests")
    parser.add_argument("--probe", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--probe-engine", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--lms", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_engine is not None:
        return engine_contract_in_this_process(args.probe_engine)
    if args.probe is not None:
        return train_in_this_process(args.probe, args.steps, args.image_size, args.lms,
                                     args.result)

    found, description = find_gpu(args.driver)
    print(f"GPU: {description}", flush=True)
    if not found:
        print("gpu-check needs an NVIDIA GPU and its driver; nothing was run. On a "
              "machine without one, LMS runs on the emulated device "
              "(TF_LMS_CPU_DEVICE_MEMORY_MB): see the README.")
        return NO_GPU_EXIT
    if args.gpu_only:
        return 0
    ok, summary = run_contract_tests(args.driver)
    print(f"engine contract over the CUDA backend on {args.driver}: {summary}", flush=True)
    if args.contract_only:
        return 0 if ok else 1
    runs: list[Run] = []
    print("largest ResNet-50 batch without LMS:", flush=True)
    base = largest_batch_without_lms(args, runs)
    lms_runs = []
    if base > 0:
        for factor in (2, 4):
            run = train(base * factor, True, args)
            runs.append(run)
            lms_runs.append(run)
            print(f"  LMS, batch {run.batch}: {'fits' if run.fits else run.reason}",
                  flush=True)
    print(format_table([r for r in runs if r.fits or r.lms]))
    trained = base > 0 and all(r.fits for r in lms_runs)
    verdict = "PASS" if ok and trained else "FAIL"
    print(f"verdict: {verdict} (engine contract {'passed' if ok else 'failed'}; "
          f"largest batch without LMS {base}; with LMS "
          + ", ".join(f"{r.batch} {'trained' if r.fits else 'failed'}" for r in lms_runs)
          + ")")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
