// The one place a backend is chosen: both ways into TensorFlow (the runtime
// overlay and the source patch) and the Python engine bindings make an LMS
// device's backend here, by name, so adding a backend touches no caller.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_BACKEND_FACTORY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_BACKEND_FACTORY_H_

#include <cstddef>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/status.h"

namespace lms {

enum class BackendKind {
  kPosix,  // plain Linux memory: the emulated device
  kCuda,   // CUDA virtual memory management on an NVIDIA GPU
};

struct BackendSpec {
  BackendKind kind = BackendKind::kPosix;
  // kPosix: the granule, a power of two multiple of the page size. kCuda:
  // the smallest granule wanted (a power of two); the driver's allocation
  // granularity wins if larger (2 MiB on current GPUs).
  size_t granule_bytes = size_t{2} << 20;
  // kCuda: the CUDA device ordinal (as the driver numbers devices, after
  // CUDA_VISIBLE_DEVICES).
  int device_ordinal = 0;
};

// "posix" or "cuda" -> *kind; anything else is kInvalidArgument naming the
// value and the accepted names.
Status ParseBackendKind(const std::string& name, BackendKind* kind);
const char* BackendKindName(BackendKind kind);

// Makes the backend `spec` describes. On failure *out is untouched and the
// status says what is missing (for kCuda: the driver, the device, or the
// virtual memory support LMS needs).
Status CreateBackend(const BackendSpec& spec, std::unique_ptr<Backend>* out);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_BACKEND_FACTORY_H_
