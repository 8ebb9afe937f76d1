// The C API (c_api.h): thin wrappers that turn Runtime's Status results into
// a TfLmsCode and a message. The test-only entry points are in
// tf_testing/c_api_testing.cc.
#include "overlay/c_api.h"

#include <cstring>
#include <string>

#include "overlay/hooks.h"
#include "tf_adapter/runtime.h"
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
  return Runtime::Get().Configure();
}

}  // namespace
}  // namespace lms

extern "C" {

int tf_lms_configure(const char* tf_version, char* message, size_t message_len) {
  return lms::ReportToC(lms::ConfigureOverlay(tf_version), message, message_len);
}

int tf_lms_device_status(char* message, size_t message_len) {
  return lms::ReportToC(lms::Runtime::Get().DeviceStatus(), message, message_len);
}

int tf_lms_set_flag(const char* setting, int enabled, char* message, size_t message_len) {
  return lms::ReportToC(lms::Runtime::Get().SetFlag(setting, enabled != 0), message,
                     message_len);
}

int tf_lms_get_flag(const char* setting, int* enabled, char* message,
                    size_t message_len) {
  bool value = false;
  const lms::Status s = lms::Runtime::Get().GetFlag(setting, &value);
  if (s.ok()) *enabled = value ? 1 : 0;
  return lms::ReportToC(s, message, message_len);
}

void tf_lms_keep_fault_handler_first(int chained_handler_removed) {
  if (!lms::Runtime::Get().StrictConfigured()) return;
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
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  return lms::ReportToC(
      lms_device->engine().StartTrace(path != nullptr ? path : "", max_bytes), message,
      message_len);
}

int tf_lms_stop_trace(const char* device, uint64_t* events, uint64_t* dropped,
                      uint64_t* max_bytes, char* message, size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  lms::TraceSummary summary;
  const int code =
      lms::ReportToC(lms_device->engine().StopTrace(&summary), message, message_len);
  *events = summary.events;
  *dropped = summary.dropped;
  *max_bytes = summary.max_bytes;
  return code;
}

int tf_lms_hold_device_memory(const char* device, uint64_t bytes, void** held,
                              char* message, size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  const lms::Engine& engine = lms_device->engine();
  const uint64_t device_bytes = engine.device_granules() * engine.granule_bytes();
  if (bytes == 0 || bytes > device_bytes) {
    return lms::FailToC(TF_LMS_INVALID_ARGUMENT,
                        "cannot hold " + std::to_string(bytes) + " bytes of " + device +
                            ", a device of " + std::to_string(device_bytes) +
                            " bytes: hold between 1 byte and the device's size",
                        message, message_len);
  }
  // Pinned from birth and never unpinned: no eviction chooses it.
  *held = lms_device->engine().Allocate(bytes, lms::Hold::kPin, &status);
  if (*held != nullptr) return TF_LMS_OK;
  return lms::ReportToC(lms::Status(status.code(), "cannot hold " + std::to_string(bytes) +
                                                       " bytes of " + device + ": " +
                                                       status.message()),
                        message, message_len);
}

int tf_lms_release_device_memory(const char* device, void* held, char* message,
                                 size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  return lms::ReportToC(lms_device->engine().Free(held), message, message_len);
}

char* tf_lms_unpinned_touches(void) {
  lms::Engine* engine = lms::Runtime::Get().DeviceEngine();
  if (engine == nullptr) return nullptr;
  return strdup(lms::FormatUnpinnedTouches(engine->UnpinnedTouches()).c_str());
}

void tf_lms_clear_unpinned_touches(void) {
  lms::Engine* engine = lms::Runtime::Get().DeviceEngine();
  if (engine != nullptr) engine->ClearUnpinnedTouches();
}

int tf_lms_check_gpu(int ordinal, char* message, size_t message_len) {
  lms::BackendSpec spec;
  spec.kind = lms::BackendKind::kCuda;
  spec.device_ordinal = ordinal;
  return lms::ReportToC(lms::CheckBackendSupport(spec), message, message_len);
}

int tf_lms_inspect(const void* address, int64_t* out) {
  lms::Runtime& runtime = lms::Runtime::Get();
  for (const std::string& name : runtime.DeviceNames()) {
    lms::Status status;
    lms::LmsDevice* device = runtime.DeviceNamed(name, &status);
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
