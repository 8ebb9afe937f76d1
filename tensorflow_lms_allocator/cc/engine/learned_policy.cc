#include "engine/learned_policy.h"

#include <algorithm>
#include <utility>

namespace lms {

namespace {

// How far a period may end from a finite prediction and still hit it: a
// quarter of it, or 2 ticks.
uint64_t Tolerance(uint64_t predicted) { return std::max<uint64_t>(2, predicted / 4); }

// Whether an inactive period of `actual` ticks (or kNever) is what
// `predicted` said.
bool Hits(uint64_t predicted, uint64_t actual) {
  if (predicted == LearnedPolicy::kNever || actual == LearnedPolicy::kNever) {
    return predicted == actual;
  }
  const uint64_t off = predicted > actual ? predicted - actual : actual - predicted;
  return off <= Tolerance(predicted);
}

}  // namespace

uint64_t LearnedPolicy::Key(const char* label, uint64_t bytes, uint32_t occurrence) {
  if (label == nullptr) return kNoKey;
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (const char* c = label; *c != '\0'; ++c) {
    h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  }
  h = (h ^ bytes) * 1099511628211ull;
  h = (h ^ occurrence) * 1099511628211ull;
  return h == kNoKey ? 1 : h;
}

LearnedPolicy::Unit& LearnedPolicy::unit(ChunkId id) {
  if (id >= units_.size()) units_.resize(id + 1);
  return units_[id];
}

LearnedPolicy::KeyEntry* LearnedPolicy::HoldKey(uint64_t key) {
  if (key == kNoKey) return nullptr;
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    if (keys_.empty()) {
      keys_.reserve(kMaxKeys);
      hand_ = keys_.end();
    }
    if (keys_.size() >= kMaxKeys && !ForgetAStaleKey()) return nullptr;
    it = keys_.emplace(key, KeyEntry()).first;
  }
  ++it->second.units;
  it->second.born = true;
  return &it->second;
}

bool LearnedPolicy::ForgetAStaleKey() {
  if (hand_ == keys_.end()) hand_ = keys_.begin();
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    KeyEntry& entry = hand_->second;
    if (entry.units == 0 && !entry.born) {
      hand_ = keys_.erase(hand_);
      if (hand_ == keys_.end()) hand_ = keys_.begin();
      return true;
    }
    entry.born = false;
    if (++hand_ == keys_.end()) hand_ = keys_.begin();
  }
  return false;
}

void LearnedPolicy::LetGoOfKey(Unit& u) {
  if (u.learned != nullptr) --u.learned->units;
  u.learned = nullptr;
}

void LearnedPolicy::Reset(Unit& u) {
  LetGoOfKey(u);
  u = Unit();
}

void LearnedPolicy::SetKey(ChunkId id, uint64_t key) {
  Unit& u = unit(id);
  KeyEntry* entry = HoldKey(key);  // first: `key` may be the one `u` holds
  LetGoOfKey(u);
  u.learned = entry;
}

LearnedPolicy::Unit& LearnedPolicy::object(uint64_t handle) {
  std::vector<Unit>& objects = objects_[handle >> 32];
  const ChunkId id = static_cast<ChunkId>(handle);
  if (id >= objects.size()) objects.resize(id + 1);
  return objects[id];
}

void LearnedPolicy::Born(ChunkId id, bool pinned) {
  Unit& u = unit(id);
  Reset(u);
  if (pinned) {
    Activate(u, /*tick=*/true);
  } else {
    Deactivate(u);
  }
}

void LearnedPolicy::Released(ChunkId id) {
  Unit& u = unit(id);
  if (!u.active && u.periods > 0) EndPeriod(u, kNever);
  Reset(u);
}

void LearnedPolicy::Activated(ChunkId id) { Activate(unit(id), /*tick=*/true); }

void LearnedPolicy::Deactivated(ChunkId id) { Deactivate(unit(id)); }

void LearnedPolicy::ObjectBorn(ChunkId page, int size_class, ChunkId id, uint64_t key,
                               bool pinned) {
  const uint64_t handle = Handle(size_class, id);
  Unit& o = object(handle);
  Reset(o);
  o.learned = HoldKey(key);
  o.holder = page;
  std::vector<uint64_t>& objects = unit(page).objects;
  o.index = static_cast<uint32_t>(objects.size());
  objects.push_back(handle);
  if (pinned) {
    o.pins = 1;
    Activate(o, /*tick=*/false);
  } else {
    Deactivate(o);
  }
}

void LearnedPolicy::ObjectPinned(int size_class, ChunkId id) {
  Unit& o = object(Handle(size_class, id));
  if (o.holder == kNoChunk) return;
  if (o.pins++ == 0) Activate(o, /*tick=*/false);
}

void LearnedPolicy::ObjectUnpinned(int size_class, ChunkId id) {
  Unit& o = object(Handle(size_class, id));
  if (o.holder == kNoChunk || o.pins == 0) return;
  if (--o.pins == 0) Deactivate(o);
}

