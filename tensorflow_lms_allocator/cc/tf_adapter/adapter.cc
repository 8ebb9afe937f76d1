// The TensorFlow adapter's entry points: the hooks the interposer calls, and
// the C API the Python package calls through ctypes (c_api.h). No exception
// leaves this file; failures are TfLmsCode values with a message.
//
// Settings are checked twice, so a value that cannot give a working device
// never runs silently:
//   1. at import (tf_lms_configure): every environment value is parsed and
//      range-checked (env_options.h), and the emulated device is created once
//      with those values and discarded, so a value the process cannot serve
//      (address space, memory for the engine's tables) is an import error
//      naming the variables;
//   2. at first use (CpuAllocatorHook): if the device still cannot be created
//      (the process's limits changed since), TensorFlow gets an
//      UnavailableDeviceAllocator whose every allocation fails with the
//      reason, so the first op raises ResourceExhaustedError saying why,
//      rather than running uncapped on TensorFlow's own allocator.
#include "tf_adapter/c_api.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "backends/backend_factory.h"
#include "engine/env_options.h"
#include "engine/strict_monitor.h"
#include "engine/thread_annotations.h"
#include "interposer/lms_hooks.h"
#include "tf_adapter/kernel_pins.h"
#include "tf_adapter/lms_allocator.h"
#include "tf_adapter/outside_kernel.h"
#include "tsl/platform/logging.h"

#ifndef LMS_BUILT_FOR_TF_VERSION
#error "LMS_BUILT_FOR_TF_VERSION must name the TensorFlow version built against"
#endif

