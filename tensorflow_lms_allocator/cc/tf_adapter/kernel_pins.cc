// The one translation unit that includes OpKernelContext's header: it reads
// a context's input tensors and the variables its resource inputs name.
// Everything else in the adapter stays light.
#include "tf_adapter/kernel_pins.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "engine/strict_monitor.h"
#include "tensorflow/core/common_runtime/dma_helper.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_handle.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/type_index.h"

namespace lms {

// How many devices' KernelPins a thread counts apart (Note [Contexts per
// device]); more live at once share the last slot, whose counts then mix
// them as every device's did before.
constexpr int kDeviceSlots = 32;

// Note [Kernel context lifetime] and Note [Contexts per device] in
// kernel_pins.h.
struct ThreadContexts {
  struct Frame {
    void* context;
    uint64_t serial;
    const char* label;  // the op's name, for strict mode's report
    // The kernel (InXlaKernel looks at it, on the failure path only).
    const tensorflow::OpKernel* kernel;
    int slot;    // its device's (KernelPins::slot_)
    bool async;  // an AsyncOpKernel's
    int64_t step;  // TensorFlow's step id
  };
  std::mutex mu;
  // Live contexts this thread created, outermost first.
  std::vector<Frame> frames LMS_GUARDED_BY(mu);
  // Per device slot, the frames of that slot, for the lock-free InKernel();
  // written under mu.
  std::atomic<int64_t> depth[kDeviceSlots] = {};
  // The last serial given to a context of this thread. Only the thread
  // itself reads or writes it: serials are unique per creator, and a
  // context is identified by (creator, serial).
  uint64_t last_serial = 0;
};

namespace {

// Device slots in use (Note [Contexts per device]).
std::mutex g_slots_mu;
bool g_slot_taken[kDeviceSlots - 1] = {};

int TakeSlot() {
  std::lock_guard<std::mutex> lock(g_slots_mu);
  for (int i = 0; i < kDeviceSlots - 1; ++i) {
    if (!g_slot_taken[i]) {
      g_slot_taken[i] = true;
      return i;
    }
  }
  return kDeviceSlots - 1;  // shared
}

void GiveSlot(int slot) {
  if (slot == kDeviceSlots - 1) return;
  std::lock_guard<std::mutex> lock(g_slots_mu);
  g_slot_taken[slot] = false;
}

// Bytes of the inputs pinned and the allocations made by kernels on this
// thread so far: a kernel's set is the difference between its end and its
// start (Note [Kernels admitted by their last set]).
thread_local int64_t t_tally = 0;

// This thread's stack: owned by the thread and shared with the entries of
// its live contexts, which may be destroyed after the thread exits. The raw
// pointer is the fast path's view of it (no TLS wrapper call).
thread_local std::shared_ptr<ThreadContexts> t_owner;
thread_local ThreadContexts* t_contexts = nullptr;

ThreadContexts& ThisThread() {
  if (t_contexts == nullptr) {
    t_owner = std::make_shared<ThreadContexts>();
    t_contexts = t_owner.get();
  }
  return *t_contexts;
}

// Whether `kernel` reads or writes the data a variable named by its resource
// inputs holds when it starts, and whether it is an XLA kernel (which may
// free a variable's buffer on its error path). TensorFlow names such ops Resource*
// (ResourceGather, ResourceScatterAdd, ResourceApplyAdam,
// ResourceSparseApply*, ...) or *VariableOp (ReadVariableOp,
// AssignAddVariableOp, AssignSubVariableOp); XLA runs a compiled cluster as
// XlaLaunch or _XlaRun, and a tf.function(jit_compile=True) as one kernel
// named after the function with the _XlaMustCompile attribute. Not:
// AssignVariableOp (it replaces the buffer, or allocates a new one in
// copy-on-read mode, and never reads the old one, so paging it in would copy
// bytes about to be freed); VarIsInitializedOp, VariableShape,
// DestroyResourceOp, function calls and control flow (they pass or inspect
// the handle only).
enum class VariableAccess { kNone, kVariableOp, kXla };

// The names are checked first: an op that names itself Resource* or
// *VariableOp is not XLA's, and the XLA check reads the kernel's NodeDef
// attributes (once per variable pinned, it showed in the step's profile).
__attribute__((noinline)) VariableAccess VariableAccessOf(const tensorflow::OpKernel& kernel) {
  static constexpr char kPrefix[] = "Resource";
  static constexpr char kSuffix[] = "VariableOp";
  const absl::string_view op = kernel.type_string_view();  // held by the kernel itself
  constexpr size_t kPrefixLen = sizeof(kPrefix) - 1;
  constexpr size_t kSuffixLen = sizeof(kSuffix) - 1;
  if (op.substr(0, kPrefixLen) == kPrefix) return VariableAccess::kVariableOp;
  if (op.size() >= kSuffixLen && op.substr(op.size() - kSuffixLen) == kSuffix) {
    return op != "AssignVariableOp" ? VariableAccess::kVariableOp : VariableAccess::kNone;
  }
  return LiveVariables::IsXlaKernel(kernel) ? VariableAccess::kXla : VariableAccess::kNone;
}

// The variable `handle` names, with a reference the caller drops, or null if
// it is not reachable from `ctx` (another device's name, deleted, another
// type). Mirrors tensorflow::LookupResource without building error statuses.
tensorflow::Var* LookupVariable(tensorflow::OpKernelContext* ctx,
                                const tensorflow::ResourceHandle& handle) {
  if (handle.IsRefCounting()) {
    // The handle owns the variable (eager and tf.function variables). The
    // caller checked the type hash, the check GetResource<Var>() makes.
    auto* var = static_cast<tensorflow::Var*>(handle.resource().get());
    var->Ref();
    return var;
  }
  // A name in a device's resource manager (tf.compat.v1 graphs): only this
  // device's manager knows it, as internal::ValidateDevice requires.
  tensorflow::DeviceBase* device = ctx->device();
  tensorflow::ResourceMgr* manager = ctx->resource_manager();
  if (device == nullptr || manager == nullptr ||
      handle.device() != device->attributes().name()) {
    return nullptr;
  }
  tensorflow::Var* var = nullptr;
  if (!manager->Lookup<tensorflow::Var>(handle.container(), handle.name(), &var).ok()) {
    return nullptr;
  }
  return var;
}

}  // namespace

KernelPins::KernelPins(Engine* engine) : engine_(engine), slot_(TakeSlot()) {}

KernelPins::~KernelPins() {
  // Contexts still live (a device destroyed under a running kernel) leave
  // their creators' stacks, so the next device given this slot inherits
  // none of their frames.
  for (Shard& shard : shards_) {
    std::lock_guard<std::mutex> lock(shard.mu);
    for (auto& [context, entry] : shard.entries) Forget(*entry.creator, entry.serial, slot_);
    shard.entries.clear();
  }
  GiveSlot(slot_);
}

void KernelPins::OnContextCreated(void* context, void* params) {
  auto* ctx = static_cast<tensorflow::OpKernelContext*>(context);
  auto* p = static_cast<tensorflow::OpKernelContext::Params*>(params);
  Entry entry;
  entry.async = p->op_kernel != nullptr && p->op_kernel->AsAsync() != nullptr;
  if (!entry.async && p->op_kernel != nullptr && engine_->lms_enabled()) {
    entry.kernel = p->op_kernel;
    entry.admitted = AwaitRoomFor(entry.kernel);
    entry.tally_at_start = t_tally;
  }
  // Counted before its first pin (the invariant of Note [Taking turns]). It
  // counts itself, then looks for waiters; a waiter takes its ticket, then
  // counts live contexts: of the two, at least one sees the other (both
  // sequentially consistent), so either this kernel holds back or the waiter
  // waits for it.
  contexts_.fetch_add(1);
  // name_view() views the NodeDef's std::string, so its data() ends in a
  // NUL; name() would reach it through the kernel's NodeProperties and
  // NodeDef, two more lines from memory per kernel (measured: most of this
  // hook's time in DenseNet121's steps).
  const char* label = p->op_kernel != nullptr ? p->op_kernel->name_view().data() : nullptr;
  // The kernel's label before its first pin: its inputs' pins (and page-ins)
  // are its own in an access trace and in strict mode's reports, as its
  // outputs are (replay.kernel_floor counts a kernel's inputs with them).
  if (label != nullptr) StrictMonitor::SetThreadLabel(label);
  const bool waiters = num_waiting_.load() > 0;
  const Status s = waiters ? Status::Ok() : PinInputs(ctx, params, &entry.pins);
  if (__builtin_expect(waiters || s.code() == StatusCode::kResourceExhausted, 0)) {
    PinInputsTakingTurns(ctx, params, &entry.pins);
  }
  if (entry.kernel != nullptr) {
    for (const tensorflow::TensorValue& value : p->inputs) {
      const tensorflow::Tensor* tensor = value.tensor;
      if (tensor != nullptr && engine_->Owns(tensorflow::DMAHelper::base(tensor))) {
        t_tally += static_cast<int64_t>(tensor->TotalBytes());
      }
    }
  }
  // An asynchronous kernel counts as blocked once its inputs are pinned
  // (while it takes turns for them it is not even counted live).
  if (entry.async) contexts_.fetch_add(kAsyncUnit);
  ThreadContexts& thread = ThisThread();
  const uint64_t serial = ++thread.last_serial;
  entry.serial = serial;
  entry.creator = t_owner;
  const bool async = entry.async;
  Entry replaced;
  Shard& shard = ShardFor(context);
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    Entry& slot = shard.entries[context];
    // A live entry here would be a context destroyed without the hook
    // (TensorFlow's destructors are all hooked): retire it, never leak it.
    replaced = std::move(slot);
    slot = std::move(entry);
  }
  if (replaced.creator != nullptr) {
    Forget(*replaced.creator, replaced.serial, slot_);
    Release(replaced);
  }
  {
    std::lock_guard<std::mutex> lock(thread.mu);
    thread.frames.push_back({context, serial, label, p->op_kernel, slot_, async, p->step_id});
    thread.depth[slot_].fetch_add(1, std::memory_order_relaxed);
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
  // Unpin first, then stop counting: a request waiting for this kernel's
  // memory (RetryWhileOthersRelease) makes its last attempt after the count
  // drops, and must find the memory released by then.
  if (entry.kernel != nullptr && entry.creator.get() == t_contexts) {
    SetShard& sets = SetShardFor(entry.kernel);
    std::lock_guard<std::mutex> lock(sets.mu);
    // Kernels TensorFlow deleted (a function traced again) leave entries: a
    // bound, not an eviction order.
    if (sets.bytes.size() >= kMostSetsPerShard) sets.bytes.clear();
    sets.bytes[entry.kernel] = t_tally - entry.tally_at_start;
  }
  Release(entry);
  const char* enclosing_label = Forget(*entry.creator, entry.serial, slot_);
  if (entry.creator.get() == t_contexts) {
    // Back to the enclosing kernel's label, or none. (A context destroyed on
    // another thread cannot reach its creator's thread-local label.)
    StrictMonitor::SetThreadLabel(enclosing_label);
  }
}

KernelPins::Turn::Turn(KernelPins* pins)
    : pins_(pins),
      start_(std::chrono::steady_clock::now()),
      span_(pins->engine_->activity_observer(), Activity::kMemoryWait, 0, 0) {
  int64_t all = 0;
  pins_->CountOwnContexts(&all, &own_);
  pins_->blocked_contexts_.fetch_add(own_);
  pins_->num_waits_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(pins_->turn_mu_);
  // Waiters whose thread holds kernel contexts (a running kernel's
  // allocation, or a nested kernel's inputs) go before kernels that hold
  // nothing yet: only they can end a kernel and release memory.
  ticket_ = pins_->next_ticket_++ | (all > 0 ? 0 : kHoldsNothing);
  pins_->waiting_.insert(ticket_);
  pins_->num_waiting_.fetch_add(1);
}

KernelPins::Turn::~Turn() {
  pins_->blocked_contexts_.fetch_sub(own_);
  {
    std::lock_guard<std::mutex> lock(pins_->turn_mu_);
    pins_->waiting_.erase(ticket_);
    pins_->num_waiting_.fetch_sub(1);
  }
  pins_->turn_cv_.notify_all();
  pins_->engine_->NoteKernelWait(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - start_)
                                     .count());
}

