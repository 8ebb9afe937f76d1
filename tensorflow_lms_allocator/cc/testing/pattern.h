// Byte patterns for integrity checks: every test that asks "did every byte
// survive?" writes FillPattern(seed) and later checks VerifyPattern(seed).
// Each 8-byte word is a hash of (seed, offset), so a byte moved, lost or
// taken from another allocation is caught, not just a byte zeroed.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TESTING_PATTERN_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TESTING_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace lms {

inline uint64_t PatternWord(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + index + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline void FillPattern(void* ptr, size_t bytes, uint64_t seed) {
  unsigned char* p = static_cast<unsigned char*>(ptr);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t w = PatternWord(seed, i / 8);
    std::memcpy(p + i, &w, 8);
  }
  if (i < bytes) {
    const uint64_t w = PatternWord(seed, i / 8);
    std::memcpy(p + i, &w, bytes - i);
  }
}

// Returns the offset of the first byte that differs, or -1.
inline int64_t VerifyPattern(const void* ptr, size_t bytes, uint64_t seed) {
  const unsigned char* p = static_cast<const unsigned char*>(ptr);
  size_t i = 0;
  for (; i < bytes; i += 8) {
    const uint64_t w = PatternWord(seed, i / 8);
    const size_t n = bytes - i < 8 ? bytes - i : 8;
    if (std::memcmp(p + i, &w, n) != 0) {
      for (size_t k = 0; k < n; ++k) {
        if (p[i + k] != reinterpret_cast<const unsigned char*>(&w)[k]) {
          return static_cast<int64_t>(i + k);
        }
      }
    }
  }
  return -1;
}

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TESTING_PATTERN_H_
