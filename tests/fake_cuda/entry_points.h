// The fake's implementation of every driver function the CUDA backend calls,
// declared from the contract itself (LMS_CUDA_DRIVER_FUNCTIONS), so each
// definition has exactly the signature the backend casts its pointer to; a
// definition that drifts from the contract is an overload the table in
// proc_address.cc does not reference, and the link fails.
//
// They live in lms::cu::fake and the library is built with hidden visibility:
// nothing here is exported, the backend reaches them only through
// cuGetProcAddress. They are noexcept, as is every exported function: an
// exception (std::bad_alloc) terminates the test instead of unwinding into a
// caller that expects a C function.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_ENTRY_POINTS_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_ENTRY_POINTS_H_

#include "backends/cuda_driver_api.h"

namespace lms {
namespace cu {
namespace fake {

#define FAKE_CUDA_DECLARE_ENTRY_POINT(name, ret, params) ret name params noexcept;
LMS_CUDA_DRIVER_FUNCTIONS(FAKE_CUDA_DECLARE_ENTRY_POINT)
#undef FAKE_CUDA_DECLARE_ENTRY_POINT

}  // namespace fake
}  // namespace cu
}  // namespace lms

#define FAKE_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_ENTRY_POINTS_H_
