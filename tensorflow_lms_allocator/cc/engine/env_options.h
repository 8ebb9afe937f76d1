// Reading the engine's settings from the environment, with errors that name
// the variable and the value. Every front end (the TensorFlow adapter, the
// Python binding, the benchmarks) goes through here, so a setting means the
// same thing everywhere.
//
// Two levels of checking:
//   - MegabytesFromEnv / FlagFromEnv / HostLimitFromEnv check the syntax
//     (a whole number of MiB, a boolean). The engine's own Python API uses
//     them with whatever granule size it is given.
//   - CheckMemorySetting checks that a size gives a working device: at least
//     one granule and no more than the machine's memory; a value that is not
//     a whole number of granules is rounded down, and the caller says so
//     (never silently). The TensorFlow adapter applies it to
//     TF_LMS_CPU_DEVICE_MEMORY_MB and TF_GPU_HOST_MEM_LIMIT_IN_MB at import.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_

#include <cstddef>
#include <string>

#include "engine/status.h"

namespace lms {

// TensorFlow's default for TF_GPU_HOST_MEM_LIMIT_IN_MB: 64 GiB.
inline constexpr size_t kDefaultHostLimitBytes = size_t{1} << 36;

// Reads a whole number of MiB from `name`. Unset or empty leaves *bytes as
// it is and sets *present to false. Anything but digits (a negative number
// is said to be one), or a value that overflows, is kInvalidArgument naming
// the variable and the value. Zero is read as zero: the caller's range check
// says what is valid.
Status MegabytesFromEnv(const char* name, bool* present, size_t* bytes);

// Reads a boolean ("1", "true", "0", "false", any case) from `name`.
Status FlagFromEnv(const char* name, bool* present, bool* value);

// The host pool's size: TF_GPU_HOST_MEM_LIMIT_IN_MB (not zero), else 64 GiB.
Status HostLimitFromEnv(size_t* bytes);

// The machine's physical memory (sysconf(_SC_PHYS_PAGES) pages). Neither the
// emulated device nor the host pool can hold more than this, so it bounds
// both settings; the host pool is a sparse file, so a limit costs nothing
// until evicted tensors fill it.
size_t MachineMemoryBytes();

// The largest valid value of a memory setting: `machine_bytes` rounded down
// to whole granules.
size_t MaxMemorySettingBytes(size_t granule_bytes, size_t machine_bytes);

// Checks that *bytes, read from the environment variable `name`, gives a
// working pool of `granule_bytes` granules on a machine with `machine_bytes`
// of memory: between one granule and MaxMemorySettingBytes.
// kInvalidArgument otherwise, naming the variable, its value and the valid
// range. A value that is not a whole number of granules is rounded down in
// *bytes and *rounded says so in one line (untouched otherwise), for the
// caller to log. `granule_bytes` must be a multiple of 1 MiB.
Status CheckMemorySetting(const char* name, size_t* bytes, size_t granule_bytes,
                          size_t machine_bytes, std::string* rounded);

// TF_GPU_HOST_MEM_LIMIT_IN_MB's default on a machine with `machine_bytes`:
// TensorFlow's 64 GiB, or the largest valid value if that is less (so the
// default is valid on every machine).
size_t DefaultHostLimitBytes(size_t granule_bytes, size_t machine_bytes);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_