void LearnedPolicy::ObjectReleased(int size_class, ChunkId id) {
  Unit& o = object(Handle(size_class, id));
  if (o.holder == kNoChunk) return;
  if (!o.active && o.periods > 0) EndPeriod(o, kNever);
  std::vector<uint64_t>& objects = unit(o.holder).objects;
  const uint64_t last = objects.back();
  objects[o.index] = last;
  object(last).index = o.index;
  objects.pop_back();
  Reset(o);
}

void LearnedPolicy::Activate(Unit& u, bool tick) {
  if (tick) ++tick_;
  if (!u.active && u.periods > 0) EndPeriod(u, tick_ - u.last_unpin);
  u.active = true;
}

void LearnedPolicy::Deactivate(Unit& u) {
  u.active = false;
  u.last_unpin = tick_;
  u.predicted = kUnknown;
  if (u.learned != nullptr && u.periods < u.learned->periods.size()) {
    u.predicted = u.learned->periods[u.periods];
  }
  if (u.predicted == kUnknown && !u.page) u.predicted = u.history.Guess();
  ++u.periods;
}

void LearnedPolicy::PeriodHistory::Add(uint64_t length) {
  if (size_ == kHistory) {  // the oldest goes, and its pairs with it
    for (size_t lag = 1; lag <= kMaxLag; ++lag) hits_[lag - 1] -= Hits(at(0), at(lag)) ? 1 : 0;
    first_ = static_cast<uint8_t>((first_ + 1) % kHistory);
    --size_;
  }
  const uint32_t kept = static_cast<uint32_t>(std::min<uint64_t>(length, UINT32_MAX));
  for (size_t lag = 1; lag <= kMaxLag && lag <= size_; ++lag) {
    hits_[lag - 1] += Hits(at(size_ - lag), kept) ? 1 : 0;
  }
  lengths_[(first_ + size_) % kHistory] = kept;
  ++size_;
}

uint64_t LearnedPolicy::PeriodHistory::Guess() const {
  const size_t n = size_;
  if (n == 0) return kUnknown;
  size_t best_lag = 0;
  size_t best_matches = 0, best_pairs = 1;  // the best fraction so far
  for (size_t lag = 1; 2 * lag <= n; ++lag) {
    const size_t matches = hits_[lag - 1], pairs = n - lag;
    if (matches * best_pairs > best_matches * pairs) {
      best_lag = lag;
      best_matches = matches;
      best_pairs = pairs;
    }
  }
  if (best_lag > 0 && 2 * best_matches >= best_pairs) return at(n - best_lag);
  return at(n - 1);
}

void LearnedPolicy::EndPeriod(Unit& u, uint64_t length) {
  if (u.predicted != kUnknown) {
    const bool hit = Hits(u.predicted, length);
    ++predictions_;
    hits_ += hit ? 1 : 0;
    window_ = (window_ << 1) | (hit ? 1 : 0);
    window_size_ = std::min(window_size_ + 1, kWindow);
  }
  // A period ending in a free is the unit's last: no guess follows it.
  if (!u.page && length != kNever) u.history.Add(length);
  if (u.learned == nullptr) return;
  const size_t period = u.periods - 1;
  if (period >= kMaxPeriods) return;
  std::vector<uint64_t>& periods = u.learned->periods;
  if (periods.size() <= period) periods.resize(period + 1, kUnknown);
  periods[period] = length;
}

void LearnedPolicy::Foresee(ChunkId id, uint64_t next_use) {
  foreseeing_ = true;
  unit(id).foreseen = next_use;
}

bool LearnedPolicy::trusted() const {
  if (foreseeing_) return true;
  if (window_size_ < kWindow / 2) return true;
  const uint64_t mask =
      window_size_ == kWindow ? ~uint64_t{0} : (uint64_t{1} << window_size_) - 1;
  return 2 * __builtin_popcountll(window_ & mask) >= window_size_;
}

uint64_t LearnedPolicy::PageDistance(const Unit& page) const {
  uint64_t soonest = kUnknown;
  for (uint64_t handle : page.objects) {
    const Unit& o = objects_[handle >> 32][static_cast<ChunkId>(handle)];
    if (o.active) return 0;
    if (o.predicted != kUnknown) soonest = std::min(soonest, Distance(o));
  }
  return soonest != kUnknown ? soonest : Distance(page);
}

