#include "engine/env_options.h"

#include <cctype>
#include <cstdlib>
#include <string>

namespace lms {

Status MegabytesFromEnv(const char* name, bool* present, size_t* bytes) {
  const char* raw = std::getenv(name);
  *present = raw != nullptr && raw[0] != '\0';
  if (!*present) return Status::Ok();
  const std::string value(raw);
  bool digits = true;
  for (char ch : value) digits = digits && std::isdigit(static_cast<unsigned char>(ch));
  const std::string quoted = std::string(name) + "='" + value + "'";
  if (!digits) {
    return InvalidArgument(quoted + " is not a whole number of megabytes (MiB); "
                           "use e.g. " + name + "=4096");
  }
  if (value.size() > 12) {
    return InvalidArgument(quoted + " is too large (at most 999999999999 MiB)");
  }
  const unsigned long long mb = std::strtoull(value.c_str(), nullptr, 10);
  if (mb == 0) {
    return InvalidArgument(quoted + " must be at least 1 MiB");
  }
  *bytes = static_cast<size_t>(mb) << 20;
  return Status::Ok();
}

Status FlagFromEnv(const char* name, bool* present, bool* value) {
  const char* raw = std::getenv(name);
  *present = raw != nullptr && raw[0] != '\0';
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
  return MegabytesFromEnv("TF_GPU_HOST_MEM_LIMIT_IN_MB", &present, bytes);
}

}  // namespace lms
