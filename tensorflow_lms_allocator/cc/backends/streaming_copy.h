// StreamingCopy: the emulated device's copy engine, a memcpy that writes
// around the CPU caches.
//
// A GPU's copy engine moves an evicted tensor by DMA: the copy costs memory
// bandwidth and nothing else. On the emulated device the CPU copies, and
// glibc's memcpy (2.36, x86-64) uses cache-bypassing stores only above
// glibc.cpu.x86_non_temporal_threshold, 3/4 of a thread's share of the last
// level cache: 114 MiB on one of this project's machines (a 300 MiB L3). The
// engine's copies are 2 MiB granules to tens of MiB, below it, so each
// destination line was first read into the cache (read for ownership) and
// the copy ran at 5.5-7.0 GB/s, against 10.5-11.0 GB/s for the same copies
// with streaming stores (glibc's own path for large copies, and this one),
// and against the 256 MiB memcpy that `make bench-overhead` takes as the copy
// floor. Measured on 2-64 MiB copies between memfd windows; in training:
// docs/decisions/0008-emulated-device-remaps-and-copies.md.
//
// The data written is not read soon by the CPU when evicting (host pool),
// and when paging in the kernel that reads it next has it from memory either
// way: a copy then a read of 64 MiB took 13.9 ms streaming, 15.2 ms with
// memcpy.
//
// Note [Copy order]. Which order of streaming stores is fast depends on the
// machine, by more than streaming gains:
//   - kPagesInterleaved: four pages at a time, a line of each in turn (four
//     streams of reads in flight, as glibc's large copy does): 10.5 GB/s on
//     the machine above, where one stream ran at 7.7;
//   - kOneStream: one line after another, reading 1 KiB ahead: on a 2-core
//     AMD EPYC virtual machine 12.3-16.0 GB/s, where four pages at a time ran
//     at 2.6-3.4 GB/s and memcpy at 9.3-10.3 (8 MiB copies between memfd
//     windows in huge pages);
//   - kMemcpy: glibc's.
// So the order is measured, not assumed: the first copy (or
// ChooseCopyMethod, which the POSIX backend calls at its creation) times each
// method on 4 MiB, three times, and every later copy in the process uses the
// fastest. The three copy the same bytes, so the choice changes only speed.
// Where the CPU has no streaming stores this file knows (not x86-64), or the
// pointers are not 16-byte aligned, a copy is memcpy.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_STREAMING_COPY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_STREAMING_COPY_H_

#include <cstddef>
#include <cstdint>

namespace lms {

enum class CopyMethod : uint8_t { kPagesInterleaved, kOneStream, kMemcpy };
inline constexpr int kCopyMethods = 3;

// "streaming stores across four pages", "streaming stores in one stream",
// "memcpy": what the emulated device's log line says it copies by.
const char* CopyMethodName(CopyMethod method);

// Copies `bytes` from `src` to `dst`, which must not overlap, with `method`,
// and fences the streaming stores, so the bytes are visible to any thread
// (and to a later remap) when it returns.
void CopyWith(CopyMethod method, void* dst, const void* src, size_t bytes);

// The method whose time in `seconds` (indexed by CopyMethod) is least; the
// earlier method on a tie.
CopyMethod FastestCopyMethod(const double (&seconds)[kCopyMethods]);

// The method StreamingCopy uses: measured once a process, at the first call
// (Note [Copy order]); kMemcpy where there are no streaming stores.
// Thread-safe.
CopyMethod ChooseCopyMethod();

// CopyWith(ChooseCopyMethod(), ...).
void StreamingCopy(void* dst, const void* src, size_t bytes);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_STREAMING_COPY_H_
