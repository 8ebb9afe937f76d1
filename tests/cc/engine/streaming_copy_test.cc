// StreamingCopy (backends/streaming_copy.h), the emulated device's copy.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backends/streaming_copy.h"
#include "harness.h"
#include "testing/pattern.h"

namespace lms {
namespace {

// Every size around the streamed blocks (16 KiB), with aligned and unaligned
// ends: the streamed part, the tail memcpy and the fallback each copy every
// byte and nothing beyond.
TEST(StreamingCopyCopiesEveryByteAndNothingBeyondAtAnySizeAndAlignment) {
  constexpr size_t kMost = 3 * 16384 + 100;
  constexpr size_t kGuard = 64;
  std::vector<unsigned char> source(kMost + 32), target(kMost + 32 + kGuard);
  const size_t sizes[] = {0, 1, 15, 16, 4096, 16383, 16384, 16385, 2 * 16384 + 48, kMost};
  const size_t offsets[] = {0, 1, 8};  // from a 16-byte aligned start
  uint64_t seed = 1;
  for (const size_t bytes : sizes) {
    for (const size_t dst_offset : offsets) {
      for (const size_t src_offset : offsets) {
        unsigned char* src = source.data() + (16 - reinterpret_cast<uintptr_t>(
                                                      source.data()) % 16) % 16 + src_offset;
        unsigned char* dst = target.data() + (16 - reinterpret_cast<uintptr_t>(
                                                      target.data()) % 16) % 16 + dst_offset;
        FillPattern(src, bytes, ++seed);
        std::fill(dst, dst + bytes + kGuard, 0xA5);
        StreamingCopy(dst, src, bytes);
        EXPECT_EQ(VerifyPattern(dst, bytes, seed), -1);
        EXPECT_TRUE(std::count(dst + bytes, dst + bytes + kGuard, 0xA5) == kGuard);
      }
    }
  }
}

}  // namespace
}  // namespace lms
