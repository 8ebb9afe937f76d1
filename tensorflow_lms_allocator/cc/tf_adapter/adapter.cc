// The TensorFlow adapter's entry points: the hooks the interposer calls, and
// the C functions the Python package calls through ctypes. No exception
// leaves this file; failures are return codes with a message.
//
// Lifecycle: Python loads the interposer (global scope) before TensorFlow,
// imports TensorFlow, loads this library (private scope) and calls
// tf_lms_configure(), which checks the TensorFlow version, reads the
// environment and registers the hooks. The emulated device's engine is
// created on the first GetCPUAllocator call, when TensorFlow creates its
// devices; from then on LMS can no longer be switched on or off.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "backends/posix_backend.h"
#include "engine/env_options.h"
#include "interposer/lms_hooks.h"
#include "tf_adapter/kernel_pins.h"
#include "tf_adapter/lms_allocator.h"

#ifndef LMS_BUILT_FOR_TF_VERSION
#error "LMS_BUILT_FOR_TF_VERSION must name the TensorFlow version built against"
#endif

namespace lms {
namespace {

struct AdapterState {
  std::mutex mu;
  // Settings; frozen once the device exists.
  bool lms_enabled = false;
  // On by default: remapping free granules moves no data, so it costs only
  // mapping calls and spares evictions (IBM's was off because its
  // defragmentation moved tensors).
  bool defrag_enabled = true;
  bool strict = false;
  size_t device_bytes = 0;  // 0: no emulated device
  size_t host_bytes = kDefaultHostLimitBytes;
  // The emulated device, once TensorFlow created it.
  std::unique_ptr<KernelPins> pins;
  // The hooks read this without the lock: it is set once, before TensorFlow
  // runs a kernel on the device.
  std::atomic<KernelPins*> active_pins{nullptr};
  std::unique_ptr<LmsAllocator> allocator;
  bool device_created = false;
  std::string device_error;
  bool gpu_warned = false;
};

AdapterState& State() {
  static AdapterState* state = new AdapterState();  // never destroyed: TF outlives us
  return *state;
}

int Fail(const std::string& message, char* error, size_t error_len) {
  if (error != nullptr && error_len > 0) {
    std::snprintf(error, error_len, "%s", message.c_str());
  }
  return 1;
}

void* CpuAllocatorHook(void* original, int /*numa_node*/) {
  AdapterState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.allocator != nullptr) return st.allocator.get();
  if (st.device_created || st.device_bytes == 0) {
    st.device_created = true;
    return original;
  }
  st.device_created = true;
  std::unique_ptr<Backend> backend;
  Status s = PosixBackend::Create(size_t{2} << 20, &backend);
  EngineOptions options;
  options.device_bytes = st.device_bytes;
  options.host_bytes = st.host_bytes;
  options.lms_enabled = st.lms_enabled;
  options.defrag_enabled = st.defrag_enabled;
  options.strict = st.strict;
  std::unique_ptr<Engine> engine;
  if (s.ok()) s = Engine::Create(options, std::move(backend), &engine);
  if (!s.ok()) {
    st.device_error = "the emulated device (TF_LMS_CPU_DEVICE_MEMORY_MB) could not be "
                      "created: " + s.ToString();
    std::fprintf(stderr, "tensorflow_lms_allocator: %s; CPU:0 runs without it\n",
                 st.device_error.c_str());
    return original;
  }
  st.pins = std::make_unique<KernelPins>(engine.get());
  st.active_pins.store(st.pins.get(), std::memory_order_release);
  st.allocator = std::make_unique<LmsAllocator>("lms_emulated_device", std::move(engine),
                                                st.pins.get());
  return st.allocator.get();
}

void* GpuAllocatorHook(void* original, int tf_device_id) {
  AdapterState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.lms_enabled && !st.gpu_warned) {
    st.gpu_warned = true;
    std::fprintf(stderr,
                 "tensorflow_lms_allocator: ERROR: LMS is enabled but this build has no "
                 "GPU backend yet; GPU:%d uses TensorFlow's own allocator, without LMS\n",
                 tf_device_id);
  }
  return original;
}

