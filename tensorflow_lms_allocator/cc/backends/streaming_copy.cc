#include "backends/streaming_copy.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace lms {
namespace {

#if defined(__x86_64__)

constexpr size_t kPage = 4096;
constexpr size_t kLine = 64;
// Blocks of kPagesInFlight pages; the interleaved order reads a line of each
// in turn.
constexpr size_t kPagesInFlight = 4;
constexpr size_t kBlock = kPage * kPagesInFlight;
// How far ahead of its copy one stream asks for a line: 16 lines ran at
// 14.4-16.0 GB/s where 4 ran at 13.1-14.5 (Note [Copy order]).
constexpr size_t kOneStreamAhead = 1024;

// One 64-byte line, read aligned and written around the caches.
inline void StreamLine(char* to, const char* from) {
  const __m128i* in = reinterpret_cast<const __m128i*>(from);
  __m128i* out = reinterpret_cast<__m128i*>(to);
  const __m128i a = _mm_load_si128(in);
  const __m128i b = _mm_load_si128(in + 1);
  const __m128i c = _mm_load_si128(in + 2);
  const __m128i d = _mm_load_si128(in + 3);
  _mm_stream_si128(out, a);
  _mm_stream_si128(out + 1, b);
  _mm_stream_si128(out + 2, c);
  _mm_stream_si128(out + 3, d);
}

// `bytes` is a multiple of kBlock.
void StreamPagesInterleaved(char* dst, const char* src, size_t bytes) {
  for (size_t block = 0; block < bytes; block += kBlock) {
    for (size_t line = 0; line < kPage; line += kLine) {
      for (size_t page = 0; page < kPagesInFlight; ++page) {
        const size_t at = block + page * kPage + line;
        _mm_prefetch(src + at + 4 * kLine, _MM_HINT_T0);
        StreamLine(dst + at, src + at);
      }
    }
  }
}

// `bytes` is a multiple of kBlock. A prefetch past the source's end is a
// hint the CPU drops, never a fault.
void StreamOneStream(char* dst, const char* src, size_t bytes) {
  for (size_t at = 0; at < bytes; at += kLine) {
    _mm_prefetch(src + at + kOneStreamAhead, _MM_HINT_T0);
    StreamLine(dst + at, src + at);
  }
}

#endif  // defined(__x86_64__)

CopyMethod MeasureCopyMethods() {
#if defined(__x86_64__)
  constexpr size_t kBytes = size_t{4} << 20;
  constexpr int kRounds = 3;
  char* src = static_cast<char*>(std::aligned_alloc(kPage, kBytes));
  char* dst = static_cast<char*>(std::aligned_alloc(kPage, kBytes));
  if (src == nullptr || dst == nullptr) {
    // Nothing measured: glibc's copy, which is never far from the best
    // (Note [Copy order]), rather than an order that may be 3x slower here.
    std::free(src);
    std::free(dst);
    return CopyMethod::kMemcpy;
  }
  // Touched first, so that no method pays the pages' first faults.
  std::memset(src, 1, kBytes);
  std::memset(dst, 2, kBytes);
  double best[kCopyMethods];
  for (double& b : best) b = 1e30;
  // Rounds of every method in turn, so that a slow moment of the machine
  // is not charged to one method.
  for (int round = 0; round < kRounds; ++round) {
    for (int m = 0; m < kCopyMethods; ++m) {
      const auto start = std::chrono::steady_clock::now();
      CopyWith(static_cast<CopyMethod>(m), dst, src, kBytes);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (took.count() < best[m]) best[m] = took.count();
    }
  }
  std::free(src);
  std::free(dst);
  return FastestCopyMethod(best);
#else
  return CopyMethod::kMemcpy;
#endif
}

}  // namespace

const char* CopyMethodName(CopyMethod method) {
  switch (method) {
    case CopyMethod::kPagesInterleaved: return "streaming stores across four pages";
    case CopyMethod::kOneStream: return "streaming stores in one stream";
    case CopyMethod::kMemcpy: return "memcpy";
  }
  return "?";
}

void CopyWith(CopyMethod method, void* dst, const void* src, size_t bytes) {
  size_t streamed = 0;
#if defined(__x86_64__)
  const bool aligned = ((reinterpret_cast<uintptr_t>(dst) |
                         reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  if (aligned && method != CopyMethod::kMemcpy) {
    streamed = bytes - bytes % kBlock;
    char* to = static_cast<char*>(dst);
    const char* from = static_cast<const char*>(src);
    if (method == CopyMethod::kPagesInterleaved) {
      StreamPagesInterleaved(to, from, streamed);
    } else {
      StreamOneStream(to, from, streamed);
    }
    // Streaming stores are weakly ordered: without the fence another thread
    // (or the kernel after a remap) could read the destination's old bytes.
    _mm_sfence();
  }
#endif
  std::memcpy(static_cast<char*>(dst) + streamed,
              static_cast<const char*>(src) + streamed, bytes - streamed);
}

CopyMethod FastestCopyMethod(const double (&seconds)[kCopyMethods]) {
  int fastest = 0;
  for (int m = 1; m < kCopyMethods; ++m) {
    if (seconds[m] < seconds[fastest]) fastest = m;
  }
  return static_cast<CopyMethod>(fastest);
}

CopyMethod ChooseCopyMethod() {
  // A function-local static: measured once, by whichever thread comes first,
  // the others waiting for it.
  static const CopyMethod chosen = MeasureCopyMethods();
  return chosen;
}

void StreamingCopy(void* dst, const void* src, size_t bytes) {
  CopyWith(ChooseCopyMethod(), dst, src, bytes);
}

}  // namespace lms
