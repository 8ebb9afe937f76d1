// Statistics: the figures docs/observing.md#statistics lists for users, in one
// struct generated from one list (LMS_FOR_EACH_STATISTIC), so the struct, the C API,
// the Python bindings and the docs never disagree on a name.
//
// Bytes are allocated sizes: a large allocation counts whole granules, a
// small object its 256-byte-rounded size. A *unit* is what is pinned and
// evicted: a large allocation, or a small-object page (engine.h).
//
// Consistency: the engine updates these under its lock and copies them out
// under the same lock, so a reader never sees half an operation; every change
// to a level goes through the engine's accounting, which
// Engine::CheckInvariants recomputes from scratch.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STATISTICS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STATISTICS_H_

#include <cstdint>

// X(name, doc) for every statistic, in the order the C API lists them.
#define LMS_FOR_EACH_STATISTIC(X)                                               \
  X(num_allocs, "allocations made so far")                                      \
  X(bytes_in_use, "live allocations, resident or evicted")                      \
  X(peak_bytes_in_use, "highest bytes_in_use")                                  \
  X(largest_alloc_size, "largest single allocation so far")                     \
  X(bytes_limit, "the device pool's capacity")                                  \
  X(bytes_reserved,                                                             \
    "device memory taken from the device pool: resident units and granules "   \
    "cached at free address ranges")                                            \
  X(peak_bytes_reserved, "highest bytes_reserved")                              \
  X(bytes_reservable_limit, "the device pool's capacity")                       \
  X(bytes_inactive,                                                             \
    "live bytes in unpinned units, resident or evicted; "                       \
    "bytes_active + bytes_inactive == bytes_in_use")                            \
  X(bytes_active,                                                               \
    "live bytes in pinned units (a kernel uses them; resident, except units "  \
    "larger than the device, used in place from host memory)")                 \
  X(bytes_unclaimed,                                                            \
    "live bytes allocated outside any kernel and not yet pinned by one: their " \
    "writers may still be writing them, so they are never evicted")            \
  X(peak_bytes_active, "highest bytes_active")                                  \
  X(bytes_reclaimed, "device bytes freed by evictions, cumulative")            \
  X(current_bytes_reclaimed, "bytes of units in host memory now")               \
  X(peak_bytes_reclaimed, "highest current_bytes_reclaimed")                    \
  X(num_single_reclaims, "out-of-memory events solved by evicting one unit")    \
  X(num_full_reclaims, "out-of-memory events solved by evicting several")       \
  X(num_defragmentations,                                                       \
    "out-of-memory events solved (in part) by remapping granules cached at "   \
    "free address ranges")                                                      \
  X(bytes_defragged, "bytes remapped by defragmentation, cumulative")          \
  X(num_cached_placements,                                                      \
    "new units placed at a free range whose granules were still mapped, "       \
    "sparing a defragmentation")                                                \
  X(num_cut_mappings_avoided,                                                   \
    "new units placed elsewhere than best fit's range, which would have cut "   \
    "a cached mapping or waited for a retired one (a GPU)")                     \
  X(host_bytes_in_use, "host-pool granules backing evicted units")              \
  X(host_peak_bytes_in_use, "highest host_bytes_in_use")                        \
  X(host_bytes_made_ahead,                                                      \
    "GPU: host memory made when the device was created, so that evictions "     \
    "need not make it (TF_LMS_HOST_AHEAD_MB)")                                  \
  X(num_page_ins, "pins that copied a unit back to the device")                 \
  X(bytes_paged_in,                                                             \
    "device bytes (whole granules) filled again by page-ins, cumulative; "      \
    "bytes_copied_in is what they copied")                                      \
  X(num_evictions, "units copied to host memory")                               \
  X(num_evictions_abandoned,                                                    \
    "emulated device: evictions dropped because a kernel pinned the unit (or "  \
    "a new object or a write reached it) while its copy ran without the lock")  \
  X(num_born_evicted,                                                           \
    "allocations no kernel held that were placed in host memory because the "  \
    "device was full")                                                          \
  X(num_overflow_placements,                                                    \
    "kernels' requests the device could not hold (nothing left to evict, or "  \
    "larger than the device), placed in host memory for the kernel to use in " \
    "place: slow on a GPU; the device is smaller than the largest kernel")     \
  X(num_optional_refused,                                                       \
    "optional requests (scratch a kernel can do without: TensorFlow's "         \
    "retry_on_failure off, as cuDNN's autotuning and workspaces ask) refused: " \
    "neither free device memory nor evictions within their allowance (a "       \
    "sixteenth of the device a TensorFlow step, no waits for other kernels) "   \
    "could serve them")                                                         \
  X(bytes_evicted_for_optional,                                                 \
    "bytes evicted to serve optional requests (at most a sixteenth of the "      \
    "device a TensorFlow step, never waiting for other kernels); cumulative")    \
  X(num_failed_pins,                                                            \
    "pins refused because the unit could not be paged in (its user may still " \
    "read it in place, from host memory)")                                      \
  X(num_fences,                                                                 \
    "GPU: rounds of events recorded on the fenced TensorFlow streams so that "  \
    "copies and unmaps follow queued work (0 on the emulated device)")          \
  X(num_host_waits,                                                             \
    "GPU: times the allocator blocked on the device: once per reclaim and per " \
    "page-in, and before unmapping memory queued work may use (0 on the "       \
    "emulated device)")                                                         \
  X(num_copies, "copy calls issued by evictions and page-ins")                  \
  X(bytes_copied, "bytes copied by evictions and page-ins, cumulative")         \
  X(bytes_copied_out,                                                           \
    "bytes completed evictions copied to host memory: a unit's requested "      \
    "bytes, a small-object page's live objects (with gaps under a 32nd of a "   \
    "granule between them); cumulative. bytes_copied also counts the copies "   \
    "of abandoned and failed moves")                                            \
  X(bytes_copied_in,                                                            \
    "bytes completed page-ins copied back, counted as bytes_copied_out; "       \
    "cumulative")                                                               \
  X(time_evicting_ns,                                                           \
    "nanoseconds in evictions, everything included: copies, waits, remaps, "    \
    "bookkeeping")                                                              \
  X(time_paging_in_ns,                                                          \
    "nanoseconds in page-ins, everything included (on a GPU the copy runs on "  \
    "after the page-in, ordered before the kernel)")                            \
  X(time_copying_ns,                                                            \
    "nanoseconds in the backend's copies (a GPU: issuing them; the emulated "   \
    "device: copying)")                                                         \
  X(time_waiting_ns,                                                            \
    "GPU: nanoseconds the host waited for copies and for work queued on the "   \
    "fenced streams")                                                           \
  X(time_fencing_ns,                                                            \
    "GPU: nanoseconds ordering streams: events recorded on the fenced streams "  \
    "and on the copy stream, waited for by another stream")                     \
  X(time_creating_memory_ns,                                                    \
    "GPU: nanoseconds making physical memory as granules are first used "       \
    "(cuMemCreate, its window mapping and access)")                             \
  X(time_mapping_ns,                                                            \
    "nanoseconds mapping granules at addresses (a GPU: cuMemMap and "           \
    "cuMemSetAccess)")                                                          \
  X(time_unmapping_ns, "nanoseconds unmapping granules (a GPU: cuMemUnmap)")    \
  X(time_planning_ns,                                                           \
    "nanoseconds choosing reclaims' victims (the policy's bookkeeping: the "    \
    "learned policy ranks every inactive unit, LRU walks its list)")            \
  X(time_move_waiting_ns,                                                       \
    "nanoseconds threads waited for other threads' evictions and page-ins to "  \
    "end: a free or a pin of a unit being moved, a reclaim that found the "     \
    "inactive units moving (the emulated device copies without the lock)")     \
  X(time_lock_waiting_ns,                                                       \
    "nanoseconds threads waited for the allocator's lock while another thread " \
    "held it: evictions and page-ins copy and remap under it, so a kernel "     \
    "allocating or pinning meanwhile waits")                                    \
  X(num_kernel_waits,                                                           \
    "requests (allocations, kernels' inputs, TensorFlow's copies) that waited " \
    "for other kernels to release memory, and kernels that waited for them "    \
    "before pinning their inputs")                                              \
  X(time_kernel_waiting_ns,                                                     \
    "nanoseconds those waits took, cumulative")                                 \
  X(time_longest_kernel_wait_ns, "the longest of those waits, in nanoseconds")  \
  X(num_learned_reclaims,                                                       \
    "reclaims whose victims the learned policy chose (farthest predicted next " \
    "use; 0 with the LRU policy)")                                              \
  X(num_predictions, "learned policy: predicted reuse distances checked")       \
  X(num_prediction_hits,                                                        \
    "learned policy: predictions within a quarter of the actual distance")     \
  X(num_prefetches,                                                             \
    "learned policy: units paged in ahead of use, into free device memory")

namespace lms {

struct Statistics {
#define LMS_STATISTIC_FIELD(name, doc) int64_t name = 0;
  LMS_FOR_EACH_STATISTIC(LMS_STATISTIC_FIELD)
#undef LMS_STATISTIC_FIELD

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
