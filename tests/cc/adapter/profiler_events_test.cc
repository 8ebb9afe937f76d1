// ProfilerEvents (cc/tf_adapter/profiler_events.h): what an LMS device records
// in TensorFlow's TraceMe recorder, the profiler's host tracer, while a
// session records: BFC's memory events with BFC's argument names, LMS's
// spans, and nothing at all with no session.
#include <string>
#include <vector>

#include "adapter_test_util.h"
#include "tf_adapter/profiler_events.h"
#include "tf_adapter/tf_compat.h"
#include "tsl/profiler/lib/scoped_memory_debug_annotation.h"
#include "tsl/profiler/lib/traceme.h"
#include LMS_TSL_ANNOTATION_STACK_H  // tf_compat.h: where this TensorFlow has them
#include LMS_TSL_TRACEME_RECORDER_H

namespace {

using lms_test::MakeDevice;
using lms_test::kMiB;
using tsl::profiler::AnnotationStack;
using tsl::profiler::TraceMeRecorder;

// The names (with their encoded arguments) of the events recorded on any
// thread, those of spans taken once from their start event.
std::vector<std::string> Names(const TraceMeRecorder::Events& events) {
  std::vector<std::string> out;
  for (const TraceMeRecorder::ThreadEvents& thread : events) {
    for (const TraceMeRecorder::Event& e : thread.events) {
      if (!e.name.empty()) out.push_back(e.name);
    }
  }
  return out;
}

std::vector<std::string> Starting(const std::vector<std::string>& names, const std::string& prefix) {
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (n.rfind(prefix, 0) == 0) out.push_back(n);
  }
  return out;
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Records the thread's annotation at the end of each span, then ends it as
// TensorFlow's observer does.
class AnnotationWitness : public lms::ActivityObserver {
 public:
  bool Active() const override { return lms::TraceMeObserver::Get()->Active(); }
  int64_t Begin(lms::Activity what, uint64_t bytes, uint64_t units) override {
    return lms::TraceMeObserver::Get()->Begin(what, bytes, units);
  }
  void End(int64_t token) override {
    seen.push_back(AnnotationStack::Get());
    lms::TraceMeObserver::Get()->End(token);
  }
  std::vector<std::string> seen;
};

// An allocation and a free under a session: one MemoryAllocation and one
// MemoryDeallocation with BFC's arguments (the Memory Profile tool reads
// them by name), the op from TensorFlow's annotation, and LMS's own
// figures after them.
TEST(AnAllocationAndAFreeAreBfcsMemoryEventsWithLmsFigures) {
  auto device = MakeDevice("lms_test_profiler", 16);
  ASSERT_TRUE(device != nullptr);
  tsl::Allocator* allocator = device->allocator();
  ASSERT_TRUE(TraceMeRecorder::Start(tsl::profiler::TraceMeLevel::kInfo));
  void* p = nullptr;
  {
    tsl::profiler::ScopedMemoryDebugAnnotation op("lms_test_op", /*step_id=*/7);
    p = allocator->AllocateRaw(256, 3 * kMiB);
  }
  ASSERT_TRUE(p != nullptr);
  allocator->DeallocateRaw(p);
  const std::vector<std::string> names = Names(TraceMeRecorder::Stop());
  const auto allocations = Starting(names, "MemoryAllocation#");
  const auto frees = Starting(names, "MemoryDeallocation#");
  ASSERT_TRUE(allocations.size() == 1 && frees.size() == 1);
  const std::string& a = allocations[0];
  for (const char* arg :
       {"allocator_name=lms_test_profiler,", "bytes_reserved=0,", "bytes_allocated=4194304,",
        "peak_bytes_in_use=", "requested_bytes=3145728,", "allocation_bytes=4194304,",
        "tf_op=lms_test_op,", "id=7,", "fragmentation=0,", "lms_device_limit=16777216,",
        "lms_bytes_evicted=0,", "lms_host_bytes=0"}) {
    EXPECT_TRUE(Has(a, arg));
    if (!Has(a, arg)) std::printf("  %s not in %s\n", arg, a.c_str());
  }
  // Available: the device and the host budget (LMS on), less what is allocated.
  EXPECT_TRUE(Has(a, "bytes_available=" + std::to_string((16 + 64 - 4) * kMiB) + ","));
  EXPECT_TRUE(Has(a, "addr=" + std::to_string(reinterpret_cast<uint64_t>(p)) + ","));
  // The figures after the free; the sizes of what was freed.
  EXPECT_TRUE(Has(frees[0], "bytes_allocated=0,"));
  EXPECT_TRUE(Has(frees[0], "requested_bytes=3145728,"));
  EXPECT_TRUE(Has(frees[0], "allocation_bytes=4194304,"));
}

// Pressure under a session: the eviction inside its reclaim and the page-in
// are spans with their bytes and units; without a session no span begins,
// however much moves, and a session of another level records nothing.
TEST(MovesAreSpansUnderASessionAndNothingIsRecordedWithout) {
  auto device = MakeDevice("lms_test_profiler_moves", 8);
  ASSERT_TRUE(device != nullptr);
  tsl::Allocator* allocator = device->allocator();
  // A kernel's use of `p`: the first claims it (allocated outside kernels,
  // it is unclaimed until then, and never evicted) and pages it in if evicted.
  auto use = [&](void* p) {
    uint64_t id = 0;
    const lms::Status pinned = device->engine().Pin(p, &id);
    EXPECT_OK(pinned);
    if (pinned.ok()) EXPECT_OK(device->engine().Unpin(p, id));
  };
  auto round = [&] {
    void* a = allocator->AllocateRaw(256, 4 * kMiB);
    use(a);
    void* b = allocator->AllocateRaw(256, 4 * kMiB);
    use(b);
    void* c = allocator->AllocateRaw(256, 4 * kMiB);  // evicts a or b
    lms::AllocationInfo info;
    EXPECT_OK(device->engine().Inspect(a, &info));
    use(info.evicted ? a : b);  // pages it in, evicting the other
    for (void* p : {a, b, c}) allocator->DeallocateRaw(p);
  };
  const int64_t evictions_before = device->engine().GetStatistics().num_evictions;
  {
    // No session: the engine asks and begins no span (nor would a free or an
    // allocation record anything: ProfilerRecording() is false).
    AnnotationWitness witness;
    device->engine().SetActivityObserver(&witness);
    EXPECT_TRUE(!lms::ProfilerRecording());
    round();
    device->engine().SetActivityObserver(lms::TraceMeObserver::Get());
    EXPECT_EQ(witness.seen.size(), 0u);
  }
  ASSERT_TRUE(TraceMeRecorder::Start(tsl::profiler::TraceMeLevel::kInfo));
  round();
  const std::vector<std::string> names = Names(TraceMeRecorder::Stop());
  EXPECT_EQ(device->engine().GetStatistics().num_evictions - evictions_before, 4);
  EXPECT_EQ(Starting(names, "LMS reclaim#").size(), 2u);
  const auto evictions = Starting(names, "LMS eviction#");
  const auto page_ins = Starting(names, "LMS page-in#");
  ASSERT_TRUE(evictions.size() == 2 && page_ins.size() == 1);
  EXPECT_TRUE(Has(evictions[0], "bytes=4194304,units=1#"));
  EXPECT_TRUE(Has(page_ins[0], "bytes=4194304,units=1#"));
  // Only the second round's events: three allocations and three frees.
  EXPECT_EQ(Starting(names, "MemoryAllocation#").size(), 3u);
  EXPECT_EQ(Starting(names, "MemoryDeallocation#").size(), 3u);

  // A session that records nothing of the info level records none of it.
  ASSERT_TRUE(TraceMeRecorder::Start(tsl::profiler::TraceMeLevel::kCritical));
  round();
  EXPECT_EQ(Names(TraceMeRecorder::Stop()).size(), 0u);
}

// While TensorFlow's GPU tracer keeps the annotation stack (enabled here by
// hand: no GPU), a span is the thread's annotation, nested spans joined as
// TensorFlow joins them, and nothing is left on the stack after them: the
// copies a move issues carry its name.
TEST(ASpanIsTheThreadsAnnotationWhileItLasts) {
  auto device = MakeDevice("lms_test_profiler_annotations", 8);
  ASSERT_TRUE(device != nullptr);
  AnnotationWitness witness;
  device->engine().SetActivityObserver(&witness);
  tsl::Allocator* allocator = device->allocator();
  AnnotationStack::Enable(true);
  ASSERT_TRUE(TraceMeRecorder::Start(tsl::profiler::TraceMeLevel::kInfo));
  std::vector<void*> held;
  for (int i = 0; i < 3; ++i) {  // the third evicts one of the first two
    held.push_back(allocator->AllocateRaw(256, 4 * kMiB));
    uint64_t id = 0;
    EXPECT_OK(device->engine().Pin(held.back(), &id));
    EXPECT_OK(device->engine().Unpin(held.back(), id));
  }
  (void)TraceMeRecorder::Stop();
  const std::string after = AnnotationStack::Get();
  AnnotationStack::Enable(false);
  device->engine().SetActivityObserver(lms::TraceMeObserver::Get());
  for (void* p : held) allocator->DeallocateRaw(p);
  ASSERT_TRUE(witness.seen.size() == 2);  // the eviction, then its reclaim
  EXPECT_TRUE(witness.seen[0] == "LMS reclaim::LMS eviction");
  EXPECT_TRUE(witness.seen[1] == "LMS reclaim");
  EXPECT_TRUE(after.empty());
}

}  // namespace
