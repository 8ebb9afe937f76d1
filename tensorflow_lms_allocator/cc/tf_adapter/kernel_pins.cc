// The one translation unit that includes OpKernelContext's header: it reads
// a context's input tensors. Everything else in the adapter stays light.
#include "tf_adapter/kernel_pins.h"

#include <cstdio>

#include "engine/strict_monitor.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace lms {
namespace {

thread_local void* t_current_context = nullptr;

}  // namespace

void KernelPins::OnContextCreated(void* context, void* params) {
  auto* p = static_cast<tensorflow::OpKernelContext::Params*>(params);
  Entry entry;
  entry.previous_context = t_current_context;
  for (const tensorflow::TensorValue& value : p->inputs) {
    if (value.tensor == nullptr) continue;
    const void* data = tensorflow::DMAHelper::base(value.tensor);
    if (data == nullptr || !engine_->InEvictableRange(data)) continue;
    uint64_t id = 0;
    Status s = RetryWhileOthersRelease([&] { return engine_->Pin(data, &id); });
    // A failed pin (counted by the engine as num_failed_pins) still lets
    // the kernel read the right bytes: evicted memory is mapped from host
    // memory at the same address, only slower to reach.
    if (s.ok()) entry.pins.push_back({data, id});
  }
  Shard& shard = ShardFor(context);
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    shard.entries[context] = std::move(entry);
  }
  live_contexts_.fetch_add(1, std::memory_order_relaxed);
  t_current_context = context;
  if (p->op_kernel != nullptr) {
    // Strict mode labels unpinned touches with the running op.
    StrictMonitor::SetThreadLabel(p->op_kernel->name().c_str());
  }
}

void KernelPins::OnContextDestroyed(void* context) {
  Entry entry;
  Shard& shard = ShardFor(context);
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.entries.find(context);
    if (it == shard.entries.end()) return;
    entry = std::move(it->second);
    shard.entries.erase(it);
  }
  live_contexts_.fetch_sub(1, std::memory_order_relaxed);
  if (t_current_context == context) {
    t_current_context = entry.previous_context;
    if (t_current_context == nullptr) StrictMonitor::SetThreadLabel(nullptr);
  }
  UnpinAll(entry.pins);
}

bool KernelPins::InKernel() const { return t_current_context != nullptr; }


void KernelPins::RecordAllocation(const void* ptr, uint64_t id) {
  void* context = t_current_context;
  if (context != nullptr) {
    Shard& shard = ShardFor(context);
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.entries.find(context);
    if (it != shard.entries.end()) {
      it->second.pins.push_back({ptr, id});
      return;
    }
  }
  // The kernel is gone (destroyed on another thread): nobody holds this.
  engine_->Unpin(ptr, id);
}

void KernelPins::UnpinAll(const std::vector<Pin>& pins) {
  for (const Pin& pin : pins) {
    // kNotFound means the kernel freed what it allocated: nothing to unpin.
    Status s = engine_->Unpin(pin.ptr, pin.allocation_id);
    if (!s.ok() && s.code() != StatusCode::kNotFound) {
      LOG(ERROR) << "tensorflow_lms_allocator: " << s.ToString();
    }
  }
}

}  // namespace lms
