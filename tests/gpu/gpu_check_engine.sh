#!/usr/bin/env bash
# make gpu-check-engine: the engine and the CUDA backend on a real GPU, with
# nothing to download and no TensorFlow (a machine with the NVIDIA driver,
# g++, CMake, ninja, nanobind and CuPy). Builds the engine, its Python
# module and its C++ tests against the real libcuda.so.1 (loaded at run
# time), then runs:
#   1. engine_test and concurrency_test on the GPU (LMS_TEST_BACKEND=cuda, no
#      fake: the granule is the driver's);
#   2. driver_timing: microseconds per granule of each VMM call;
#   3. check_engine.py: 1.5x the device of patterned tensors, evict and
#      page-in GB/s beside cudaMemcpyAsync pinned bandwidth, a kernel's
#      inputs paged in one by one and together (pin_all), CuPy kernels on
#      registered and unregistered streams under eviction, a 64 GiB device;
#      the contract, kernel and overlap steps also with evicted tensors
#      unmapped (TF_LMS_UNMAP_EVICTED).
# cuda_backend_test is not among them: every test of it drives the fake
# driver's knobs (injected failures, delays, host-run kernels, call counts).
#
# Without a GPU it says so and exits 2. LMS_GPU_CHECK_DRY_RUN=<fake driver
# .so> runs the same steps against the fake CUDA driver instead, every line
# labelled DRY RUN (make gpu-check-engine DRY_RUN=1).
# Environment: PYTHON (default: python3), CMAKE, BUILD_DIR, LMS_GPU_CHECK_DRIVER
# (the library probed for a GPU; default libcuda.so.1).
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build/gpu-check-engine}
FAKE=${LMS_GPU_CHECK_DRY_RUN:-}
label=""

if [[ -n "$FAKE" ]]; then
  [[ -f "$FAKE" ]] || { echo "gpu-check-engine: LMS_GPU_CHECK_DRY_RUN=$FAKE is not a file" >&2; exit 1; }
  export TF_LMS_CUDA_DRIVER_PATH=$(realpath "$FAKE")
  label=" DRY RUN against the fake CUDA driver, not a GPU"
else
  unset TF_LMS_CUDA_DRIVER_PATH
  if ! gpus=$("$PYTHON" - "${LMS_GPU_CHECK_DRIVER:-libcuda.so.1}" <<'EOF'
import ctypes, sys
driver = sys.argv[1]
try:
    cuda = ctypes.CDLL(driver)
except OSError as error:
    sys.exit(f"no NVIDIA driver ({driver}: {error})")
count = ctypes.c_int(0)
if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
    sys.exit("the NVIDIA driver sees no GPU")
print(count.value)
EOF
  ); then
    echo "gpu-check-engine: no GPU here, nothing checked. It needs an NVIDIA GPU and driver;" \
         "make gpu-check-engine DRY_RUN=1 runs its steps against the fake CUDA driver." >&2
    exit 2
  fi
  echo "gpu-check-engine: $gpus GPU(s); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
fi
say() { echo "gpu-check-engine$label: $*"; }

CMAKE=${CMAKE:-$(command -v cmake || echo "$(dirname "$PYTHON")/cmake")}
generator=()
if ninja=$(command -v ninja || ls "$(dirname "$PYTHON")/ninja" 2>/dev/null); then
  generator=(-G Ninja -DCMAKE_MAKE_PROGRAM="$ninja")
fi
mkdir -p "$(dirname "$BUILD_DIR")"
say "building the engine, _engine and the C++ tests in $BUILD_DIR"
# Without nanobind (or Python's headers) the C++ steps still run.
nanobind_dir=$("$PYTHON" -m nanobind --cmake_dir 2>/dev/null) || say "$PYTHON has no nanobind: no _engine"
if ! { "$CMAKE" -S . -B "$BUILD_DIR" "${generator[@]}" -DLMS_ENGINE_ONLY=ON \
         -DPython_EXECUTABLE="$(command -v "$PYTHON")" ${nanobind_dir:+-Dnanobind_DIR="$nanobind_dir"} >/dev/null &&
       "$CMAKE" --build "$BUILD_DIR" -j "$(nproc)"; } > "$BUILD_DIR.log" 2>&1; then
  tail -30 "$BUILD_DIR.log"
  say "FAIL: the build failed (log: $BUILD_DIR.log)"
  exit 1
fi

failed=()
run() {  # run NAME COMMAND...: prints its output, records a failure
  local name=$1; shift
  say "== $name"
  local start=$SECONDS
  if "$@"; then say "PASS $name ($((SECONDS - start)) s)"; else failed+=("$name"); say "FAIL $name"; fi
}
run "engine_test on the CUDA backend" env LMS_TEST_BACKEND=cuda "$BUILD_DIR/engine_test"
run "concurrency_test on the CUDA backend" env LMS_TEST_BACKEND=cuda "$BUILD_DIR/concurrency_test"
run "driver_timing" "$BUILD_DIR/driver_timing" $([[ -n "$FAKE" ]] && echo 64 || echo 1024)
run "check_engine.py" "$PYTHON" tests/gpu/check_engine.py --build "$BUILD_DIR" \
    $([[ -n "$FAKE" ]] && echo --dry-run)
if ((${#failed[@]})); then
  say "FAILED: ${failed[*]}"
  exit 1
fi
say "every step passed"
