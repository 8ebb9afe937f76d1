#include "engine/env_options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace lms {
namespace {

// The variable's value, or null when it is unset or empty (both mean "use
// the default" for every setting).
const char* ValueOf(const char* name) {
  const char* raw = std::getenv(name);
  return raw != nullptr && raw[0] != '\0' ? raw : nullptr;
}

// TF_LMS_GRANULE_MB: a power of two from 2 to 1024 (MiB).
Status GranuleFromEnv(size_t* bytes) {
  const char* raw = ValueOf("TF_LMS_GRANULE_MB");
  if (raw == nullptr) return Status::Ok();
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

// The text of the file at `path`, or "" where it cannot be read.
std::string ReadSmallFile(const std::string& path) {
  std::string text;
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return text;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  std::fclose(file);
  return text;
}

// A cgroup memory limit file's value in bytes, or 0 for none: "max" (v2),
// v1's unlimited value (2^63 less a page), anything not a number.
size_t CgroupLimitValue(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\n");
  if (begin == std::string::npos) return 0;
  const size_t end = text.find_first_of(" \t\n", begin);
  const std::string value = text.substr(begin, end - begin);
  if (value.size() > 20 || value.find_first_not_of("0123456789") != std::string::npos) {
    return 0;
  }
  const unsigned long long bytes = std::strtoull(value.c_str(), nullptr, 10);
  return bytes >= (1ull << 62) ? 0 : static_cast<size_t>(bytes);
}

// The smallest limit in `file` of the cgroup `path` (as /proc/self/cgroup
// writes it) under `dir` and of its ancestors up to `dir` itself; 0: none.
size_t SmallestLimitUpTo(const std::string& dir, std::string path, const char* file) {
  // A path outside the mount (a cgroup namespace's "/../sibling") names no
  // directory under it: only the mount root's limit is known.
  if ((path + "/").find("/../") != std::string::npos) path.clear();
  while (!path.empty() && path.back() == '/') path.pop_back();
  size_t smallest = 0;
  for (;;) {
    const size_t limit = CgroupLimitValue(ReadSmallFile(dir + path + "/" + file));
    if (limit != 0 && (smallest == 0 || limit < smallest)) smallest = limit;
    if (path.empty()) return smallest;
    path.erase(path.rfind('/'));
  }
}

}  // namespace

size_t CgroupMemoryLimitBytes(const std::string& cgroup_root,
                              const std::string& proc_self_cgroup) {
  size_t smallest = 0;
  size_t line_begin = 0;
  while (line_begin < proc_self_cgroup.size()) {
    size_t line_end = proc_self_cgroup.find('\n', line_begin);
    if (line_end == std::string::npos) line_end = proc_self_cgroup.size();
    const std::string line = proc_self_cgroup.substr(line_begin, line_end - line_begin);
    line_begin = line_end + 1;
    // hierarchy-id:controllers:path; the path may itself hold ':'.
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos || second + 1 >= line.size() || line[second + 1] != '/') {
      continue;
    }
    const std::string id = line.substr(0, first);
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    const std::string path = line.substr(second + 1);
    size_t limit = 0;
    if (id == "0" && controllers == ",,") {
      limit = SmallestLimitUpTo(cgroup_root, path, "memory.max");
    } else if (controllers.find(",memory,") != std::string::npos) {
      limit = SmallestLimitUpTo(cgroup_root + "/memory", path, "memory.limit_in_bytes");
    }
    if (limit != 0 && (smallest == 0 || limit < smallest)) smallest = limit;
  }
  return smallest;
}

size_t ProcessCgroupMemoryLimitBytes() {
  return CgroupMemoryLimitBytes("/sys/fs/cgroup", ReadSmallFile("/proc/self/cgroup"));
}

size_t HostShareBytes(size_t limit_bytes, size_t devices, size_t granule_bytes) {
  if (limit_bytes == 0 || granule_bytes == 0) return limit_bytes;
  if (devices == 0) devices = 1;
  const size_t share = limit_bytes / devices / granule_bytes * granule_bytes;
  return share < granule_bytes ? granule_bytes : share;
}