void KernelPins::CountOwnContexts(int64_t* all, int64_t* synchronous) const {
  *all = *synchronous = 0;
  ThreadContexts* thread = t_contexts;
  if (thread == nullptr) return;
  std::lock_guard<std::mutex> lock(thread->mu);
  for (const ThreadContexts::Frame& frame : thread->frames) {
    if (frame.slot != slot_) continue;
    ++*all;
    if (!frame.async) ++*synchronous;
  }
}

bool KernelPins::Turn::oldest() const {
  std::lock_guard<std::mutex> lock(pins_->turn_mu_);
  return *pins_->waiting_.begin() == ticket_;
}

void KernelPins::AwaitTurn() {
  // Note [No waits on TensorFlow's event threads].
  if (OnTensorFlowEventThread()) return;
  // An enclosing kernel of this thread cannot end while it waits.
  int64_t all = 0;
  int64_t own = 0;
  CountOwnContexts(&all, &own);
  const auto start = std::chrono::steady_clock::now();
  blocked_contexts_.fetch_add(own);
  {
    ScopedActivity span(engine_->activity_observer(), Activity::kMemoryWait, 0, 0);
    std::unique_lock<std::mutex> lock(turn_mu_);
    turn_cv_.wait_for(lock, kTurnWait,
                      [this]() LMS_EXCLUSIVE_LOCKS_REQUIRED(turn_mu_) { return waiting_.empty(); });
  }
  blocked_contexts_.fetch_sub(own);
  engine_->NoteKernelWait(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - start)
                              .count());
}

