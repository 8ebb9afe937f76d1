// The one place a backend is chosen: both ways into TensorFlow (the runtime
// overlay and the source patch) and the Python engine bindings make an LMS
// device's backend here, by name, so adding a backend touches no caller.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_BACKEND_FACTORY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_BACKEND_FACTORY_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backends/posix_backend.h"
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
  // kCuda: create device memory as granules are first used, not all when the
  // pool is created (TensorFlow's allow_growth). The host pool always grows
  // on demand: it is pinned memory, taken from the machine.
  bool allow_growth = false;
  // kCuda: the other devices (driver ordinals) whose work may read or write
  // this device's memory: TensorFlow's peer GPUs. Each mapping grants them
  // access (cuMemSetAccess; peer access does not cover VMM memory).
  std::vector<int> peer_ordinals;
  // kPosix: whether pool memory uses transparent huge pages (posix_backend.h).
  HugePages huge_pages = HugePages::kAuto;
};

// "posix" or "cuda" -> *kind; anything else is kInvalidArgument naming the
// value and the accepted names.
Status ParseBackendKind(const std::string& name, BackendKind* kind);
const char* BackendKindName(BackendKind kind);

// Makes the backend `spec` describes. On failure *out is untouched and the
// status says what is missing (for kCuda: the driver, the device, or the
// virtual memory support LMS needs).
Status CreateBackend(const BackendSpec& spec, std::unique_ptr<Backend>* out);

// Whether `spec`'s backend can run here, without making it (for kCuda: the
// driver, the device and its virtual memory support, queried without
// creating a context). The same error CreateBackend would give, earlier:
// when the user enables LMS rather than when TensorFlow creates its devices.
Status CheckBackendSupport(const BackendSpec& spec);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_BACKEND_FACTORY_H_
