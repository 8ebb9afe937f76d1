// Statistics: the figures DESIGN.md's "Public surface" lists, in one struct.
//
// Definitions (bytes are allocated sizes: a large allocation counts whole
// granules, a small one its 256-byte-rounded size):
//   bytes_in_use      live allocations, resident or evicted
//   bytes_active      live bytes that may not be evicted now: pinned large
//                     allocations and every small-object allocation
//   bytes_inactive    live unpinned large allocations, resident or evicted;
//                     bytes_active + bytes_inactive == bytes_in_use
//   bytes_reserved    device memory taken from the device pool: resident
//                     allocations, granules cached at free address ranges
//                     and the small-object region
//   bytes_limit, bytes_reservable_limit   the device pool's capacity
//   bytes_reclaimed   device bytes freed by evictions, cumulative
//   current_bytes_reclaimed   bytes of allocations evicted now
//   num_single_reclaims / num_full_reclaims   out-of-memory events solved by
//                     evicting one / several inactive allocations
//   num_defragmentations, bytes_defragged   out-of-memory events solved (in
//                     part) by remapping granules cached at free address
//                     ranges, and the bytes remapped
//   host_bytes_in_use host-pool granules backing evicted allocations
//   num_page_ins, bytes_paged_in   pins that copied an allocation back
//   num_failed_pins   pins refused because the allocation could not be paged
//                     in (its user may still read it in place, from host memory)
//
// Consistency: the engine updates these under its lock and copies them out
// under the same lock, so a reader never sees half an operation.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STATISTICS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STATISTICS_H_

#include <cstdint>

// Calls X(name) for every field of Statistics, in declaration order, so the
// bindings list them without repeating the names.
#define LMS_FOR_EACH_STATISTIC(X)                                             \
  X(num_allocs) X(bytes_in_use) X(peak_bytes_in_use) X(largest_alloc_size)    \
  X(bytes_limit) X(bytes_reserved) X(peak_bytes_reserved)                     \
  X(bytes_reservable_limit) X(bytes_inactive) X(bytes_active)                 \
  X(peak_bytes_active) X(bytes_reclaimed) X(current_bytes_reclaimed)          \
  X(peak_bytes_reclaimed) X(num_single_reclaims) X(num_full_reclaims)         \
  X(num_defragmentations) X(bytes_defragged) X(host_bytes_in_use)             \
  X(host_peak_bytes_in_use) X(num_page_ins) X(bytes_paged_in) X(num_evictions) \
  X(num_failed_pins)

namespace lms {

struct Statistics {
  int64_t num_allocs = 0;
  int64_t bytes_in_use = 0;
  int64_t peak_bytes_in_use = 0;
  int64_t largest_alloc_size = 0;
  int64_t bytes_limit = 0;
  int64_t bytes_reserved = 0;
  int64_t peak_bytes_reserved = 0;
  int64_t bytes_reservable_limit = 0;
  int64_t bytes_inactive = 0;
  int64_t bytes_active = 0;
  int64_t peak_bytes_active = 0;
  int64_t bytes_reclaimed = 0;
  int64_t current_bytes_reclaimed = 0;
  int64_t peak_bytes_reclaimed = 0;
  int64_t num_single_reclaims = 0;
  int64_t num_full_reclaims = 0;
  int64_t num_defragmentations = 0;
  int64_t bytes_defragged = 0;
  int64_t host_bytes_in_use = 0;
  int64_t host_peak_bytes_in_use = 0;
  int64_t num_page_ins = 0;
  int64_t bytes_paged_in = 0;
  int64_t num_evictions = 0;
  int64_t num_failed_pins = 0;

  // Raises each peak_* to its current figure.
  void UpdatePeaks() {
    if (bytes_in_use > peak_bytes_in_use) peak_bytes_in_use = bytes_in_use;
    if (bytes_reserved > peak_bytes_reserved) {
      peak_bytes_reserved = bytes_reserved;
    }
    if (bytes_active > peak_bytes_active) peak_bytes_active = bytes_active;
    if (current_bytes_reclaimed > peak_bytes_reclaimed) {
      peak_bytes_reclaimed = current_bytes_reclaimed;
    }
    if (host_bytes_in_use > host_peak_bytes_in_use) {
      host_peak_bytes_in_use = host_bytes_in_use;
    }
  }
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STATISTICS_H_