void KernelPins::Release(const Entry& entry) {
  if (entry.admitted != 0) admitted_bytes_.fetch_sub(entry.admitted);
  UnpinAll(entry.pins);
  contexts_.fetch_sub(entry.async ? kAsyncUnit + 1 : 1);
  // Its room, its pins and its count are back: a kernel waiting to be
  // admitted looks again (an unpin moves the epoch only for a unit no other
  // kernel pins, and a kernel that freed what it allocated unpins nothing).
  WakeAdmissionWaiters();
}

void KernelPins::WakeAdmissionWaiters() {
  if (admission_waiters_.load() > 0) engine_->NoteReleaseOutside();
}

int64_t KernelPins::LastSetBytes(const tensorflow::OpKernel* kernel) {
  SetShard& sets = SetShardFor(kernel);
  std::lock_guard<std::mutex> lock(sets.mu);
  const auto it = sets.bytes.find(kernel);
  return it != sets.bytes.end() ? it->second : 0;
}

int64_t KernelPins::AwaitRoomFor(const tensorflow::OpKernel* kernel) {
  const int64_t set = LastSetBytes(kernel);
  if (set == 0) return 0;
  const int64_t device =
      static_cast<int64_t>(engine_->device_granules() * engine_->granule_bytes());
  // Takes the set's room if it fits: beside what is held, and beside the
  // sets of the kernels admitted before it (what they will still allocate;
  // one counter, so two kernels starting at once never both take the last
  // room).
  auto admit_if_room = [&] {
    int64_t admitted = admitted_bytes_.load();
    while (std::max(engine_->HeldBytes(), admitted) + set <= device) {
      if (admitted_bytes_.compare_exchange_weak(admitted, admitted + set)) return true;
    }
    return false;
  };
  if (admit_if_room()) return set;
  // Note [No waits on TensorFlow's event threads]; otherwise an enclosing
  // kernel of this thread cannot end while it waits.
  int64_t all = 0;
  int64_t own = 0;
  const bool event_thread = OnTensorFlowEventThread();
  if (!event_thread) CountOwnContexts(&all, &own);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + kTurnWait;
  bool waited = false;
  bool room = false;
  blocked_contexts_.fetch_add(own);
  admission_waiters_.fetch_add(1);
  {
    ScopedActivity span(engine_->activity_observer(), Activity::kMemoryWait, 0, 0);
    while (!event_thread) {
      // The epoch before the figures: a release after them wakes the wait
      // (HeldBytes is published before the epoch moves, and a kernel's set
      // is given back before it unpins).
      const uint64_t epoch = engine_->ReleaseEpoch();
      room = admit_if_room();
      if (room) break;
      // Synchronous kernels of other threads that do not wait themselves
      // (for memory, a turn or admission): only their ends release.
      const int64_t contexts = contexts_.load();
      if (Live(contexts) - Async(contexts) - blocked_contexts_.load() <= 0) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      if (!waited) num_admission_waits_.fetch_add(1, std::memory_order_relaxed);
      waited = true;
      engine_->WaitForRelease(epoch, std::min(left, kTurnSlice));
    }
  }
  admission_waiters_.fetch_sub(1);
  blocked_contexts_.fetch_sub(own);
  // Without room: goes on as without admission, its set counted for those
  // after it.
  if (!room) admitted_bytes_.fetch_add(set);
  if (waited) {
    engine_->NoteKernelWait(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count());
  }
  return set;
}

