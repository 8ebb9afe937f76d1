// The learned reclaim policy (engine/learned_policy.h, Note [Learned
// eviction]) through the engine: what it evicts, what it predicts, what it
// forgets, and what it prefetches, against LRU.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/learned_policy.h"
#include "engine/strict_monitor.h"
#include "engine_test_util.h"

namespace lms::engine_test {
namespace {

// Unpins the unit `p` lies in, by the id Inspect gives: a kernel that made
// `p` (allocated pinned) ends.
void UnpinAt(Engine& e, void* p) {
  AllocationInfo info;
  EXPECT_OK(e.Inspect(p, &info));
  EXPECT_OK(e.Unpin(p, info.unit_id));
}

// A kernel labelled `op` (nullptr: none) that reads `p`: pins and unpins it.
void UseIn(Engine& e, const char* op, void* p) {
  StrictMonitor::SetThreadLabel(op);
  uint64_t id = 0;
  EXPECT_OK(e.Pin(p, &id));
  EXPECT_OK(e.Unpin(p, id));
}

// `count` one-granule tensors, each allocated pinned by its own "kernel"
// (thread label op<i>, so the learned policy keys them apart), filled with
// pattern seed_base + i and unpinned.
std::vector<void*> KernelTensors(Engine& e, int count, uint64_t seed_base) {
  static const char* const kOps[] = {"op0", "op1", "op2", "op3", "op4", "op5", "op6", "op7"};
  std::vector<void*> tensors;
  for (int i = 0; i < count; ++i) {
    StrictMonitor::SetThreadLabel(kOps[i]);
    void* p = MustAllocate(e, kGranule, /*pin=*/true);
    if (p == nullptr) std::abort();
    Fill(e, p, kGranule, seed_base + i);
    UnpinAt(e, p);
    tensors.push_back(p);
  }
  StrictMonitor::SetThreadLabel(nullptr);
  return tensors;
}

// Eight tensors used round and round on a device that holds seven: LRU
// evicts exactly the one needed next, every time; the learned policy (Note
// [Learned eviction]) evicts the one used farthest ahead once it has seen a
// round. Every byte survives under both.
int64_t LoopPageIns(PolicyKind policy, int64_t* learned_reclaims) {
  Setup setup{/*device=*/7, /*host=*/16};
  setup.policy = policy;
  auto e = MakeEngine(setup);
  const std::vector<void*> tensors = KernelTensors(*e, 8, 100);
  for (int round = 0; round < 6; ++round) {
    for (void* p : tensors) {
      uint64_t id;
      EXPECT_OK(e->Pin(p, &id));
      EXPECT_OK(e->Unpin(p, id));
    }
  }
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Verify(*e, tensors[i], kGranule, 100 + i), -1);
  EXPECT_OK(e->CheckInvariants());
  const Statistics s = e->GetStatistics();
  *learned_reclaims = s.num_learned_reclaims;
  return s.num_page_ins;
}

TEST(TheLearnedPolicyEvictsWhatALoopNeedsLast) {
  int64_t lru_learned = 0, learned = 0;
  const int64_t lru = LoopPageIns(PolicyKind::kLru, &lru_learned);
  const int64_t ours = LoopPageIns(PolicyKind::kLearned, &learned);
  EXPECT_EQ(lru, 48);  // every use of every round misses
  EXPECT_EQ(lru_learned, 0);
  EXPECT_TRUE(learned > 0);
  EXPECT_TRUE(ours * 3 <= lru);
}

// One kernel ("split") makes two outputs of one size each step: the first is
// used by the next kernel, the second ten kernels later. Keyed by op and
// size alone they would share what was learned, and the first's prediction
// would miss every step; keyed by their occurrence too, every prediction
// hits once a step has been seen. (The eight kernels between make a
// temporary each, of one size: their occurrences key them apart too.)
// Runs five such steps on `e` and checks the last three's predictions.
void RunStepsOfASplitKernel(Engine& e) {
  Statistics before;
  for (int step = 0; step < 5; ++step) {
    if (step == 2) before = e.GetStatistics();
    StrictMonitor::SetThreadLabel("split");
    void* first = MustAllocate(e, kGranule, /*pin=*/true);
    void* second = MustAllocate(e, kGranule, /*pin=*/true);
    ASSERT_TRUE(first && second);
    Fill(e, second, kGranule, step);
    UnpinAt(e, first);
    UnpinAt(e, second);
    UseIn(e, "use_first", first);
    StrictMonitor::SetThreadLabel("temporaries");
    for (int i = 0; i < 8; ++i) {
      void* t = MustAllocate(e, 2 * kGranule, /*pin=*/true);
      ASSERT_TRUE(t != nullptr);
      UnpinAt(e, t);
      EXPECT_OK(e.Free(t));
    }
    UseIn(e, "use_second", second);
    EXPECT_EQ(Verify(e, second, kGranule, step), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    EXPECT_OK(e.Free(first));
    EXPECT_OK(e.Free(second));
  }
  const Statistics after = e.GetStatistics();
  const int64_t predictions = after.num_predictions - before.num_predictions;
  EXPECT_EQ(predictions, 3 * (2 * 2 + 8));  // three steps: two periods of each output, 8 temporaries
  EXPECT_EQ(after.num_prediction_hits - before.num_prediction_hits, predictions);
}

TEST(TheLearnedPolicyTellsApartTwoSameSizedOutputsOfOneKernel) {
  Setup setup{/*device=*/16, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  RunStepsOfASplitKernel(*MakeEngine(setup));
}

// A run whose shapes changed every step for a while (here: 196,608 kernels,
// each allocating a tensor under a label never seen again, three times the
// keys the table holds) still learns the steps that follow (Note [Forgetting keys]);
// a table that kept every key would be full and learn nothing more. A
// tensor that stays live meanwhile holds its key's entry, which is never
// forgotten (under ASan, a forgotten one would be used after its free when
// the tensor is freed).
TEST(TheLearnedPolicyForgetsKeysThatNeverComeBack) {
  Setup setup{/*device=*/16, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  auto e = MakeEngine(setup);
  StrictMonitor::SetThreadLabel("kept");
  void* kept = MustAllocate(*e, 1000);
  ASSERT_TRUE(kept != nullptr);
  Fill(*e, kept, 1000, 3);
  const size_t kShapes = 3 * LearnedPolicy::kMaxKeys;  // the hand goes round twice
  for (size_t i = 0; i < kShapes; ++i) {
    const std::string label = "shapes_" + std::to_string(i);
    StrictMonitor::SetThreadLabel(label.c_str());
    void* t = MustAllocate(*e, 1000, /*pin=*/true);
    ASSERT_TRUE(t != nullptr);
    UnpinAt(*e, t);
    EXPECT_OK(e->Free(t));
  }
  StrictMonitor::SetThreadLabel(nullptr);
  RunStepsOfASplitKernel(*e);
  EXPECT_EQ(Verify(*e, kept, 1000, 3), -1);
  EXPECT_OK(e->Free(kept));
  EXPECT_OK(e->CheckInvariants());
}

// `granules` granules allocated by the kernel `op`, pinned, then unpinned.
void* MadeBy(Engine& e, const char* op, size_t granules) {
  StrictMonitor::SetThreadLabel(op);
  void* p = MustAllocate(e, granules * kGranule, /*pin=*/true);
  if (p == nullptr) std::abort();
  UnpinAt(e, p);
  return p;
}

// A device of 8 granules under the learned policy, defragmented: freed
// memory serves the next step wherever it lies.
std::unique_ptr<Engine> EightGranulesLearnedDefrag() {
  Setup setup{/*device=*/8, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  setup.defrag = true;
  return MakeEngine(setup);
}

// Each step a kernel needs 2 granules while B (1 granule, used last), C (3,
// used next-to-last) and A (2, used first) are inactive. Farthest first
// would evict B and C (4 granules, paged in again later); C alone frees
// enough, so the learned policy evicts it alone: 3 granules move each way.
TEST(TheLearnedPolicyEvictsOneUnitThatFreesEnoughInsteadOfSeveral) {
  auto e = EightGranulesLearnedDefrag();
  Statistics before;
  for (int step = 0; step < 5; ++step) {
    if (step == 2) before = e->GetStatistics();
    void* b = MadeBy(*e, "make_b", 1);
    void* c = MadeBy(*e, "make_c", 3);
    void* a = MadeBy(*e, "make_a", 2);
    Fill(*e, a, 2 * kGranule, step);
    void* scratch = MadeBy(*e, "kernel", 4);  // needs 2 granules more than are free
    AllocationInfo info;
    EXPECT_OK(e->Inspect(b, &info));
    EXPECT_TRUE(!info.evicted);
    EXPECT_OK(e->Free(scratch));
    UseIn(*e, "use_a", a);
    UseIn(*e, "use_c", c);
    UseIn(*e, "use_b", b);
    EXPECT_EQ(Verify(*e, a, 2 * kGranule, step), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    for (void* p : {a, b, c}) EXPECT_OK(e->Free(p));
  }
  const Statistics after = e->GetStatistics();
  EXPECT_TRUE(after.num_learned_reclaims > before.num_learned_reclaims);
  // Three steps: C out and in, 3 granules each way, every step.
  EXPECT_EQ(after.bytes_reclaimed - before.bytes_reclaimed,
            static_cast<int64_t>(3 * 3 * kGranule));
  EXPECT_EQ(after.bytes_paged_in - before.bytes_paged_in,
            static_cast<int64_t>(3 * 3 * kGranule));
}

// Each step a kernel needs 1 granule more than is free while X (4 granules,
// used last), Y (1) and A (2, used `before` times before Y and `between`
// times between Y and X) are inactive. Farthest first would evict X,
// freeing 3 granules more than needed; Y frees enough, and goes instead if
// it is needed nearly as late: at least 3/4 of X's distance (Note [Learned
// eviction]). Returns the granules evicted over the last three steps (each
// comes back in).
int64_t GranulesEvictedWithXYA(int before_y, int between) {
  auto e = EightGranulesLearnedDefrag();
  Statistics before;
  for (int step = 0; step < 5; ++step) {
    if (step == 2) before = e->GetStatistics();
    void* y = MadeBy(*e, "make_y", 1);
    void* x = MadeBy(*e, "make_x", 4);
    void* a = MadeBy(*e, "make_a", 2);
    Fill(*e, x, 4 * kGranule, step);
    Fill(*e, y, kGranule, step + 10);
    void* scratch = MadeBy(*e, "kernel", 2);  // needs 1 granule more than is free
    EXPECT_OK(e->Free(scratch));
    for (int use = 0; use < before_y; ++use) UseIn(*e, "use_a", a);
    UseIn(*e, "use_y", y);
    for (int use = 0; use < between; ++use) UseIn(*e, "use_a_again", a);
    UseIn(*e, "use_x", x);
    EXPECT_EQ(Verify(*e, x, 4 * kGranule, step), -1);
    EXPECT_EQ(Verify(*e, y, kGranule, step + 10), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    for (void* p : {a, x, y}) EXPECT_OK(e->Free(p));
  }
  const Statistics after = e->GetStatistics();
  EXPECT_TRUE(after.num_learned_reclaims > before.num_learned_reclaims);
  EXPECT_EQ(after.bytes_paged_in - before.bytes_paged_in,
            after.bytes_reclaimed - before.bytes_reclaimed);
  return (after.bytes_reclaimed - before.bytes_reclaimed) / static_cast<int64_t>(kGranule);
}

TEST(TheLearnedPolicyEvictsTheUnitThatFitsAmongThoseNeededNearlyAsLate) {
  // Y needed one use before X, 3 uses of A ahead of both: Y goes, 1
  // granule a step.
  EXPECT_EQ(GranulesEvictedWithXYA(/*before_y=*/3, /*between=*/0), 3);
  // Y needed about half as far ahead as X: X goes, 4 a step.
  EXPECT_EQ(GranulesEvictedWithXYA(/*before_y=*/1, /*between=*/2), 12);
}

// A unit used round and round expects its last inactive period again: a
// large allocation does, and so does a small object; a small-object page,
// whose objects come and go with the kernels, does not (Note [Learned
// eviction]): pinning an object makes the object's prediction only.
int64_t PredictionsForATensorUsedRoundAndRound(size_t bytes) {
  Setup setup{/*device=*/8, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  auto e = MakeEngine(setup);
  void* p = MustAllocate(*e, bytes);
  if (p == nullptr) std::abort();
  AllocationInfo info;
  EXPECT_OK(e->Inspect(p, &info));
  EXPECT_EQ(info.small, bytes < kGranule);
  for (int round = 0; round < 6; ++round) UseIn(*e, nullptr, p);
  EXPECT_OK(e->Free(p));
  return e->GetStatistics().num_predictions;
}

TEST(ASmallObjectPageDoesNotExpectItsLastPeriodAgain) {
  EXPECT_EQ(PredictionsForATensorUsedRoundAndRound(kGranule), 6);  // 5 pins, the free
  EXPECT_EQ(PredictionsForATensorUsedRoundAndRound(1000), 6);  // the object's, none of its page
}

// A weight, made outside any kernel (so without a key), is used three times
// a step with 3, 12 and 30 other kernels between (its forward use, its
// gradient's, the optimizer's update): its inactive periods run 4, 13 and 31
// ticks in turn. Expecting its last period again misses every time; its
// periods repeat at a lag of three (Note [Periodic units]), so once two
// steps are in its history every prediction hits, the other tensor's too.
TEST(AUnitUsedSeveralTimesAStepPredictsEachOfItsPeriods) {
  Setup setup{/*device=*/8, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  auto e = MakeEngine(setup);
  void* weight = MustAllocate(*e, kGranule);
  ASSERT_TRUE(weight != nullptr);
  Fill(*e, weight, kGranule, 7);
  const std::vector<void*> other = KernelTensors(*e, 1, 8);
  const int kGaps[] = {3, 12, 30};
  Statistics before;
  for (int step = 0; step < 8; ++step) {
    if (step == 4) before = e->GetStatistics();
    for (int gap : kGaps) {
      UseIn(*e, "use_weight", weight);
      for (int i = 0; i < gap; ++i) UseIn(*e, "use_other", other[0]);
    }
  }
  StrictMonitor::SetThreadLabel(nullptr);
  const Statistics after = e->GetStatistics();
  const int64_t predictions = after.num_predictions - before.num_predictions;
  EXPECT_EQ(predictions, 4 * (3 + 45));  // four steps: the weight's 3 periods, the other's 45
  EXPECT_EQ(after.num_prediction_hits - before.num_prediction_hits, predictions);
  EXPECT_EQ(Verify(*e, weight, kGranule, 7), -1);
  EXPECT_OK(e->CheckInvariants());
}

// Each step a page holds `cold` (freed unused) and `hot` (used right after
// the shortfall), and L (one granule, used last) is more recently used than
// the page, which has been inactive longer than L will be. When a kernel
// needs a granule, LRU evicts the page, and so would the learned policy if
// it ranked the page by its age (longer than L's predicted distance) or by
// its farthest object (`cold`: never); ranked by its soonest object, `hot`,
// the page stays and L goes. Unless the page is mostly empty: a page whose
// objects fill a quarter of it copies a quarter of L's bytes, and ranks as
// if `hot` were used four times later than it is, after L.
// `count` one-granule temporaries, each pinned at birth and freed: kernels
// that tick the learned policy's clock.
void Churn(Engine& e, int count) {
  StrictMonitor::SetThreadLabel("temporary");
  for (int i = 0; i < count; ++i) {
    void* t = MustAllocate(e, kGranule, /*pin=*/true);
    if (t == nullptr) std::abort();
    UnpinAt(e, t);
    EXPECT_OK(e.Free(t));
  }
}

// A kernel ("kernel") needing one granule while another ("held") holds one,
// both pinned: on a full device, the reclaim a test looks at. End() unpins
// and frees them.
class Shortfall {
 public:
  explicit Shortfall(Engine& e) : e_(e) {
    StrictMonitor::SetThreadLabel("held");
    held_ = MustAllocate(e, kGranule, /*pin=*/true);
    StrictMonitor::SetThreadLabel("kernel");
    needs_ = MustAllocate(e, kGranule, /*pin=*/true);
    if (held_ == nullptr || needs_ == nullptr) std::abort();
  }
  void End() const {
    for (void* p : {needs_, held_}) {
      UnpinAt(e_, p);
      EXPECT_OK(e_.Free(p));
    }
  }

 private:
  Engine& e_;
  void* held_ = nullptr;
  void* needs_ = nullptr;
};

// Fills `page_evicted` with whether the page was evicted (else L), per step
// after the first (LRU: always the page).
void PageOrLargeEvicted(PolicyKind policy, size_t object_bytes,
                        std::vector<bool>* page_evicted) {
  Setup setup{/*device=*/3, /*host=*/16};
  setup.policy = policy;
  auto e = MakeEngine(setup);
  for (int step = 0; step < 4; ++step) {
    StrictMonitor::SetThreadLabel("make_objects");
    void* cold = MustAllocate(*e, object_bytes);
    void* hot = MustAllocate(*e, object_bytes);
    Churn(*e, 6);
    StrictMonitor::SetThreadLabel("make_l");
    void* l = MustAllocate(*e, kGranule, /*pin=*/true);
    ASSERT_TRUE(cold && hot && l);
    Fill(*e, hot, object_bytes, step);
    Fill(*e, l, kGranule, 10 + step);
    UnpinAt(*e, l);
    const Shortfall shortfall(*e);
    AllocationInfo page, large;
    EXPECT_OK(e->Inspect(hot, &page));
    EXPECT_OK(e->Inspect(l, &large));
    EXPECT_TRUE(page.evicted != large.evicted);
    if (step == 0) {
      EXPECT_TRUE(page.evicted);  // nothing learned yet: LRU's choice
    } else {
      page_evicted->push_back(page.evicted);
    }
    shortfall.End();
    UseIn(*e, "use_hot", hot);
    Churn(*e, 2);
    UseIn(*e, "use_l", l);
    EXPECT_EQ(Verify(*e, hot, object_bytes, step), -1);
    EXPECT_EQ(Verify(*e, l, kGranule, 10 + step), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    for (void* p : {cold, hot, l}) EXPECT_OK(e->Free(p));
  }
  EXPECT_OK(e->CheckInvariants());
}

TEST(TheLearnedPolicyRanksAPageByTheSoonestUseOfItsObjects) {
  // Objects filling 7/8 of the page: ranked by `hot`, it stays.
  std::vector<bool> lru, learned;
  PageOrLargeEvicted(PolicyKind::kLru, kGranule * 7 / 16, &lru);
  PageOrLargeEvicted(PolicyKind::kLearned, kGranule * 7 / 16, &learned);
  EXPECT_TRUE(lru == std::vector<bool>(3, true));
  EXPECT_TRUE(learned == std::vector<bool>(3, false));
}

TEST(TheLearnedPolicyEvictsAMostlyEmptyPageBeforeAFullUnitNeededLater) {
  // A quarter full: the page copies a quarter of L's bytes, and goes.
  std::vector<bool> learned;
  PageOrLargeEvicted(PolicyKind::kLearned, kGranule / 8, &learned);
  EXPECT_TRUE(learned == std::vector<bool>(3, true));
}

// Each step B (keyed "make_b") is used right after a shortfall, and A (a
// new key every step, as a loop's tensors have no period of their own in
// the table) is read by three kernels in a row and then waits 8 kernels
// more: its history predicts 1 tick, and by the shortfall that prediction
// has missed (Note [Overdue predictions]). Counted as due, A would stay
// and B, needed next, would go (as under LRU, B being older); counted by
// its age, A goes, and it is not prefetched back. Every byte survives.
TEST(AUnitPastItsPredictionRanksByItsAge) {
  Setup setup{/*device=*/3, /*host=*/16};
  setup.policy = PolicyKind::kLearned;
  setup.defrag = true;  // freed granules are free for a prefetch
  auto e = MakeEngine(setup);
  static const char* const kMakeA[] = {"make_a0", "make_a1", "make_a2", "make_a3"};
  for (int step = 0; step < 4; ++step) {
    StrictMonitor::SetThreadLabel("make_b");
    void* b = MustAllocate(*e, kGranule, /*pin=*/true);
    StrictMonitor::SetThreadLabel(kMakeA[step]);
    void* a = MustAllocate(*e, kGranule, /*pin=*/true);
    ASSERT_TRUE(a && b);
    Fill(*e, a, kGranule, step);
    Fill(*e, b, kGranule, 10 + step);
    UnpinAt(*e, b);
    UnpinAt(*e, a);
    for (const char* op : {"read_a1", "read_a2", "read_a3"}) UseIn(*e, op, a);
    Churn(*e, 8);
    const Shortfall shortfall(*e);
    AllocationInfo info_a, info_b;
    EXPECT_OK(e->Inspect(a, &info_a));
    EXPECT_OK(e->Inspect(b, &info_b));
    // Step 0 has learned nothing of B: its age, the older, sends it.
    EXPECT_EQ(info_b.evicted, step == 0);
    EXPECT_EQ(info_a.evicted, step > 0);
    shortfall.End();
    uint64_t prefetched = 0;
    EXPECT_OK(e->Prefetch(/*lookahead=*/4, &prefetched));
    if (step > 0) EXPECT_EQ(prefetched, 0u);
    UseIn(*e, "use_b", b);
    Churn(*e, 2);
    UseIn(*e, "use_a", a);
    EXPECT_EQ(Verify(*e, a, kGranule, step), -1);
    EXPECT_EQ(Verify(*e, b, kGranule, 10 + step), -1);
    StrictMonitor::SetThreadLabel(nullptr);
    for (void* p : {a, b}) EXPECT_OK(e->Free(p));
  }
  EXPECT_OK(e->CheckInvariants());
}

// Seven tensors used round and round while each use also needs a 2-granule
// temporary, on 8 granules: the temporary evicts a tensor; once it is freed,
// the prefetch pages in the tensor predicted next into its granules, so its
// pin finds it resident. Every byte survives.
TEST(PrefetchPagesInThePredictedNextTensorIntoFreeMemory) {
  Setup setup{/*device=*/8, /*host=*/32};
  setup.policy = PolicyKind::kLearned;
  setup.defrag = true;  // the freed temporary's granules stay cached at its range
  auto e = MakeEngine(setup);
  const std::vector<void*> tensors = KernelTensors(*e, 7, 200);
  StrictMonitor::SetThreadLabel("temporary");
  uint64_t prefetched = 0;
  for (int round = 0; round < 6; ++round) {
    for (void* p : tensors) {
      uint64_t id;
      EXPECT_OK(e->Pin(p, &id));
      void* temp = MustAllocate(*e, 2 * kGranule, /*pin=*/true);
      if (temp == nullptr) std::abort();
      EXPECT_OK(e->Unpin(p, id));
      AllocationInfo info;
      EXPECT_OK(e->Inspect(temp, &info));
      EXPECT_OK(e->Unpin(temp, info.unit_id));
      EXPECT_OK(e->Free(temp));
      uint64_t units = 0;
      EXPECT_OK(e->Prefetch(/*lookahead=*/4, &units));
      prefetched += units;
    }
  }
  StrictMonitor::SetThreadLabel(nullptr);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(Verify(*e, tensors[i], kGranule, 200 + i), -1);
  EXPECT_OK(e->CheckInvariants());
  const Statistics s = e->GetStatistics();
  EXPECT_TRUE(prefetched > 0);
  EXPECT_TRUE(s.num_page_ins <= 20);  // LRU: 41 (every use of a round misses)
  EXPECT_EQ(s.num_prefetches, static_cast<int64_t>(prefetched));
  e.reset();  // one engine at a time (the fake driver counts what each leaves)
  // With the LRU policy the same call does nothing.
  auto lru = MakeEngine({/*device=*/8, /*host=*/32});
  void* p = MustAllocate(*lru, kGranule);
  EXPECT_OK(lru->Evict(p));
  uint64_t units = 1;
  EXPECT_OK(lru->Prefetch(4, &units));
  EXPECT_EQ(units, 0u);
}

// Training-like steps (weights, forward activations read back in the
// backward pass, temporaries, small objects in pages, kernels labelled as
// TensorFlow's) on a device smaller than a step's peak, under the learned
// policy; every byte is checked as it is freed. Returns, after every kernel,
// which allocations are evicted and the engine's moves so far.
std::vector<std::string> TrainingSteps(uint32_t seed, bool sort_every_reclaim,
                                       Statistics* statistics) {
  static const char* const kForward[] = {"f0", "f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8"};
  static const char* const kBackward[] = {"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8"};
  constexpr int kLayers = 9, kWeights = 5, kSteps = 6;
  Setup setup{/*device=*/12, /*host=*/96};
  setup.policy = PolicyKind::kLearned;
  setup.threshold = kGranule / 8;  // small objects share pages
  setup.defrag = true;
  auto e = MakeEngine(setup);
  if (sort_every_reclaim) EXPECT_OK(e->SortEveryReclaimForTesting());
  std::mt19937 rng(seed);
  struct Tensor {
    void* at;
    size_t bytes;
    uint64_t pattern;
  };
  uint64_t patterns = 0;
  std::vector<Tensor> live;
  // Allocates (pinned), labelled `op`, and fills.
  auto make = [&](const char* op, size_t bytes) {
    StrictMonitor::SetThreadLabel(op);
    Tensor t{MustAllocate(*e, bytes, /*pin=*/true), bytes, ++patterns};
    if (t.at == nullptr) {
      std::fflush(stdout);
      std::abort();
    }
    Fill(*e, t.at, bytes, t.pattern);
    return t;
  };
  auto pin = [&](const Tensor& t) {
    uint64_t id;
    EXPECT_OK(e->Pin(t.at, &id));
  };
  auto release = [&](const Tensor& t) {
    EXPECT_EQ(Verify(*e, t.at, t.bytes, t.pattern), -1);  // intact
    EXPECT_OK(e->Free(t.at));
  };
  std::vector<std::string> states;
  auto note = [&]() {
    const Statistics s = e->GetStatistics();
    std::string state = std::to_string(s.num_evictions) + " evictions, " +
                        std::to_string(s.num_page_ins) + " page-ins, " +
                        std::to_string(s.bytes_reclaimed) + " bytes; evicted:";
    for (size_t i = 0; i < live.size(); ++i) {
      AllocationInfo info;
      EXPECT_OK(e->Inspect(live[i].at, &info));
      if (info.evicted) state += " " + std::to_string(i);
    }
    states.push_back(state);
  };
  std::vector<Tensor> weights;
  for (int w = 0; w < kWeights; ++w) {
    weights.push_back(make(nullptr, (1 + rng() % 2) * kGranule));
    UnpinAt(*e, weights.back().at);
    live.push_back(weights.back());
  }
  // Each layer's activation size, the same every step.
  std::vector<size_t> sizes;
  for (int l = 0; l < kLayers; ++l) {
    sizes.push_back(rng() % 3 == 0 ? 1 + rng() % (kGranule / 8 - 1)
                                   : (1 + rng() % 3) * kGranule - rng() % 4096);
  }
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Tensor> acts;
    for (int l = 0; l < kLayers; ++l) {  // forward
      const Tensor& w = weights[l % kWeights];
      pin(w);
      if (l > 0) pin(acts.back());
      acts.push_back(make(kForward[l], sizes[l]));
      live.push_back(acts.back());
      const Tensor temp = make(kForward[l], kGranule / 2 + 1);
      UnpinAt(*e, temp.at);
      release(temp);
      UnpinAt(*e, w.at);
      if (l > 0) UnpinAt(*e, acts[l - 1].at);
      UnpinAt(*e, acts.back().at);
      note();
    }
    for (int l = kLayers - 1; l >= 0; --l) {  // backward
      const Tensor& w = weights[l % kWeights];
      pin(w);
      pin(acts[l]);
      const Tensor grad = make(kBackward[l], sizes[l] + kGranule);
      UnpinAt(*e, w.at);
      UnpinAt(*e, acts[l].at);
      release(acts[l]);
      live.erase(std::find_if(live.begin(), live.end(),
                              [&](const Tensor& t) { return t.at == acts[l].at; }));
      UnpinAt(*e, grad.at);
      release(grad);
      note();
    }
  }
  StrictMonitor::SetThreadLabel(nullptr);
  *statistics = e->GetStatistics();
  for (const Tensor& t : weights) release(t);
  return states;
}

// The learned policy's kept order (Note [A maintained reclaim order])
// against ranking and sorting every inactive unit at each reclaim: after
// every kernel of the same steps, the same allocations are evicted, with
// the same moves, and many reclaims took the learned order.
TEST(TheLearnedPolicysKeptOrderEvictsWhatSortingEveryUnitWould) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    Statistics kept, sorted;
    const std::vector<std::string> a = TrainingSteps(seed, false, &kept);
    const std::vector<std::string> b = TrainingSteps(seed, true, &sorted);
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (a[i] == b[i]) continue;
      std::printf("  seed %u, kernel %zu: kept order: %s; sorting: %s\n", seed, i, a[i].c_str(),
                  b[i].c_str());
      EXPECT_TRUE(a[i] == b[i]);
      break;
    }
    EXPECT_TRUE(kept.num_learned_reclaims > 20);
    EXPECT_TRUE(kept.num_evictions > 40);
  }
}

}  // namespace
}  // namespace lms::engine_test
