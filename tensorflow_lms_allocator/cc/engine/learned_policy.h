// LearnedPolicy: evicting what the previous step says is needed farthest
// ahead (EngineOptions::policy = kLearned).
//
// Note [Learned eviction]
// =======================
// Training runs the same kernels in the same order every step, so a tensor
// that a kernel allocates at some point of one step is used again at the
// same points of the next step by a tensor of the same op and size. The
// policy learns those reuse distances and evicts, when memory runs out, the
// inactive unit whose next use is predicted farthest ahead (Belady's rule,
// with the previous step as the oracle):
//   - a unit's *key* is the label of the kernel that allocated it (the op
//     name the adapter sets for the thread), its requested size, and its
//     occurrence: the how-manieth allocation of that size the kernel run
//     made (two same-sized outputs of one op, a batch norm's gradients, the
//     parts of a split, are two keys); allocations made outside kernels
//     have no key. A small object is keyed and followed like a unit (its
//     pins and unpins at its first byte, without ticking the clock below);
//     its page, a unit of its own, has no key;
//   - time is counted in *uses*: a tick each time a unit turns active (its
//     first pin); a unit's n-th inactive period runs from its n-th last
//     unpin (pin count back to zero) to its next pin, or to its free;
//   - learning: when a keyed unit's n-th inactive period ends, the table
//     records for (key, n) its length in ticks, or "never" if it ended in a
//     free; the latest step's value replaces the previous one;
//   - prediction: a keyed unit whose n-th inactive period begins looks up
//     (key, n): its next use is expected that many ticks after its unpin, or
//     never. A unit that lives across steps (a weight, an optimizer slot,
//     a small object made outside any kernel, so without a key) has new
//     period numbers every step, so without (key, n) it predicts from its
//     own last kHistory periods (Note [Periodic units]). A unit without a
//     prediction (no key and no previous period, or nothing learned yet),
//     and one whose prediction has already missed (Note [Overdue
//     predictions]), counts its age (ticks since its unpin) as its
//     distance: among such units the choice is LRU's. Small-object
//     pages, whose objects come and go, never repeat their last period: a
//     replayed DenseNet121 trace at 1/4 of its peak moved 985 MiB a step
//     with pages repeating (59% of all predictions hit) and 762 without
//     (76% hit; LRU 806).
//     Instead a page's distance is the soonest predicted use of its
//     inactive objects (its age if none has a prediction): ranked by its
//     age, a page that an object is about to use was evicted as often as a
//     cold one. Replayed DenseNet121 at 1/4: 727 MiB a step by age, 670 by
//     its objects, 649 with every unit's true next use (replay.py's
//     oracle); ResNet-50 at 1/4 1,277 and 1,247; the other cases within
//     0.1%;
//   - a reclaim orders the inactive units by rank (a unit's distance; a
//     page's scaled, below), farthest first (never used again before all),
//     and evicts in that order until it has freed enough; ties keep LRU
//     order. The order is kept as units change, not sorted at each reclaim
//     (Note [A maintained reclaim order] in reclaim_order.h). But when
//     that takes several units and one unit alone frees
//     enough, the farthest such unit goes alone if its rank is at least a
//     quarter of the nearest of theirs: fewer units move now, and mostly
//     fewer bytes (LRU's preference for one victim, which farthest-first alone
//     lost to on replayed Transformer traces: 1,184 against LRU's 1,156 MiB
//     a step at 1/2 of the peak, 1,152 with this rule at a half; at 1/4 of
//     the peak, two recordings moved 1,724 and 1,731 MiB at a half, 1,712
//     and 1,713 at a quarter, LRU 1,712 and 1,740; the CNNs within 0.2%);
//   - and when the unit next in that order would free more than is still
//     needed, the smallest of the next kFitWindow units that frees enough
//     and ranks at least 3/4 of its rank goes first instead (best fit among
//     units needed nearly as late): what farthest-first frees beyond the
//     shortfall is copied out now and back later, and a unit needed nearly
//     as late costs nearly nothing more. Replayed on the recordings of 2026-11-27,
//     MiB a step before / after (LRU): ResNet-50 at 1/2 of its peak 626.8 /
//     606.3 (804.2), MobileNetV2 at 1/2 412.0 / 401.4 (420.6), the
//     Transformer at 1/2 1,162.7 / 1,154.7 (1,156.0), DenseNet121 at 1/2
//     373.5 / 371.3, at 1/4 570.0 / 572.6; the others within 0.1%. With
//     perfect predictions (replay's oracle) it moved less in every case but
//     rnn's (+0.1%); at half the rank instead of 3/4, DenseNet121 moved 6%
//     more at 1/2 and ResNet-50 3% more at 1/4;
//   - a page's rank is its distance times the granule over its live bytes
//     (at least 1/64 of a granule): evicting any page frees a granule, but
//     it copies only the page's live objects, out and back (Note [Live
//     bytes only] in engine.h), so a page a quarter full ranks as if needed
//     four times farther ahead. Replayed, with pages copying live bytes
//     only, in MiB a step: DenseNet121 at 1/4 of its peak 611 unscaled, 594
//     scaled; ResNet-50 at 1/4 1,067 and 1,058, at 1/2 641 and 631;
//     DenseNet121 and MobileNetV2 at 1/2 370 and 372, 405 and 407; the
//     Transformer's unchanged;
//   - falling back: every prediction is checked when its period ends (a hit
//     is within a quarter of the predicted length, or 2 ticks). While fewer
//     than half of the last 64 predictions hit (a new tf.function trace, a
//     new batch shape: the step's sequence changed), reclaims use LRU. The
//     table keeps learning meanwhile, so the next repeated step restores it.
//   - prefetching (Engine::Prefetch, called by a helper thread of the
//     TensorFlow adapter after each kernel starts, with TF_LMS_PREFETCH=1;
//     off by default, since on two cores it moved more bytes and gained no
//     step time: docs/decisions/0003-prefetch-off-by-default.md): evicted
//     units predicted to be used within the next few ticks are paged in
//     ahead of their pin,
//     into free device memory only (a prefetch never evicts), so the copy
//     overlaps the kernels running meanwhile instead of delaying the kernel
//     that pins the unit. A wrong guess pages in a unit early; an eviction
//     may take it out again.
// Correctness never depends on it: it only orders the same candidates LRU
// would evict, and a prefetch is a page-in like a pin's, so a wrong guess
// costs copies, never data. Why it is the default, and the variants measured
// and not kept: docs/decisions/0002-learned-policy-default.md.
//
// Note [Periodic units]
// ======================
// A unit used several times a step, and across steps, has periods of
// different lengths in turn: a weight's from its forward use to its
// gradient's, then to the optimizer's update, then to the next step's
// forward use. Predicting its previous period's length again is wrong at
// every turn. Its sequence of lengths repeats with the step, though, so the
// policy looks for the lag k (1 to half its history) at which the most of
// its last periods equal (within a quarter, as a hit) the ones k earlier,
// the smallest such lag on ties, and predicts the length it had k periods
// ago; with no lag matching at least half of them, its last length. A
// replayed DenseNet121 trace at 1/4 of its peak: objects made outside
// kernels end 15,400 inactive periods a run, and 25% of them were predicted
// right by their last length; 48% by the smallest lag at which the last k
// lengths all repeat (32 kept). Of all predictions, 58%, 64% and, with this rule, 69%
// hit, and a step moved 594, 583 and 569 MiB (the oracle: 566). ResNet-50
// at 1/4: 1,058, 1,042 and 1,040; MobileNetV2 at 1/2: 407, 412 and 412;
// the other cases within 0.3%. Requiring a third or three quarters of
// the periods to match instead of half moved 580 on DenseNet121 at 1/4;
// 16, 32 or 64 periods of history the same. A unit keeps, for each lag,
// how many of its periods match the one that lag before, updated as a
// period ends (with the 8 before it) and as the oldest of its 16 leaves (with
// the 8 after it): at most 16 comparisons a period, not the 92 pairs of a
// search from scratch, which made a pin and unpin cost 153 ns instead of
// 50 (LRU: 27; `make bench-allocator`).
//
// Note [Overdue predictions]
// ==========================
// A unit still inactive later than its prediction's hit window (a quarter of
// the predicted length, or 2 ticks, past it) has missed: its next use is as
// unknown as that of a unit without a prediction, so it ranks by its age as
// such a unit does, and is not prefetched. Ranked as due (distance 0), as it
// was, every such unit counted as needed now: on a replayed trace of an
// Embedding+LSTM+GRU model (benchmarks/mincap.py's rnn) the loops' tensors,
// which share keys, expect one iteration's short period and then wait for
// the backward pass, so at most reclaims every candidate was overdue and
// the policy fell back to LRU's order among them, keeping pages of cold
// tensors. Replayed, MiB copied a step, before / after (LRU; the oracle):
// rnn at 1/2 of its peak 87.1 / 83.3 (84.0; 77.3), at 1/3 232.6 / 164.6
// (265.5; 139.5); DenseNet121 at 1/2 371.3 / 373.5 (414.2), the
// Transformer at 1/2 1,158.7 / 1,162.7 (1,156.0; the oracle 1,162.7);
// ResNet-50, MobileNetV2 and the other cases within 0.2%. Its age less the
// predicted length moved the same; skipping such objects when ranking a
// page, 83.1 and 175.2 on rnn.
//
// The engine calls it only with the learned policy on (EngineOptions::
// policy), so LRU pays nothing. Thread-compatible: the engine's lock guards
// every call. Memory is bounded: at most kMaxKeys keys and kMaxPeriods
// periods per key are learned (Note [Forgetting keys]), and a unit keeps
// kHistory period lengths.
//
// Note [Forgetting keys]
// ======================
// Shapes that change every step (text batched by its length, a last batch
// smaller than the rest) make new keys every step, which never come back.
// Before, a full table (kMaxKeys) learned nothing new for the rest of the
// run. Now a new key takes the place of one that is stale, found as the
// CLOCK algorithm finds a page to replace: a hand goes round the table,
// forgetting the first key that no live unit holds and no unit was born
// with since the hand last passed it, and marking the keys it passes
// instead. So what a steady step learns is kept (its keys are born with
// every step), and a run whose shapes changed long ago learns its new ones.
// Units hold a pointer to their key's entry (found once, at birth: every
// period's start and end reads it), so an entry is forgotten only while no
// unit holds it: each counts the live units and objects born with it. The
// hand passes at most kMaxPasses keys for one new key, which goes unlearned
// if none of them could be forgotten: a full table costs a new key a few
// steps of the hand, never a scan. The hand goes round the table's slots,
// which keep their numbers as it grows (Note [A flat key table]). A step of
// a large model makes a key an allocation, 100,000 and more: with room for
// 65,536, `make bench-scale`'s step of 100,000 units forgot and relearned
// keys all the time (the hand and the table's misses were 16% of its time,
// and planning predicted less), so there is room for 262,144. What a key
// costs an allocation: docs/decisions/0010-allocate-free-fast-path.md.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_LEARNED_POLICY_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_LEARNED_POLICY_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/key_table.h"
#include "engine/reclaim_order.h"
#include "engine/reclaim_policy.h"
#include "engine/residency.h"
#include "engine/small_pages.h"