const char* KernelPins::Forget(ThreadContexts& creator, uint64_t serial, int slot) {
  std::lock_guard<std::mutex> lock(creator.mu);
  std::vector<ThreadContexts::Frame>& frames = creator.frames;
  // Innermost first: contexts mostly end in reverse order of creation.
  for (size_t i = frames.size(); i-- > 0;) {
    if (frames[i].serial == serial) {
      frames.erase(frames.begin() + static_cast<ptrdiff_t>(i));
      creator.depth[slot].fetch_sub(1, std::memory_order_relaxed);
      break;
    }
  }
  return frames.empty() ? nullptr : frames.back().label;
}

bool KernelPins::InKernel() const {
  const ThreadContexts* thread = t_contexts;
  return thread != nullptr && thread->depth[slot_].load(std::memory_order_relaxed) > 0;
}

int64_t KernelPins::ThreadLiveContexts() const {
  const ThreadContexts* thread = t_contexts;
  return thread != nullptr ? thread->depth[slot_].load(std::memory_order_relaxed) : 0;
}

// The innermost of `thread`'s frames on device `slot`, or null.
static const ThreadContexts::Frame* InnermostOn(const ThreadContexts& thread, int slot)
    LMS_EXCLUSIVE_LOCKS_REQUIRED(thread.mu) {
  for (size_t i = thread.frames.size(); i-- > 0;) {
    if (thread.frames[i].slot == slot) return &thread.frames[i];
  }
  return nullptr;
}

