// StreamingCopy (backends/streaming_copy.h), the emulated device's copy.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/streaming_copy.h"
#include "harness.h"
#include "testing/pattern.h"

namespace lms {
namespace {

// Copies every size around the streamed blocks (16 KiB), with aligned and
// unaligned ends, by `copy`, checking that every byte arrives and nothing
// beyond is written.
template <typename Copy>
void CheckEveryByteAndNothingBeyond(Copy copy) {
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
        copy(dst, src, bytes);
        EXPECT_EQ(VerifyPattern(dst, bytes, seed), -1);
        EXPECT_TRUE(std::count(dst + bytes, dst + bytes + kGuard, 0xA5) == kGuard);
      }
    }
  }
}

// Each method: the streamed part, the tail memcpy and the fallback for
// unaligned pointers each copy every byte and nothing beyond.
TEST(EveryCopyMethodCopiesEveryByteAndNothingBeyondAtAnySizeAndAlignment) {
  for (int m = 0; m < kCopyMethods; ++m) {
    CheckEveryByteAndNothingBeyond([m](void* dst, const void* src, size_t bytes) {
      CopyWith(static_cast<CopyMethod>(m), dst, src, bytes);
    });
  }
}

// StreamingCopy, with the method this machine measured fastest.
TEST(StreamingCopyCopiesEveryByteAndNothingBeyondAtAnySizeAndAlignment) {
  CheckEveryByteAndNothingBeyond(StreamingCopy);
}

// The choice is the least time, the earlier method on a tie; it is made once
// a process, so every copy after the first uses the same method.
TEST(TheFastestCopyMethodIsTheLeastTimeAndIsChosenOnce) {
  EXPECT_TRUE(FastestCopyMethod({3.0, 1.0, 2.0}) == CopyMethod::kOneStream);
  EXPECT_TRUE(FastestCopyMethod({1.0, 3.0, 2.0}) == CopyMethod::kPagesInterleaved);
  EXPECT_TRUE(FastestCopyMethod({3.0, 2.0, 1.0}) == CopyMethod::kMemcpy);
  EXPECT_TRUE(FastestCopyMethod({2.0, 1.0, 1.0}) == CopyMethod::kOneStream);
  EXPECT_TRUE(FastestCopyMethod({1.0, 1.0, 1.0}) == CopyMethod::kPagesInterleaved);
  const CopyMethod chosen = ChooseCopyMethod();
  EXPECT_TRUE(static_cast<int>(chosen) < kCopyMethods);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ChooseCopyMethod() == chosen);
  EXPECT_TRUE(std::string(CopyMethodName(CopyMethod::kMemcpy)) == "memcpy");
}

}  // namespace
}  // namespace lms
