// The C entry points both ways in export (statistics_c_api.h): thin wrappers
// over Runtime's devices. No exception leaves this file.
#include "tf_adapter/statistics_c_api.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/statistics.h"
#include "tf_adapter/lms_device.h"
#include "tf_adapter/runtime.h"

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

// The statistics, in the order tf_lms_statistic_name() lists them.
#define LMS_NAME(n, doc) #n,
const char* const kStatisticNames[] = {LMS_FOR_EACH_STATISTIC(LMS_NAME)};
#undef LMS_NAME
constexpr int kNumStatistics = sizeof(kStatisticNames) / sizeof(kStatisticNames[0]);

}  // namespace

int FailToC(TfLmsCode code, const std::string& message, char* out, size_t out_len) {
  if (out != nullptr && out_len > 0) std::snprintf(out, out_len, "%s", message.c_str());
  return code;
}

int ReportToC(const Status& status, char* out, size_t out_len) {
  if (status.ok()) return TF_LMS_OK;
  return FailToC(CodeOf(status.code()), status.message(), out, out_len);
}

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

int tf_lms_num_statistics(void) { return lms::kNumStatistics; }

const char* tf_lms_statistic_name(int i) {
  return i >= 0 && i < lms::kNumStatistics ? lms::kStatisticNames[i] : nullptr;
}

int tf_lms_get_statistics(const char* device, int64_t* values, int count, char* message,
                          size_t message_len) {
  lms::Status status;
  lms::LmsDevice* lms_device =
      lms::Runtime::Get().DeviceNamed(device != nullptr ? device : "", &status);
  if (lms_device == nullptr) return lms::ReportToC(status, message, message_len);
  const lms::Statistics s = lms_device->engine().GetStatistics();
  const int64_t all[] = {
#define LMS_VALUE(n, doc) s.n,
      LMS_FOR_EACH_STATISTIC(LMS_VALUE)
#undef LMS_VALUE
  };
  for (int i = 0; i < count && i < lms::kNumStatistics; ++i) values[i] = all[i];
  return TF_LMS_OK;
}

char* tf_lms_device_names(void) {
  std::string out;
  for (const std::string& name : lms::Runtime::Get().DeviceNames()) out += name + "\n";
  return strdup(out.c_str());
}

void tf_lms_free_string(char* s) { free(s); }

}  // extern "C"
