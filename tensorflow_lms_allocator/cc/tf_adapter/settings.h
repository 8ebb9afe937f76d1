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

#include "backends/posix_backend.h"
#include "engine/engine.h"
#include "engine/reclaim_policy.h"
#include "engine/status.h"

namespace lms {

// The granule without TF_LMS_GRANULE_MB: 2 MiB, as on current NVIDIA GPUs.
inline constexpr size_t kDefaultGranuleBytes = size_t{2} << 20;
// The largest TF_LMS_GRANULE_MB: 1 GiB.
inline constexpr size_t kMaxGranuleBytes = size_t{1} << 30;

// The engine options every LMS device starts from (one struct from the
// environment to the engine: LmsDeviceSpec carries it, a GPU's GPUOptions may
// turn more on, gpu_devices.h): device_bytes is the emulated device's (0:
// none), host_bytes the host pool (swap space) of every LMS device. LMS is
// off until asked for; defragmentation on (engine.h says why).
inline EngineOptions DefaultSettingsEngineOptions() {
  EngineOptions options;
  options.lms_enabled = false;
  return options;
}

struct Settings {
  EngineOptions engine = DefaultSettingsEngineOptions();
  // TF_LMS_PREFETCH: with the learned policy, page in ahead of use. Off by
  // default: on the 2-core emulated device it moved more bytes and gained no
  // step time (benchmarks/README.md, make bench-policy).
  bool prefetch = false;
  // TF_LMS_GRANULE_MB: the memory behind one mapping, the unit in which every
  // allocation of a granule or more is rounded up and evicted (the emulated
  // device's granule; a GPU's is the larger of this and its driver's). A GPU
  // driver's remap costs per mapping, not per byte, so on a GPU a larger
  // granule moves a swapped byte faster (benchmarks/README.md).
  size_t granule_bytes = kDefaultGranuleBytes;
  // TF_LMS_HUGE_PAGES: the emulated device's memory in transparent huge
  // pages as the machine allows (auto, the default) or never (off: what
  // remaps cost without them, or a machine whose huge pages misbehave).
  HugePages huge_pages = HugePages::kAuto;
};

// Reads TF_LMS_ENABLED, TF_LMS_DEFRAG_ENABLED, TF_LMS_STRICT, TF_LMS_POLICY,
// TF_LMS_PREFETCH, TF_LMS_GRANULE_MB, TF_LMS_HUGE_PAGES,
// TF_LMS_CPU_DEVICE_MEMORY_MB and TF_GPU_HOST_MEM_LIMIT_IN_MB into *out.
// kInvalidArgument names the variable, its value and what is valid.
Status ReadSettings(Settings* out);

// "TF_LMS_CPU_DEVICE_MEMORY_MB=64, TF_GPU_HOST_MEM_LIMIT_IN_MB=65536": the
// values the emulated device was built from, for messages.
std::string DescribeEmulatedDevice(const Settings& settings);

// The flag a settable name ("lms_enabled", "lms_defrag_enabled") refers to,
// or null. With `readable_only`, also the flags fixed at import ("strict").
bool* FlagNamed(Settings& settings, const char* name, bool readable_only = false);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_SETTINGS_H_
