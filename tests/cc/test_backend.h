// The backend the engine's C++ tests run over, chosen by LMS_TEST_BACKEND:
// "posix" (the default) or "cuda": the CUDA backend over the fake driver
// that TF_LMS_CUDA_DRIVER_PATH names (tests/fake_cuda), with the fake's
// granularity set to the tests' granule so both backends run the same
// sizes. `make test` runs every engine test binary once per backend.
//
// With LMS_TEST_BACKEND=cuda and TF_LMS_CUDA_DRIVER_PATH unset, the tests run
// on the real GPU 0 through libcuda.so.1 (`make gpu-check-engine`): the
// granule is then the driver's (TestGranule), and the fake's own checks
// (violations, leaks) are not there to make.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_TEST_BACKEND_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_TEST_BACKEND_H_

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "backends/backend_factory.h"
#include "fake_cuda_access.h"
#include "harness.h"

namespace lms_test {

inline bool UsingCuda() {
  const char* kind = std::getenv("LMS_TEST_BACKEND");
  return kind != nullptr && std::strcmp(kind, "cuda") == 0;
}

// The CUDA backend over the fake driver, not a real GPU.
inline bool UsingFakeCuda() {
  return UsingCuda() && std::getenv("TF_LMS_CUDA_DRIVER_PATH") != nullptr;
}

// The granule every test sizes its allocations in: LMS_TEST_GRANULE bytes,
// by default 64 KiB (the fake's granularity is set to it), or on a real GPU
// the larger granule its driver imposes (2 MiB on every NVIDIA GPU so far),
// asked of a probe backend once.
inline size_t TestGranule() {
  static const size_t granule = [] {
    const char* env = std::getenv("LMS_TEST_GRANULE");
    size_t bytes = env != nullptr ? std::strtoull(env, nullptr, 10) : 64 << 10;
    if (UsingCuda() && !UsingFakeCuda()) {
      lms::BackendSpec spec;
      spec.kind = lms::BackendKind::kCuda;
      spec.granule_bytes = bytes;
      std::unique_ptr<lms::Backend> probe;
      const lms::Status s = lms::CreateBackend(spec, &probe);
      if (!s.ok()) {
        std::printf("CreateBackend(cuda) on the real driver: %s\n", s.ToString().c_str());
        std::abort();
      }
      bytes = probe->granule_bytes();
    }
    return bytes;
  }();
  return granule;
}

// Aborts with the reason if the backend cannot be made: every test needs it.
// LMS_TEST_HUGE_PAGES=advise|collapse|off: the POSIX backend's huge pages
// (posix_backend.h) whatever the machine allows; unset, as it allows.
inline std::unique_ptr<lms::Backend> MakeTestBackend(size_t granule) {
  lms::BackendSpec spec;
  spec.granule_bytes = granule;
  if (const char* huge = std::getenv("LMS_TEST_HUGE_PAGES")) {
    spec.huge_pages = std::strcmp(huge, "advise") == 0     ? lms::HugePages::kAdvise
                      : std::strcmp(huge, "collapse") == 0 ? lms::HugePages::kCollapse
                                                           : lms::HugePages::kOff;
    if (spec.huge_pages == lms::HugePages::kOff && std::strcmp(huge, "off") != 0) {
      std::printf("LMS_TEST_HUGE_PAGES=%s is not advise, collapse or off\n", huge);
      std::abort();
    }
  }
  if (UsingCuda()) spec.kind = lms::BackendKind::kCuda;
  if (UsingFakeCuda()) {
    // Each test's engine is gone before the next one is made, so the fake
    // must hold nothing now: what it still holds, the last test leaked, and
    // what its checker caught, the last test did.
    if (Fake().violation_count() != 0) {
      std::printf("  fake CUDA driver violations:\n%s", Fake().Violations().c_str());
      ++Failures();
    }
    if (const size_t live = Fake().reset(); live != 0) {
      std::printf("  %zu fake CUDA objects (handles, mappings, reservations, streams, "
                  "events) outlived their engine\n", live);
      ++Failures();
      Fake().destroy_all();  // so that one leak fails one test, not all later ones
      Fake().reset();
    }
    if (Fake().set_granularity(granule) != 0) {
      std::printf("fake_cuda_set_granularity(%zu) refused: something is still alive\n",
                  granule);
      std::abort();
    }
  }
  std::unique_ptr<lms::Backend> backend;
  lms::Status s = lms::CreateBackend(spec, &backend);
  if (!s.ok()) {
    std::printf("CreateBackend(%s): %s\n", lms::BackendKindName(spec.kind),
                s.ToString().c_str());
    std::abort();
  }
  return backend;
}

}  // namespace lms_test

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_TEST_BACKEND_H_