namespace lms {

// Plan needs every change of the LRU list of the residency it plans over
// (Residency::KeepListChanges; Note [A maintained reclaim order]).
class LearnedPolicy {
 public:
  static constexpr uint64_t kNoKey = 0;
  static constexpr uint64_t kNever = ~uint64_t{0} - 1;
  static constexpr size_t kMaxKeys = 1 << 18;
  static constexpr size_t kMaxPeriods = 256;

  // The key of the `occurrence`-th unit of `bytes` requested (0: the first)
  // that one run of the kernel labelled `label` (null: none) allocated.
  static uint64_t Key(const char* label, uint64_t bytes, uint32_t occurrence);

  // A unit was created (`pinned`: it starts active), without a key; SetKey
  // gives a large allocation its key.
  void Born(ChunkId id, bool pinned);
  void SetKey(ChunkId id, uint64_t key);
  // The unit is a small-object page: its periods are its objects' comings
  // and goings, so its last one says nothing of its next.
  void MarkPage(ChunkId id) {
    unit(id).page = true;
    Changed(id);
  }
  // A small object (`object` in its class's arena) was placed on `page`,
  // with its key; it is followed like a unit, without ticking the clock,
  // so that its page is ranked by the soonest predicted use of its objects.
  void ObjectBorn(ChunkId page, int size_class, ChunkId object, uint64_t key, bool pinned);
  // A pin or unpin at the object's first byte (interior pins, of slices,
  // are not followed: finding their object would walk the page).
  void ObjectPinned(int size_class, ChunkId object);
  void ObjectUnpinned(int size_class, ChunkId object);
  void ObjectReleased(int size_class, ChunkId object);
  void Released(ChunkId id);
  // A unit turned active (first pin) or inactive (last unpin).
  void Activated(ChunkId id);
  void Deactivated(ChunkId id);

