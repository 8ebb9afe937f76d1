// StreamingCopy: the emulated device's copy engine, a memcpy that writes
// around the CPU caches.
//
// A GPU's copy engine moves an evicted tensor by DMA: the copy costs memory
// bandwidth and nothing else. On the emulated device the CPU copies, and
// glibc's memcpy (2.36, x86-64) uses cache-bypassing stores only above
// glibc.cpu.x86_non_temporal_threshold, 3/4 of a thread's share of the last
// level cache: 114 MiB on this project's machines (a 300 MiB L3). The
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
// Where the CPU has no streaming stores this backend knows (not x86-64), or
// the pointers are not 16-byte aligned, it is memcpy.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_STREAMING_COPY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_STREAMING_COPY_H_

#include <cstddef>

namespace lms {

// Copies `bytes` from `src` to `dst`, which must not overlap, and fences the
// streaming stores, so the bytes are visible to any thread (and to a later
// remap) when it returns.
void StreamingCopy(void* dst, const void* src, size_t bytes);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_BACKENDS_STREAMING_COPY_H_
