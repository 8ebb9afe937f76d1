// What the engine's unit tests share (engine_test.cc and the tests of its
// parts beside it): an engine over the backend the tests ask for
// (test_backend.h) in granules of the tests' size, and the pattern written
// and checked through it (testing/engine_pattern.h).
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_ENGINE_TEST_UTIL_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_ENGINE_TEST_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "engine/engine.h"
#include "harness.h"
#include "test_backend.h"
#include "testing/engine_pattern.h"

namespace lms::engine_test {

// The granule every test sizes its allocations in (test_backend.h).
inline const size_t kGranule = lms_test::TestGranule();

// An engine's options in granules; the defaults serve most tests.
struct Setup {
  size_t device_granules = 16;
  size_t host_granules = 64;
  bool lms = true;
  bool defrag = false;
  bool strict = false;
  bool unmap_evicted = false;
  size_t threshold = 0;
  PolicyKind policy = PolicyKind::kLru;
};

// Engine::Create, aborting with the reason if the engine cannot be made:
// every test needs it.
inline std::unique_ptr<Engine> MustCreateEngine(const EngineOptions& o,
                                                std::unique_ptr<Backend> backend) {
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(o, std::move(backend), &e);
  if (!st.ok()) {
    std::printf("Engine::Create: %s\n", st.ToString().c_str());
    std::abort();
  }
  return e;
}

inline std::unique_ptr<Engine> MakeEngine(const Setup& s) {
  EngineOptions o;
  o.device_bytes = s.device_granules * kGranule;
  o.host_bytes = s.host_granules * kGranule;
  o.lms_enabled = s.lms;
  o.defrag_enabled = s.defrag;
  o.strict = s.strict;
  o.unmap_evicted = s.unmap_evicted;
  o.small_object_threshold = s.threshold;
  o.policy = s.policy;
  return MustCreateEngine(o, lms_test::MakeTestBackend(kGranule));
}

inline void* MustAllocate(Engine& e, size_t bytes, bool pin = false) {
  Status s;
  void* p = e.Allocate(bytes, pin, &s);
  if (p == nullptr) std::printf("  allocate %zu: %s\n", bytes, s.ToString().c_str());
  return p;
}

// The pattern at an allocation, through the engine's copies when the host
// cannot touch the backend's memory (engine_pattern.h).
inline void Fill(Engine& e, void* p, size_t bytes, uint64_t seed) {
  Status s = FillAllocation(e, p, bytes, seed);
  if (!s.ok()) std::printf("  fill: %s\n", s.ToString().c_str());
}

inline int64_t Verify(Engine& e, const void* p, size_t bytes, uint64_t seed) {
  Status s;
  const int64_t bad = VerifyAllocation(e, p, bytes, seed, &s);
  if (!s.ok()) std::printf("  verify: %s\n", s.ToString().c_str());
  return bad;
}

using lms_test::Contains;

}  // namespace lms::engine_test

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_ENGINE_TEST_UTIL_H_
