// KernelPins (cc/tf_adapter/kernel_pins.h) and LmsAllocator's use of it: what
// a kernel's context pins and for how long, where its requests go when the
// device is full, and how they wait for other kernels. Real tensors from an
// LMS device's allocator, contexts as TensorFlow's hooks report them
// (adapter_test_util.h); no TensorFlow runtime.
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "adapter_test_util.h"
#include "tensorflow/core/framework/allocator.h"
#include "testing/pattern.h"

namespace {

using lms_test::Context;
using lms_test::Info;
using lms_test::MakeDevice;
using lms_test::MakeTensor;

// Every byte of `t`, as the engine's tests write and check them.
void Fill(tensorflow::Tensor& t, uint64_t seed) {
  lms::FillPattern(t.data(), t.TotalBytes(), seed);
}

bool Holds(const tensorflow::Tensor& t, uint64_t seed) {
  return lms::VerifyPattern(t.data(), t.TotalBytes(), seed) == -1;
}

// Another kernel (`kernel`'s, or a synchronous one), on a thread of its
// own, holding `inputs` pinned from its construction (which returns once
// they are pinned) until `hold` passes or Release; Release (or the
// destructor) waits for it to end.
class KernelElsewhere {
 public:
  KernelElsewhere(lms::KernelPins* pins, std::vector<tensorflow::Tensor*> inputs,
                  std::chrono::milliseconds hold, tensorflow::OpKernel* kernel = nullptr)
      : thread_([this, pins, inputs, hold, kernel] {
          Context context(pins, inputs, /*step_id=*/1, kernel);
          std::unique_lock<std::mutex> lock(mu_);
          holding_ = true;
          cv_.notify_all();
          cv_.wait_for(lock, hold, [this] { return released_; });
        }) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return holding_; });
  }
  ~KernelElsewhere() { Release(); }
  KernelElsewhere(const KernelElsewhere&) = delete;
  KernelElsewhere& operator=(const KernelElsewhere&) = delete;
  // Ends the kernel now, or waits for its `hold` to pass (Join).
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
    Join();
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;  // these before thread_, which uses them
  std::condition_variable cv_;
  bool holding_ = false;
  bool released_ = false;
  std::thread thread_;
};

TEST(AnAllocationOutsideAKernelIsUnclaimedUntilAKernelPinsIt) {
  auto device = MakeDevice("outside", 16);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor t = MakeTensor(*device, 4);
  EXPECT_TRUE(!device->pins()->InKernel());
  EXPECT_TRUE(Info(*device, t).unclaimed);
  EXPECT_EQ(Info(*device, t).pin_count, 0u);
  {
    Context kernel(device->pins(), {&t});
    EXPECT_TRUE(device->pins()->InKernel());
    EXPECT_EQ(device->pins()->LiveContexts(), 1);
    EXPECT_EQ(Info(*device, t).pin_count, 1u);
    EXPECT_TRUE(!Info(*device, t).unclaimed);
  }
  EXPECT_TRUE(!device->pins()->InKernel());
  EXPECT_EQ(device->pins()->LiveContexts(), 0);
  EXPECT_EQ(Info(*device, t).pin_count, 0u);
  EXPECT_TRUE(!Info(*device, t).unclaimed);
}

TEST(AnAllocationInsideAKernelStaysPinnedUntilTheKernelEnds) {
  auto device = MakeDevice("inside", 16);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor output;
  {
    Context kernel(device->pins(), {});
    output = MakeTensor(*device, 4);
    EXPECT_EQ(Info(*device, output).pin_count, 1u);
    EXPECT_TRUE(!Info(*device, output).unclaimed);
  }
  EXPECT_EQ(Info(*device, output).pin_count, 0u);
}