  // False while the recent predictions mostly missed (Note [Learned
  // eviction]): reclaims should use LRU.
  bool trusted() const;
  // Fills `plan` with inactive units by predicted distance (a page's scaled
  // by what it copies: its live bytes in `pages`), farthest first, until
  // they free `granules_needed`; false (as PlanReclaim) if all of them would
  // not.
  bool Plan(Residency& residency, const SmallPages& pages, uint64_t granules_needed,
            ReclaimPlan* plan);
  // Tests only: every reclaim ranks and sorts every inactive unit, as with
  // foresight, instead of walking the maintained order (the reference the
  // order is checked against: reclaim_order_test.cc).
  void set_sort_every_reclaim(bool on) { sort_every_reclaim_ = on; }

  // Evicted units whose next use is predicted within `lookahead` ticks (or
  // overdue, within the prediction's hit window), soonest first: what
  // Engine::Prefetch pages in ahead of use.
  std::vector<ChunkId> DueSoon(const Residency& residency, uint64_t lookahead) const;

  // Foresight, for replay.py's "oracle" reference only: a caller that knows
  // the whole future tells, on its own clock, when each unit is next used
  // (kNever: not again) and what time it is; from the first call on,
  // reclaims order units by that instead of what was learned, and always
  // trust it. It shows how far the learned predictions are from perfect
  // ones on the engine's own units (pages included).
  void Foresee(ChunkId id, uint64_t next_use);
  void SetClock(uint64_t now) { now_ = now; }

