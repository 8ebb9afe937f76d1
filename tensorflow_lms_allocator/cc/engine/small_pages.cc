#include "engine/small_pages.h"

namespace lms {

SmallPages::SmallPages(size_t granule, uint64_t max_pages, size_t tiny_bytes)
    : units_per_page_(granule / kUnit),
      max_pages_(max_pages),
      tiny_bytes_(tiny_bytes),
      arenas_{{max_pages * units_per_page_, /*index_interior=*/false,
               /*segment_units=*/units_per_page_},
              {max_pages * units_per_page_, /*index_interior=*/false,
               /*segment_units=*/units_per_page_},
              {max_pages * units_per_page_, /*index_interior=*/false,
               /*segment_units=*/units_per_page_}} {
  static_assert(kNumClasses == 3, "one initializer per class above");
}

bool SmallPages::TakeSegment(uint64_t* segment) {
  if (!free_segments_.empty()) {
    *segment = free_segments_.back();
    free_segments_.pop_back();
    return true;
  }
  if (pages_.size() >= max_pages_) return false;
  for (auto& arena : arenas_) {
    if (!arena.Grow(units_per_page_)) return false;
  }
  *segment = pages_.size();
  pages_.emplace_back();
  return true;
}

void SmallPages::ReturnSegment(uint64_t segment) {
  pages_[segment] = Page();
  free_segments_.push_back(segment);
}

}  // namespace lms
