// KernelPins (cc/tf_adapter/kernel_pins.h) and LmsAllocator's use of it: what
// a kernel's context pins and for how long, where its requests go when the
// device is full, and how they wait for other kernels. Real tensors from an
// LMS device's allocator, contexts as TensorFlow's hooks report them
// (adapter_test_util.h); no TensorFlow runtime.
#include <atomic>
#include <chrono>
#include <thread>

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
  std::atomic<bool> holding{false};
  std::thread other([&] {
    Context kernel(device->pins(), {&a});
    holding = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });  // the other kernel ends here, unpinning a
  while (!holding) std::this_thread::yield();
  tensorflow::Tensor b;
  {
    Context kernel(device->pins(), {});
    b = MakeTensor(*device, 6);  // fits once a is unpinned and evicted
    EXPECT_TRUE(!Info(*device, b).evicted);
  }
  other.join();
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

TEST(AnOptionalRequestEvictsNothing) {
  auto device = MakeDevice("optional", 8);
  ASSERT_TRUE(device != nullptr);
  tensorflow::Tensor a = MakeTensor(*device, 6);
  { Context writer(device->pins(), {&a}); }  // inactive, resident
  tsl::AllocationAttributes optional;
  optional.retry_on_failure = false;  // as cuDNN's autotuning scratch asks
  void* scratch = device->allocator()->AllocateRaw(256, 4 * lms_test::kMiB, optional);
  EXPECT_TRUE(scratch == nullptr);
  EXPECT_TRUE(!Info(*device, a).evicted);
  EXPECT_TRUE(device->engine().GetStatistics().num_optional_refused >= 1);
}

}  // namespace
