// A seeded random sequence of engine operations (allocate small and large,
// free, pin, PinAll, unpin, evict, prefetch, rewrite, read back) on a device
// of a few granules, so reclaims and page-ins happen all the time, with
// Engine::CheckInvariants after every operation and every byte of an
// allocation checked against its pattern whenever it is pinned and before
// it is freed. Over the backend the tests ask for (test_backend.h), like the
// other engine tests.
//
// The seeds are fixed so a run is deterministic: a failure names its seed,
// step and operation, and LMS_TEST_FUZZ_SEEDS=FIRST-LAST replays those
// seeds (one seed: FIRST-FIRST); LMS_TEST_FUZZ_STEPS sets the steps per seed.
//   LMS_TEST_FUZZ_SEEDS=1-500 build/cc/engine_test_plain EngineFuzz
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace lms::engine_test {
namespace {

// One live allocation of the model: its pattern's seed and the pins it holds.
struct Live {
  void* ptr;
  size_t bytes;
  uint64_t seed;
  std::vector<uint64_t> pins;  // unit ids, one per pin taken through ptr
};

class EngineFuzz {
 public:
  static constexpr size_t kMostPins = 4;

  explicit EngineFuzz(uint64_t seed) : seed_(seed), rng_(seed) {
    Setup setup{/*device=*/8, /*host=*/64};
    setup.defrag = seed % 2 == 0;
    setup.policy = seed % 3 == 0 ? PolicyKind::kLearned : PolicyKind::kLru;
    // Seeds 3, 4, 7, 8, ...: evictions leave addresses unmapped (Note
    // [Evicted tensors unmapped]); the pattern's reads and writes then go
    // through the engine's copies, which map an evicted unit back.
    setup.unmap_evicted = seed % 4 == 3 || seed % 4 == 0;
    e_ = MakeEngine(setup);
    // Half the seeds read HeldBytes, as KernelPins' admission does: it is
    // published from then on, and CheckInvariants checks every publish.
    if (seed % 2 == 1) (void)e_->HeldBytes();
  }

  // What the steps made the engine do (before the teardown's frees).
  const Statistics& statistics() const { return before_teardown_; }
  int64_t refusals() const { return refusals_; }

  // Runs `steps` random operations; false at the first broken expectation.
  bool Run(int steps) {
    for (step_ = 0; step_ < steps; ++step_) {
      const int roll = static_cast<int>(rng_() % 100);
      // Pins are a running kernel's: a few at a time, so the device has
      // inactive units to reclaim.
      const bool pin = roll >= 45 && roll < 62 && Pins() < kMostPins;
      const bool ok = roll < 25 || live_.empty() ? Allocate()
                      : roll < 45                ? Free()
                      : pin && roll < 57         ? Pin()
                      : pin                      ? PinAll()
                      : roll < 80                ? Unpin()
                      : roll < 88                ? Evict()
                      : roll < 93                ? Rewrite()
                      : roll < 98                ? Read()
                                                 : Prefetch();
      if (!ok || !Expect(e_->CheckInvariants(), "CheckInvariants")) return false;
    }
    before_teardown_ = e_->GetStatistics();
    op_ = "teardown";
    while (!live_.empty()) {
      if (!FreeAt(live_.size() - 1) || !Expect(e_->CheckInvariants(), "CheckInvariants")) {
        return false;
      }
    }
    const Statistics s = e_->GetStatistics();
    return Expect(s.bytes_in_use == 0 && s.current_bytes_reclaimed == 0,
                  "bytes in use or reclaimed after every free");
  }

 private:
  // Small objects (pages) and large allocations of one to three granules.
  bool Allocate() {
    op_ = "allocate";
    const size_t bytes = rng_() % 2 == 0 ? 1 + rng_() % (kGranule / 2)
                                         : kGranule + rng_() % (2 * kGranule);
    const int roll = static_cast<int>(rng_() % 10);
    const Hold hold = roll < 5 ? Hold::kNone : roll < 9 ? Hold::kPin : Hold::kWriter;
    Status s;
    uint64_t unit_id = 0;
    void* p = e_->Allocate(bytes, hold, &s, &unit_id);
    if (p == nullptr) return ExpectExhausted(s);
    live_.push_back({p, bytes, ++next_pattern_, {}});
    if (hold == Hold::kPin) live_.back().pins.push_back(unit_id);
    return Expect(FillAllocation(*e_, p, bytes, next_pattern_), "fill");
  }

  bool Free() {
    op_ = "free";
    return FreeAt(rng_() % live_.size());
  }

  // As a kernel ends: its pins go, then every byte is checked and it is freed.
  bool FreeAt(size_t i) {
    Live& a = live_[i];
    for (uint64_t id : a.pins) {
      if (!Expect(e_->Unpin(a.ptr, id), "unpin before free")) return false;
    }
    if (!ExpectIntact(a) || !Expect(e_->Free(a.ptr), "free")) return false;
    live_[i] = live_.back();
    live_.pop_back();
    return true;
  }

  // Through any byte of the allocation; pinned, it is resident and intact.
  bool Pin() {
    op_ = "pin";
    Live& a = live_[rng_() % live_.size()];
    uint64_t id = 0;
    const Status s = e_->Pin(static_cast<char*>(a.ptr) + rng_() % a.bytes, &id);
    if (!s.ok()) return ExpectExhausted(s);
    a.pins.push_back(id);
    return ExpectResidentAndIntact(a);
  }

  bool Unpin() {
    op_ = "unpin";
    std::vector<Live*> pinned;
    for (Live& a : live_) {
      if (!a.pins.empty()) pinned.push_back(&a);
    }
    if (pinned.empty()) return true;
    Live& a = *pinned[rng_() % pinned.size()];
    const uint64_t id = a.pins.back();
    a.pins.pop_back();
    return Expect(e_->Unpin(a.ptr, id), "unpin");
  }

  // A kernel's inputs, duplicates allowed: each pin that worked holds.
  bool PinAll() {
    op_ = "pin all";
    const size_t count = 1 + rng_() % 4;
    std::vector<size_t> which(count);
    std::vector<const void*> ptrs(count);
    for (size_t k = 0; k < count; ++k) {
      which[k] = rng_() % live_.size();
      ptrs[k] = live_[which[k]].ptr;
    }
    std::vector<uint64_t> ids(count, 0);
    const Status s = e_->PinAll(ptrs.data(), count, ids.data());
    if (!s.ok() && !ExpectExhausted(s)) return false;
    for (size_t k = 0; k < count; ++k) {
      if (ids[k] == 0) continue;
      live_[which[k]].pins.push_back(ids[k]);
      if (!ExpectResidentAndIntact(live_[which[k]])) return false;
    }
    return true;
  }

  // Refused only for a unit that is pinned, unclaimed or already evicted,
  // or with the host pool full.
  bool Evict() {
    op_ = "evict";
    const Live& a = live_[rng_() % live_.size()];
    const Status s = e_->Evict(a.ptr);
    return s.ok() || s.code() == StatusCode::kFailedPrecondition || ExpectExhausted(s);
  }

  // New bytes wherever the allocation is, resident or evicted.
  bool Rewrite() {
    op_ = "rewrite";
    Live& a = live_[rng_() % live_.size()];
    a.seed = ++next_pattern_;
    return Expect(FillAllocation(*e_, a.ptr, a.bytes, a.seed), "fill");
  }

  bool Read() {
    op_ = "read";
    return ExpectIntact(live_[rng_() % live_.size()]);
  }

  bool Prefetch() {
    op_ = "prefetch";
    uint64_t units = 0;
    return Expect(e_->Prefetch(/*lookahead=*/1 + rng_() % 8, &units), "prefetch");
  }

  size_t Pins() const {
    size_t pins = 0;
    for (const Live& a : live_) pins += a.pins.size();
    return pins;
  }

  bool ExpectResidentAndIntact(const Live& a) {
    AllocationInfo info;
    if (!Expect(e_->Inspect(a.ptr, &info), "inspect")) return false;
    // A unit larger than the device would be pinned in place; none is here.
    return Expect(!info.evicted && info.pin_count > 0, "a pinned unit resident") &&
           ExpectIntact(a);
  }

  bool ExpectIntact(const Live& a) {
    Status s;
    const int64_t bad = VerifyAllocation(*e_, a.ptr, a.bytes, a.seed, &s);
    if (bad == -1) return true;
    Report("byte " + std::to_string(bad) + " of an allocation of " + std::to_string(a.bytes) +
           " differs from its pattern " + s.ToString());
    return false;
  }

  // A request the device could not take (everything else pinned or
  // unclaimed, or the host pool full) is refused as exhausted, nothing else.
  bool ExpectExhausted(const Status& s) {
    refusals_ += s.code() == StatusCode::kResourceExhausted;
    return s.code() == StatusCode::kResourceExhausted || Expect(s, "a refusal");
  }

  bool Expect(const Status& s, const char* what) {
    if (!s.ok()) Report(std::string(what) + ": " + s.ToString());
    return s.ok();
  }

  bool Expect(bool holds, const char* what) {
    if (!holds) Report(std::string("expected ") + what);
    return holds;
  }

  void Report(const std::string& what) {
    std::printf("  seed %" PRIu64 ", step %d (%s, %zu live): %s\n", seed_, step_, op_,
                live_.size(), what.c_str());
    ++lms_test::Failures();
  }

  const uint64_t seed_;
  std::mt19937_64 rng_;
  std::unique_ptr<Engine> e_;
  std::vector<Live> live_;
  uint64_t next_pattern_ = 0;
  int step_ = 0;
  const char* op_ = "";
  Statistics before_teardown_;
  int64_t refusals_ = 0;
};

// The seeds and steps a run takes: fixed, or from the environment.
void FuzzRange(uint64_t* first, uint64_t* last, int* steps) {
  *first = 1;
  *last = 6;
  // Granules of 2 MiB (collapsed huge pages) move 32 times the bytes a step.
  *steps = kGranule > (size_t{64} << 10) ? 150 : 1500;
  if (const char* seeds = std::getenv("LMS_TEST_FUZZ_SEEDS")) {
    if (std::sscanf(seeds, "%" SCNu64 "-%" SCNu64, first, last) != 2 || *first > *last) {
      std::printf("LMS_TEST_FUZZ_SEEDS=%s is not FIRST-LAST\n", seeds);
      std::abort();
    }
  }
  if (const char* n = std::getenv("LMS_TEST_FUZZ_STEPS")) *steps = std::atoi(n);
}

TEST(EngineFuzzKeepsEveryInvariantAndEveryByteUnderRandomOperations) {
  uint64_t first = 0, last = 0;
  int steps = 0;
  FuzzRange(&first, &last, &steps);
  int64_t evictions = 0, page_ins = 0, refusals = 0;
  for (uint64_t seed = first; seed <= last; ++seed) {
    EngineFuzz fuzz(seed);
    if (!fuzz.Run(steps)) return;  // one seed's report is enough
    evictions += fuzz.statistics().num_evictions;
    page_ins += fuzz.statistics().num_page_ins;
    refusals += fuzz.refusals();
  }
  std::printf("  seeds %" PRIu64 "-%" PRIu64 ", %d steps each: %" PRId64 " evictions, %" PRId64
              " page-ins, %" PRId64 " requests refused as exhausted\n",
              first, last, steps, evictions, page_ins, refusals);
}

}  // namespace
}  // namespace lms::engine_test
