// Initialization, devices and primary contexts of the fake driver.
//
// Each device has one primary context, retained and released with a
// reference count; a context is usable while its count is positive. The
// current context is per thread (cuCtxSetCurrent), as in the real driver, and
// every memory, stream and event call needs one. A context's sticky error
// (CUDA_ERROR_ILLEGAL_ADDRESS once stream work touched memory without
// access) is returned by later synchronizing calls, as a GPU's is.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_CONTEXT_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_CONTEXT_H_

#include <atomic>

#include "backends/cuda_driver_api.h"

namespace lms {
namespace cu {
namespace fake {

struct Context {
  int device = 0;
  std::atomic<int> refcount{0};
  std::atomic<CUresult> sticky_error{CUDA_SUCCESS};
};

// CUDA_SUCCESS once cuInit succeeded, else CUDA_ERROR_NOT_INITIALIZED.
CUresult RequireInitialized();

// The calling thread's current context, or the error a call that needs one
// returns (not initialized, no current context, or it was released).
CUresult RequireContext(Context** context);

// Makes `error` the sticky error of `context` unless it already has one.
void SetStickyError(Context* context, CUresult error);

// The context a stream worker belongs to, for fake_cuda_device_alias: set on
// worker threads, null elsewhere.
Context*& ExecutingContext();

// The calling thread's current context, or null.
Context* CurrentContextOrNull();

// For fake_cuda_reset: forget cuInit, release every primary context and
// clear the sticky errors.
void ResetContexts();
int RetainedContexts();

}  // namespace fake
}  // namespace cu
}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_CONTEXT_H_
