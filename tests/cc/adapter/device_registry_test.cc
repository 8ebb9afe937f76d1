// DeviceRegistry (cc/tf_adapter/device_registry.h): which LMS device a kernel
// context belongs to, from the TensorFlow device its Params name, and which
// device contexts' streams are handed on. TensorFlow devices are stand-ins
// whose GetAllocator is all the registry asks of them.
#include <utility>
#include <vector>

#include "adapter_test_util.h"
#include "tensorflow/core/framework/device_base.h"
#include "tf_adapter/device_registry.h"

namespace {

using lms_test::MakeDevice;

// A TensorFlow device that allocates from `allocator`.
class StandInDevice : public tensorflow::DeviceBase {
 public:
  explicit StandInDevice(tsl::Allocator* allocator)
      : tensorflow::DeviceBase(nullptr), allocator_(allocator) {}
  tsl::Allocator* GetAllocator(tsl::AllocatorAttributes) override { return allocator_; }

 private:
  tsl::Allocator* allocator_;
};

tensorflow::OpKernelContext::Params ParamsOn(tensorflow::DeviceBase* device,
                                             void* device_context = nullptr) {
  tensorflow::OpKernelContext::Params params;
  params.device = device;
  params.op_device_context = static_cast<tensorflow::DeviceContext*>(device_context);
  return params;
}

struct Handed {
  std::vector<std::pair<lms::LmsDevice*, void*>> pairs;
  lms::DeviceRegistry::NewDeviceContextFn Recorder() {
    return [this](lms::LmsDevice* device, void* context) { pairs.push_back({device, context}); };
  }
};

TEST(WithOnlyTheEmulatedDeviceEveryContextGoesToIt) {
  auto emulated = MakeDevice("emulated", 8);
  ASSERT_TRUE(emulated != nullptr);
  Handed handed;
  lms::DeviceRegistry registry(handed.Recorder());
  EXPECT_TRUE(registry.ForParams(nullptr) == nullptr);  // no device yet
  registry.Add(emulated.get(), /*emulated=*/true);
  StandInDevice elsewhere(nullptr);
  auto params = ParamsOn(&elsewhere);
  EXPECT_TRUE(registry.ForParams(&params) == emulated.get());
  EXPECT_TRUE(handed.pairs.empty());
}

TEST(AContextGoesToTheDeviceItsTensorFlowDeviceAllocatesFrom) {
  auto emulated = MakeDevice("emulated", 8);
  auto gpu0 = MakeDevice("gpu0", 8);
  auto gpu1 = MakeDevice("gpu1", 8);
  ASSERT_TRUE(emulated != nullptr && gpu0 != nullptr && gpu1 != nullptr);
  Handed handed;
  lms::DeviceRegistry registry(handed.Recorder());
  registry.Add(emulated.get(), /*emulated=*/true);
  registry.Add(gpu0.get(), /*emulated=*/false);
  registry.Add(gpu1.get(), /*emulated=*/false);
  StandInDevice on_gpu0(gpu0->allocator()), on_gpu1(gpu1->allocator()), on_cpu(nullptr);
  auto p0 = ParamsOn(&on_gpu0), p1 = ParamsOn(&on_gpu1), cpu = ParamsOn(&on_cpu);
  for (int again = 0; again < 2; ++again) {  // the second time from the cached route
    EXPECT_TRUE(registry.ForParams(&p0) == gpu0.get());
    EXPECT_TRUE(registry.ForParams(&p1) == gpu1.get());
    EXPECT_TRUE(registry.ForParams(&cpu) == emulated.get());
  }
}

TEST(ADeviceContextIsHandedOnOncePerDeviceAndContext) {
  auto gpu0 = MakeDevice("gpu0", 8);
  auto gpu1 = MakeDevice("gpu1", 8);
  ASSERT_TRUE(gpu0 != nullptr && gpu1 != nullptr);
  Handed handed;
  lms::DeviceRegistry registry(handed.Recorder());
  registry.Add(gpu0.get(), /*emulated=*/false);
  registry.Add(gpu1.get(), /*emulated=*/false);
  StandInDevice on_gpu0(gpu0->allocator()), on_gpu1(gpu1->allocator());
  int stream_group_a = 0, stream_group_b = 0;  // two device contexts' addresses
  auto a = ParamsOn(&on_gpu0, &stream_group_a), b = ParamsOn(&on_gpu0, &stream_group_b);
  auto a_on_gpu1 = ParamsOn(&on_gpu1, &stream_group_a);
  for (auto* params : {&a, &a, &b, &a, &b, &a_on_gpu1}) registry.ForParams(params);
  registry.NoteDeviceContext(gpu0.get(), &stream_group_b);  // a copy's, known already
  registry.NoteDeviceContext(gpu0.get(), nullptr);          // none: nothing to fence
  const std::vector<std::pair<lms::LmsDevice*, void*>> expected = {
      {gpu0.get(), &stream_group_a}, {gpu0.get(), &stream_group_b},
      {gpu1.get(), &stream_group_a}};
  EXPECT_TRUE(handed.pairs == expected);
}

TEST(TheOwnerOfAnyByteOfATensorIsItsDevice) {
  auto gpu0 = MakeDevice("gpu0", 8);
  auto gpu1 = MakeDevice("gpu1", 8);
  ASSERT_TRUE(gpu0 != nullptr && gpu1 != nullptr);
  lms::DeviceRegistry registry([](lms::LmsDevice*, void*) {});
  registry.Add(gpu0.get(), /*emulated=*/false);
  registry.Add(gpu1.get(), /*emulated=*/false);
  tensorflow::Tensor t0 = lms_test::MakeTensor(*gpu0, 4), t1 = lms_test::MakeTensor(*gpu1, 1);
  const char* last0 = static_cast<const char*>(t0.data()) + t0.TotalBytes() - 1;
  EXPECT_TRUE(registry.Owner(t0.data()) == gpu0.get());
  EXPECT_TRUE(registry.Owner(last0) == gpu0.get());
  EXPECT_TRUE(registry.Owner(t1.data()) == gpu1.get());
  int not_lms = 0;
  EXPECT_TRUE(registry.Owner(&not_lms) == nullptr);
  int seen = 0;
  registry.ForEach([&](lms::LmsDevice*) { ++seen; });
  EXPECT_EQ(seen, 2);
}

}  // namespace