namespace lms {
namespace {

// The emulated device's granule: 2 MiB, as on current NVIDIA GPUs.
constexpr size_t kEmulatedGranuleBytes = size_t{2} << 20;
constexpr char kDeviceName[] = "lms_emulated_device";

// What the environment asked for; validated as a whole by tf_lms_configure.
struct Settings {
  bool lms_enabled = false;
  // On by default: remapping free granules moves no data, so it costs only
  // mapping calls and spares evictions (IBM's was off because its
  // defragmentation moved tensors).
  bool defrag_enabled = true;
  bool strict = false;
  size_t device_bytes = 0;  // 0: no emulated device
  size_t host_bytes = 0;
};

struct AdapterState {
  std::mutex mu;
  // True once tf_lms_configure succeeded; the hooks serve nothing before.
  bool configured LMS_GUARDED_BY(mu) = false;
  bool hooks_registered LMS_GUARDED_BY(mu) = false;
  Settings settings LMS_GUARDED_BY(mu);
  // TensorFlow asked for its CPU allocator: the settings are fixed from here
  // on, whether or not LMS serves the device.
  bool device_created LMS_GUARDED_BY(mu) = false;
  // The emulated device, once TensorFlow created it.
  std::unique_ptr<KernelPins> pins LMS_GUARDED_BY(mu);
  std::unique_ptr<LmsAllocator> allocator LMS_GUARDED_BY(mu);
  // Set instead of `allocator` when the device could not be created.
  std::unique_ptr<UnavailableDeviceAllocator> unavailable LMS_GUARDED_BY(mu);
  std::string device_error LMS_GUARDED_BY(mu);
  bool gpu_warned LMS_GUARDED_BY(mu) = false;
  // The hooks read this without the lock: it is set once, before TensorFlow
  // runs a kernel on the device.
  std::atomic<KernelPins*> active_pins{nullptr};
};

AdapterState& State() {
  static AdapterState* state = new AdapterState();  // never destroyed: TF outlives us
  return *state;
}

TfLmsCode CodeOf(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return TF_LMS_OK;
    case StatusCode::kInvalidArgument: return TF_LMS_INVALID_ARGUMENT;
    case StatusCode::kNotFound: return TF_LMS_NOT_FOUND;
    case StatusCode::kFailedPrecondition: return TF_LMS_FAILED_PRECONDITION;
    case StatusCode::kResourceExhausted: return TF_LMS_RESOURCE_EXHAUSTED;
    case StatusCode::kInternal: return TF_LMS_INTERNAL;
  }
  return TF_LMS_INTERNAL;
}

int Fail(TfLmsCode code, const std::string& message, char* out, size_t out_len) {
  if (out != nullptr && out_len > 0) std::snprintf(out, out_len, "%s", message.c_str());
  return code;
}

int Fail(const Status& status, char* out, size_t out_len) {
  return Fail(CodeOf(status.code()), status.message(), out, out_len);
}

// "TF_LMS_CPU_DEVICE_MEMORY_MB=64, TF_GPU_HOST_MEM_LIMIT_IN_MB=65536": the
// values a device was built from, for messages.
std::string DescribeDevice(const Settings& s) {
  return "TF_LMS_CPU_DEVICE_MEMORY_MB=" + std::to_string(s.device_bytes >> 20) +
         ", TF_GPU_HOST_MEM_LIMIT_IN_MB=" + std::to_string(s.host_bytes >> 20) +
         (s.strict ? ", TF_LMS_STRICT=1" : "");
}

// Creates the emulated device's engine. Never throws: running out of memory
// for the engine's tables (std::bad_alloc) is kResourceExhausted, so it
// cannot unwind through TensorFlow's device creation.
Status CreateDeviceEngine(const Settings& settings, std::unique_ptr<Engine>* out) {
  try {
    std::unique_ptr<Backend> backend;
    BackendSpec spec;
    spec.granule_bytes = kEmulatedGranuleBytes;
    LMS_RETURN_IF_ERROR(CreateBackend(spec, &backend));
    EngineOptions options;
    options.device_bytes = settings.device_bytes;
    options.host_bytes = settings.host_bytes;
    options.lms_enabled = settings.lms_enabled;
    options.defrag_enabled = settings.defrag_enabled;
    options.strict = settings.strict;
    return Engine::Create(options, std::move(backend), out);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory for the engine's tables");
  } catch (const std::exception& e) {
    return Internal(e.what());
  }
}

Status DeviceCreationError(const Settings& settings, const Status& cause) {
  return Status(cause.code(), "the emulated device (" + DescribeDevice(settings) +
                                  ") could not be created: " + cause.ToString() +
                                  "; lower these values or raise the process's "
                                  "limits (ulimit -v)");
}

// Reads and validates the environment into *out.
Status ReadSettings(Settings* out) {
  Settings s;
  const size_t machine = MachineMemoryBytes();
  bool device_present = false;
  bool host_present = false;
  bool present = false;
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_ENABLED", &present, &s.lms_enabled));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_DEFRAG_ENABLED", &present, &s.defrag_enabled));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_STRICT", &present, &s.strict));
  LMS_RETURN_IF_ERROR(
      MegabytesFromEnv("TF_LMS_CPU_DEVICE_MEMORY_MB", &device_present, &s.device_bytes));
  if (device_present) {
    LMS_RETURN_IF_ERROR(CheckMemorySetting("TF_LMS_CPU_DEVICE_MEMORY_MB", s.device_bytes,
                                           kEmulatedGranuleBytes, machine));
  }
  // The host pool is a sparse file: TensorFlow's 64 GiB default costs nothing
  // until evicted tensors fill it, but it is capped at the machine's memory
  // so that the default is itself a valid value.
  s.host_bytes = DefaultHostLimitBytes(kEmulatedGranuleBytes, machine);
  LMS_RETURN_IF_ERROR(
      MegabytesFromEnv("TF_GPU_HOST_MEM_LIMIT_IN_MB", &host_present, &s.host_bytes));
  if (host_present) {
    LMS_RETURN_IF_ERROR(CheckMemorySetting("TF_GPU_HOST_MEM_LIMIT_IN_MB", s.host_bytes,
                                           kEmulatedGranuleBytes, machine));
  }
  *out = s;
  return Status::Ok();
}

