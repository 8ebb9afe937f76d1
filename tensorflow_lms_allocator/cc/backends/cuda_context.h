// ScopedCudaContext: makes a context current on the calling thread for a
// scope and restores whatever was current before.
//
// The CUDA backend shares TensorFlow's context (the device's primary
// context) and is called from any thread TensorFlow allocates on, some of
// which have no context or another device's current. Every backend call that
// reaches the driver runs inside one of these, so a call never depends on, nor
// changes, the caller's current context.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_CONTEXT_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_CONTEXT_H_

#include "backends/cuda_driver.h"
#include "engine/status.h"

namespace lms {

class ScopedCudaContext {
 public:
  // On failure status() says why and the destructor restores nothing.
  ScopedCudaContext(const CudaDriver& driver, cu::CUcontext context) : driver_(driver) {
    status_ = driver_.Check(driver_.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
    if (status_.ok() && previous_ != context) {
      status_ = driver_.Check(driver_.cuCtxSetCurrent(context), "cuCtxSetCurrent");
      switched_ = status_.ok();
    }
  }
  ~ScopedCudaContext() {
    if (switched_) driver_.cuCtxSetCurrent(previous_);
  }
  ScopedCudaContext(const ScopedCudaContext&) = delete;
  ScopedCudaContext& operator=(const ScopedCudaContext&) = delete;

  const Status& status() const { return status_; }

 private:
  const CudaDriver& driver_;
  cu::CUcontext previous_ = nullptr;
  bool switched_ = false;
  Status status_;
};

}  // namespace lms

// Makes `context` current for the rest of the enclosing scope, or returns
// the failure.
#define LMS_CUDA_SCOPE(driver, context)                         \
  ::lms::ScopedCudaContext lms_cuda_scope_((driver), (context)); \
  LMS_RETURN_IF_ERROR(lms_cuda_scope_.status())

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_CUDA_CONTEXT_H_
