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
  KeyEntry* entry = keys_.Find(key);
  if (entry == nullptr) {
    if (keys_.size() >= kMaxKeys && !ForgetAStaleKey()) return nullptr;
    entry = keys_.Insert(key);
  }
  ++entry->units;
  entry->born = true;
  return entry;
}

bool LearnedPolicy::ForgetAStaleKey() {
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    if (hand_ >= keys_.slots()) hand_ = 0;
    const size_t at = hand_++;
    if (keys_.key_at(at) == kNoKey) continue;  // a free slot
    KeyEntry& entry = keys_.entry_at(at);
    if (entry.units == 0 && !entry.born) {
      keys_.Erase(at);
      return true;
    }
    entry.born = false;
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

size_t LearnedPolicy::FitFrom(const Residency& residency, size_t next, uint64_t needed) {
  uint64_t best = residency.record(walked_[next].id).granules;
  if (best <= needed) return next;
  const uint64_t floor = walked_[next].rank - walked_[next].rank / 4;
  size_t pick = next;
  for (size_t j = next + 1; j < next + 1 + kFitWindow && Candidate(j) && walked_[j].rank >= floor;
       ++j) {
    const uint64_t granules = residency.record(walked_[j].id).granules;
    if (!taken_[j] && granules >= needed && granules < best) {
      best = granules;
      pick = j;
    }
  }
  return pick;
}

bool LearnedPolicy::Candidate(size_t i) {
  RankedUnit next;
  while (walked_.size() <= i) {
    if (!walking_ || !order_.Next(&next)) return false;
    walked_.push_back(next);
    taken_.push_back(false);
  }
  return true;
}

const RankedUnit* LearnedPolicy::FirstOfAtLeast(const Residency& residency, uint64_t granules,
                                                uint64_t lowest_rank) {
  // The first candidate that frees enough, unless one ranked below
  // `lowest_rank` comes first (every later one ranks no higher): among
  // those walked so far, else the first of those not walked yet.
  for (const RankedUnit& r : walked_) {
    if (r.rank < lowest_rank) return nullptr;
    if (residency.record(r.id).granules >= granules) return &r;
  }
  // Pages, ranked apart, free one granule: never enough here (a reclaim of
  // one granule takes its first candidate alone).
  if (!walking_ || !order_.FirstOfAtLeast(granules, &single_) || single_.rank < lowest_rank) {
    return nullptr;
  }
  return &single_;
}

void LearnedPolicy::Reorder(Residency& residency) {
  residency.TakeListChanges(&list_changes_);
  for (ChunkId id : list_changes_) Reposition(residency, id);
  for (ChunkId id : changes_) {
    changed_[id] = false;
    Reposition(residency, id);
  }
  changes_.clear();
}

void LearnedPolicy::Reposition(const Residency& residency, ChunkId id) {
  if (id < page_at_.size() && page_at_[id] != UINT32_MAX) {  // off the pages
    const ChunkId last = listed_pages_.back();
    listed_pages_[page_at_[id]] = last;
    page_at_[last] = page_at_[id];
    listed_pages_.pop_back();
    page_at_[id] = UINT32_MAX;
  }
  if (!residency.tracked(id) || !residency.record(id).in_lru) {
    order_.Remove(id);
    return;
  }
  const uint64_t seq = residency.record(id).lru_seq;
  const uint64_t granules = residency.record(id).granules;
  const Unit& u = unit(id);
  if (u.page) {
    order_.Remove(id);
    if (id >= page_at_.size()) page_at_.resize(id + 1, UINT32_MAX);
    page_at_[id] = static_cast<uint32_t>(listed_pages_.size());
    listed_pages_.push_back(id);
  } else if (u.predicted == kNever) {
    order_.PutNever(id, granules, kNever, seq);
  } else if (u.predicted == kUnknown) {
    order_.PutAged(id, granules, u.last_unpin, seq);
  } else {
    // Missed or not, the walk tells (ReclaimOrder::BeginWalk): the same
    // test as Missed's.
    const uint64_t due = u.last_unpin + u.predicted;
    order_.PutDue(id, granules, u.last_unpin, due, due + Tolerance(u.predicted), seq);
  }
}

RankedUnit LearnedPolicy::Ranked(const Residency& residency, const SmallPages& pages,
                                 uint64_t granule_bytes, ChunkId c) {
  const Residency::Record& r = residency.record(c);
  const uint64_t live =
      r.segment == Residency::kNoSegment ? 0 : static_cast<uint64_t>(pages.page(r.segment).bytes);
  return RankedUnit{Rank(unit(c), live, granule_bytes), r.lru_seq, c};
}

std::vector<RankedUnit> LearnedPolicy::RankPages(const Residency& residency,
                                                 const SmallPages& pages,
                                                 uint64_t granule_bytes) {
  std::vector<RankedUnit> ranked;
  ranked.reserve(listed_pages_.size());
  for (ChunkId c : listed_pages_) {
    ranked.push_back(Ranked(residency, pages, granule_bytes, c));
  }
  std::sort(ranked.begin(), ranked.end(), TakenBefore);
  return ranked;
}

void LearnedPolicy::SortEveryUnit(const Residency& residency, const SmallPages& pages,
                                  uint64_t granule_bytes) {
  for (ChunkId c = residency.LeastRecentlyUsed(); c != kNoChunk;
       c = residency.NextMoreRecent(c)) {
    walked_.push_back(Ranked(residency, pages, granule_bytes, c));
  }
  std::sort(walked_.begin(), walked_.end(), TakenBefore);  // lru_seq: no ties
  taken_.assign(walked_.size(), false);
}

bool LearnedPolicy::Plan(Residency& residency, const SmallPages& pages,
                         uint64_t granules_needed, ReclaimPlan* plan) {
  plan->victims.clear();
  plan->single = false;
  // Kept up even when not walked, so that it is right when it is next.
  Reorder(residency);
  if (residency.inactive_resident_granules() < granules_needed) return false;
  const uint64_t granule_bytes = pages.units_per_page() * SmallPages::kUnit;
  walked_.clear();
  taken_.clear();
  walking_ = !foreseeing_ && !sort_every_reclaim_;
  if (walking_) {
    order_.BeginWalk(tick_, RankPages(residency, pages, granule_bytes));
  } else {
    SortEveryUnit(residency, pages, granule_bytes);
  }
  uint64_t freed = 0;
  uint64_t nearest = kNever;  // the lowest rank of the victims taken
  for (size_t next = 0; freed < granules_needed && Candidate(next);) {
    if (taken_[next]) {
      ++next;
      continue;
    }
    const size_t pick = FitFrom(residency, next, granules_needed - freed);
    taken_[pick] = true;
    plan->victims.push_back(walked_[pick].id);
    freed += residency.record(walked_[pick].id).granules;
    nearest = std::min(nearest, walked_[pick].rank);
  }
  // One unit that frees enough alone, if it is not needed much sooner than
  // the nearest of those: it moves fewer bytes (Note [Learned eviction]).
  // The first that frees enough decides; none after one ranked below
  // nearest / 4 could pass.
  if (plan->victims.size() > 1) {
    const RankedUnit* single = FirstOfAtLeast(residency, granules_needed, nearest / 4);
    if (single != nullptr) plan->victims.assign(1, single->id);
  }
  walking_ = false;
  plan->single = plan->victims.size() == 1;
  return freed >= granules_needed;
}

}  // namespace lms