void* CpuAllocatorHook(void* original, int /*numa_node*/) {
  AdapterState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.allocator != nullptr) return st.allocator.get();
  if (st.unavailable != nullptr) return st.unavailable.get();
  const bool first = !st.device_created;
  st.device_created = true;
  if (!st.configured || st.settings.device_bytes == 0 || !first) return original;
  std::unique_ptr<Engine> engine;
  Status s = CreateDeviceEngine(st.settings, &engine);
  if (s.ok()) {
    try {
      auto pins = std::make_unique<KernelPins>(engine.get());
      auto allocator = std::make_unique<LmsAllocator>(kDeviceName, std::move(engine),
                                                      pins.get());
      st.pins = std::move(pins);
      st.allocator = std::move(allocator);
    } catch (const std::bad_alloc&) {
      s = ResourceExhausted("out of memory for the adapter's tables");
    }
  }
  if (!s.ok()) {
    st.device_error = DeviceCreationError(st.settings, s).message();
    LOG(ERROR) << "tensorflow_lms_allocator: " << st.device_error
               << "; every allocation on CPU:0 fails";
    // Not `original`: that would run the program uncapped, without LMS.
    st.unavailable = std::make_unique<UnavailableDeviceAllocator>(kDeviceName,
                                                                  st.device_error);
    return st.unavailable.get();
  }
  st.active_pins.store(st.pins.get(), std::memory_order_release);
  return st.allocator.get();
}

void* GpuAllocatorHook(void* original, int tf_device_id) {
  AdapterState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.settings.lms_enabled && !st.gpu_warned) {
    st.gpu_warned = true;
    LOG(ERROR) << "tensorflow_lms_allocator: LMS is enabled but this build has no GPU "
                  "backend yet; GPU:"
               << tf_device_id << " uses TensorFlow's own allocator, without LMS";
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
                           GpuAllocatorHook, MakeTensorFromProtoHook};

// The device's allocator, or null with *status saying why there is none.
LmsAllocator* DeviceAllocator(Status* status) {
  AdapterState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.allocator != nullptr) return st.allocator.get();
  if (!st.device_error.empty()) {
    *status = FailedPrecondition(st.device_error);
  } else if (st.configured && st.settings.device_bytes != 0) {
    *status = FailedPrecondition("TensorFlow has not created its devices yet");
  } else {
    *status = NotFound(
        "CPU:0 has no LMS allocator: set TF_LMS_CPU_DEVICE_MEMORY_MB=<MiB> before "
        "starting Python to run the CPU device as an emulated GPU");
  }
  return nullptr;
}

Engine* DeviceEngine() {
  Status ignored;
  LmsAllocator* allocator = DeviceAllocator(&ignored);
  return allocator != nullptr ? &allocator->engine() : nullptr;
}

// The flag a settable name refers to, or null. With `readable_only`, also
// the flags fixed at import.
bool* FlagNamed(Settings& s, const char* name, bool readable_only = false) {
  if (name == nullptr) return nullptr;
  if (std::strcmp(name, "lms_enabled") == 0) return &s.lms_enabled;
  if (std::strcmp(name, "lms_defrag_enabled") == 0) return &s.defrag_enabled;
  if (readable_only && std::strcmp(name, "strict") == 0) return &s.strict;
  return nullptr;
}

// The statistics, in the order tf_lms_statistic_name() lists them.
#define LMS_NAME(n, doc) #n,
const char* const kStatisticNames[] = {LMS_FOR_EACH_STATISTIC(LMS_NAME)};
#undef LMS_NAME
constexpr int kNumStatistics = sizeof(kStatisticNames) / sizeof(kStatisticNames[0]);

}  // namespace
}  // namespace lms

