#include "engine/granule_pool.h"

namespace lms {

GranulePool::GranulePool(PoolKind kind, size_t capacity)
    : kind_(kind), capacity_(capacity) {
  free_.reserve(capacity);
  for (size_t i = capacity; i > 0; --i) {
    free_.push_back(static_cast<GranuleId>(i - 1));
  }
}

bool GranulePool::Take(size_t n, GranuleId* out) {
  if (n > free_.size()) return false;
  for (size_t i = 0; i < n; ++i) {
    out[i] = free_.back();
    free_.pop_back();
  }
  if (in_use() > peak_in_use_) peak_in_use_ = in_use();
  return true;
}

void GranulePool::Give(const GranuleId* ids, size_t n) {
  for (size_t i = n; i > 0; --i) free_.push_back(ids[i - 1]);
}

}  // namespace lms
