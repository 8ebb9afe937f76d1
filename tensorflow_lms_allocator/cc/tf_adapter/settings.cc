#include "tf_adapter/settings.h"

#include <cstring>
#include <string>
#include <vector>

#include "tsl/platform/logging.h"

namespace lms {

Status ReadSettings(Settings* out) {
  std::vector<std::string> notes;
  const Status read = ReadSettingsFromEnv(out, &notes);
  // Also before an error: a size rounded down is said even if a later
  // setting is refused.
  for (const std::string& note : notes) LOG(WARNING) << "tensorflow_lms_allocator: " << note;
  return read;
}

std::string DescribeEmulatedDevice(const Settings& s) {
  return "TF_LMS_CPU_DEVICE_MEMORY_MB=" + std::to_string(s.engine.device_bytes >> 20) +
         ", TF_GPU_HOST_MEM_LIMIT_IN_MB=" + std::to_string(s.engine.host_bytes >> 20) +
         (s.granule_bytes != kDefaultGranuleBytes
              ? ", TF_LMS_GRANULE_MB=" + std::to_string(s.granule_bytes >> 20)
              : "") +
         (s.engine.strict ? ", TF_LMS_STRICT=1" : "");
}

bool* FlagNamed(Settings& s, const char* name, bool readable_only) {
  if (name == nullptr) return nullptr;
  if (std::strcmp(name, "lms_enabled") == 0) return &s.engine.lms_enabled;
  if (std::strcmp(name, "lms_defrag_enabled") == 0) return &s.engine.defrag_enabled;
  if (readable_only && std::strcmp(name, "strict") == 0) return &s.engine.strict;
  return nullptr;
}

}  // namespace lms
