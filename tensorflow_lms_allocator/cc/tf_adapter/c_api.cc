// The C API (c_api.h): thin wrappers that turn Overlay's Status results into
// a TfLmsCode and a message. No exception leaves this file.
#include "tf_adapter/c_api.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/statistics.h"
#include "tf_adapter/overlay.h"
#include "tf_adapter/strict_report.h"

namespace lms {
namespace {

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

// TF_LMS_OK, or the status's code with its message written to `out`.
int Report(const Status& status, char* out, size_t out_len) {
  if (status.ok()) return TF_LMS_OK;
  return Fail(CodeOf(status.code()), status.message(), out, out_len);
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
  return lms::Report(lms::Overlay::Get().Configure(tf_version), message, message_len);
}

int tf_lms_device_status(char* message, size_t message_len) {
  return lms::Report(lms::Overlay::Get().DeviceStatus(), message, message_len);
}

int tf_lms_set_flag(const char* setting, int enabled, char* message, size_t message_len) {
  return lms::Report(lms::Overlay::Get().SetFlag(setting, enabled != 0), message,
                     message_len);
}

int tf_lms_get_flag(const char* setting, int* enabled, char* message,
                    size_t message_len) {
  bool value = false;
  const lms::Status s = lms::Overlay::Get().GetFlag(setting, &value);
  if (s.ok()) *enabled = value ? 1 : 0;
  return lms::Report(s, message, message_len);
}

void tf_lms_keep_fault_handler_first(int chained_handler_removed) {
  if (!lms::Overlay::Get().StrictConfigured()) return;
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
  lms::LmsAllocator* allocator = lms::Overlay::Get().DeviceAllocator(&status);
  if (allocator == nullptr) return lms::Report(status, message, message_len);
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
  lms::Engine* engine = lms::Overlay::Get().DeviceEngine();
  if (engine == nullptr) return nullptr;
  return strdup(lms::FormatUnpinnedTouches(engine->UnpinnedTouches()).c_str());
}

void tf_lms_clear_unpinned_touches(void) {
  lms::Engine* engine = lms::Overlay::Get().DeviceEngine();
  if (engine != nullptr) engine->ClearUnpinnedTouches();
}

void tf_lms_free_string(char* s) { free(s); }

int tf_lms_test_allocate_raw(size_t alignment, size_t num_bytes, int retry_on_failure,
                             void** ptr, char* message, size_t message_len) {
  lms::Status status;
  lms::LmsAllocator* allocator = lms::Overlay::Get().DeviceAllocator(&status);
  *ptr = nullptr;
  if (allocator == nullptr) return lms::Report(status, message, message_len);
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
  lms::LmsAllocator* allocator = lms::Overlay::Get().DeviceAllocator(&status);
  if (allocator == nullptr) return lms::CodeOf(status.code());
  *requested = allocator->RequestedSize(ptr);
  *allocated = allocator->AllocatedSize(ptr);
  return TF_LMS_OK;
}

int tf_lms_test_deallocate_raw(void* ptr) {
  lms::Status status;
  lms::LmsAllocator* allocator = lms::Overlay::Get().DeviceAllocator(&status);
  if (allocator == nullptr) return lms::CodeOf(status.code());
  allocator->DeallocateRaw(ptr);
  return TF_LMS_OK;
}

int tf_lms_kernel_contexts(int64_t* out) {
  lms::KernelPins* pins = lms::Overlay::Get().active_pins();
  if (pins == nullptr) return 1;
  out[0] = pins->LiveContexts();
  out[1] = pins->ThreadLiveContexts();
  return 0;
}

int tf_lms_inspect(const void* address, int64_t* out) {
  lms::Engine* engine = lms::Overlay::Get().DeviceEngine();
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