  uint64_t num_predictions() const { return predictions_; }
  uint64_t num_prediction_hits() const { return hits_; }

 private:
  static constexpr uint64_t kUnknown = ~uint64_t{0};
  static constexpr int kWindow = 64;
  static constexpr size_t kHistory = 16;
  static constexpr int kMaxPasses = 64;
  static constexpr size_t kFitWindow = 64;

  // A unit's last kHistory inactive-period lengths, and for each lag k up
  // to half of them how many hit (within the hit window of) the length k
  // before, kept up as lengths come and go: 16 comparisons a period instead
  // of up to 92 a guess (Note [Periodic units]). Lengths are kept to 32 bits
  // (saturating: 4 billion ticks is never in practice).
  class PeriodHistory {
   public:
    void Add(uint64_t length);
    // The next period's length, or kUnknown if there is no period yet.
    uint64_t Guess() const;

   private:
    static constexpr size_t kMaxLag = kHistory / 2;
    uint64_t at(size_t i) const { return lengths_[(first_ + i) % kHistory]; }  // oldest first
    uint32_t lengths_[kHistory] = {};
    uint8_t first_ = 0;
    uint8_t size_ = 0;
    uint8_t hits_[kMaxLag] = {};  // hits_[k - 1]: pairs k apart that hit
  };

  // What is learned of one key: its period lengths, by period number, and
  // what Note [Forgetting keys] needs.
  struct KeyEntry {
    std::vector<uint64_t> periods;
    uint32_t units = 0;  // live units and objects holding it
    bool born = true;    // a unit was born with it since the hand passed
  };

  struct Unit {
    // Its key's entry in keys_ (found once, at its birth: an entry stays
    // put, and one is erased only while no unit holds it), or null: no key,
    // or no room.
    KeyEntry* learned = nullptr;
    uint32_t periods = 0;        // inactive periods begun so far
    bool active = false;
    uint64_t last_unpin = 0;     // tick its current inactive period began
    uint64_t predicted = kUnknown;  // its length, kNever, or kUnknown
    PeriodHistory history;  // not a page's
    bool page = false;
    uint64_t foreseen = kUnknown;  // next use on the foresight clock
    // A page: its live objects (Handle()); an object: pins at its first
    // byte, its page and its index in the page's list.
    std::vector<uint64_t> objects;
    uint32_t pins = 0;
    ChunkId holder = kNoChunk;
    uint32_t index = 0;
  };

  static uint64_t Handle(int size_class, ChunkId object) {
    return (uint64_t{static_cast<uint32_t>(size_class)} << 32) | object;
  }
  Unit& unit(ChunkId id);
  Unit& object(uint64_t handle);
  // `key`'s entry in keys_, held by one more unit; made if new and there is
  // room (Note [Forgetting keys]); null for kNoKey or when there is none.
  KeyEntry* HoldKey(uint64_t key);
  // Forgets a stale key, moving the hand; false if the hand found none
  // within kMaxPasses keys (Note [Forgetting keys]).
  bool ForgetAStaleKey();
  // `u` holds no key's entry any more.
  void LetGoOfKey(Unit& u);
  // `u` as a new unit, its key's entry let go.
  void Reset(Unit& u);
  // A unit turns active (`tick`: the clock counts it) or inactive.
  void Activate(Unit& u, bool tick);
  void Deactivate(Unit& u);
  // Ends `u`'s current inactive period, of `length` ticks or kNever.
  void EndPeriod(Unit& u, uint64_t length);
  // Whether `u`'s inactive period has outrun its prediction's hit window
  // (Note [Overdue predictions]).
  bool Missed(const Unit& u) const;
  uint64_t Distance(const Unit& u) const;
  // A page's: the soonest predicted use of its inactive objects, or, if
  // none has a prediction, its own (its age).
  uint64_t PageDistance(const Unit& page) const;

