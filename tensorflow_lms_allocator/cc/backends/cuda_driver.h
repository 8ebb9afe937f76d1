// CudaDriver: the CUDA driver API reached through the backend's own dlopen
// handle, never through global symbol lookup (docs/design.md, "Facts about the
// GPU path": TensorFlow's GPU wheel exports ~600 cu* stubs of its own).
//
// Loading: dlopen(RTLD_NOW | RTLD_LOCAL) of TF_LMS_CUDA_DRIVER_PATH if set,
// else of "libcuda.so.1"; dlsym on that handle of cuGetProcAddress_v2 (CUDA
// >= 12.0), else cuGetProcAddress (11.3); then every function of
// LMS_CUDA_DRIVER_FUNCTIONS through it, at kCudaAbiVersion.
//
// TF_LMS_CUDA_DRIVER_PATH is a testing knob: it points the backend at the
// fake driver of the tests (tests/fake_cuda). It is read at every load, so a
// process may set it before its first CUDA backend is created. Users leave it
// unset.
//
// The handle is never closed: CUDA contexts, TensorFlow's included, live until
// the process ends, and the driver must outlive them.
//
// Immutable after Load: safe to share between threads.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_DRIVER_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_DRIVER_H_

#include <memory>
#include <string>

#include "backends/cuda_driver_api.h"
#include "engine/env_options.h"  // kCudaDriverPathEnv: the library Load takes
#include "engine/status.h"

namespace lms {

class CudaDriver {
 public:
  // Loads the driver named by TF_LMS_CUDA_DRIVER_PATH, or libcuda.so.1.
  // kFailedPrecondition if the library cannot be loaded ("no NVIDIA driver:
  // ..."), or lacks cuGetProcAddress or one of the functions LMS needs.
  static Status Load(std::unique_ptr<CudaDriver>* out);
  // The same, from an explicit library path.
  static Status LoadFrom(const std::string& path, std::unique_ptr<CudaDriver>* out);

  // The function table, one pointer per LMS_CUDA_DRIVER_FUNCTIONS entry.
#define LMS_CUDA_DRIVER_POINTER(name, ret, params) cu::PFN_##name name = nullptr;
  LMS_CUDA_DRIVER_FUNCTIONS(LMS_CUDA_DRIVER_POINTER)
#undef LMS_CUDA_DRIVER_POINTER

  // OK for CUDA_SUCCESS; otherwise an error naming the call, the result's
  // name and number ("cuMemMap(...) failed: CUDA_ERROR_OUT_OF_MEMORY (2)").
  // Out-of-memory results become kResourceExhausted, the rest kInternal.
  Status Check(cu::CUresult result, const std::string& call) const;
  // "CUDA_ERROR_INVALID_VALUE (1)", or "CUresult 12345" for a result the
  // driver cannot name.
  std::string ErrorName(cu::CUresult result) const;

  const std::string& library() const { return library_; }

 private:
  CudaDriver() = default;
  std::string library_;  // the path dlopen was given
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_DRIVER_H_
