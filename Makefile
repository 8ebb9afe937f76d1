# make test   the whole suite: the engine's thread-safety analysis, its C++ tests under
#             ASan/UBSan and TSan, then pytest
# make demo   the README's main job
# make bench-allocator   allocator benchmark against TensorFlow's own BFC allocator
#
# Every target bootstraps .venv (tensorflow-cpu 2.21.0 and the build tools) on
# first use, so a fresh clone needs only Python 3.11, pip, a C++ compiler and make.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
CXX ?= g++

CC_SRC := tensorflow_lms_allocator/cc
ENGINE_SRCS := $(wildcard $(CC_SRC)/engine/*.cc) $(wildcard $(CC_SRC)/backends/*.cc)
PACKAGE_SRCS := $(wildcard $(CC_SRC)/*/*.cc $(CC_SRC)/*/*.c $(CC_SRC)/*/*.h)
ENGINE_HDRS := $(wildcard $(CC_SRC)/engine/*.h) $(wildcard $(CC_SRC)/backends/*.h) \
               $(wildcard $(CC_SRC)/testing/*.h) tests/cc/harness.h
TEST_CXXFLAGS := -std=c++17 -g -Wall -Wextra -I$(CC_SRC) -Itests/cc -pthread
ASAN_FLAGS := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
TSAN_FLAGS := -O1 -fsanitize=thread
# clang (from the pinned ziglang wheel, so no system clang or root is needed)
# checks every LMS_GUARDED_BY / LMS_EXCLUSIVE_LOCKS_REQUIRED in the engine.
THREAD_SAFETY_FLAGS := -std=c++17 -c -Wall -Wextra -Wthread-safety -Wthread-safety-beta \
                       -Werror -I$(CC_SRC)

.PHONY: all build test test-asan test-tsan test-thread-safety test-python demo bench-allocator \
        bench-maxbatch bench-mincap clean test-gpu-wheel

all: build

$(VENV)/.bootstrapped: requirements-dev.txt
	@echo "== Bootstrapping $(VENV) with $(PYTHON): TensorFlow 2.21 and the build tools (a few minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off -r requirements-dev.txt
	touch $@

# The package, built in place (build/ is reused, so a rebuild compiles only what changed).
$(VENV)/.built: $(VENV)/.bootstrapped $(PACKAGE_SRCS) CMakeLists.txt pyproject.toml
	@echo "== Building tensorflow_lms_allocator"
	$(PY) -m pip install --quiet --no-build-isolation --no-deps -e .
	touch $@

build: $(VENV)/.built

$(BUILD)/cc/engine_test_asan: $(ENGINE_SRCS) $(ENGINE_HDRS) tests/cc/engine_test.cc
	@mkdir -p $(@D)
	@echo "== Compiling $@"
	$(CXX) $(TEST_CXXFLAGS) $(ASAN_FLAGS) $(ENGINE_SRCS) tests/cc/engine_test.cc -o $@

$(BUILD)/cc/concurrency_test_asan: $(ENGINE_SRCS) $(ENGINE_HDRS) tests/cc/concurrency_test.cc
	@mkdir -p $(@D)
	@echo "== Compiling $@"
	$(CXX) $(TEST_CXXFLAGS) $(ASAN_FLAGS) $(ENGINE_SRCS) tests/cc/concurrency_test.cc -o $@

$(BUILD)/cc/concurrency_test_tsan: $(ENGINE_SRCS) $(ENGINE_HDRS) tests/cc/concurrency_test.cc
	@mkdir -p $(@D)
	@echo "== Compiling $@"
	$(CXX) $(TEST_CXXFLAGS) $(TSAN_FLAGS) $(ENGINE_SRCS) tests/cc/concurrency_test.cc -o $@

test-asan: $(BUILD)/cc/engine_test_asan $(BUILD)/cc/concurrency_test_asan
	@echo "== Engine tests under ASan/UBSan"
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUILD)/cc/engine_test_asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 $(BUILD)/cc/concurrency_test_asan

test-tsan: $(BUILD)/cc/concurrency_test_tsan
	@echo "== Concurrency test under TSan"
	TSAN_OPTIONS=halt_on_error=1 $(BUILD)/cc/concurrency_test_tsan

$(BUILD)/cc/thread_safety.stamp: $(ENGINE_SRCS) $(ENGINE_HDRS) $(VENV)/.bootstrapped
	@mkdir -p $(@D)
	@echo "== Thread-safety analysis of the engine (clang -Wthread-safety -Werror)"
	@for f in $(ENGINE_SRCS); do \
	  $(PY) -m ziglang c++ $(THREAD_SAFETY_FLAGS) $$f -o $(BUILD)/cc/thread_safety.o || exit 1; \
	done
	touch $@

test-thread-safety: $(BUILD)/cc/thread_safety.stamp

# The GPU wheel (tensorflow==2.21.0, without the CUDA libraries of its
# and-cuda extra) in its own environment: the package built against it, every
# intercepted symbol checked against its libraries, and the emulated-device
# TensorFlow tests run with it (no GPU: TensorFlow runs its CPU device).
GPU_VENV := .venv-gpu-wheel
GPU_PY := $(GPU_VENV)/bin/python
GPU_WHEEL_TESTS := tests/test_c_api.py tests/test_tensorflow.py tests/test_tf_variables.py \
                   tests/test_tf_small_objects.py tests/test_tf_kernel_contexts.py \
                   tests/test_gpu_wiring.py

$(GPU_VENV)/.bootstrapped: requirements-dev.txt
	@echo "== Bootstrapping $(GPU_VENV) with the GPU wheel tensorflow==2.21.0 (about 600 MB the first time)"
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install --quiet --upgrade pip
	sed 's/^tensorflow-cpu==/tensorflow==/' requirements-dev.txt > $(GPU_VENV)/requirements.txt
	$(GPU_PY) -m pip install --progress-bar off -r $(GPU_VENV)/requirements.txt
	touch $@

$(GPU_VENV)/.built: $(GPU_VENV)/.bootstrapped $(PACKAGE_SRCS) CMakeLists.txt pyproject.toml
	@echo "== Building tensorflow_lms_allocator against the GPU wheel"
	$(GPU_PY) -m pip install --quiet --no-build-isolation --no-deps \
	    -C build-dir=$(BUILD)/gpu-wheel -e .
	touch $@

test-gpu-wheel: $(GPU_VENV)/.built fake-cuda
	@echo "== Intercepted symbols in the GPU wheel"
	$(GPU_PY) build_scripts/check_wheel_symbols.py
	@echo "== TensorFlow tests with the GPU wheel"
	LD_BIND_NOW=1 $(GPU_PY) -m pytest $(GPU_WHEEL_TESTS)

test-python: build
	@echo "== Python tests"
	$(PY) -m pytest tests

test: test-thread-safety test-asan test-tsan test-python

# ResNet-50 at batch 32 (about 900 MiB at its peak) in 256 MiB of emulated
# device memory: trains with LMS, runs out of memory without (about a minute).
demo: build
	$(PY) examples/demo.py

bench-allocator: MAKEFLAGS += --no-print-directory
bench-allocator: build
	$(MAKE) -C benchmarks PY=$(abspath $(PY)) bench-allocator

# Largest ResNet-50 batch under a 512 MiB cap, TensorFlow's BFC allocator vs
# LMS, and LMS on/off step time (about 12 minutes on two cores); the last line
# is `max_batch_ratio R`.
bench-maxbatch: build
	$(PY) benchmarks/maxbatch.py

# Smallest emulated device on which ResNet-50, DenseNet121 and a Transformer
# encoder still train with LMS, as a fraction of each one's peak; the last line
# is `min_cap_fraction F` (target <= 0.25).
bench-mincap: build
	$(PY) benchmarks/mincap.py

clean:
	rm -rf $(BUILD) $(VENV)/.built
