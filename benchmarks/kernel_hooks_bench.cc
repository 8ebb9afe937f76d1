// Times the adapter's kernel-context hooks: OnContextCreated +
// OnContextDestroyed for Params with no inputs, two small (never evicted)
// inputs and two large (pinned) inputs, on an emulated device. It loads an
// adapter library (argument 1), captures the hooks it registers by defining
// tf_lms_register_hooks itself, and calls them with a fake context (no
// DT_RESOURCE input, so no OpKernelContext is needed).
//
// Not wired into make; build and run from the repository root:
//   TF=$(.venv/bin/python -c 'import tensorflow as tf; print(tf.sysconfig.get_lib())')
//   g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=1 -DEIGEN_MAX_ALIGN_BYTES=64 -w \
//       -I$TF/include benchmarks/kernel_hooks_bench.cc -o build/kernel_hooks_bench \
//       -rdynamic -L$TF -l:libtensorflow_framework.so.2 -Wl,-rpath,$TF -ldl
//   taskset -c 1 build/kernel_hooks_bench \
//       .venv/lib/python3.11/site-packages/tensorflow_lms_allocator/libtf_lms_adapter.so
// Compare two builds of the adapter by passing each library in turn.
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

// The TensorFlow version the adapter checks for (tf_lms_configure).
#ifndef LMS_TF_VERSION
#define LMS_TF_VERSION "2.21.0"
#endif

extern "C" {
// Must match tensorflow_lms_allocator/cc/interposer/lms_hooks.h.
typedef struct TfLmsHooks {
  void (*on_context_created)(void*, void*);
  void (*on_context_destroyed)(void*);
  void* (*cpu_allocator)(void*, int);
  void* (*gpu_allocator)(void*, int);
} TfLmsHooks;
static const TfLmsHooks* g_hooks;
__attribute__((visibility("default"))) int tf_lms_register_hooks(const TfLmsHooks* h) {
  g_hooks = h;
  return 0;
}
}

namespace {

using tensorflow::TensorValue;

// Best of 9 rounds of `n` create+destroy pairs, in ns per pair.
double Time(std::vector<TensorValue>& inputs, int n) {
  tensorflow::OpKernelContext::Params params;
  params.inputs = inputs;
  alignas(64) static char context[1024];
  double best = 1e9;
  for (int r = 0; r < 9; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      g_hooks->on_context_created(context, &params);
      g_hooks->on_context_destroyed(context);
    }
    const double ns = std::chrono::duration<double, std::nano>(
                          std::chrono::steady_clock::now() - start).count() / n;
    if (ns < best) best = ns;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ADAPTER.so [PAIRS]\n", argv[0]);
    return 2;
  }
  ::setenv("TF_LMS_CPU_DEVICE_MEMORY_MB", "256", 1);
  ::setenv("TF_LMS_ENABLED", "1", 1);
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  auto configure = reinterpret_cast<int (*)(const char*, char*, size_t)>(
      dlsym(lib, "tf_lms_configure"));
  char error[512];
  if (configure == nullptr || configure(LMS_TF_VERSION, error, sizeof(error)) != 0) {
    std::fprintf(stderr, "tf_lms_configure failed: %s\n", configure ? error : dlerror());
    return 1;
  }
  auto* allocator = static_cast<tensorflow::Allocator*>(g_hooks->cpu_allocator(nullptr, 0));
  tensorflow::Tensor small(allocator, tensorflow::DT_FLOAT, tensorflow::TensorShape({16}));
  tensorflow::Tensor big1(allocator, tensorflow::DT_FLOAT, tensorflow::TensorShape({1 << 20}));
  tensorflow::Tensor big2(allocator, tensorflow::DT_FLOAT, tensorflow::TensorShape({1 << 20}));
  std::vector<TensorValue> none;
  std::vector<TensorValue> smalls = {TensorValue(&small), TensorValue(&small)};
  std::vector<TensorValue> bigs = {TensorValue(&big1), TensorValue(&big2)};
  const int n = argc > 2 ? std::atoi(argv[2]) : 400000;
  std::printf("%-40s %6.1f ns\n", "no inputs", Time(none, n));
  std::printf("%-40s %6.1f ns\n", "2 small (not evictable) inputs", Time(smalls, n));
  std::printf("%-40s %6.1f ns\n", "2 large (pinned) inputs", Time(bigs, n));
  return 0;
}