bool KernelPins::InXlaKernel() const {
  ThreadContexts* thread = t_contexts;
  if (thread == nullptr) return false;
  const tensorflow::OpKernel* kernel = nullptr;
  {
    std::lock_guard<std::mutex> lock(thread->mu);
    if (const ThreadContexts::Frame* frame = InnermostOn(*thread, slot_)) kernel = frame->kernel;
  }
  // The innermost context lives while this thread runs inside it.
  return kernel != nullptr && LiveVariables::IsXlaKernel(*kernel);
}

int64_t KernelPins::CurrentStep() const {
  ThreadContexts* thread = t_contexts;
  if (thread == nullptr) return 0;
  std::lock_guard<std::mutex> lock(thread->mu);
  const ThreadContexts::Frame* frame = InnermostOn(*thread, slot_);
  return frame != nullptr ? frame->step : 0;
}

Status KernelPins::PinForCopy(const void* data, uint64_t* unit_id) {
  Outcome outcome;
  // A copy that cannot be pinned fails: no deadlock verdict, it waits for
  // asynchronous kernels too.
  return RetryWhileOthersRelease([&] { return engine_->Pin(data, unit_id); }, &outcome,
                                 /*releases_on_failure=*/false,
                                 /*deadlock_fallback=*/false);
}

void KernelPins::CountInKernelSet(size_t bytes) { t_tally += static_cast<int64_t>(bytes); }