TEST(AnEvictedInputIsPagedInWholeBeforeItsKernelRuns) {
  auto device = MakeDevice("page_in", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor a = MakeTensor(*device, 6);
  Fill(a, 1);
  { Context writer(device->pins(), {&a}); }  // claimed, then inactive
  tensorflow::Tensor b;
  {
    Context kernel(device->pins(), {});
    b = MakeTensor(*device, 6);  // evicts a: 12 MiB on an 8 MiB device
  }
  EXPECT_TRUE(Info(*device, a).evicted);
  {
    Context reader(device->pins(), {&a});
    EXPECT_TRUE(!Info(*device, a).evicted);
    EXPECT_EQ(Info(*device, a).pin_count, 1u);
    EXPECT_TRUE(Info(*device, b).evicted);
    EXPECT_TRUE(Holds(a, 1));
  }
  EXPECT_TRUE(device->engine().GetStatistics().num_page_ins >= 1);
}

TEST(AContextDestroyedOnAnotherThreadUnpinsItsInputs) {
  auto device = MakeDevice("other_thread", 16);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor t = MakeTensor(*device, 4);
  Context kernel(device->pins(), {&t});
  EXPECT_EQ(Info(*device, t).pin_count, 1u);
  std::thread([&] { kernel.Destroy(); }).join();
  EXPECT_EQ(Info(*device, t).pin_count, 0u);
  EXPECT_EQ(device->pins()->LiveContexts(), 0);
  EXPECT_TRUE(!device->pins()->InKernel());  // its creator forgot it too
}

TEST(AKernelsRequestWaitsForAnotherKernelToReleaseItsInputs) {
  auto device = MakeDevice("waits", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor a = MakeTensor(*device, 6);
  KernelElsewhere other(device->pins(), {&a}, std::chrono::milliseconds(200));
  tensorflow::Tensor b;
  {
    Context kernel(device->pins(), {});
    b = MakeTensor(*device, 6);  // fits once a is unpinned and evicted
    EXPECT_TRUE(!Info(*device, b).evicted);
  }
  other.Join();
  EXPECT_TRUE(Info(*device, a).evicted);
  EXPECT_TRUE(device->pins()->NumWaits() >= 1);
  EXPECT_EQ(device->pins()->NumDeadlocks(), 0);
}

TEST(AKernelsRequestNoOtherKernelCanMakeRoomForGoesToHostMemory) {
  auto device = MakeDevice("no_release", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor a = MakeTensor(*device, 6);
  const auto start = std::chrono::steady_clock::now();
  {
    Context kernel(device->pins(), {&a});
    // a is this kernel's own input: nothing another kernel releases can make
    // room, so the request does not wait out the retry budget.
    tensorflow::Tensor b = MakeTensor(*device, 6);
    ASSERT_TRUE(b.data() != nullptr);
    EXPECT_TRUE(Info(*device, b).evicted);
    EXPECT_TRUE(!Info(*device, a).evicted);
    Fill(b, 2);  // the emulated device's kernels use it in place
    EXPECT_TRUE(Holds(b, 2));
  }
  EXPECT_TRUE(std::chrono::steady_clock::now() - start < lms::KernelPins::kRetryBudget);
}

// Two kernels of step 2, the second started once the first has: the first,
// on a thread of its own, gives the second up to 300 ms to start, then runs
// `first_work`; the second runs `second_work` once its context is made.
// Returns whether the first's work was done when the second's context was
// made (the second was admitted only after the first).
bool SecondAdmittedAfterFirst(lms::KernelPins* pins, tensorflow::OpKernel* first,
                              std::vector<tensorflow::Tensor*> first_inputs,
                              const std::function<void()>& first_work,
                              tensorflow::OpKernel* second,
                              std::vector<tensorflow::Tensor*> second_inputs,
                              const std::function<void()>& second_work) {
  std::mutex mu;
  std::condition_variable cv;
  bool first_started = false, second_started = false, first_done = false;
  std::thread other([&] {
    Context run(pins, first_inputs, /*step_id=*/2, first);
    std::unique_lock<std::mutex> lock(mu);
    first_started = true;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::milliseconds(300), [&] { return second_started; });
    lock.unlock();
    first_work();
    lock.lock();
    first_done = true;
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return first_started; });
  }
  bool after = false;
  {
    Context run(pins, second_inputs, /*step_id=*/2, second);
    {
      std::lock_guard<std::mutex> lock(mu);
      after = first_done;
      second_started = true;
    }
    cv.notify_all();
    second_work();
  }
  other.join();
  return after;
}

// An 8 MiB device and two synchronous kernels, "first" and "second", for
// the admission tests.
struct TwoKernels {
  explicit TwoKernels(const char* name)
      : device(MakeDevice(name, 8)),
        first(lms_test::SyncKernel::Make("first")),
        second(lms_test::SyncKernel::Make("second")) {}
  std::unique_ptr<lms::LmsDevice> device;
  std::unique_ptr<lms_test::SyncKernel> first;
  std::unique_ptr<lms_test::SyncKernel> second;
};

// Note [Kernels admitted by their last set]: two kernels that each pin 4 MiB
// and then allocate 4 MiB, on an 8 MiB device. Pinned at once, both would
// wait for the other's release until one is served from host memory; the
// second, whose last set (8 MiB) does not fit beside the first's input, is
// not admitted until the first ends.
TEST(AKernelWhoseLastSetDoesNotFitBesideRunningKernelsWaitsForThemBeforePinning) {
  TwoKernels kernels("admitted");
  ASSERT_TRUE(kernels.device != nullptr);
  std::unique_ptr<lms::LmsDevice>& device = kernels.device;
  std::unique_ptr<lms_test::SyncKernel>& first = kernels.first;
  std::unique_ptr<lms_test::SyncKernel>& second = kernels.second;
  lms::KernelPins* pins = device->pins();
  tensorflow::Tensor a = MakeTensor(*device, 4);
  tensorflow::Tensor b = MakeTensor(*device, 4);
  Fill(a, 1);
  Fill(b, 2);
  { Context writer(pins, {&a, &b}); }  // claimed, then inactive
  // Their last runs, one at a time: inputs and outputs, 8 MiB each.
  for (auto [kernel, input] : {std::pair{first.get(), &a}, std::pair{second.get(), &b}}) {
    Context run(pins, {input}, /*step_id=*/1, kernel);
    tensorflow::Tensor out = MakeTensor(*device, 4);
    EXPECT_TRUE(!Info(*device, out).evicted);
  }
  EXPECT_EQ(pins->LastSetBytes(first.get()), static_cast<int64_t>(8 * lms_test::kMiB));
  EXPECT_EQ(pins->LastSetBytes(second.get()), static_cast<int64_t>(8 * lms_test::kMiB));
  const int64_t overflows = device->engine().GetStatistics().num_overflow_placements;
  // Each allocates its output, writes it and reads its input back.
  auto output_of = [&](const tensorflow::Tensor& input, uint64_t in_seed, uint64_t out_seed) {
    return [&device, &input, in_seed, out_seed] {
      tensorflow::Tensor out = MakeTensor(*device, 4);
      EXPECT_TRUE(!Info(*device, out).evicted);
      Fill(out, out_seed);
      EXPECT_TRUE(Holds(input, in_seed) && Holds(out, out_seed));
    };
  };
  EXPECT_TRUE(SecondAdmittedAfterFirst(pins, first.get(), {&a}, output_of(a, 1, 3),
                                       second.get(), {&b}, output_of(b, 2, 4)));
  EXPECT_EQ(pins->NumAdmissionWaits(), 1);
  EXPECT_EQ(pins->NumDeadlocks(), 0);
  EXPECT_EQ(device->engine().GetStatistics().num_overflow_placements, overflows);
  EXPECT_EQ(pins->AdmittedBytes(), 0);  // each gave its room back
}

// A kernel admitted by its last set keeps the room that set needs until it
// ends, though it holds nothing yet: a kernel that starts after it (before
// it allocates) waits, rather than take room the first will need.
TEST(AKernelAdmittedBeforeKeepsTheRoomOfItsSetUntilItEnds) {
  TwoKernels kernels("reserved");
  ASSERT_TRUE(kernels.device != nullptr);
  std::unique_ptr<lms::LmsDevice>& device = kernels.device;
  std::unique_ptr<lms_test::SyncKernel>& first = kernels.first;
  std::unique_ptr<lms_test::SyncKernel>& second = kernels.second;
  lms::KernelPins* pins = device->pins();
  // Each allocates an output of `mib` and finds it resident.
  auto output = [&device](size_t mib) {
    return [&device, mib] {
      tensorflow::Tensor out = MakeTensor(*device, mib);
      EXPECT_TRUE(!Info(*device, out).evicted);
    };
  };
  for (auto [kernel, mib] : {std::pair{first.get(), 8}, std::pair{second.get(), 4}}) {
    Context run(pins, {}, /*step_id=*/1, kernel);
    output(mib)();
  }
  EXPECT_TRUE(SecondAdmittedAfterFirst(pins, first.get(), {}, output(8), second.get(), {},
                                       output(4)));
  EXPECT_EQ(pins->NumAdmissionWaits(), 1);
  EXPECT_EQ(pins->AdmittedBytes(), 0);
}

// A last set that does not fit beside what is held, with no other kernel
// running to release anything (here an allocation outside kernels, which
// nothing evicts): the kernel goes on at once, as without admission.
TEST(AKernelWhoseLastSetDoesNotFitGoesOnAtOnceWhenNoOtherKernelRuns) {
  auto device = MakeDevice("alone", 8);
  ASSERT_TRUE(device != nullptr);
  lms::KernelPins* pins = device->pins();
  auto kernel = lms_test::SyncKernel::Make("alone");
  tensorflow::Tensor a = MakeTensor(*device, 4);
  {
    Context run(pins, {&a}, /*step_id=*/1, kernel.get());
    tensorflow::Tensor out = MakeTensor(*device, 4);
  }
  tensorflow::Tensor unclaimed = MakeTensor(*device, 2);  // held: 2 MiB
  EXPECT_TRUE(Info(*device, unclaimed).unclaimed && !Info(*device, unclaimed).evicted);
  {
    Context run(pins, {&a}, /*step_id=*/2, kernel.get());
    EXPECT_EQ(pins->AdmittedBytes(), static_cast<int64_t>(8 * lms_test::kMiB));
  }
  EXPECT_EQ(pins->NumAdmissionWaits(), 0);
  EXPECT_EQ(pins->AdmittedBytes(), 0);
}

TEST(AnOptionalRequestEvictsWithinItsStepsAllowance) {
  // Note [Optional requests] in engine.h: a sixteenth of the device a step.
  auto device = MakeDevice("optional", 64);
  ASSERT_TRUE(device != nullptr);
  std::vector<tensorflow::Tensor> held;
  for (int i = 0; i < 15; ++i) {
    held.push_back(MakeTensor(*device, 4));
    Fill(held.back(), i);
    Context writer(device->pins(), {&held.back()});  // claimed, then inactive
  }
  tsl::AllocationAttributes optional;
  optional.retry_on_failure = false;  // as cuDNN's autotuning scratch asks
  const auto evictions = [&] { return device->engine().GetStatistics().num_evictions; };
  {
    Context kernel(device->pins(), {}, /*step_id=*/7);
    void* fits = device->allocator()->AllocateRaw(256, 4 * lms_test::kMiB, optional);
    EXPECT_TRUE(fits != nullptr);  // the free 4 MiB
    EXPECT_EQ(evictions(), 0);
    void* evicts = device->allocator()->AllocateRaw(256, 4 * lms_test::kMiB, optional);
    EXPECT_TRUE(evicts != nullptr);  // the step's allowance: one victim of 4 MiB
    EXPECT_EQ(evictions(), 1);
    EXPECT_EQ(device->engine().GetStatistics().bytes_evicted_for_optional,
              int64_t{4} << 20);
    void* refused = device->allocator()->AllocateRaw(256, 4 * lms_test::kMiB, optional);
    EXPECT_TRUE(refused == nullptr);  // the allowance is spent
    EXPECT_EQ(evictions(), 1);
    EXPECT_TRUE(device->engine().GetStatistics().num_optional_refused >= 1);
    device->allocator()->DeallocateRaw(fits);
    device->allocator()->DeallocateRaw(evicts);
  }
  {
    Context kernel(device->pins(), {}, /*step_id=*/8);
    // 8 MiB free again (the scratch above was freed): take it, then evict.
    void* first = device->allocator()->AllocateRaw(256, 8 * lms_test::kMiB, optional);
    void* second = device->allocator()->AllocateRaw(256, 4 * lms_test::kMiB, optional);
    EXPECT_TRUE(first != nullptr && second != nullptr);  // a new step, a new allowance
    EXPECT_EQ(evictions(), 2);
    device->allocator()->DeallocateRaw(first);
    device->allocator()->DeallocateRaw(second);
  }
  EXPECT_EQ(device->engine().GetStatistics().num_born_evicted, 0);
  for (int i = 0; i < 15; ++i) EXPECT_TRUE(Holds(held[i], i));
}

TEST(ACountOfContextsIsPerDevice) {
  // Note [Contexts per device]: this thread holds a kernel on device 0
  // (an asynchronous one whose done has not come, say) while its kernel on
  // device 1 waits for another thread's kernel on device 1. Counted with
  // device 0's, its own contexts matched device 1's live ones: no release
  // expected, and the request went to host memory at once.
  auto gpu0 = MakeDevice("gpu0", 8);
  auto gpu1 = MakeDevice("gpu1", 8);
  ASSERT_TRUE(gpu0 != nullptr && gpu1 != nullptr);
  tensorflow::Tensor held = MakeTensor(*gpu0, 2);
  tensorflow::Tensor a = MakeTensor(*gpu1, 6);
  Context pending(gpu0->pins(), {&held});
  EXPECT_EQ(gpu0->pins()->ThreadLiveContexts(), 1);
  EXPECT_EQ(gpu1->pins()->ThreadLiveContexts(), 0);
  EXPECT_TRUE(gpu0->pins()->InKernel() && !gpu1->pins()->InKernel());
  KernelElsewhere other(gpu1->pins(), {&a}, std::chrono::milliseconds(200));
  {
    Context kernel(gpu1->pins(), {});
    tensorflow::Tensor b = MakeTensor(*gpu1, 6);  // fits once a is released
    EXPECT_TRUE(!Info(*gpu1, b).evicted);
    EXPECT_EQ(Info(*gpu1, b).pin_count, 1u);  // joined this thread's kernel on gpu1
  }
  other.Join();
  EXPECT_TRUE(gpu1->pins()->NumWaits() >= 1);
  EXPECT_EQ(gpu1->engine().GetStatistics().num_overflow_placements, 0);
  EXPECT_EQ(Info(*gpu0, held).pin_count, 1u);
}

// Runs `request` on a thread named as TensorFlow names its event threads,
// while another kernel holds `a` pinned for two seconds; returns how long
// the request took.
template <typename Request>
std::chrono::milliseconds OnAnEventThreadWhileAnotherKernelHolds(lms::LmsDevice& device,
                                                                 tensorflow::Tensor& a,
                                                                 Request request) {
  KernelElsewhere other(device.pins(), {&a}, std::chrono::milliseconds(2000));
  std::chrono::milliseconds took{0};
  std::thread event([&] {
    pthread_setname_np(pthread_self(), "tf_Device_Event");
    const auto start = std::chrono::steady_clock::now();
    request();
    took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
  });
  event.join();
  other.Join();
  return took;
}

TEST(AKernelsAllocationOnAnEventThreadNeverWaitsForOtherKernels) {
  // The executor runs inexpensive kernels inline in an event callback (after
  // an asynchronous kernel's done): Note [No waits on TensorFlow's event
  // threads]. Before, the request waited for the other kernel (2 s).
  auto device = MakeDevice("event_allocation", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor a = MakeTensor(*device, 6);
  bool evicted = false;
  const auto took = OnAnEventThreadWhileAnotherKernelHolds(*device, a, [&] {
    Context kernel(device->pins(), {});
    tensorflow::Tensor b = MakeTensor(*device, 6);
    evicted = Info(*device, b).evicted;  // served in host memory instead
  });
  EXPECT_TRUE(took < std::chrono::milliseconds(1000));
  EXPECT_TRUE(evicted);
}

TEST(AKernelsInputsOnAnEventThreadNeverWaitForOtherKernels) {
  auto device = MakeDevice("event_inputs", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor b = MakeTensor(*device, 6);
  Fill(b, 3);
  { Context writer(device->pins(), {&b}); }  // inactive
  tensorflow::Tensor a;
  {
    Context kernel(device->pins(), {});
    a = MakeTensor(*device, 6);  // evicts b
  }
  ASSERT_TRUE(Info(*device, b).evicted);
  bool still_evicted = false;
  bool holds = false;
  const auto took = OnAnEventThreadWhileAnotherKernelHolds(*device, a, [&] {
    Context kernel(device->pins(), {&b});  // b cannot be paged in while a is pinned
    still_evicted = Info(*device, b).evicted;  // read in place
    holds = Holds(b, 3);
  });
  EXPECT_TRUE(took < std::chrono::milliseconds(1000));
  EXPECT_TRUE(still_evicted && holds);
}

TEST(ACopysPinOnAnEventThreadNeverWaitsForOtherKernels) {
  // TensorFlow's own copies (tensorflow_copies.cc) pin through PinForCopy.
  auto device = MakeDevice("event_copy", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor b = MakeTensor(*device, 6);
  { Context writer(device->pins(), {&b}); }
  tensorflow::Tensor a;
  {
    Context kernel(device->pins(), {});
    a = MakeTensor(*device, 6);  // evicts b
  }
  ASSERT_TRUE(Info(*device, b).evicted);
  lms::Status status;
  const auto took = OnAnEventThreadWhileAnotherKernelHolds(*device, a, [&] {
    uint64_t unit_id = 0;
    status = device->pins()->PinForCopy(b.data(), &unit_id);
    if (status.ok()) (void)device->engine().Unpin(b.data(), unit_id);
  });
  EXPECT_TRUE(took < std::chrono::milliseconds(1000));
  EXPECT_TRUE(status.code() == lms::StatusCode::kResourceExhausted);
  // Off the event threads the same pin waits for the release, and succeeds.
  KernelElsewhere other(device->pins(), {&a}, std::chrono::milliseconds(200));
  uint64_t unit_id = 0;
  EXPECT_TRUE(device->pins()->PinForCopy(b.data(), &unit_id).ok());
  other.Join();
  EXPECT_TRUE(device->engine().Unpin(b.data(), unit_id).ok());
}

TEST(AWaitForOtherKernelsIsCountedWithTheLongest) {
  auto device = MakeDevice("wait_statistics", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor a = MakeTensor(*device, 6);
  KernelElsewhere other(device->pins(), {&a}, std::chrono::milliseconds(300));
  {
    Context kernel(device->pins(), {});
    tensorflow::Tensor b = MakeTensor(*device, 6);
  }
  other.Join();
  const lms::Statistics stats = device->engine().GetStatistics();
  EXPECT_TRUE(stats.num_kernel_waits >= 1);
  EXPECT_TRUE(stats.time_longest_kernel_wait_ns >= 200'000'000);
  EXPECT_TRUE(stats.time_longest_kernel_wait_ns < 2'000'000'000);
  EXPECT_TRUE(stats.time_kernel_waiting_ns >= stats.time_longest_kernel_wait_ns);
}

// Every span an engine reports, with the thread that began or ended it.
class SpanLog : public lms::ActivityObserver {
 public:
  struct Entry {
    std::thread::id thread;
    lms::Activity what;
    bool begin;
  };
  bool Active() const override { return true; }
  int64_t Begin(lms::Activity what, uint64_t, uint64_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back({std::this_thread::get_id(), what, true});
    open_.push_back(what);
    return static_cast<int64_t>(open_.size());
  }
  void End(int64_t token) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_TRUE(token > 0 && static_cast<size_t>(token) <= open_.size());
    entries_.push_back({std::this_thread::get_id(), open_[token - 1], false});
  }
  std::vector<Entry> entries() {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_;
  }

 private:
  std::mutex mu_;
  std::vector<lms::Activity> open_;
  std::vector<Entry> entries_;
};

// A request's wait for other kernels is a span on the waiting thread (Note
// [LMS's work in the trace viewer] in profiler_events.h), begun and ended
// there, with the reclaim that finally served it inside.
TEST(AWaitForOtherKernelsIsASpanOnTheWaitingThread) {
  auto device = MakeDevice("wait_span", 8);
  ASSERT_TRUE(device != nullptr);
  SpanLog log;
  device->engine().SetActivityObserver(&log);
  tensorflow::Tensor a = MakeTensor(*device, 6);
  KernelElsewhere other(device->pins(), {&a}, std::chrono::milliseconds(100));
  {
    Context kernel(device->pins(), {});
    tensorflow::Tensor b = MakeTensor(*device, 6);
  }
  other.Join();
  device->engine().SetActivityObserver(nullptr);
  const std::thread::id me = std::this_thread::get_id();
  int begun = 0, ended = 0;
  for (const SpanLog::Entry& e : log.entries()) {
    if (e.what != lms::Activity::kMemoryWait) continue;
    EXPECT_TRUE(e.thread == me);
    (e.begin ? begun : ended) += 1;
  }
  EXPECT_TRUE(begun >= 1);
  EXPECT_EQ(begun, ended);
  EXPECT_TRUE(device->engine().GetStatistics().num_kernel_waits >= 1);
}

// An asynchronous kernel (a collective waiting for its peer) holding `a`
// pinned on a thread of its own until Release.
class WaitingCollective {
 public:
  WaitingCollective(lms::KernelPins* pins, tensorflow::Tensor* a)
      : kernel_(lms_test::AsyncKernel::Make()),
        elsewhere_(pins, {a}, std::chrono::hours(1), kernel_.get()) {}
  void Release() { elsewhere_.Release(); }

 private:
  std::unique_ptr<lms_test::AsyncKernel> kernel_;  // outlives elsewhere_
  KernelElsewhere elsewhere_;
};

TEST(AKernelsRequestBesideAWaitingCollectiveIsServedAtOnce) {
  // Note [Asynchronous kernels wait for others]: the collective releases
  // only when its peer comes, which this thread brings after. Counted as a
  // running kernel, the request waited the whole retry budget (10 s).
  auto device = MakeDevice("beside_collective", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor a = MakeTensor(*device, 6);
  WaitingCollective collective(device->pins(), &a);
  EXPECT_EQ(device->pins()->AsyncContexts(), 1);
  EXPECT_EQ(device->pins()->LiveContexts(), 1);
  const auto start = std::chrono::steady_clock::now();
  bool evicted = false;
  {
    Context kernel(device->pins(), {});
    tensorflow::Tensor b = MakeTensor(*device, 6);
    evicted = Info(*device, b).evicted;  // placed in host memory
    Fill(b, 4);
    EXPECT_TRUE(Holds(b, 4));
  }
  EXPECT_TRUE(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  EXPECT_TRUE(evicted);
  EXPECT_TRUE(device->pins()->NumDeadlocks() >= 1);
  collective.Release();
  EXPECT_EQ(device->pins()->AsyncContexts(), 0);
  EXPECT_EQ(device->pins()->LiveContexts(), 0);
}

TEST(ACopysPinWaitsForAWaitingCollectiveInsteadOfFailing) {
  // A TensorFlow copy has no other way to be served: for it the collective
  // counts as running, and the pin waits for its release.
  auto device = MakeDevice("copy_beside_collective", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor b = MakeTensor(*device, 6);
  Fill(b, 5);
  { Context writer(device->pins(), {&b}); }
  tensorflow::Tensor a;
  {
    Context kernel(device->pins(), {});
    a = MakeTensor(*device, 6);  // evicts b
  }
  ASSERT_TRUE(Info(*device, b).evicted);
  WaitingCollective collective(device->pins(), &a);
  std::thread peer([&] {  // the collective's peer comes after 300 ms
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    collective.Release();
  });
  uint64_t unit_id = 0;
  const lms::Status pinned = device->pins()->PinForCopy(b.data(), &unit_id);
  peer.join();
  EXPECT_TRUE(pinned.ok());
  if (pinned.ok()) {
    EXPECT_TRUE(!Info(*device, b).evicted);
    EXPECT_TRUE(Holds(b, 5));
    EXPECT_TRUE(device->engine().Unpin(b.data(), unit_id).ok());
  }
}

}  // namespace
