// The fake CUDA driver's test-extension API (tests/fake_cuda/fake_cuda.h),
// reached the way the backend reaches the driver: dlopen of the library that
// TF_LMS_CUDA_DRIVER_PATH names (the same handle the backend gets) and dlsym,
// so test binaries need not link the fake and still run without it on POSIX.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_FAKE_CUDA_ACCESS_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_FAKE_CUDA_ACCESS_H_

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fake_cuda/fake_cuda.h"

namespace lms_test {

struct FakeCuda {
#define LMS_FAKE_FUNCTIONS(X)                                          \
  X(launch_kernel, fake_cuda_launch_kernel)                            \
  X(device_alias, fake_cuda_device_alias)                              \
  X(violation_count, fake_cuda_violation_count)                        \
  X(violations, fake_cuda_violations)                                  \
  X(clear_violations, fake_cuda_clear_violations)                      \
  X(set_copy_delay_us, fake_cuda_set_copy_delay_us)                    \
  X(hold_unmaps, fake_cuda_hold_unmaps)                                \
  X(unmaps_waiting, fake_cuda_unmaps_waiting)                          \
  X(fail_nth_mem_create, fake_cuda_fail_nth_mem_create)                \
  X(fail_nth_mem_map, fake_cuda_fail_nth_mem_map)                      \
  X(set_host_vmm_supported, fake_cuda_set_host_vmm_supported)          \
  X(refuse_host_create, fake_cuda_refuse_host_create)                  \
  X(set_driver_version, fake_cuda_set_driver_version)                  \
  X(set_map_offset_zero_only, fake_cuda_set_map_offset_zero_only)      \
  X(set_device_count, fake_cuda_set_device_count)                      \
  X(set_granularity, fake_cuda_set_granularity)                        \
  X(set_pool_capacity, fake_cuda_set_pool_capacity)                    \
  X(live_handles, fake_cuda_live_handles)                              \
  X(live_mappings, fake_cuda_live_mappings)                            \
  X(live_reservations, fake_cuda_live_reservations)                    \
  X(live_streams, fake_cuda_live_streams)                              \
  X(live_events, fake_cuda_live_events)                                \
  X(pool_bytes_in_use, fake_cuda_pool_bytes_in_use)                    \
  X(check_invariants, fake_cuda_check_invariants)                      \
  X(call_count, fake_cuda_call_count)                                  \
  X(reset_call_counts, fake_cuda_reset_call_counts)                    \
  X(destroy_all, fake_cuda_destroy_all)                                \
  X(reset, fake_cuda_reset)
#define LMS_FAKE_FIELD(field, symbol) decltype(&symbol) field = nullptr;
  LMS_FAKE_FUNCTIONS(LMS_FAKE_FIELD)
#undef LMS_FAKE_FIELD

  // Every violation since the last clear, one per line ("" if none).
  std::string Violations() const {
    char* text = violations();
    std::string s = text != nullptr ? text : "";
    std::free(text);
    return s;
  }
};

// Aborts with the reason if the fake cannot be loaded: only CUDA-mode tests
// call this, and they cannot run without it.
inline const FakeCuda& Fake() {
  static const FakeCuda* fake = [] {
    const char* path = std::getenv("TF_LMS_CUDA_DRIVER_PATH");
    void* handle = path != nullptr ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (handle == nullptr) {
      std::printf("the fake CUDA driver could not be loaded: TF_LMS_CUDA_DRIVER_PATH=%s (%s)\n",
                  path != nullptr ? path : "(unset)", path != nullptr ? dlerror() : "");
      std::abort();
    }
    auto* f = new FakeCuda();
#define LMS_FAKE_RESOLVE(field, symbol)                                  \
  f->field = reinterpret_cast<decltype(&symbol)>(dlsym(handle, #symbol)); \
  if (f->field == nullptr) {                                             \
    std::printf("the fake CUDA driver %s lacks %s\n", path, #symbol);    \
    std::abort();                                                        \
  }
    LMS_FAKE_FUNCTIONS(LMS_FAKE_RESOLVE)
#undef LMS_FAKE_RESOLVE
    return f;
  }();
  return *fake;
}

#undef LMS_FAKE_FUNCTIONS

}  // namespace lms_test

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_FAKE_CUDA_ACCESS_H_