uint64_t LearnedPolicy::Rank(const Unit& u, uint64_t live_bytes,
                             uint64_t granule_bytes) const {
  if (!u.page) return Distance(u);
  const uint64_t distance = foreseeing_ ? Distance(u) : PageDistance(u);
  // Bytes copied both ways, against the granule it frees: a page a quarter
  // full ranks as if needed four times farther ahead. Floored at 1/64 of a
  // granule, so a nearly empty page needed soon still waits its turn.
  const uint64_t live = std::max(live_bytes, granule_bytes / 64);
  if (distance >= kNever || live >= granule_bytes) return distance;
  const double scaled = static_cast<double>(distance) * static_cast<double>(granule_bytes) /
                        static_cast<double>(live);
  return scaled >= static_cast<double>(kNever - 1) ? kNever - 1
                                                   : static_cast<uint64_t>(scaled);
}

bool LearnedPolicy::Missed(const Unit& u) const {
  return u.predicted < kNever && tick_ - u.last_unpin > u.predicted + Tolerance(u.predicted);
}

uint64_t LearnedPolicy::Distance(const Unit& u) const {
  if (foreseeing_ && u.foreseen != kUnknown) {
    if (u.foreseen == kNever) return kNever;
    return u.foreseen > now_ ? u.foreseen - now_ : 0;
  }
  if (u.predicted == kNever) return kNever;
  // Its age, LRU's order, without a prediction or once it has missed (Note
  // [Overdue predictions]).
  if (u.predicted == kUnknown || Missed(u)) return tick_ - u.last_unpin;
  const uint64_t due = u.last_unpin + u.predicted;
  return due > tick_ ? due - tick_ : 0;
}

std::vector<ChunkId> LearnedPolicy::DueSoon(const Residency& residency,
                                            uint64_t lookahead) const {
  std::vector<std::pair<uint64_t, ChunkId>> due;
  for (ChunkId c = 0; c < units_.size() && c < residency.size(); ++c) {
    const Unit& u = units_[c];
    if (u.active || u.predicted == kUnknown || u.predicted == kNever || Missed(u)) continue;
    if (!residency.tracked(c) || !residency.record(c).evicted) continue;
    const uint64_t at = u.last_unpin + u.predicted;
    if (at <= tick_ + lookahead) due.emplace_back(at, c);
  }
  std::sort(due.begin(), due.end());
  std::vector<ChunkId> out;
  out.reserve(due.size());
  for (const auto& [at, c] : due) out.push_back(c);
  return out;
}

size_t LearnedPolicy::FitFrom(const Residency& residency,
                             const std::vector<std::pair<uint64_t, ChunkId>>& candidates,
                             const std::vector<bool>& taken, size_t next, uint64_t needed) {
  uint64_t best = residency.record(candidates[next].second).granules;
  if (best <= needed) return next;
  const uint64_t floor = candidates[next].first - candidates[next].first / 4;
  size_t pick = next;
  const size_t end = std::min(candidates.size(), next + 1 + kFitWindow);
  for (size_t j = next + 1; j < end && candidates[j].first >= floor; ++j) {
    const uint64_t granules = residency.record(candidates[j].second).granules;
    if (!taken[j] && granules >= needed && granules < best) {
      best = granules;
      pick = j;
    }
  }
  return pick;
}

bool LearnedPolicy::Plan(const Residency& residency, const SmallPages& pages,
                         uint64_t granules_needed, ReclaimPlan* plan) {
  plan->victims.clear();
  plan->single = false;
  if (residency.inactive_resident_granules() < granules_needed) return false;
  const uint64_t granule_bytes = pages.units_per_page() * SmallPages::kUnit;
  std::vector<std::pair<uint64_t, ChunkId>> candidates;  // (rank, unit), LRU order
  for (ChunkId c = residency.LeastRecentlyUsed(); c != kNoChunk;
       c = residency.NextMoreRecent(c)) {
    const uint64_t segment = residency.record(c).segment;
    const uint64_t live =
        segment == Residency::kNoSegment ? 0 : static_cast<uint64_t>(pages.page(segment).bytes);
    candidates.emplace_back(Rank(unit(c), live, granule_bytes), c);
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  uint64_t freed = 0;
  uint64_t nearest = kNever;  // the lowest rank of the victims taken
  std::vector<bool> taken(candidates.size(), false);
  for (size_t next = 0; next < candidates.size() && freed < granules_needed;) {
    if (taken[next]) {
      ++next;
      continue;
    }
    const size_t pick = FitFrom(residency, candidates, taken, next, granules_needed - freed);
    taken[pick] = true;
    plan->victims.push_back(candidates[pick].second);
    freed += residency.record(candidates[pick].second).granules;
    nearest = std::min(nearest, candidates[pick].first);
  }
  // One unit that frees enough alone, if it is not needed much sooner than
  // the nearest of those: it moves fewer bytes (Note [Learned eviction]).
  if (plan->victims.size() > 1) {
    for (const auto& [distance, c] : candidates) {
      if (residency.record(c).granules < granules_needed) continue;
      if (distance >= nearest / 4) plan->victims.assign(1, c);
      break;
    }
  }
  plan->single = plan->victims.size() == 1;
  return freed >= granules_needed;
}

}  // namespace lms