  // Of the untaken candidates from `next` (ranked farthest first), the
  // victim to take for `needed` more granules: `next`, unless it frees more
  // than that and a later one within kFitWindow, ranked at least 3/4 of its
  // rank, frees enough with fewer granules: then the one with fewest (Note
  // [Learned eviction]).
  size_t FitFrom(const Residency& residency, size_t next, uint64_t needed);
  // Whether the reclaim's i-th candidate exists (in walked_), walking the
  // order further if need be.
  bool Candidate(size_t i);
  // Ranks every inactive unit and sorts them into walked_ (with
  // foresight, or sort_every_reclaim_).
  void SortEveryUnit(const Residency& residency, const SmallPages& pages,
                     uint64_t granule_bytes);
  // `id`'s rank inputs changed: its place in order_ is brought up to date
  // at the next Plan. Invariant: every change of a listed unit's rank
  // inputs (its prediction, last unpin, being a page; its place, size or
  // presence in the LRU list) is noted before the next Plan, by the
  // residency (TakeListChanges: a prediction changes only as the unit
  // joins or leaves the list, at its birth, first pin, last unpin and
  // free) or here (a unit becoming a page).
  void Changed(ChunkId id) {
    if (id >= changed_.size()) changed_.resize(id + 1, false);
    if (changed_[id]) return;
    changed_[id] = true;
    changes_.push_back(id);
  }
  // Of the candidates ranked at least `lowest_rank`, the first that frees
  // `granules` alone (at least 2); null if none.
  const RankedUnit* FirstOfAtLeast(const Residency& residency, uint64_t granules,
                                   uint64_t lowest_rank);
  // Brings order_ and listed_pages_ up to date with the changes.
  void Reorder(Residency& residency);
  // Puts `id` where it belongs in order_ or listed_pages_, or nowhere.
  void Reposition(const Residency& residency, ChunkId id);
  // Unit `c` of the LRU list with its Rank (a page's by its live bytes).
  RankedUnit Ranked(const Residency& residency, const SmallPages& pages,
                    uint64_t granule_bytes, ChunkId c);
  // The listed pages, ranked (Rank) and sorted by TakenBefore.
  std::vector<RankedUnit> RankPages(const Residency& residency, const SmallPages& pages,
                                    uint64_t granule_bytes);

  // A reclaim's order: a page's distance scaled by what evicting it frees
  // (a granule) over what it copies (`live_bytes`; Note [Learned eviction]).
  uint64_t Rank(const Unit& u, uint64_t live_bytes, uint64_t granule_bytes) const;

  std::vector<Unit> units_;  // by ChunkId
  // The inactive units of the LRU list but pages, in reclaim order (Note [A
  // maintained reclaim order]), up to date but for changes_.
  ReclaimOrder order_;
  std::vector<ChunkId> listed_pages_;  // pages in the LRU list
  std::vector<uint32_t> page_at_;      // by ChunkId: index in listed_pages_
  std::vector<bool> changed_;          // by ChunkId: in changes_
  std::vector<ChunkId> changes_;
  std::vector<ChunkId> list_changes_;  // the residency's, taken at Plan
  bool sort_every_reclaim_ = false;
  // A reclaim's candidates so far, in order, and which it took.
  std::vector<RankedUnit> walked_;
  std::vector<bool> taken_;
  bool walking_ = false;  // more come from order_
  RankedUnit single_;     // FirstOfAtLeast's, found outside the walk
  // By size class, then ChunkId in its arena.
  std::vector<Unit> objects_[SmallPages::kNumClasses];
  // Keys by slot (Note [A flat key table] in key_table.h).
  KeyTable<KeyEntry> keys_;
  // The CLOCK hand: the slot it points at (a slot keeps its number as the
  // table grows; Note [Forgetting keys]).
  size_t hand_ = 0;
  uint64_t tick_ = 0;
  uint64_t predictions_ = 0;
  uint64_t hits_ = 0;
  // The last kWindow checked predictions: bit i set if it hit.
  uint64_t window_ = 0;
  int window_size_ = 0;
  bool foreseeing_ = false;
  uint64_t now_ = 0;  // the foresight clock
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_LEARNED_POLICY_H_
