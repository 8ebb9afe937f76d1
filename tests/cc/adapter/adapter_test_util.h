// Shared set-up of the adapter's unit tests: an LMS device over the POSIX
// backend, tensors allocated by its allocator as TensorFlow allocates them,
// and kernel contexts as TensorFlow's OpKernelContext hooks report them.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_ADAPTER_TEST_UTIL_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_ADAPTER_TEST_UTIL_H_

#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include "harness.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/node_properties.h"
#include "tensorflow/core/framework/op_def.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tf_adapter/lms_device.h"

namespace lms_test {

inline constexpr size_t kMiB = size_t{1} << 20;

// An LMS device of `device_mib` over the POSIX backend (2 MiB granules),
// with LMS on and `host_mib` of host memory for evicted tensors.
inline std::unique_ptr<lms::LmsDevice> MakeDevice(const char* name, size_t device_mib,
                                                  size_t host_mib = 64) {
  lms::LmsDeviceSpec spec;
  spec.name = name;
  spec.backend.kind = lms::BackendKind::kPosix;
  spec.backend.granule_bytes = 2 * kMiB;
  spec.engine.device_bytes = device_mib * kMiB;
  spec.engine.host_bytes = host_mib * kMiB;
  spec.engine.lms_enabled = true;
  std::unique_ptr<lms::LmsDevice> device;
  const lms::Status s = lms::LmsDevice::Create(spec, &device);
  if (!s.ok()) std::printf("  LmsDevice::Create: %s\n", s.ToString().c_str());
  return device;
}

// A float tensor of `mib` MiB from `device`'s allocator, as TensorFlow makes one.
inline tensorflow::Tensor MakeTensor(lms::LmsDevice& device, size_t mib) {
  return tensorflow::Tensor(device.allocator(), tensorflow::DT_FLOAT,
                            tensorflow::TensorShape({static_cast<int64_t>(mib * kMiB / 4)}));
}

inline lms::AllocationInfo Info(lms::LmsDevice& device, const tensorflow::Tensor& t) {
  lms::AllocationInfo info;
  const lms::Status s = device.engine().Inspect(t.data(), &info);
  if (!s.ok()) std::printf("  Inspect: %s\n", s.ToString().c_str());
  return info;
}

// The construction a test kernel named `name` is made from: its OpDef (one
// per name, living as long as the kernels) and NodeDef, on no device.
class TestKernelConstruction {
 public:
  explicit TestKernelConstruction(const char* name)
      : props_(Props(name)),
        construction_(tensorflow::DeviceType("CPU"), /*device=*/nullptr, /*allocator=*/nullptr,
                      /*flib=*/nullptr, /*resource_mgr=*/nullptr, props_, {}, {},
                      /*graph_def_version=*/0, &status_) {}
  tensorflow::OpKernelConstruction* get() { return &construction_; }

 private:
  static std::shared_ptr<const tensorflow::NodeProperties> Props(const char* name) {
    auto* def = new tensorflow::OpDef;  // lives as long as the kernels
    def->set_name(name);
    tensorflow::NodeDef node;
    node.set_name(name);
    node.set_op(name);
    return std::make_shared<const tensorflow::NodeProperties>(
        def, std::move(node), tensorflow::DataTypeSlice(), tensorflow::DataTypeSlice());
  }
  std::shared_ptr<const tensorflow::NodeProperties> props_;
  absl::Status status_;
  tensorflow::OpKernelConstruction construction_;
};

// An asynchronous kernel (an AsyncOpKernel, as collectives, _Recv and
// function calls are), for a Context whose kernel waits for others: the
// adapter asks it only AsAsync() and its name.
class AsyncKernel : public tensorflow::AsyncOpKernel {
 public:
  static std::unique_ptr<AsyncKernel> Make() {
    TestKernelConstruction construction("LmsTestAsync");
    return std::unique_ptr<AsyncKernel>(new AsyncKernel(construction.get()));
  }
  void ComputeAsync(tensorflow::OpKernelContext*, DoneCallback done) override { done(); }

 private:
  explicit AsyncKernel(tensorflow::OpKernelConstruction* construction)
      : tensorflow::AsyncOpKernel(construction) {}
};

// A synchronous kernel named `name`, for a Context that TensorFlow would run
// again each step: the adapter keys its last set by it (Note [Kernels
// admitted by their last set]).
class SyncKernel : public tensorflow::OpKernel {
 public:
  static std::unique_ptr<SyncKernel> Make(const char* name) {
    TestKernelConstruction construction(name);
    return std::unique_ptr<SyncKernel>(new SyncKernel(construction.get()));
  }
  void Compute(tensorflow::OpKernelContext*) override {}

 private:
  explicit SyncKernel(tensorflow::OpKernelConstruction* construction)
      : tensorflow::OpKernel(construction) {}
};

// A kernel's context on `pins` while it lives: created with `inputs` as the
// OpKernelContext hook reports one (its Params), destroyed at scope exit.
// The context's address is only a key to the adapter, never dereferenced for
// kernels without resource inputs.
class Context {
 public:
  Context(lms::KernelPins* pins, std::vector<tensorflow::Tensor*> inputs, int64_t step_id = 0,
          tensorflow::OpKernel* kernel = nullptr)
      : pins_(pins) {
    for (tensorflow::Tensor* t : inputs) values_.push_back(tensorflow::TensorValue(t));
    SetInputs(params_.inputs, values_);
    params_.step_id = step_id;
    params_.op_kernel = kernel;
    pins_->OnContextCreated(this, &params_);
  }
  ~Context() { Destroy(); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Ends the kernel now (on the calling thread, which may be another).
  void Destroy() {
    if (pins_ == nullptr) return;
    pins_->OnContextDestroyed(this);
    pins_ = nullptr;
  }

 private:
  // Params::inputs: an absl::Span of the values, or an InlinedVector of them
  // in older TensorFlow versions.
  template <typename Inputs>
  static void SetInputs(Inputs& inputs, std::vector<tensorflow::TensorValue>& values) {
    if constexpr (std::is_constructible_v<Inputs, std::vector<tensorflow::TensorValue>&>) {
      inputs = Inputs(values);
    } else {
      inputs.assign(values.begin(), values.end());
    }
  }

  lms::KernelPins* pins_;
  std::vector<tensorflow::TensorValue> values_;
  tensorflow::OpKernelContext::Params params_;
};

}  // namespace lms_test

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_ADAPTER_TEST_UTIL_H_