void ContextCreatedHook(void* context, void* params) {
  KernelPins* pins = State().active_pins.load(std::memory_order_acquire);
  if (pins != nullptr) pins->OnContextCreated(context, params);
}

void ContextDestroyedHook(void* context) {
  KernelPins* pins = State().active_pins.load(std::memory_order_acquire);
  if (pins != nullptr) pins->OnContextDestroyed(context);
}

const TfLmsHooks kHooks = {ContextCreatedHook, ContextDestroyedHook, CpuAllocatorHook,
                           GpuAllocatorHook};

Engine* DeviceEngine() {
  AdapterState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.allocator != nullptr ? &st.allocator->engine() : nullptr;
}

// The statistics, in the order tf_lms_statistic_name() lists them.
#define LMS_NAME(n) #n,
const char* const kStatisticNames[] = {LMS_FOR_EACH_STATISTIC(LMS_NAME)};
#undef LMS_NAME
constexpr int kNumStatistics = sizeof(kStatisticNames) / sizeof(kStatisticNames[0]);

}  // namespace
}  // namespace lms

extern "C" {

// Checks the TensorFlow version, reads the environment (TF_LMS_ENABLED,
// TF_LMS_DEFRAG_ENABLED, TF_LMS_STRICT, TF_LMS_CPU_DEVICE_MEMORY_MB,
// TF_GPU_HOST_MEM_LIMIT_IN_MB) and registers the hooks with the interposer.
__attribute__((visibility("default"))) int tf_lms_configure(const char* tf_version,
                                                            char* error, size_t error_len) {
  using namespace lms;
  if (std::strcmp(tf_version, LMS_BUILT_FOR_TF_VERSION) != 0) {
    return Fail(std::string("tensorflow_lms_allocator was built for TensorFlow ") +
                    LMS_BUILT_FOR_TF_VERSION + " but TensorFlow " + tf_version +
                    " is installed; install tensorflow==" LMS_BUILT_FOR_TF_VERSION
                    " or rebuild the package against this TensorFlow",
                error, error_len);
  }
  AdapterState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  bool present = false;
  Status s = FlagFromEnv("TF_LMS_ENABLED", &present, &st.lms_enabled);
  if (s.ok()) s = FlagFromEnv("TF_LMS_DEFRAG_ENABLED", &present, &st.defrag_enabled);
  if (s.ok()) s = FlagFromEnv("TF_LMS_STRICT", &present, &st.strict);
  if (s.ok()) s = MegabytesFromEnv("TF_LMS_CPU_DEVICE_MEMORY_MB", &present, &st.device_bytes);
  if (s.ok()) s = HostLimitFromEnv(&st.host_bytes);
  if (!s.ok()) return Fail(s.message(), error, error_len);
  auto* reg = reinterpret_cast<int (*)(const TfLmsHooks*)>(
      dlsym(RTLD_DEFAULT, "tf_lms_register_hooks"));
  if (reg == nullptr) {
    return Fail("the LMS interposer is not loaded in the global scope", error, error_len);
  }
  reg(&kHooks);
  return 0;
}

// Why the emulated device could not be created, or null if it was (or was
// not asked for). The string lives as long as the process.
__attribute__((visibility("default"))) const char* tf_lms_device_error() {
  lms::AdapterState& st = lms::State();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.device_error.empty() ? nullptr : st.device_error.c_str();
}

// which: 0 LMS, 1 defragmentation. Returns 0, or 1 with *error set when the
// device already exists and the value would change.
__attribute__((visibility("default"))) int tf_lms_set_flag(int which, int enabled, char* error,
                                                           size_t error_len) {
  lms::AdapterState& st = lms::State();
  std::lock_guard<std::mutex> lock(st.mu);
  bool& flag = which == 0 ? st.lms_enabled : st.defrag_enabled;
  if (st.device_created && flag != (enabled != 0)) {
    return lms::Fail(std::string(which == 0 ? "LMS" : "LMS defragmentation") +
                         " must be set before TensorFlow creates its devices (before "
                         "the first op or tf.config call that lists logical devices); "
                         "set it right after importing tensorflow, or use the "
                         "environment variable " +
                         (which == 0 ? "TF_LMS_ENABLED" : "TF_LMS_DEFRAG_ENABLED"),
                     error, error_len);
  }
  flag = enabled != 0;
  return 0;
}

__attribute__((visibility("default"))) int tf_lms_get_flag(int which) {
  lms::AdapterState& st = lms::State();
  std::lock_guard<std::mutex> lock(st.mu);
  return (which == 0 ? st.lms_enabled : st.defrag_enabled) ? 1 : 0;
}

__attribute__((visibility("default"))) int tf_lms_num_statistics() {
  return lms::kNumStatistics;
}

__attribute__((visibility("default"))) const char* tf_lms_statistic_name(int i) {
  return i >= 0 && i < lms::kNumStatistics ? lms::kStatisticNames[i] : nullptr;
}

// Fills values[0..count) in tf_lms_statistic_name order. Returns 1 if there
// is no LMS device (values untouched).
__attribute__((visibility("default"))) int tf_lms_get_statistics(int64_t* values, int count) {
  lms::Engine* engine = lms::DeviceEngine();
  if (engine == nullptr) return 1;
  const lms::Statistics s = engine->GetStatistics();
  const int64_t all[] = {
#define LMS_VALUE(n) s.n,
      LMS_FOR_EACH_STATISTIC(LMS_VALUE)
#undef LMS_VALUE
  };
  for (int i = 0; i < count && i < lms::kNumStatistics; ++i) values[i] = all[i];
  return 0;
}

// Strict mode's report as lines "address allocation_id allocation_address
// allocation_bytes label\n", in a buffer the caller frees with
// tf_lms_free_string. Null if there is no LMS device.
__attribute__((visibility("default"))) char* tf_lms_unpinned_touches() {
  lms::Engine* engine = lms::DeviceEngine();
  if (engine == nullptr) return nullptr;
  std::string out;
  char line[160];
  for (const lms::UnpinnedTouch& t : engine->UnpinnedTouches()) {
    std::snprintf(line, sizeof(line), "%#lx %lu %#lx %lu ",
                  static_cast<unsigned long>(t.address),
                  static_cast<unsigned long>(t.allocation_id),
                  static_cast<unsigned long>(t.allocation_address),
                  static_cast<unsigned long>(t.allocation_bytes));
    out += line;
    out += t.label.empty() ? "-" : t.label;
    out += "\n";
  }
  return strdup(out.c_str());
}

__attribute__((visibility("default"))) void tf_lms_clear_unpinned_touches() {
  lms::Engine* engine = lms::DeviceEngine();
  if (engine != nullptr) engine->ClearUnpinnedTouches();
}

__attribute__((visibility("default"))) void tf_lms_free_string(char* s) { free(s); }

// For tests: out[0..2) = {live kernel contexts in the process, live contexts
// the calling thread created}. Returns 1 (out untouched) if there is no LMS
// device.
__attribute__((visibility("default"))) int tf_lms_kernel_contexts(int64_t* out) {
  lms::KernelPins* pins = lms::State().active_pins.load(std::memory_order_acquire);
  if (pins == nullptr) return 1;
  out[0] = pins->LiveContexts();
  out[1] = pins->ThreadLiveContexts();
  return 0;
}

// For tests and tools: what the engine knows about the live allocation
// containing `address`, as out[0..5) = {allocation id, its first byte,
// requested bytes, evicted (0/1), pin count}. Returns 1 (out untouched) if
// there is no LMS device or no live allocation contains `address`.
__attribute__((visibility("default"))) int tf_lms_inspect(const void* address, int64_t* out) {
  lms::Engine* engine = lms::DeviceEngine();
  lms::AllocationInfo info;
  if (engine == nullptr || !engine->Inspect(address, &info).ok()) return 1;
  out[0] = static_cast<int64_t>(info.id);
  out[1] = static_cast<int64_t>(info.address);
  out[2] = static_cast<int64_t>(info.requested_bytes);
  out[3] = info.evicted ? 1 : 0;
  out[4] = static_cast<int64_t>(info.pin_count);
  return 0;
}

}  // extern "C"
