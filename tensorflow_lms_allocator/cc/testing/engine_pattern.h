// The test pattern (pattern.h) written into and checked in an engine's
// allocations whatever the backend: directly at the address when the host
// can touch it (POSIX), through the engine's copies when it cannot (a GPU,
// whose device memory the host never reads; an engine that leaves evicted
// units unmapped, whose copies map them back first). Like FillPattern, no
// pin is taken: the bytes are read and written where they are, resident or
// evicted.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TESTING_ENGINE_PATTERN_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TESTING_ENGINE_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "testing/pattern.h"

namespace lms {

// VerifyAllocation's result when the bytes could not be read at all.
constexpr int64_t kPatternUnreadable = -2;

inline Status FillAllocation(Engine& engine, void* ptr, size_t bytes, uint64_t seed) {
  if (engine.backend().HostCanTouch() && !engine.unmaps_evicted()) {
    FillPattern(ptr, bytes, seed);
    return Status::Ok();
  }
  std::vector<unsigned char> buffer(bytes);
  FillPattern(buffer.data(), bytes, seed);
  return engine.CopyFromHost(ptr, buffer.data(), bytes);
}

// -1 if every byte is intact, else the offset of the first that is not, or
// kPatternUnreadable with *status saying why.
inline int64_t VerifyAllocation(Engine& engine, const void* ptr, size_t bytes,
                                uint64_t seed, Status* status = nullptr) {
  if (engine.backend().HostCanTouch() && !engine.unmaps_evicted()) {
    return VerifyPattern(ptr, bytes, seed);
  }
  std::vector<unsigned char> buffer(bytes);
  Status s = engine.CopyToHost(ptr, buffer.data(), bytes);
  if (status != nullptr) *status = s;
  return s.ok() ? VerifyPattern(buffer.data(), bytes, seed) : kPatternUnreadable;
}

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TESTING_ENGINE_PATTERN_H_
