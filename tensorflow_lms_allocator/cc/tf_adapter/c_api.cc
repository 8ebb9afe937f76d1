// The C API (c_api.h): thin wrappers that turn Overlay's Status results into
// a TfLmsCode and a message. No exception leaves this file.
#include "tf_adapter/c_api.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tensorflow/core/common_runtime/gpu/gpu_id_manager.h"
#include "tensorflow/core/protobuf/config.pb.h"
#include "tf_adapter/gpu_devices.h"
#include "tf_adapter/hooks.h"
#include "tf_adapter/overlay.h"
#include "tf_adapter/strict_report.h"

#ifndef LMS_BUILT_FOR_TF_VERSION
#error "LMS_BUILT_FOR_TF_VERSION must name the TensorFlow version built against"
#endif

namespace lms {
namespace {

// The overlay interposes TensorFlow's functions by their mangled names and
// reads its objects by this version's layout: any other version is refused
// before a hook is installed.
Status CheckTensorFlowVersion(const char* tf_version) {
  if (tf_version != nullptr && std::strcmp(tf_version, LMS_BUILT_FOR_TF_VERSION) == 0) {
    return Status::Ok();
  }
  return FailedPrecondition(
      std::string("tensorflow_lms_allocator was built for TensorFlow ") +
      LMS_BUILT_FOR_TF_VERSION + " but TensorFlow " +
      (tf_version != nullptr ? tf_version : "(unknown)") +
      " is installed; install tensorflow==" LMS_BUILT_FOR_TF_VERSION
      " or rebuild the package against this TensorFlow");
}

// The hooks go in before the settings are read, even if those turn out bad:
// then a retry after a failed import can tell whether TensorFlow created its
// devices in between (without LMS, since nothing was configured).
Status ConfigureOverlay(const char* tf_version) {
  LMS_RETURN_IF_ERROR(CheckTensorFlowVersion(tf_version));
  LMS_RETURN_IF_ERROR(RegisterOverlayHooks());
  return Overlay::Get().Configure();
}

// The budgets tf_lms_test_gpu_allocator's stand-in for TensorFlow's
// GetGPUAllocator was asked for, in order (test-only; one thread).
std::vector<size_t> g_tensorflow_gpu_allocator_budgets;

}  // namespace
}  // namespace lms

extern "C" {

int tf_lms_configure(const char* tf_version, char* message, size_t message_len) {
  return lms::ReportToC(lms::ConfigureOverlay(tf_version), message, message_len);
}

int tf_lms_device_status(char* message, size_t message_len) {
  return lms::ReportToC(lms::Overlay::Get().DeviceStatus(), message, message_len);
}

int tf_lms_set_flag(const char* setting, int enabled, char* message, size_t message_len) {
  return lms::ReportToC(lms::Overlay::Get().SetFlag(setting, enabled != 0), message,
                     message_len);
}

int tf_lms_get_flag(const char* setting, int* enabled, char* message,
                    size_t message_len) {
  bool value = false;
  const lms::Status s = lms::Overlay::Get().GetFlag(setting, &value);
  if (s.ok()) *enabled = value ? 1 : 0;
  return lms::ReportToC(s, message, message_len);
}

void tf_lms_keep_fault_handler_first(int chained_handler_removed) {
  if (!lms::Overlay::Get().StrictConfigured()) return;
  if (chained_handler_removed) {
    lms::StrictMonitor::ChainedHandlerRemoved();
  } else {
    lms::StrictMonitor::EnsureHandlerFirst();
  }
}

int tf_lms_start_trace(const char* device, const char* path, uint64_t max_bytes,
                       char* message, size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Overlay::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  return lms::ReportToC(
      lms_device->engine().StartTrace(path != nullptr ? path : "", max_bytes), message,
      message_len);
}

int tf_lms_stop_trace(const char* device, uint64_t* events, uint64_t* dropped,
                      uint64_t* max_bytes, char* message, size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Overlay::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  lms::TraceSummary summary;
  const int code =
      lms::ReportToC(lms_device->engine().StopTrace(&summary), message, message_len);
  *events = summary.events;
  *dropped = summary.dropped;
  *max_bytes = summary.max_bytes;
  return code;
}

char* tf_lms_unpinned_touches(void) {
  lms::Engine* engine = lms::Overlay::Get().DeviceEngine();
  if (engine == nullptr) return nullptr;
  return strdup(lms::FormatUnpinnedTouches(engine->UnpinnedTouches()).c_str());
}

void tf_lms_clear_unpinned_touches(void) {
  lms::Engine* engine = lms::Overlay::Get().DeviceEngine();
  if (engine != nullptr) engine->ClearUnpinnedTouches();
}

int tf_lms_test_allocate_raw(const char* device, size_t alignment, size_t num_bytes,
                             int retry_on_failure, void** ptr, char* message,
                             size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Overlay::Get().DeviceNamed(device != nullptr ? device : "", &status);
  *ptr = nullptr;
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  lms::LmsAllocator* allocator = lms_device->allocator();
  tsl::AllocationAttributes attributes;
  attributes.retry_on_failure = retry_on_failure != 0;
  *ptr = allocator->AllocateRaw(alignment, num_bytes, attributes);
  if (*ptr == nullptr) {
    return lms::FailToC(TF_LMS_RESOURCE_EXHAUSTED, allocator->Name(), message, message_len);
  }
  return TF_LMS_OK;
}

int tf_lms_test_allocation_sizes(const char* device, const void* ptr, size_t* requested,
                                 size_t* allocated) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Overlay::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, nullptr, 0);
  *requested = lms_device->allocator()->RequestedSize(ptr);
  *allocated = lms_device->allocator()->AllocatedSize(ptr);
  return TF_LMS_OK;
}

