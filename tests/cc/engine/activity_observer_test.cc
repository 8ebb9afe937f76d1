// The engine's spans for a profiler (engine/activity_observer.h): which of
// its moves and waits it reports, with what, nested how, and nothing while
// the observer is inactive.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/activity_observer.h"
#include "engine_test_util.h"

namespace lms::engine_test {
namespace {

// Records every span, with its depth among the spans open on the thread.
class RecordingObserver : public ActivityObserver {
 public:
  struct Span {
    Activity what;
    uint64_t bytes;
    uint64_t units;
    int depth;
    bool ended = false;
  };

  bool Active() const override { return active; }
  int64_t Begin(Activity what, uint64_t bytes, uint64_t units) override {
    spans.push_back({what, bytes, units, static_cast<int>(open.size())});
    open.push_back(spans.size() - 1);
    return static_cast<int64_t>(spans.size());  // never 0
  }
  void End(int64_t token) override {
    // Spans end innermost first, each with the token its Begin returned.
    EXPECT_TRUE(!open.empty() && open.back() == static_cast<size_t>(token - 1));
    if (!open.empty()) open.pop_back();
    spans[token - 1].ended = true;
  }

  // The spans of `what`, in the order they began.
  std::vector<Span> Of(Activity what) const {
    std::vector<Span> out;
    for (const Span& s : spans) {
      if (s.what == what) out.push_back(s);
    }
    return out;
  }

  bool active = true;
  std::vector<Span> spans;
  std::vector<size_t> open;
};

// A reclaim is a span holding its eviction's span; the eviction carries the
// victims' bytes and count, the page-in the bytes it brings back, and they
// add up to the engine's own statistics.
TEST(ReclaimsEvictionsAndPageInsAreSpansWithTheirBytes) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  RecordingObserver observer;
  e->SetActivityObserver(&observer);
  const size_t size = 4 * kGranule;
  void* a = MustAllocate(*e, size);
  void* b = MustAllocate(*e, size);
  ASSERT_TRUE(a && b);
  Fill(*e, a, size, 1);
  Fill(*e, b, size, 2);
  EXPECT_TRUE(observer.spans.empty());  // nothing moved yet
  void* c = MustAllocate(*e, size, /*pin=*/true);  // evicts a
  ASSERT_TRUE(c != nullptr);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(a, &id));  // pages a in, evicting b
  EXPECT_EQ(Verify(*e, a, size, 1), -1);
  EXPECT_OK(e->Unpin(a, id));

  const auto reclaims = observer.Of(Activity::kReclaim);
  const auto evictions = observer.Of(Activity::kEviction);
  const auto page_ins = observer.Of(Activity::kPageIn);
  ASSERT_TRUE(reclaims.size() == 2u);
  ASSERT_TRUE(evictions.size() == 2u);
  ASSERT_TRUE(page_ins.size() == 1u);
  EXPECT_EQ(reclaims[0].depth, 0);
  EXPECT_EQ(evictions[0].depth, 1);  // inside the first reclaim
  EXPECT_EQ(evictions[0].bytes, size);
  EXPECT_EQ(evictions[0].units, 1u);
  EXPECT_EQ(reclaims[0].bytes, size);  // what the allocation lacked
  // The page-in made room first: its reclaim and eviction are before it,
  // not inside (the span starts once the device has room).
  EXPECT_EQ(page_ins[0].depth, 0);
  EXPECT_EQ(page_ins[0].bytes, size);
  EXPECT_EQ(page_ins[0].units, 1u);
  const Statistics s = e->GetStatistics();
  uint64_t evicted = 0, paged_in = 0;
  for (const auto& span : evictions) evicted += span.bytes;
  for (const auto& span : page_ins) paged_in += span.units;
  EXPECT_EQ(static_cast<int64_t>(evicted), s.bytes_reclaimed);
  EXPECT_EQ(static_cast<int64_t>(paged_in), s.num_page_ins);
  for (const auto& span : observer.spans) EXPECT_TRUE(span.ended);
  EXPECT_TRUE(observer.open.empty());
  e->SetActivityObserver(nullptr);
}

// An inactive observer (no profiler session) is asked and records nothing;
// taking it away stops the calls.
TEST(NoSpansWhileTheObserverIsInactiveOrGone) {
  auto e = MakeEngine({/*device=*/8, /*host=*/16});
  RecordingObserver observer;
  observer.active = false;
  e->SetActivityObserver(&observer);
  const size_t size = 4 * kGranule;
  void* a = MustAllocate(*e, size);
  void* b = MustAllocate(*e, size);
  ASSERT_TRUE(a && b);
  void* c = MustAllocate(*e, size, /*pin=*/true);
  ASSERT_TRUE(c != nullptr);
  EXPECT_EQ(e->GetStatistics().num_evictions, 1);
  EXPECT_TRUE(observer.spans.empty());
  observer.active = true;
  e->SetActivityObserver(nullptr);
  uint64_t id = 0;
  EXPECT_OK(e->Pin(a, &id));  // a page-in, with no observer
  EXPECT_OK(e->Unpin(a, id));
  EXPECT_EQ(e->GetStatistics().num_page_ins, 1);
  EXPECT_TRUE(observer.spans.empty());
}

TEST(EveryActivityHasAProfilerName) {
  for (Activity what : {Activity::kReclaim, Activity::kEviction, Activity::kPageIn,
                        Activity::kMoveWait, Activity::kMemoryWait}) {
    const std::string name = ActivityName(what);
    EXPECT_TRUE(name.rfind("LMS ", 0) == 0 && name.size() > 4);
  }
}

}  // namespace
}  // namespace lms::engine_test
