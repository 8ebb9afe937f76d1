// The overlay's settings: what the environment (and the Python calls that may
// change the flags before TensorFlow creates its devices) asked for.
//
// Read and validated as a whole at import (ReadSettings), so a value that
// cannot give a working device is an import error naming the variable, never
// a device that silently runs without LMS.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_SETTINGS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_SETTINGS_H_

#include <cstddef>
#include <string>

#include "engine/env_options.h"
#include "engine/status.h"

namespace lms {

// ReadSettingsFromEnv (engine/env_options.h: every variable, its default),
// its notes logged as TensorFlow's warnings (those made before an error too).
Status ReadSettings(Settings* out);

// "TF_LMS_CPU_DEVICE_MEMORY_MB=64, TF_GPU_HOST_MEM_LIMIT_IN_MB=65536": the
// values the emulated device was built from, for messages.
std::string DescribeEmulatedDevice(const Settings& settings);

// The flag a settable name ("lms_enabled", "lms_defrag_enabled") refers to,
// or null. With `readable_only`, also the flags fixed at import ("strict").
bool* FlagNamed(Settings& settings, const char* name, bool readable_only = false);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_SETTINGS_H_