extern "C" {

const char* tf_lms_code_name(int code) {
  switch (code) {
    case TF_LMS_OK: return "OK";
    case TF_LMS_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case TF_LMS_NOT_FOUND: return "NOT_FOUND";
    case TF_LMS_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case TF_LMS_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case TF_LMS_INTERNAL: return "INTERNAL";
  }
  return "UNKNOWN";
}

int tf_lms_configure(const char* tf_version, char* message, size_t message_len) {
  using namespace lms;
  if (tf_version == nullptr || std::strcmp(tf_version, LMS_BUILT_FOR_TF_VERSION) != 0) {
    return Fail(TF_LMS_FAILED_PRECONDITION,
                std::string("tensorflow_lms_allocator was built for TensorFlow ") +
                    LMS_BUILT_FOR_TF_VERSION + " but TensorFlow " +
                    (tf_version != nullptr ? tf_version : "(unknown)") +
                    " is installed; install tensorflow==" LMS_BUILT_FOR_TF_VERSION
                    " or rebuild the package against this TensorFlow",
                message, message_len);
  }
  AdapterState& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  // The hooks go in first, even if the settings turn out bad: then a retry
  // after a failed import can tell whether TensorFlow created its devices in
  // between (without LMS, since nothing was configured).
  if (!st.hooks_registered) {
    auto* reg = reinterpret_cast<int (*)(const TfLmsHooks*)>(
        dlsym(RTLD_DEFAULT, "tf_lms_register_hooks"));
    if (reg == nullptr || reg(&kHooks) != 0) {
      return Fail(TF_LMS_FAILED_PRECONDITION,
                  "the LMS interposer is not loaded in the global scope", message,
                  message_len);
    }
    st.hooks_registered = true;
  }
  if (st.device_created && !st.configured) {
    return Fail(TF_LMS_FAILED_PRECONDITION,
                "TensorFlow created its devices after the earlier import of "
                "tensorflow_lms_allocator failed, so they run without LMS and "
                "the settings can no longer apply in this process; start a new "
                "Python process with the corrected setting",
                message, message_len);
  }
  if (st.configured) return TF_LMS_OK;  // the package was imported already
  Settings settings;
  Status s = ReadSettings(&settings);
  if (!s.ok()) return Fail(s, message, message_len);
  if (settings.device_bytes != 0) {
    // Create the device once and discard it: the pools are sparse files and
    // the address ranges are only reserved, so this costs a few system calls,
    // and whatever would make the device fail at TensorFlow's first op fails
    // here, at import, naming the settings.
    std::unique_ptr<Engine> trial;
    s = CreateDeviceEngine(settings, &trial);
    if (!s.ok()) return Fail(DeviceCreationError(settings, s), message, message_len);
  }
  st.settings = settings;
  st.configured = true;
  return TF_LMS_OK;
}

int tf_lms_device_status(char* message, size_t message_len) {
  lms::AdapterState& st = lms::State();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.device_error.empty()) return TF_LMS_OK;
  return lms::Fail(TF_LMS_FAILED_PRECONDITION, st.device_error, message, message_len);
}

int tf_lms_set_flag(const char* setting, int enabled, char* message, size_t message_len) {
  lms::AdapterState& st = lms::State();
  std::lock_guard<std::mutex> lock(st.mu);
  bool* flag = lms::FlagNamed(st.settings, setting);
  if (flag == nullptr) {
    return lms::Fail(TF_LMS_INVALID_ARGUMENT,
                     std::string("unknown LMS setting '") + (setting ? setting : "") +
                         "'; use lms_enabled or lms_defrag_enabled",
                     message, message_len);
  }
  const bool is_lms = std::strcmp(setting, "lms_enabled") == 0;
  if (st.device_created && *flag != (enabled != 0)) {
    return lms::Fail(TF_LMS_FAILED_PRECONDITION,
                     std::string(is_lms ? "LMS" : "LMS defragmentation") +
                         " must be set before TensorFlow creates its devices (before "
                         "the first op or tf.config call that lists logical devices); "
                         "set it right after importing tensorflow, or use the "
                         "environment variable " +
                         (is_lms ? "TF_LMS_ENABLED" : "TF_LMS_DEFRAG_ENABLED"),
                     message, message_len);
  }
  *flag = enabled != 0;
  return TF_LMS_OK;
}