Status MegabytesFromEnv(const char* name, bool* present, size_t* bytes) {
  const char* raw = ValueOf(name);
  *present = raw != nullptr;
  if (!*present) return Status::Ok();
  const std::string value(raw);
  bool digits = true;
  for (char ch : value) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
  const std::string quoted = std::string(name) + "='" + value + "'";
  if (value.size() > 1 && value[0] == '-' &&
      value.find_first_not_of("0123456789", 1) == std::string::npos) {
    return InvalidArgument(quoted + " is negative; use a positive whole number of "
                           "megabytes (MiB), e.g. " + name + "=4096");
  }
  if (!digits) {
    return InvalidArgument(quoted + " is not a whole number of megabytes (MiB); "
                           "use e.g. " + name + "=4096");
  }
  if (value.size() > 12) {
    return InvalidArgument(quoted + " is too large: no machine has that many MiB");
  }
  const unsigned long long mb = std::strtoull(value.c_str(), nullptr, 10);
  *bytes = static_cast<size_t>(mb) << 20;
  return Status::Ok();
}

Status FlagFromEnv(const char* name, bool* present, bool* value) {
  const char* raw = ValueOf(name);
  *present = raw != nullptr;
  if (!*present) return Status::Ok();
  std::string v(raw);
  for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (v == "1" || v == "true") {
    *value = true;
  } else if (v == "0" || v == "false") {
    *value = false;
  } else {
    return InvalidArgument(std::string(name) + "='" + raw +
                           "' is not a boolean; use 1, true, 0 or false");
  }
  return Status::Ok();
}

Status HostLimitFromEnv(size_t* bytes) {
  bool present = false;
  *bytes = kDefaultHostLimitBytes;
  LMS_RETURN_IF_ERROR(MegabytesFromEnv("TF_GPU_HOST_MEM_LIMIT_IN_MB", &present, bytes));
  if (present && *bytes == 0) {
    return InvalidArgument("TF_GPU_HOST_MEM_LIMIT_IN_MB='0' leaves no host memory for "
                           "evicted tensors; use a positive number of megabytes (MiB)");
  }
  return Status::Ok();
}

size_t MachineMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<size_t>(pages) * static_cast<size_t>(page_bytes);
}

size_t MaxMemorySettingBytes(size_t granule_bytes, size_t machine_bytes) {
  // An unknown machine size (sysconf failed) bounds nothing.
  if (machine_bytes == 0) machine_bytes = SIZE_MAX / 2;
  return machine_bytes / granule_bytes * granule_bytes;
}

Status CheckMemorySetting(const char* name, size_t* bytes_in_out, size_t granule_bytes,
                          size_t machine_bytes, std::string* rounded) {
  const size_t bytes = *bytes_in_out;
  const size_t mib = size_t{1} << 20;
  const size_t step = granule_bytes / mib;
  const size_t max_mb = MaxMemorySettingBytes(granule_bytes, machine_bytes) / mib;
  const std::string quoted = std::string(name) + "='" + std::to_string(bytes / mib) + "'";
  const std::string range = "valid values are whole numbers of " + std::to_string(step) +
                            " MiB granules from " + std::to_string(step) + " to " +
                            std::to_string(max_mb) + " (this machine's memory)";
  if (bytes < granule_bytes) {
    return InvalidArgument(quoted + " is less than one granule (" + std::to_string(step) +
                           " MiB) and gives no usable memory; " + range);
  }
  if (bytes / mib > max_mb) {
    return InvalidArgument(quoted + " is more than this machine's memory (" +
                           std::to_string(machine_bytes / mib) + " MiB); " + range);
  }
  if (bytes % granule_bytes != 0) {
    // As TensorFlow rounds its own memory limits (and LMS a GPU's budget), so
    // that a computed value (half a model's peak, say) works.
    *bytes_in_out = bytes / granule_bytes * granule_bytes;
    *rounded = std::string(name) + "=" + std::to_string(bytes / mib) +
               " is not a whole number of " + std::to_string(step) +
               " MiB granules: using " + std::to_string(*bytes_in_out / mib) + " MiB";
  }
  return Status::Ok();
}

size_t DefaultHostLimitBytes(size_t granule_bytes, size_t machine_bytes,
                             size_t cgroup_bytes) {
  size_t max = MaxMemorySettingBytes(granule_bytes, machine_bytes);
  if (cgroup_bytes != 0) {
    const size_t in_cgroup = MaxMemorySettingBytes(granule_bytes, cgroup_bytes);
    // A cgroup of less than a granule leaves the smallest valid value.
    max = std::min(max, std::max(in_cgroup, granule_bytes));
  }
  return kDefaultHostLimitBytes < max ? kDefaultHostLimitBytes : max;
}

