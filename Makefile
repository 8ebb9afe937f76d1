# make test   the whole suite: the thread-safety analysis, the engine's C++ tests under
#             ASan/UBSan and TSan, the fake CUDA driver's tests, then pytest
# make demo   the README's main job
# make bench-allocator   allocator benchmark against TensorFlow's own BFC allocator
# make fake-cuda   the fake CUDA driver of the tests (build/fake_cuda/libfakecuda*.so)
#
# Every target bootstraps .venv (tensorflow-cpu 2.21.0 and the build tools) on
# first use, so a fresh clone needs only Python 3.11, pip, a C++ compiler and make.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
# The builds the tests use carry the adapter's test-only C entry points
# (cc/tf_testing/c_api_testing.h); `make wheel` and `pip install` do not.
TEST_ENTRY_POINTS := -C cmake.define.LMS_TEST_ENTRY_POINTS=ON
PY := $(VENV)/bin/python
BUILD := build
CXX ?= g++

CC_SRC := tensorflow_lms_allocator/cc
ENGINE_SRCS := $(wildcard $(CC_SRC)/engine/*.cc) $(wildcard $(CC_SRC)/backends/*.cc)
PACKAGE_SRCS := $(wildcard $(CC_SRC)/*/*.cc $(CC_SRC)/*/*.c $(CC_SRC)/*/*.h)
# The adapter's unit tests are built with the package (CMakeLists.txt).
ADAPTER_TEST_SRCS := $(wildcard tests/cc/adapter/*)
ENGINE_HDRS := $(wildcard $(CC_SRC)/engine/*.h) $(wildcard $(CC_SRC)/backends/*.h) \
               $(wildcard $(CC_SRC)/testing/*.h) tests/cc/harness.h
TEST_CXXFLAGS := -std=c++17 -g -Wall -Wextra -I$(CC_SRC) -Itests/cc -pthread
ASAN_FLAGS := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
TSAN_FLAGS := -O1 -fsanitize=thread
# clang (from the pinned ziglang wheel, so no system clang or root is needed)
# checks every LMS_GUARDED_BY / LMS_EXCLUSIVE_LOCKS_REQUIRED in the engine and the
# fake CUDA driver (THREAD_SAFETY_FLAGS, below).
# The fake CUDA driver (tests/fake_cuda): a shared library exporting only the
# cuGetProcAddress bootstrap and its fake_cuda_* test API. Tests built with a
# sanitizer load the variant built with the same one (FAKE_CUDA_ASAN_LIB for
# ASAN_FLAGS binaries, FAKE_CUDA_TSAN_LIB for TSAN_FLAGS), by path through
# TF_LMS_CUDA_DRIVER_PATH, as the CUDA backend loads libcuda.so.1.
FAKE_CUDA_DIR := tests/fake_cuda
FAKE_CUDA_SRCS := $(wildcard $(FAKE_CUDA_DIR)/*.cc)
FAKE_CUDA_HDRS := $(wildcard $(FAKE_CUDA_DIR)/*.h) $(FAKE_CUDA_DIR)/exports.map \
                  $(CC_SRC)/backends/cuda_driver_api.h $(CC_SRC)/engine/thread_annotations.h \
                  $(CC_SRC)/engine/mutex.h
FAKE_CUDA_CXXFLAGS := -std=c++17 -g -Wall -Wextra -fPIC -shared -fvisibility=hidden \
                      -I$(CC_SRC) -I$(FAKE_CUDA_DIR) -pthread \
                      -Wl,--version-script=$(FAKE_CUDA_DIR)/exports.map
FAKE_CUDA_LIB := $(BUILD)/fake_cuda/libfakecuda.so
FAKE_CUDA_ASAN_LIB := $(BUILD)/fake_cuda/libfakecuda_asan.so
FAKE_CUDA_TSAN_LIB := $(BUILD)/fake_cuda/libfakecuda_tsan.so
# The CUDA driver API's cuda.h, against which tests/cc/cuda_abi_test.cc checks
# cuda_driver_api.h (only that test needs it): by default the one NVIDIA's
# nvidia-cuda-runtime 13.0 wheel installs into .venv (requirements-dev.txt), so
# no CUDA toolkit is needed; CUDA_INCLUDE=/usr/local/cuda/include checks a toolkit's.
VENV_CUDA_INCLUDE := $(VENV)/cuda_include
CUDA_INCLUDE ?= $(VENV_CUDA_INCLUDE)
# The engine's C++ tests run over both backends (tests/cc/test_backend.h):
# POSIX, then CUDA over the fake driver built with the same sanitizer.
ENGINE_TEST_HDRS := tests/cc/test_backend.h tests/cc/gated_backend.h tests/cc/fake_cuda_access.h \
                    tests/cc/harness.h tests/cc/engine/engine_test_util.h $(FAKE_CUDA_DIR)/fake_cuda.h
# The engine's unit tests, tests/cc/engine/PART_test.cc for cc/engine/PART.h
# and cc/backends/PART.h (engine_test.cc: the Engine's own, and main()),
# linked into one binary per sanitizer (CMakeLists.txt globs the same files).
ENGINE_UNIT_TESTS := $(wildcard tests/cc/engine/*_test.cc)
ENGINE_TEST_CXXFLAGS := -Itests
CUDA_TEST_ASAN := LMS_TEST_BACKEND=cuda TF_LMS_CUDA_DRIVER_PATH=$(FAKE_CUDA_ASAN_LIB)
CUDA_TEST_TSAN := LMS_TEST_BACKEND=cuda TF_LMS_CUDA_DRIVER_PATH=$(FAKE_CUDA_TSAN_LIB)
THREAD_SAFETY_FLAGS := -std=c++17 -c -Wall -Wextra -Wthread-safety -Wthread-safety-beta \
                       -Werror -I$(CC_SRC)

.PHONY: all build test test-asan test-tsan test-thread-safety test-python demo bench-allocator \
        bench-maxbatch bench-mincap bench-overhead bench-trace bench-profiler bench-scale bench-policy bench-small-pages clean fake-cuda test-fake-cuda mutation-check-cuda \
        test-gpu-wheel test-tf test-tf-matrix gpu-check gpu-check-engine bench-driver-calls \
        bench-gpu-model wheel \
        wheels test-wheels test-patches patches \
        test-quick test-adapter help

all: build

# $(call venv,DIR,TENSORFLOW): every virtual environment of the project is
# made by this one macro: DIR with requirements-dev.txt's build and test tools
# and its tensorflow-cpu line replaced by TENSORFLOW (a sed replacement: \1 is
# the file's version), or kept without one. An environment for another
# TensorFlow is made afresh each time; .venv is updated in place.
define venv
@echo "== Bootstrapping $(1) with $(PYTHON) and the build tools (a download of 250 MB to a few GB the first time)"
$(if $(2),rm -rf $(1))
$(PYTHON) -m venv $(1)
$(1)/bin/python -m pip install --quiet --upgrade pip
sed 's/^tensorflow-cpu==\(.*\)/$(or $(2),&)/' requirements-dev.txt > $(1)/requirements.txt
$(1)/bin/python -m pip install --progress-bar off -r $(1)/requirements.txt
touch $(1)/.bootstrapped
endef

# $(call venv-build,DIR,BUILD_DIR): the package built in place against DIR's
# TensorFlow, with the tests' entry points (BUILD_DIR is reused, so a rebuild
# compiles only what changed).
define venv-build
@echo "== Building tensorflow_lms_allocator against $$($(1)/bin/python -m pip list 2>/dev/null | grep -E '^tensorflow([-_]cpu)? ')"
$(1)/bin/python -m pip install --quiet --no-build-isolation --no-deps \
    -C build-dir=$(2) $(TEST_ENTRY_POINTS) -e .
touch $(1)/.built
endef

$(VENV)/.bootstrapped: requirements-dev.txt
	$(call venv,$(VENV))

$(VENV)/.built: $(VENV)/.bootstrapped $(PACKAGE_SRCS) $(ADAPTER_TEST_SRCS) CMakeLists.txt pyproject.toml
	$(call venv-build,$(VENV),$(BUILD)/{wheel_tag})

build: $(VENV)/.built

# The engine and backends are compiled once per sanitizer (one object per
# source, so a change recompiles that source only) and linked into each test.
ENGINE_ASAN_OBJS := $(patsubst $(CC_SRC)/%.cc,$(BUILD)/cc/asan/%.o,$(ENGINE_SRCS))
ENGINE_TSAN_OBJS := $(patsubst $(CC_SRC)/%.cc,$(BUILD)/cc/tsan/%.o,$(ENGINE_SRCS))
ENGINE_PLAIN_OBJS := $(patsubst $(CC_SRC)/%.cc,$(BUILD)/cc/plain/%.o,$(ENGINE_SRCS))

$(BUILD)/cc/plain/%.o: $(CC_SRC)/%.cc $(ENGINE_HDRS)
	@mkdir -p $(@D)
	$(CXX) $(TEST_CXXFLAGS) -O1 -c $< -o $@

$(BUILD)/cc/asan/%.o: $(CC_SRC)/%.cc $(ENGINE_HDRS)
	@mkdir -p $(@D)
	$(CXX) $(TEST_CXXFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(BUILD)/cc/tsan/%.o: $(CC_SRC)/%.cc $(ENGINE_HDRS)
	@mkdir -p $(@D)
	$(CXX) $(TEST_CXXFLAGS) $(TSAN_FLAGS) -c $< -o $@

# $(call engine-test,SANITIZER_FLAGS,OBJECTS): links the test source (the first
# prerequisite) with the engine's objects.
define engine-test
@echo "== Compiling $@"
$(CXX) $(TEST_CXXFLAGS) $(ENGINE_TEST_CXXFLAGS) $(1) $< $(2) -ldl -o $@
endef

# Each unit test file compiled alone (build/cc/{asan,plain}/tests/), so that
# editing one recompiles one.
ENGINE_UNIT_TEST_ASAN_OBJS := $(patsubst tests/cc/%.cc,$(BUILD)/cc/asan/tests/%.o,$(ENGINE_UNIT_TESTS))
ENGINE_UNIT_TEST_PLAIN_OBJS := $(patsubst tests/cc/%.cc,$(BUILD)/cc/plain/tests/%.o,$(ENGINE_UNIT_TESTS))

$(ENGINE_UNIT_TEST_ASAN_OBJS): $(BUILD)/cc/asan/tests/%.o: tests/cc/%.cc $(ENGINE_HDRS) $(ENGINE_TEST_HDRS)
	@mkdir -p $(@D)
	$(CXX) $(TEST_CXXFLAGS) $(ENGINE_TEST_CXXFLAGS) $(ASAN_FLAGS) -c $< -o $@

$(ENGINE_UNIT_TEST_PLAIN_OBJS): $(BUILD)/cc/plain/tests/%.o: tests/cc/%.cc $(ENGINE_HDRS) $(ENGINE_TEST_HDRS)
	@mkdir -p $(@D)
	$(CXX) $(TEST_CXXFLAGS) $(ENGINE_TEST_CXXFLAGS) -O1 -c $< -o $@

$(BUILD)/cc/engine_test_asan: $(ENGINE_UNIT_TEST_ASAN_OBJS) $(ENGINE_ASAN_OBJS)
	@echo "== Linking $@"
	$(CXX) $(TEST_CXXFLAGS) $(ASAN_FLAGS) $^ -ldl -o $@

$(BUILD)/cc/concurrency_test_asan: tests/cc/concurrency_test.cc $(ENGINE_ASAN_OBJS) $(ENGINE_HDRS) $(ENGINE_TEST_HDRS)
	$(call engine-test,$(ASAN_FLAGS),$(ENGINE_ASAN_OBJS))

$(BUILD)/cc/concurrency_test_tsan: tests/cc/concurrency_test.cc $(ENGINE_TSAN_OBJS) $(ENGINE_HDRS) $(ENGINE_TEST_HDRS)
	$(call engine-test,$(TSAN_FLAGS),$(ENGINE_TSAN_OBJS))

$(BUILD)/cc/engine_test_plain: $(ENGINE_UNIT_TEST_PLAIN_OBJS) $(ENGINE_PLAIN_OBJS)
	@echo "== Linking $@"
	$(CXX) $(TEST_CXXFLAGS) -O1 $^ -ldl -o $@

$(BUILD)/cc/concurrency_test_plain: tests/cc/concurrency_test.cc $(ENGINE_PLAIN_OBJS) $(ENGINE_HDRS) $(ENGINE_TEST_HDRS)
	$(call engine-test,-O1,$(ENGINE_PLAIN_OBJS))

test-asan: $(BUILD)/cc/engine_test_asan $(BUILD)/cc/concurrency_test_asan \
           $(BUILD)/cc/cuda_backend_test_asan $(FAKE_CUDA_ASAN_LIB)
	@echo "== Engine tests under ASan/UBSan (POSIX backend)"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUILD)/cc/engine_test_asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUILD)/cc/concurrency_test_asan
	@echo "== Engine tests under ASan/UBSan (POSIX backend, each way to huge pages whatever the machine allows; 2 MiB granules to collapse)"
	LMS_TEST_HUGE_PAGES=advise ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUILD)/cc/engine_test_asan
	LMS_TEST_HUGE_PAGES=collapse LMS_TEST_GRANULE=2097152 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  $(BUILD)/cc/engine_test_asan
	@echo "== Engine tests under ASan/UBSan (CUDA backend, fake driver)"
	$(CUDA_TEST_ASAN) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUILD)/cc/engine_test_asan
	$(CUDA_TEST_ASAN) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUILD)/cc/concurrency_test_asan
	@echo "== CUDA backend contract and stream-ordering tests under ASan/UBSan"
	$(CUDA_TEST_ASAN) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUILD)/cc/cuda_backend_test_asan

# TSan binaries run without address-space randomisation where the machine
# allows it (tests/cc/without_aslr.sh says why).
TSAN_RUN := TSAN_OPTIONS=halt_on_error=1 tests/cc/without_aslr.sh

test-tsan: $(BUILD)/cc/concurrency_test_tsan $(BUILD)/cc/cuda_backend_test_tsan \
           $(FAKE_CUDA_TSAN_LIB)
	@echo "== Concurrency test under TSan (POSIX, then CUDA over the fake driver)"
	$(TSAN_RUN) $(BUILD)/cc/concurrency_test_tsan
	$(CUDA_TEST_TSAN) $(TSAN_RUN) $(BUILD)/cc/concurrency_test_tsan
	@echo "== CUDA backend tests under TSan"
	$(CUDA_TEST_TSAN) $(TSAN_RUN) $(BUILD)/cc/cuda_backend_test_tsan

fake-cuda: $(FAKE_CUDA_LIB) $(FAKE_CUDA_ASAN_LIB) $(FAKE_CUDA_TSAN_LIB)

$(FAKE_CUDA_LIB): $(FAKE_CUDA_SRCS) $(FAKE_CUDA_HDRS)
	@mkdir -p $(@D)
	@echo "== Compiling $@"
	$(CXX) $(FAKE_CUDA_CXXFLAGS) -O2 $(FAKE_CUDA_SRCS) -o $@

$(FAKE_CUDA_ASAN_LIB): $(FAKE_CUDA_SRCS) $(FAKE_CUDA_HDRS)
	@mkdir -p $(@D)
	@echo "== Compiling $@"
	$(CXX) $(FAKE_CUDA_CXXFLAGS) $(ASAN_FLAGS) $(FAKE_CUDA_SRCS) -o $@

$(FAKE_CUDA_TSAN_LIB): $(FAKE_CUDA_SRCS) $(FAKE_CUDA_HDRS)
	@mkdir -p $(@D)
	@echo "== Compiling $@"
	$(CXX) $(FAKE_CUDA_CXXFLAGS) $(TSAN_FLAGS) $(FAKE_CUDA_SRCS) -o $@

$(BUILD)/cc/fake_cuda_test_asan: tests/cc/fake_cuda_test.cc tests/cc/harness.h $(FAKE_CUDA_HDRS)
	@mkdir -p $(@D)
	@echo "== Compiling $@"
	$(CXX) $(TEST_CXXFLAGS) -I$(FAKE_CUDA_DIR) $(ASAN_FLAGS) tests/cc/fake_cuda_test.cc -ldl -o $@

$(BUILD)/cc/fake_cuda_test_tsan: tests/cc/fake_cuda_test.cc tests/cc/harness.h $(FAKE_CUDA_HDRS)
	@mkdir -p $(@D)
	@echo "== Compiling $@"
	$(CXX) $(TEST_CXXFLAGS) -I$(FAKE_CUDA_DIR) $(TSAN_FLAGS) tests/cc/fake_cuda_test.cc -ldl -o $@

ifeq ($(CUDA_INCLUDE),$(VENV_CUDA_INCLUDE))
# A link to the wheel's include folder, wherever pip put it.
$(VENV_CUDA_INCLUDE)/cuda.h: $(VENV)/.bootstrapped
	ln -sfn "$$($(PY) -c 'import importlib.util as u, pathlib as p; \
	  print(p.Path(u.find_spec("nvidia.cu13").submodule_search_locations[0]) / "include")')" \
	  $(VENV_CUDA_INCLUDE)
	test -f $@
else
$(CUDA_INCLUDE)/cuda.h:
	@echo "error: $@ is missing. tests/cc/cuda_abi_test.cc checks cuda_driver_api.h" \
	      "against cuda.h: point CUDA_INCLUDE at the directory holding it, or leave" \
	      "CUDA_INCLUDE unset to use the one in .venv (nvidia-cuda-runtime)." >&2
	@exit 1
endif

$(BUILD)/cc/cuda_abi_test: tests/cc/cuda_abi_test.cc $(CC_SRC)/backends/cuda_driver_api.h $(CUDA_INCLUDE)/cuda.h
	@mkdir -p $(@D)
	@echo "== Compiling $@ (static checks against $(CUDA_INCLUDE)/cuda.h)"
	$(CXX) $(TEST_CXXFLAGS) -isystem $(CUDA_INCLUDE) tests/cc/cuda_abi_test.cc -o $@

# The fake driver's own tests under ASan/UBSan and TSan, each loading the
# library built with the same sanitizer, and the ABI check of the contract.
test-fake-cuda: $(BUILD)/cc/fake_cuda_test_asan $(BUILD)/cc/fake_cuda_test_tsan \
                $(FAKE_CUDA_ASAN_LIB) $(FAKE_CUDA_TSAN_LIB) $(BUILD)/cc/cuda_abi_test
	@echo "== cuda_driver_api.h against the toolkit's cuda.h"
	$(BUILD)/cc/cuda_abi_test
	@echo "== Fake CUDA driver tests under ASan/UBSan"
	TF_LMS_CUDA_DRIVER_PATH=$(FAKE_CUDA_ASAN_LIB) ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  $(BUILD)/cc/fake_cuda_test_asan
	@echo "== Fake CUDA driver tests under TSan"
	TF_LMS_CUDA_DRIVER_PATH=$(FAKE_CUDA_TSAN_LIB) $(TSAN_RUN) $(BUILD)/cc/fake_cuda_test_tsan

$(BUILD)/cc/thread_safety.stamp: $(ENGINE_SRCS) $(ENGINE_HDRS) $(FAKE_CUDA_SRCS) $(FAKE_CUDA_HDRS) \
                                 $(VENV)/.bootstrapped
	@mkdir -p $(@D)
	@echo "== Thread-safety analysis of the engine and the fake CUDA driver" \
	      "(clang -Wthread-safety -Werror)"
	@for f in $(ENGINE_SRCS) $(FAKE_CUDA_SRCS); do \
	  $(PY) -m ziglang c++ $(THREAD_SAFETY_FLAGS) -I$(FAKE_CUDA_DIR) $$f \
	    -o $(BUILD)/cc/thread_safety.o || exit 1; \
	done
	touch $@

# The adapter's annotated files, against TensorFlow's headers: only the
# analysis's own findings are errors (TensorFlow's headers warn under clang).
# zig's clang targets the machine's CPU; on one with AVX512-FP16 (Sapphire
# Rapids) Eigen's FP16 packet math in TensorFlow's headers does not compile
# under clang, so that extension is off for this analysis-only compile.
ADAPTER_ANNOTATED := $(addprefix $(CC_SRC)/tf_adapter/,kernel_pins.cc live_variables.cc runtime.cc device_registry.cc)
ADAPTER_ANALYSIS_FLAGS := $(if $(filter x86_64,$(shell uname -m)),-mno-avx512fp16)
$(BUILD)/cc/thread_safety_adapter.stamp: $(ADAPTER_ANNOTATED) $(wildcard $(CC_SRC)/tf_adapter/*.h) \
                                         $(ENGINE_HDRS) $(VENV)/.bootstrapped
	@mkdir -p $(@D)
	@echo "== Thread-safety analysis of the TensorFlow adapter (clang -Werror=thread-safety)"
	@TF_INCLUDE=$$($(PY) -c "import sysconfig, pathlib; print(pathlib.Path(sysconfig.get_paths()['purelib']) / 'tensorflow' / 'include')"); \
	for f in $(ADAPTER_ANNOTATED); do \
	  $(PY) -m ziglang c++ -std=c++17 -c -Wthread-safety -Werror=thread-safety-analysis \
	    $(ADAPTER_ANALYSIS_FLAGS) \
	    -Wno-deprecated-declarations -I$(CC_SRC) -I$$TF_INCLUDE -D_GLIBCXX_USE_CXX11_ABI=1 \
	    -DEIGEN_MAX_ALIGN_BYTES=64 -DLMS_BUILT_FOR_TF_VERSION='"2.21.0"' $$f \
	    -o $(BUILD)/cc/thread_safety_adapter.o > $(BUILD)/cc/thread_safety_adapter.log 2>&1 || \
	    { grep -B2 -A4 "thread-safety" $(BUILD)/cc/thread_safety_adapter.log; exit 1; }; \
	done
	touch $@

test-thread-safety: $(BUILD)/cc/thread_safety.stamp $(BUILD)/cc/thread_safety_adapter.stamp

# The TensorFlow versions LMS builds for from this one source (Keras 3: 2.16
# on). Each gets its own environment, .venv-tf-VERSION with tensorflow-cpu of
# that version (or .venv-gpu-wheel-VERSION with the GPU wheel), and build
# directory: `make test-tf VERSION=2.18.1`, `make test-tf-matrix`, `make wheels`.
TF_VERSIONS := 2.16.2 2.17.1 2.18.1 2.19.1 2.20.0 2.21.0
VERSION ?= 2.21.0
# $(call check-version): stops make unless VERSION is one of TF_VERSIONS.
check-version = $(if $(filter $(VERSION),$(TF_VERSIONS)),,$(error VERSION=$(VERSION) \
  is not a TensorFlow version LMS builds for; use one of: $(TF_VERSIONS)))

.venv-tf-%/.bootstrapped: requirements-dev.txt
	$(call venv,.venv-tf-$*,tensorflow-cpu==$*)

.venv-tf-%/.built: .venv-tf-%/.bootstrapped $(PACKAGE_SRCS) $(ADAPTER_TEST_SRCS) CMakeLists.txt pyproject.toml
	$(call venv-build,.venv-tf-$*,$(BUILD)/tf-$*)

.venv-gpu-wheel-%/.bootstrapped: requirements-dev.txt
	$(call venv,.venv-gpu-wheel-$*,tensorflow==$*)

.venv-gpu-wheel-%/.built: .venv-gpu-wheel-%/.bootstrapped $(PACKAGE_SRCS) $(ADAPTER_TEST_SRCS) CMakeLists.txt pyproject.toml
	$(call venv-build,.venv-gpu-wheel-$*,$(BUILD)/gpu-wheel-$*)

.PRECIOUS: .venv-tf-%/.bootstrapped .venv-tf-%/.built .venv-gpu-wheel-%/.bootstrapped \
           .venv-gpu-wheel-%/.built

# What a user of an older TensorFlow relies on: the demo (ResNet-50 trains
# under a cap with LMS and stops with a clean OOM without), then the tests
# marked `tensorflow` (bit-identical Keras training under eviction and strict
# mode, variables pinned, the tf.config.experimental API and statistics, the
# callbacks, tf.data batches with known contents, the C API).
test-tf:
	$(call check-version)
	$(MAKE) .venv-tf-$(VERSION)/.built
	@echo "== TensorFlow $(VERSION): symbols LMS interposes and links"
	.venv-tf-$(VERSION)/bin/python build_scripts/check_wheel_symbols.py
	@echo "== TensorFlow $(VERSION): the demo"
	.venv-tf-$(VERSION)/bin/python examples/demo.py
	@echo "== TensorFlow $(VERSION): tests"
	.venv-tf-$(VERSION)/bin/python -m pytest -q -p no:cacheprovider -m tensorflow tests

# make test-tf for every version, one after the other (a download of about
# 250 MB each the first time; 30-60 minutes): writes the table of results into
# docs/tensorflow-versions.md and the README.
test-tf-matrix:
	$(PYTHON) build_scripts/tf_matrix.py $(TF_VERSIONS)

# The GPU wheel (tensorflow==VERSION, default 2.21.0, without the CUDA
# libraries of its and-cuda extra) in its own environment: the package built
# against it, every intercepted symbol checked against its libraries, and the
# emulated-device TensorFlow tests run with it (no GPU: TensorFlow runs its CPU
# device): the tests marked `gpu_wheel`.

test-gpu-wheel: $(FAKE_CUDA_LIB)
	$(call check-version)
	$(MAKE) .venv-gpu-wheel-$(VERSION)/.built
	@echo "== Intercepted symbols in the GPU wheel of TensorFlow $(VERSION)"
	.venv-gpu-wheel-$(VERSION)/bin/python build_scripts/check_wheel_symbols.py
	@echo "== TensorFlow tests with the GPU wheel of TensorFlow $(VERSION)"
	LD_BIND_NOW=1 .venv-gpu-wheel-$(VERSION)/bin/python -m pytest -m gpu_wheel tests

# The CUDA backend's own tests (contract, fault injection, stream order).
$(BUILD)/cc/cuda_backend_test_asan: tests/cc/cuda_backend_test.cc $(ENGINE_ASAN_OBJS) \
                                    $(ENGINE_HDRS) $(ENGINE_TEST_HDRS)
	$(call engine-test,$(ASAN_FLAGS),$(ENGINE_ASAN_OBJS))

$(BUILD)/cc/cuda_backend_test_tsan: tests/cc/cuda_backend_test.cc $(ENGINE_TSAN_OBJS) \
                                    $(ENGINE_HDRS) $(ENGINE_TEST_HDRS)
	$(call engine-test,$(TSAN_FLAGS),$(ENGINE_TSAN_OBJS))

# Driver calls per device creation and per GiB evicted and paged in, as the
# fake driver counts them (the time they take on a GPU: driver_timing, in
# make gpu-check-engine).
bench-driver-calls: $(BUILD)/cc/cuda_backend_test_asan $(FAKE_CUDA_ASAN_LIB)
	$(CUDA_TEST_ASAN) $(BUILD)/cc/cuda_backend_test_asan DriverCallsPerGranule

# Recorded TensorFlow steps replayed through the engine over the CUDA backend on
# the fake driver's timing model of an H200 (benchmarks/README.md); the last
# line is the worst case's gpu_step_vs_ideal. About 7 minutes.
bench-gpu-model: build $(FAKE_CUDA_LIB)
	TF_LMS_CUDA_DRIVER_PATH=$(abspath $(FAKE_CUDA_LIB)) FAKE_CUDA_DEVICE_MB=8192 \
	  FAKE_CUDA_HOST_MB=16384 $(PY) benchmarks/gpu_model.py $(GPU_MODEL_ARGS)

# Proves the stream-ordering tests fail without the fence or the host wait
# (tests/cc/mutation_check.py; mutated copies live in build/, never in the
# sources). About a minute; not part of `make test`.
mutation-check-cuda: $(FAKE_CUDA_LIB)
	$(PY) tests/cc/mutation_check.py $(BUILD)/mutation $(CXX) $(FAKE_CUDA_LIB)

# For a user with an NVIDIA GPU: is the GPU usable by LMS (checked before
# anything is installed), the engine's contract on the real driver, then
# ResNet-50 on GPU:0 at the largest batch without LMS and 2x and 4x it with
# LMS. Installs tensorflow[and-cuda]==2.21.0 into .venv-gpu (several GB).
# Without a GPU it says so and exits 2.
GPU_CHECK_VENV := .venv-gpu
$(GPU_CHECK_VENV)/.bootstrapped: requirements-dev.txt
	$(call venv,$(GPU_CHECK_VENV),tensorflow[and-cuda]==\1)

$(GPU_CHECK_VENV)/.built: $(GPU_CHECK_VENV)/.bootstrapped $(PACKAGE_SRCS) $(ADAPTER_TEST_SRCS) CMakeLists.txt pyproject.toml
	$(call venv-build,$(GPU_CHECK_VENV),$(BUILD)/gpu-check)

gpu-check:
	@$(PYTHON) benchmarks/gpu_check.py --gpu-only
	$(MAKE) $(GPU_CHECK_VENV)/.built
	$(GPU_CHECK_VENV)/bin/python benchmarks/gpu_check.py

# The engine and the CUDA backend on a GPU machine with no network and no
# TensorFlow (the NVIDIA driver, g++, CMake, ninja, nanobind, CuPy): its C++
# tests, driver call timings, real kernels under eviction, bandwidth beside
# cudaMemcpyAsync (tests/gpu/gpu_check_engine.sh). Without a GPU it says so
# and exits 2; DRY_RUN=1 runs its steps against the fake CUDA driver.
ifeq ($(DRY_RUN),1)
gpu-check-engine: $(VENV)/.bootstrapped $(FAKE_CUDA_LIB)
	LMS_GPU_CHECK_DRY_RUN=$(FAKE_CUDA_LIB) PYTHON=$(PY) bash tests/gpu/gpu_check_engine.sh
else
gpu-check-engine:
	bash tests/gpu/gpu_check_engine.sh
endif

# A wheel for installing LMS into another environment that has the same
# TensorFlow (README, Install). It is built against the TensorFlow in .venv and
# refuses, at import, to load into another TensorFlow version.
wheel: build
	$(PY) -m pip wheel --quiet --no-build-isolation --no-deps \
	    -C cmake.define.LMS_TEST_ENTRY_POINTS=OFF -w dist .
	@$(PY) build_scripts/wheel_info.py dist

# One wheel per TensorFlow version (TF_VERSIONS) into dist/, each built in the
# environment of `make test-tf VERSION=...` against that version's headers:
# tensorflow_lms_allocator-0.1.0+tf2.18.1-...whl and so on (README, Install).
wheels:
	@for v in $(TF_VERSIONS); do \
	  $(MAKE) --no-print-directory .venv-tf-$$v/.bootstrapped || exit 1; \
	  echo "== Wheel for TensorFlow $$v"; \
	  .venv-tf-$$v/bin/python -m pip wheel --quiet --no-build-isolation --no-deps \
	      -C build-dir=$(BUILD)/wheel-$$v -C cmake.define.LMS_TEST_ENTRY_POINTS=OFF \
	      -w dist . || exit 1; \
	done
	@$(PYTHON) build_scripts/wheel_info.py dist $(TF_VERSIONS)

# Each wheel of `make wheels` installed with its [cpu] extra into a fresh
# environment (build/wheel-check/VERSION), which pins its TensorFlow, and the
# demo run there (outside CI: six downloads and six demos, about 15 minutes).
test-wheels:
	$(PYTHON) build_scripts/check_wheels.py dist $(TF_VERSIONS)

# The 15 slowest tests are listed at the end: the suite must stay under 20
# minutes in CI.
#
# Two pytest workers (pytest-xdist), a test file each at a time: many tests
# run TensorFlow with one intra-op and one inter-op thread (bit-exact
# comparisons), so one after the other left a core idle (measured here: 361
# tests in 10m16s with three workers, against 16m20s for the TensorFlow tests
# in one pytest with the others beside them). Not three in CI: TensorFlow's
# spinning thread pools made a test of several models 7x slower, near its
# timeout.
#
# MARKERS chooses which (pyproject.toml's markers): while iterating,
# `make test-python MARKERS="not patches and not slow"` leaves out the tests
# of a minute or more.
MARKERS ?= not patches
test-python: build $(FAKE_CUDA_LIB)
	@echo "== Python tests (two workers)"
	$(PY) -m pytest tests -m "$(MARKERS)" -n 2 --dist loadfile --durations=15

# The source patch for TensorFlow v2.21.0 (patches/README.md), checked against
# TensorFlow's real files (the wheel's, and TF_SOURCE_DIR's, by default
# ../shared/tensorflow-source/pre-v2.21.0): never stale, applies with plain
# git am, every hunk's context also after the tag, BUILD labels exist, new C++
# compiles with tf_copts() against the wheel's headers, the patched Python API
# works on the stock wheel; the wheel build script's commands match the tree.
test-patches: build
	@echo "== Source patch checks"
	$(PY) -m pytest -q -m patches tests

# The adapter's C++ unit tests (tests/cc/adapter/PART_test.cc for
# cc/tf_adapter/PART.h): built by `make build` against the TensorFlow in .venv
# and installed beside the adapter there.
test-adapter: build
	@echo "== The adapter's C++ unit tests"
	TF_CPP_MIN_LOG_LEVEL=2 "$$($(PY) -c 'import importlib.util as u, pathlib as p; \
	  print(p.Path(u.find_spec("tensorflow_lms_allocator._engine").origin).parent / "adapter_test")')"

# Regenerates the series (patches/tensorflow_v2.21.0_large_model_support.patch)
# after a change to the engine, backends or adapter.
patches: build
	$(PY) build_scripts/make_patches.py

# The C++ suites and the patch checks build and run two at a time (each step
# is one compiler or one test process; CI machines have two cores), each
# target's output printed whole when it ends; pytest runs alone after them,
# since its TensorFlow programs wait on one another's kernels.
CHECKS := test-thread-safety test-asan test-tsan test-fake-cuda test-patches test-adapter
test:
	$(MAKE) -j2 --output-sync=target $(CHECKS)
	$(MAKE) test-python

# For iterating (about 2 minutes, not a substitute for `make test`): the
# engine's C++ tests over POSIX without sanitizers, and the pytest files that
# run no TensorFlow training (the engine, its model-based test, traces,
# replay, statistics tools, settings parsing in-process): the tests marked
# `quick`.
test-quick: build $(FAKE_CUDA_LIB) $(BUILD)/cc/engine_test_plain $(BUILD)/cc/concurrency_test_plain
	@echo "== Engine tests (POSIX backend, no sanitizer)"
	$(BUILD)/cc/engine_test_plain
	$(BUILD)/cc/concurrency_test_plain
	@echo "== Quick Python tests"
	$(PY) -m pytest -q -m quick tests
	$(MAKE) --no-print-directory test-adapter

# Every target with one line; tests/test_makefile.py checks that none is missing.
define HELP
make demo                the README's main job: ResNet-50 trained in 256 MiB of emulated device memory
make test                the whole suite (what CI runs): C++ under sanitizers, patch checks, pytest
make test-quick          about 2 minutes: engine C++ tests without sanitizers, quick pytest files, adapter tests
make test-python         the pytest suite without the patch checks (MARKERS="not patches and not slow": faster)
make test-asan           engine unit and concurrency tests under ASan/UBSan (POSIX and the fake CUDA driver)
make test-tsan           the concurrency tests under ThreadSanitizer
make test-thread-safety  clang -Wthread-safety -Werror over the engine, the fake driver and the adapter
make test-fake-cuda      the fake CUDA driver's own tests, and cuda_driver_api.h against cuda.h
make test-patches        the source patch series and the wheel build script, against TensorFlow's files
make test-adapter        the TensorFlow adapter's C++ unit tests (kernel pins, the device registry)
make test-gpu-wheel      the package against the GPU wheel tensorflow==VERSION (default 2.21.0): symbols, TF tests
make test-tf             the package against tensorflow-cpu==VERSION (2.16.2-2.21.0): symbols, demo, TF tests
make test-tf-matrix      make test-tf for every supported TensorFlow; writes the README's table
make mutation-check-cuda proves the stream-ordering tests fail without the fence or the waits
make gpu-check           the acceptance run on a real GPU (exits 2 without one)
make gpu-check-engine    the engine and CUDA backend on a real GPU, no TensorFlow (DRY_RUN=1: the fake)
make build               (re)build the package into .venv
make all                 the same as make build
make wheel               a wheel for your own environment (dist/)
make wheels              one wheel per supported TensorFlow version (dist/)
make test-wheels         each wheel of make wheels in a fresh environment with its TensorFlow: the demo
make patches             regenerate the TensorFlow patch series (TF_SOURCE_DIR: TensorFlow's files)
make fake-cuda           the fake CUDA driver of the tests (build/fake_cuda/)
make bench-allocator     a CNN-shaped trace through TensorFlow's BFC allocator and the engine
make bench-maxbatch      largest ResNet-50 batch under a cap: TensorFlow's BFC allocator vs LMS
make bench-mincap        smallest device on which the benchmark models train, / their peak
make bench-overhead      step time under LMS vs the copy floor, by category
make bench-policy        LRU, learned, perfect-foresight and Belady eviction on recorded traces and real training
make bench-small-pages   swap bytes with small-object size classes vs one class, on replayed traces
make bench-trace         what recording an access trace costs a training step
make bench-profiler      what TensorFlow's profiler, with LMS's events, costs a training step
make bench-scale         the engine's per-operation costs from 1,000 to 100,000 live units
make bench-driver-calls  CUDA driver calls per GiB evicted and paged in (fake driver)
make bench-gpu-model     recorded steps on a modeled H200: step vs compute and copies (fake driver)
make clean               remove build/ and the package build stamp
make help                this list
endef
export HELP
help:
	@echo "$$HELP"

# ResNet-50 at batch 32 (about 900 MiB at its peak) in 256 MiB of emulated
# device memory: trains with LMS, runs out of memory without (about a minute).
demo: build
	$(PY) examples/demo.py

bench-allocator: MAKEFLAGS += --no-print-directory
bench-allocator: build
	$(MAKE) -C benchmarks PY=$(abspath $(PY)) bench-allocator

# The engine's per-operation costs (allocate+free, pin+unpin, reclaim and its
# planning) at 1,000, 10,000 and 100,000 live units of a synthetic
# transformer-shaped step (benchmarks/scale_bench.cc); the last line is
# `cost_growth_1k_to_100k R` (target 1.5).
bench-scale: MAKEFLAGS += --no-print-directory
bench-scale:
	$(MAKE) -C benchmarks bench-scale

# Largest ResNet-50 batch under a 512 MiB cap, TensorFlow's BFC allocator vs
# LMS, and LMS on/off step time (about 12 minutes on two cores); the last line
# is `max_batch_ratio R`.
bench-maxbatch: build
	$(PY) benchmarks/maxbatch.py

# Smallest emulated device on which ResNet-50, DenseNet121 and a Transformer
# encoder still train with LMS, as a fraction of each one's peak and over its
# floor (the most one kernel pins at once); the last lines are
# `min_cap_fraction F` (target <= 0.25) and `min_cap_vs_floor R` (target 1.2).
bench-mincap: build
	$(PY) benchmarks/mincap.py

# Where a swapped byte's time goes: step time at 1/2 and 1/4 of the peak over
# the uncapped step, beside the copy floor and the time LMS accounted
# (benchmarks/overhead.py; last line overhead_vs_copy_floor). PAIRED=1: each
# model's sizes in one process, by holding device memory (overhead_paired.py).
bench-overhead: build
	$(PY) benchmarks/overhead.py $(if $(PAIRED),--paired)

# Eviction policies (LRU, learned, Belady) on traces and real training
# (benchmarks/README.md).
bench-policy: build
	$(PY) benchmarks/policy.py

# Small-object size classes vs one class, on replayed traces (benchmarks/README.md).
bench-small-pages: build
	$(PY) benchmarks/small_pages.py

# What recording an access trace costs a training step (benchmarks/README.md).
bench-trace: build
	$(PY) benchmarks/trace_overhead.py

bench-profiler: build
	$(PY) benchmarks/trace_overhead.py --observe profiler

clean:
	rm -rf $(BUILD) $(VENV)/.built
