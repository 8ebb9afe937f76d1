// Reading the engine's settings from the environment, with errors that name
// the variable and the value. Every front end (the TensorFlow adapter, the
// Python binding, the benchmarks) goes through here, so a setting means the
// same thing everywhere.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_

#include <cstddef>

#include "engine/status.h"

namespace lms {

// TensorFlow's default for TF_GPU_HOST_MEM_LIMIT_IN_MB: 64 GiB.
inline constexpr size_t kDefaultHostLimitBytes = size_t{1} << 36;

// Reads a whole number of MiB from `name`. Unset or empty leaves *bytes as
// it is and sets *present to false. Anything but digits, zero, or a value
// that overflows is kInvalidArgument naming the variable and the value.
Status MegabytesFromEnv(const char* name, bool* present, size_t* bytes);

// Reads a boolean ("1", "true", "0", "false", any case) from `name`.
Status FlagFromEnv(const char* name, bool* present, bool* value);

// The host pool's size: TF_GPU_HOST_MEM_LIMIT_IN_MB, else 64 GiB.
Status HostLimitFromEnv(size_t* bytes);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_