Status ReadSettingsFromEnv(Settings* out, std::vector<std::string>* notes) {
  Settings s;
  EngineOptions& engine = s.engine;
  const size_t machine = MachineMemoryBytes();
  bool device_present = false;
  bool host_present = false;
  bool present = false;
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_ENABLED", &present, &engine.lms_enabled));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_DEFRAG_ENABLED", &present, &engine.defrag_enabled));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_STRICT", &present, &engine.strict));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_UNMAP_EVICTED", &present, &engine.unmap_evicted));
  LMS_RETURN_IF_ERROR(FlagFromEnv("TF_LMS_PREFETCH", &present, &s.prefetch));
  if (const char* policy = ValueOf("TF_LMS_POLICY"); policy != nullptr) {
    if (!PolicyFromName(policy, &engine.policy)) {
      return InvalidArgument(std::string("TF_LMS_POLICY='") + policy +
                             "' is not a policy: use learned (the default: farthest "
                             "predicted next use) or lru (least recently used first)");
    }
  }
  LMS_RETURN_IF_ERROR(GranuleFromEnv(&s.granule_bytes));
  if (const char* huge = ValueOf("TF_LMS_HUGE_PAGES"); huge != nullptr) {
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
    if (!rounded.empty()) notes->push_back(rounded);
  }
  // The host pool is a sparse file (pinned memory made as evictions need it,
  // on a GPU): TensorFlow's 64 GiB default costs nothing until evicted
  // tensors fill it, but it is capped at the machine's memory so that the
  // default is itself a valid value, and at the cgroup's so that it is one
  // in a container too. (The cgroup's limit covers the whole process, so
  // evicted tensors filling all of it would still meet the kernel's OOM
  // killer first: a container that evicts much wants a smaller setting.)
  engine.host_bytes =
      DefaultHostLimitBytes(s.granule_bytes, machine, ProcessCgroupMemoryLimitBytes());
  LMS_RETURN_IF_ERROR(
      MegabytesFromEnv("TF_GPU_HOST_MEM_LIMIT_IN_MB", &host_present, &engine.host_bytes));
  if (host_present) {
    rounded.clear();
    LMS_RETURN_IF_ERROR(CheckMemorySetting("TF_GPU_HOST_MEM_LIMIT_IN_MB", &engine.host_bytes,
                                           s.granule_bytes, machine, &rounded));
    if (!rounded.empty()) notes->push_back(rounded);
  }
  bool ahead_present = false;
  LMS_RETURN_IF_ERROR(
      MegabytesFromEnv("TF_LMS_HOST_AHEAD_MB", &ahead_present, &engine.host_ahead_bytes));
  if (ahead_present && engine.host_ahead_bytes != 0) {
    // 0 turns it off; any other value is a size like the others (a GPU
    // makes at most its host pool).
    rounded.clear();
    LMS_RETURN_IF_ERROR(CheckMemorySetting("TF_LMS_HOST_AHEAD_MB", &engine.host_ahead_bytes,
                                           s.granule_bytes, machine, &rounded));
    if (!rounded.empty()) notes->push_back(rounded);
  }
  if (s.prefetch && engine.policy != PolicyKind::kLearned) {
    notes->push_back(std::string("TF_LMS_PREFETCH=1 has no effect with TF_LMS_POLICY=") +
                     PolicyName(engine.policy) +
                     ": prefetching pages in what the learned policy predicts; set "
                     "TF_LMS_POLICY=learned to use it");
  }
  if (engine.unmap_evicted && engine.strict) {
    notes->push_back(
        "TF_LMS_UNMAP_EVICTED=1 has no effect with TF_LMS_STRICT=1: strict mode maps "
        "evicted memory with no access and reports each touch without a pin, where "
        "TF_LMS_UNMAP_EVICTED would leave it unmapped (the touch faults)");
  }
  *out = s;
  return Status::Ok();
}

std::string CudaDriverPathFromEnv() {
  const char* path = ValueOf(kCudaDriverPathEnv);
  return path != nullptr ? path : kDefaultCudaDriverPath;
}

bool ForcedGpuAllowGrowthFromEnv(bool* value) {
  bool present = false;
  return FlagFromEnv("TF_FORCE_GPU_ALLOW_GROWTH", &present, value).ok() && present;
}

std::string TensorFlowGpuAllocatorFromEnv() {
  const char* asked = ValueOf("TF_GPU_ALLOCATOR");
  return asked != nullptr ? asked : "";
}

}  // namespace lms