int tf_lms_get_flag(const char* setting, int* enabled, char* message,
                    size_t message_len) {
  lms::AdapterState& st = lms::State();
  std::lock_guard<std::mutex> lock(st.mu);
  bool* flag = lms::FlagNamed(st.settings, setting, /*readable_only=*/true);
  if (flag == nullptr) {
    return lms::Fail(TF_LMS_INVALID_ARGUMENT,
                     std::string("unknown LMS setting '") + (setting ? setting : "") +
                         "'; use lms_enabled, lms_defrag_enabled or strict",
                     message, message_len);
  }
  *enabled = *flag ? 1 : 0;
  return TF_LMS_OK;
}

void tf_lms_keep_fault_handler_first(int chained_handler_removed) {
  lms::AdapterState& st = lms::State();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.configured || !st.settings.strict) return;
  }
  if (chained_handler_removed) {
    lms::StrictMonitor::ChainedHandlerRemoved();
  } else {
    lms::StrictMonitor::EnsureHandlerFirst();
  }
}

int tf_lms_num_statistics(void) { return lms::kNumStatistics; }

const char* tf_lms_statistic_name(int i) {
  return i >= 0 && i < lms::kNumStatistics ? lms::kStatisticNames[i] : nullptr;
}

int tf_lms_get_statistics(int64_t* values, int count, char* message, size_t message_len) {
  lms::Status status;
  lms::LmsAllocator* allocator = lms::DeviceAllocator(&status);
  if (allocator == nullptr) return lms::Fail(status, message, message_len);
  const lms::Statistics s = allocator->engine().GetStatistics();
  const int64_t all[] = {
#define LMS_VALUE(n, doc) s.n,
      LMS_FOR_EACH_STATISTIC(LMS_VALUE)
#undef LMS_VALUE
  };
  for (int i = 0; i < count && i < lms::kNumStatistics; ++i) values[i] = all[i];
  return TF_LMS_OK;
}

char* tf_lms_unpinned_touches(void) {
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

void tf_lms_clear_unpinned_touches(void) {
  lms::Engine* engine = lms::DeviceEngine();
  if (engine != nullptr) engine->ClearUnpinnedTouches();
}

void tf_lms_free_string(char* s) { free(s); }

int tf_lms_test_allocate_raw(size_t alignment, size_t num_bytes, int retry_on_failure,
                             void** ptr, char* message, size_t message_len) {
  lms::Status status;
  lms::LmsAllocator* allocator = lms::DeviceAllocator(&status);
  *ptr = nullptr;
  if (allocator == nullptr) return lms::Fail(status, message, message_len);
  tsl::AllocationAttributes attributes;
  attributes.retry_on_failure = retry_on_failure != 0;
  *ptr = allocator->AllocateRaw(alignment, num_bytes, attributes);
  if (*ptr == nullptr) {
    return lms::Fail(TF_LMS_RESOURCE_EXHAUSTED, allocator->Name(), message, message_len);
  }
  return TF_LMS_OK;
}

int tf_lms_test_allocation_sizes(const void* ptr, size_t* requested, size_t* allocated) {
  lms::Status status;
  lms::LmsAllocator* allocator = lms::DeviceAllocator(&status);
  if (allocator == nullptr) return lms::CodeOf(status.code());
  *requested = allocator->RequestedSize(ptr);
  *allocated = allocator->AllocatedSize(ptr);
  return TF_LMS_OK;
}

int tf_lms_test_deallocate_raw(void* ptr) {
  lms::Status status;
  lms::LmsAllocator* allocator = lms::DeviceAllocator(&status);
  if (allocator == nullptr) return lms::CodeOf(status.code());
  allocator->DeallocateRaw(ptr);
  return TF_LMS_OK;
}

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