void KernelPins::RecordAllocation(const void* ptr, uint64_t unit_id, size_t bytes) {
  ThreadContexts::Frame current{nullptr, 0, nullptr, nullptr, slot_, false, 0};
  if (ThreadContexts* thread = t_contexts) {
    std::lock_guard<std::mutex> lock(thread->mu);
    if (const ThreadContexts::Frame* frame = InnermostOn(*thread, slot_)) current = *frame;
  }
  if (current.context != nullptr) {
    Shard& shard = ShardFor(current.context);
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.entries.find(current.context);
    // The identity check matters only if the context ended (on another
    // thread) since it was read above and TensorFlow reused its address.
    if (it != shard.entries.end() && it->second.creator.get() == t_contexts &&
        it->second.serial == current.serial) {
      it->second.pins.push_back({ptr, unit_id});
      t_tally += static_cast<int64_t>(bytes);
      return;
    }
  }
  // The kernel is gone (destroyed on another thread): nobody holds this.
  engine_->Unpin(ptr, unit_id);
}

Status KernelPins::PinInputs(tensorflow::OpKernelContext* ctx, void* params,
                             std::vector<Pin>* pins, bool all_or_none) {
  auto* p = static_cast<tensorflow::OpKernelContext::Params*>(params);
  // The inputs are pinned kPinBatch at a time by one Engine::PinAll, so
  // their page-ins share one fence, host wait and stream order.
  const void* batch[kPinBatch];
  size_t batched = 0;
  bool variables = false;
  for (const tensorflow::TensorValue& value : p->inputs) {
    const tensorflow::Tensor* tensor = value.tensor;
    if (tensor == nullptr) continue;
    const void* data = tensorflow::DMAHelper::base(tensor);
    if (data != nullptr && engine_->Owns(data)) {
      batch[batched++] = data;
      if (__builtin_expect(batched == kPinBatch, 0)) {
        Status s = PinBatch(batch, batched, pins);
        if (s.code() == StatusCode::kResourceExhausted && all_or_none) return s;
        batched = 0;
      }
    }
    // Marked unlikely, so the loop over plain inputs stays as small as it
    // was without this check (measured: it matters).
    if (__builtin_expect(tensor->dtype() == tensorflow::DT_RESOURCE, 0)) variables = true;
  }
  if (batched > 0) {
    Status s = PinBatch(batch, batched, pins);
    if (__builtin_expect(s.code() == StatusCode::kResourceExhausted, 0) && all_or_none) {
      return s;
    }
  }
  if (__builtin_expect(variables, 0)) return PinVariableInputs(ctx, params, pins, all_or_none);
  return Status::Ok();
}

Status KernelPins::PinBatch(const void* const* data, size_t count, std::vector<Pin>* pins) {
  uint64_t ids[kPinBatch];
  Status s = engine_->PinAll(data, count, ids);
  // As PinOne: a failed pin (id 0) leaves the tensor where it is.
  for (size_t i = 0; i < count; ++i) {
    if (ids[i] != 0) pins->push_back({data[i], ids[i]});
  }
  return s;
}

__attribute__((noinline)) Status KernelPins::PinVariableInputs(
    tensorflow::OpKernelContext* ctx, void* params, std::vector<Pin>* pins, bool all_or_none) {
  auto* p = static_cast<tensorflow::OpKernelContext::Params*>(params);
  if (p->op_kernel == nullptr) return Status::Ok();
  const VariableAccess access = VariableAccessOf(*p->op_kernel);
  if (access == VariableAccess::kNone) return Status::Ok();
  for (const tensorflow::TensorValue& value : p->inputs) {
    if (value.tensor == nullptr || value.tensor->dtype() != tensorflow::DT_RESOURCE) continue;
    Status s = PinVariables(ctx, *value.tensor, access == VariableAccess::kXla, pins,
                            all_or_none);
    if (s.code() == StatusCode::kResourceExhausted) return s;
  }
  return Status::Ok();
}

