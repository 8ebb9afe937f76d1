#include "tf_adapter/settings.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/env_options.h"
#include "tsl/platform/logging.h"

namespace lms {
namespace {

// TF_LMS_GRANULE_MB: a power of two from 2 to 1024 (MiB).
Status GranuleFromEnv(size_t* bytes) {
  const char* raw = std::getenv("TF_LMS_GRANULE_MB");
  if (raw == nullptr || *raw == '\0') return Status::Ok();
  const std::string value(raw);
  const bool digits = value.size() <= 4 &&
                      value.find_first_not_of("0123456789") == std::string::npos;
  const size_t asked = digits ? std::strtoull(raw, nullptr, 10) << 20 : 0;
  if (asked < kDefaultGranuleBytes || asked > kMaxGranuleBytes ||
      (asked & (asked - 1)) != 0) {
    return InvalidArgument(
        "TF_LMS_GRANULE_MB='" + value + "' is not a power of two from " +
        std::to_string(kDefaultGranuleBytes >> 20) + " to " +
        std::to_string(kMaxGranuleBytes >> 20) +
        " (MiB of memory behind each mapping; unset it for 2, or try 8)");
  }
  *bytes = asked;
  return Status::Ok();
}

}  // namespace

Status ReadSettings(Settings* out) {
  Settings s;
  EngineOptions& engine = s.engine;
  // The learned policy moved no more bytes than LRU in every case `make
  // bench-policy` replays (benchmarks/README.md), and 4-33% fewer on CNNs.
  engine.policy = PolicyKind::kLearned;
  const size_t machine = MachineMemoryBytes();
  bool device_present = false;
  bool host_present = false;
  bool present = false;
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_ENABLED", &present, &engine.lms_enabled));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_DEFRAG_ENABLED", &present, &engine.defrag_enabled));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_STRICT", &present, &engine.strict));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_PREFETCH", &present, &s.prefetch));
  if (const char* policy = std::getenv("TF_LMS_POLICY"); policy != nullptr && *policy != '\0') {
    if (!PolicyFromName(policy, &engine.policy)) {
      return InvalidArgument(std::string("TF_LMS_POLICY='") + policy +
                             "' is not a policy: use learned (the default: farthest "
                             "predicted next use) or lru (least recently used first)");
    }
  }
  LMS_RETURN_IF_ERROR(GranuleFromEnv(&s.granule_bytes));
  if (const char* huge = std::getenv("TF_LMS_HUGE_PAGES"); huge != nullptr && *huge != '\0') {
    if (std::strcmp(huge, "auto") != 0 && std::strcmp(huge, "off") != 0) {
      return InvalidArgument(std::string("TF_LMS_HUGE_PAGES='") + huge +
                             "' is not auto (the default: the emulated device's memory in "
                             "huge pages where the machine allows) or off");
    }
    s.huge_pages = std::strcmp(huge, "off") == 0 ? HugePages::kOff : HugePages::kAuto;
  }
  LMS_RETURN_IF_ERROR(
      MegabytesFromEnv("TF_LMS_CPU_DEVICE_MEMORY_MB", &device_present, &engine.device_bytes));
  std::string rounded;
  if (device_present) {
    LMS_RETURN_IF_ERROR(CheckMemorySetting("TF_LMS_CPU_DEVICE_MEMORY_MB", &engine.device_bytes,
                                           s.granule_bytes, machine, &rounded));
    if (!rounded.empty()) LOG(WARNING) << "tensorflow_lms_allocator: " << rounded;
  }
  // The host pool is a sparse file: TensorFlow's 64 GiB default costs nothing
  // until evicted tensors fill it, but it is capped at the machine's memory
  // so that the default is itself a valid value.
  engine.host_bytes = DefaultHostLimitBytes(s.granule_bytes, machine);
  LMS_RETURN_IF_ERROR(
      MegabytesFromEnv("TF_GPU_HOST_MEM_LIMIT_IN_MB", &host_present, &engine.host_bytes));
  if (host_present) {
    rounded.clear();
    LMS_RETURN_IF_ERROR(CheckMemorySetting("TF_GPU_HOST_MEM_LIMIT_IN_MB", &engine.host_bytes,
                                           s.granule_bytes, machine, &rounded));
    if (!rounded.empty()) LOG(WARNING) << "tensorflow_lms_allocator: " << rounded;
  }
  if (s.prefetch && engine.policy != PolicyKind::kLearned) {
    LOG(WARNING) << "tensorflow_lms_allocator: TF_LMS_PREFETCH=1 has no effect with "
                    "TF_LMS_POLICY="
                 << PolicyName(engine.policy)
                 << ": prefetching pages in what the learned policy predicts; set "
                    "TF_LMS_POLICY=learned to use it";
  }
  *out = s;
  return Status::Ok();
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