int tf_lms_test_deallocate_raw(const char* device, void* ptr) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Overlay::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, nullptr, 0);
  lms_device->allocator()->DeallocateRaw(ptr);
  return TF_LMS_OK;
}

int tf_lms_test_tensorflow_bytes_limit(const char* device, int64_t* bytes_limit) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Overlay::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, nullptr, 0);
  const std::optional<tsl::AllocatorStats> stats = lms_device->allocator()->GetStats();
  *bytes_limit = stats && stats->bytes_limit ? *stats->bytes_limit : 0;
  return TF_LMS_OK;
}

int tf_lms_check_gpu(int ordinal, char* message, size_t message_len) {
  lms::BackendSpec spec;
  spec.kind = lms::BackendKind::kCuda;
  spec.device_ordinal = ordinal;
  return lms::ReportToC(lms::CheckBackendSupport(spec), message, message_len);
}

int tf_lms_test_gpu_allocator(int tf_device_id, size_t total_bytes, const void* gpu_options,
                              size_t gpu_options_len, char* message, size_t message_len) {
  tensorflow::GPUOptions options;
  if (gpu_options_len > 0 &&
      !options.ParseFromArray(gpu_options, static_cast<int>(gpu_options_len))) {
    return lms::FailToC(TF_LMS_INVALID_ARGUMENT, "the GPUOptions do not parse", message,
                     message_len);
  }
  // As TensorFlow's GPU device factory would have: TfDeviceId n is CUDA
  // device n.
  tsl::PlatformDeviceId platform_id;
  if (!tensorflow::GpuIdManager::TfToPlatformDeviceId(tsl::TfDeviceId(tf_device_id),
                                                      &platform_id)
           .ok()) {
    (void)tensorflow::GpuIdManager::InsertTfPlatformDeviceIdPair(
        tsl::TfDeviceId(tf_device_id), tsl::PlatformDeviceId(tf_device_id));
  }
  // Stands in for TensorFlow's GetGPUAllocator, which needs a GPU: makes no
  // allocator and records the budget it was asked for.
  auto no_tensorflow_allocator = [](void*, const void*, int, size_t budget,
                                    const void*) -> void* {
    lms::g_tensorflow_gpu_allocator_budgets.push_back(budget);
    return nullptr;
  };
  void* allocator = lms::Overlay::Get().GpuAllocator(
      reinterpret_cast<void*>(+no_tensorflow_allocator), nullptr, &options, tf_device_id,
      total_bytes, nullptr);
  if (allocator == nullptr) {
    return lms::FailToC(TF_LMS_FAILED_PRECONDITION,
                     "LMS is not enabled: TensorFlow's own allocator would serve the GPU",
                     message, message_len);
  }
  lms::Status status;
  if (lms::Overlay::Get().DeviceNamed(lms::GpuDeviceName(tf_device_id), &status) ==
      nullptr) {
    return lms::ReportToC(status, message, message_len);
  }
  return TF_LMS_OK;
}

int tf_lms_test_tensorflow_gpu_allocator_budgets(size_t* out, int max) {
  const auto& budgets = lms::g_tensorflow_gpu_allocator_budgets;
  for (int i = 0; i < max && i < static_cast<int>(budgets.size()); ++i) out[i] = budgets[i];
  return static_cast<int>(budgets.size());
}

int tf_lms_kernel_contexts(int64_t* out) {
  lms::Status status;
  lms::LmsDevice* device = lms::Overlay::Get().DeviceNamed("CPU:0", &status);
  if (device == nullptr) return 1;
  out[0] = device->pins()->LiveContexts();
  out[1] = device->pins()->ThreadLiveContexts();
  return 0;
}

int tf_lms_turns(int64_t* out) {
  lms::Status status;
  lms::LmsDevice* device = lms::Overlay::Get().DeviceNamed("CPU:0", &status);
  if (device == nullptr) return 1;
  out[0] = device->pins()->NumWaits();
  out[1] = device->pins()->NumDeadlocks();
  return 0;
}

int tf_lms_inspect(const void* address, int64_t* out) {
  lms::Overlay& overlay = lms::Overlay::Get();
  for (const std::string& name : overlay.DeviceNames()) {
    lms::Status status;
    lms::LmsDevice* device = overlay.DeviceNamed(name, &status);
    lms::AllocationInfo info;
    if (device == nullptr || !device->engine().Inspect(address, &info).ok()) continue;
    out[0] = static_cast<int64_t>(info.id);
    out[1] = static_cast<int64_t>(info.address);
    out[2] = static_cast<int64_t>(info.requested_bytes);
    out[3] = info.evicted ? 1 : 0;
    out[4] = static_cast<int64_t>(info.pin_count);
    return 0;
  }
  return 1;
}

}  // extern "C"