Status KernelPins::PinOne(const void* data, std::vector<Pin>* pins) {
  uint64_t id = 0;
  Status s = engine_->Pin(data, &id);
  // A failed pin leaves the tensor where it is; the kernel still reads the
  // right bytes (evicted memory is mapped from host memory at the same
  // address, only slower to reach). kResourceExhausted is the caller's to
  // handle; other failures (no live allocation there) are not.
  if (s.ok()) pins->push_back({data, id});
  return s;
}

__attribute__((noinline)) void KernelPins::PinInputsTakingTurns(
    tensorflow::OpKernelContext* ctx, void* params, std::vector<Pin>* pins) {
  // Holds nothing while it waits: unpin, then stop counting (as a context
  // that ends does), and count again before each attempt.
  const auto release = [&] {
    UnpinAll(*pins);
    pins->clear();
    contexts_.fetch_sub(1);
  };
  release();
  if (num_waiting_.load() > 0) AwaitTurn();
  Outcome outcome;
  Status s = RetryWhileOthersRelease(
      [&] {
        contexts_.fetch_add(1);
        Status attempt = PinInputs(ctx, params, pins);
        if (attempt.code() == StatusCode::kResourceExhausted) release();
        return attempt;
      },
      &outcome, /*releases_on_failure=*/true);
  if (s.code() != StatusCode::kResourceExhausted) return;
  // The device cannot hold them all now (deadlocked, or after waiting
  // kRetryBudget): pin what fits and let the kernel read the rest in place.
  // The engine counts each refused pin (num_failed_pins).
  contexts_.fetch_add(1);
  PinInputs(ctx, params, pins, /*all_or_none=*/false);
}

__attribute__((noinline)) Status KernelPins::PinVariables(
    tensorflow::OpKernelContext* context, const tensorflow::Tensor& handles, bool xla,
    std::vector<Pin>* pins, bool all_or_none) {
  // TypeIndex hashes the type's name (the wheel is built with RTTI), so this
  // equals the hash TensorFlow's own libraries put in Var handles.
  static const uint64_t kVarType =
      tensorflow::TypeIndex::Make<tensorflow::Var>().hash_code();
  if (!handles.IsInitialized()) return Status::Ok();
  const auto flat = handles.flat<tensorflow::ResourceHandle>();
  for (int64_t i = 0; i < flat.size(); ++i) {
    const tensorflow::ResourceHandle& handle = flat(i);
    if (handle.hash_code() != kVarType) continue;  // a table, iterator, ...
    tensorflow::Var* var = LookupVariable(context, handle);
    if (var == nullptr) continue;
    tensorflow::core::ScopedUnref unref(var);
    Status s;
    {
      // The buffer is read and pinned under the variable's shared lock (the
      // lock TensorFlow's kernels take), never waiting while holding it: an
      // assign on another kernel may need it exclusively before it can end.
      tensorflow::tf_shared_lock lock(*var->mu());
      const void* data = tensorflow::DMAHelper::base(var->tensor());
      // Uninitialized, or not in this device's evictable memory.
      if (data == nullptr || !engine_->Owns(data)) continue;
      s = PinOne(data, pins);
      // XLA's error path may free it while the variable holds it.
      if (s.ok() && xla) {
        pins->back().variable = var;
        live_variables_.Add(data, var);
      }
    }
    if (all_or_none && s.code() == StatusCode::kResourceExhausted) return s;
  }
  return Status::Ok();
}

void KernelPins::UnpinAll(const std::vector<Pin>& pins) {
  for (const Pin& pin : pins) {
    // kNotFound means the kernel freed what it allocated: nothing to unpin.
    Status s = engine_->Unpin(pin.ptr, pin.unit_id);
    if (!s.ok() && s.code() != StatusCode::kNotFound) {
      LOG(ERROR) << "tensorflow_lms_allocator: " << s.ToString();
    }
    // A free the kernel made of a variable's buffer, deferred until now
    // (Note [XLA frees live variables on its error path]).
    if (pin.variable != nullptr && live_variables_.Remove(pin.ptr, pin.variable)) {
      s = engine_->Free(const_cast<void*>(pin.ptr));
      if (!s.ok()) LOG(ERROR) << "tensorflow_lms_allocator: " << s.ToString();
    }
  }
}

}  // namespace lms
