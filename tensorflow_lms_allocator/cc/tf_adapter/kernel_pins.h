// KernelPins: what each running kernel holds pinned.
//
// When an OpKernelContext is constructed, every input tensor whose buffer the
// engine may evict is pinned (sub-slices included: the engine resolves any
// address inside an allocation), paging it in first if it was evicted. So is
// the buffer of every variable the kernel reaches through a DT_RESOURCE input
// (ResourceGather, AssignAddVariableOp, ResourceApplyAdam, ...): see Note
// [Variables reached through handles]. While the kernel runs, what it
// allocates on its thread starts pinned and joins the same list; that covers
// a variable whose buffer the kernel replaces (a copy-on-write update or an
// assign that copies allocates the new buffer inside the kernel). When the
// context is destroyed, everything on the list is unpinned and becomes
// inactive, ready for eviction in LRU order.
//
// Note [Kernel context lifetime]
// TensorFlow constructs an OpKernelContext on the thread that runs the
// kernel, and usually destroys it there. Two exceptions shape this class:
//   - An asynchronous kernel's context (the executor keeps it in its
//     AsyncState) is destroyed by whichever thread calls the kernel's done
//     callback: often another one, e.g. the thread of the enqueue that
//     completed a blocked dequeue.
//   - A kernel may run other kernels inline on its own thread while its
//     context lives: tf.py_function's kernel runs eager ops, a function call
//     may run the function's kernels. Contexts then nest.
// So each thread keeps the stack of the live contexts it created, innermost
// last (ThreadContexts): the innermost is the thread's current kernel, which
// its allocations join. Each context's entry holds its creator's stack, and
// destroying the context removes it from that stack on whichever thread the
// destruction runs. Invariant: a thread's stack holds exactly the live
// contexts it created; no stale context stays current, and an address
// TensorFlow reuses for a new context starts a new entry with a new identity
// (creator, serial), so nothing recorded for the old one joins the new one.
// "Other kernels" (whose end may release memory a failed request waits for)
// are the live contexts minus the waiting thread's own: an outer context on
// the same thread cannot end before the inner one returns, so waiting for it
// would only wait out the timeout. Two approximations remain: a pending
// asynchronous kernel the thread started also counts as its own (not waited
// for, though another thread may complete it: the request may fail where a
// wait could have saved it), and an outer kernel whose inner kernels run on
// another thread (a function call on the inter-op pool) still counts as
// another kernel for them (they wait out the timeout).
// Precondition (TensorFlow keeps it): a context is destroyed only after its
// constructor returned, and only once.
//
// Note [Contexts per device]
// Each device has its KernelPins, but a thread may hold contexts on several:
// under MirroredStrategy with TensorFlow's default global GPU thread mode,
// one thread runs kernels of every GPU, and an asynchronous kernel it
// started on GPU 0 lives on while it runs GPU 1's. So a thread's counts are
// per (thread, device): each frame names its device, InKernel and
// ThreadLiveContexts count this device's frames only, and an allocation
// joins the thread's innermost kernel on the same device. A count that mixed
// devices would make GPU 1's waiter take GPU 0's kernel for its own (no
// release expected: kNoRelease) or for a blocked one (a false kDeadlocked).
//
// Note [Asynchronous kernels wait for others]
// An asynchronous kernel's context lives from its ComputeAsync until its
// done: a collective waiting for its peers, a _Recv waiting for its send, a
// function call waiting for the kernels of its body, an iterator waiting for
// its input pipeline. What it pinned comes back only when what it waits
// for happens, often a kernel that needs memory itself, so for the deadlock
// rule (Note [Taking turns], rule 3) such a context counts as blocked from
// when its inputs are pinned until it ends (Async(contexts_)), and never as
// the waiting thread's own (which the waiter's Turn counts as blocked
// besides). Counting it as a
// running kernel that will release made a request that could not fit wait
// the whole kRetryBudget (measured: two 10 s waits in one collective), and
// every new kernel up to kTurnWait meanwhile. A release by it still wakes
// the waiters, and a verdict needs two slices (2 x kTurnSlice) without any
// release, so an asynchronous kernel whose done comes within about 100 ms
// (a GPU kernel finishing in an event callback) is waited for; one that
// takes longer gets a caller that serves the request otherwise. A
// TensorFlow copy has no other way to be served (it would fail), so for
// it asynchronous kernels count as running and it waits for them
// (PinForCopy: RetryWhileOthersRelease's deadlock_fallback).
//
// Note [No waits on TensorFlow's event threads]
// A GPU's EventMgr runs every completion callback of that GPU on its event
// threads ("tf_Device_Event"): some kernels allocate their outputs there
// (Where, the segment reductions), TensorFlow copies from there, and the
// executor runs inexpensive kernels inline there after an asynchronous
// kernel's done. A wait for other kernels' releases there would hold up
// every later callback of the device, among them the done that would end a
// kernel and release memory. So on an event thread RetryWhileOthersRelease
// makes one attempt (kNoRelease if it fails: the caller serves the request
// otherwise or fails it) and a new kernel does not wait for its turn.
//
// Note [Variables reached through handles]
// A DT_RESOURCE input holds ResourceHandles, not data. For each handle whose
// type is tensorflow::Var, the variable is found as TensorFlow's own
// LookupResource finds it (the handle owns it, or this device's
// ResourceMgr names it), and the buffer it holds when the kernel starts is
// pinned. Only kernels that read or write a variable's data take this path:
// ops named Resource* or *VariableOp (not AssignVariableOp, which discards
// the old buffer unread) and XLA launches (TouchesVariableData). Handles also
// flow through function calls, control flow and VarIsInitializedOp, and
// pinning there would keep every weight of a model resident for a whole call,
// or page a variable in to read its shape. Other inputs never pay for it: the
// check is one dtype compare. The buffer is read under the variable's shared
// lock (the lock TensorFlow's kernels take) and pinned without waiting; if
// the device cannot take it, the lock is dropped and the kernel waits with
// its inputs (Note [Taking turns]), holding no pin and no lock, since
// another kernel may need the lock exclusively (an assign) before it can
// finish. A variable whose buffer another kernel replaces concurrently is
// pinned in its old buffer only; TensorFlow serialises such updates with the
// same lock, so this is a race the program has without LMS too.
//
// Note [Kernels admitted by their last set]
// Kernels that each fit alone but not together take turns only once a
// request fails (Note [Taking turns]). By then each has pinned its inputs,
// and two that both need more wait for each other until one is served from
// host memory (measured on `make bench-mincap`'s probes: with one inter-op
// thread ResNet-50 trained from device memory in 60 MiB and DenseNet121 in
// 40, with two only in 82 and 46). So a synchronous kernel is also admitted
// by what it held in its last run: its OpKernel, which TensorFlow runs
// again every step, remembers the bytes of the inputs it pinned and of what
// it allocated, in device or host memory (temporaries included: at least
// what it held at once; variables reached through handles are not counted).
// Before it pins its inputs, if that set beside what is held now
// (Engine::HeldBytes: pinned, and unclaimed on the device), or beside the
// sets of the running kernels admitted so (what they hold and may still
// allocate; one counter, taken with a compare-and-swap, so two kernels
// starting at once never both take the last room), exceeds the device, it
// waits until the set fits, no other synchronous kernel runs that is not
// itself waiting (nothing else would release), or kTurnWait passes, and then
// goes on as before (a turn, AwaitTurn, may follow: at most 2 x kTurnWait
// in all). A kernel that ends gives its room back and wakes the waiters. A
// waiter holds nothing and is not yet a live context, and its thread's
// enclosing kernels count as blocked (as in AwaitTurn), so no waiter for
// memory waits for it. A kernel never run, an asynchronous one, one on an
// event thread, and every kernel with LMS off go straight on. An input that
// a running kernel also pins counts twice, so a kernel may wait for one
// reading the same tensor: concurrency is lost only on a device that is full.
//
// Thread-safety: all methods may be called from any thread. One KernelPins
// serves a device (the logical devices of the emulated device share one);
// the thread stacks are per thread and shared by every device's, each
// frame naming its device (Note [Contexts per device]).
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_KERNEL_PINS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_KERNEL_PINS_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <condition_variable>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/thread_annotations.h"
#include "tf_adapter/live_variables.h"
#include "tf_adapter/outside_kernel.h"

namespace tensorflow {
class OpKernel;
class OpKernelContext;
class Tensor;
class Var;
}  // namespace tensorflow

namespace lms {

// The live contexts one thread created (kernel_pins.cc).
struct ThreadContexts;

class KernelPins {
 public:
  explicit KernelPins(Engine* engine);
  ~KernelPins();
  KernelPins(const KernelPins&) = delete;
  KernelPins& operator=(const KernelPins&) = delete;

  // `context` is a tensorflow::OpKernelContext*, `params` its Params*.
  void OnContextCreated(void* context, void* params);
  void OnContextDestroyed(void* context);

  // Whether this thread is inside a kernel (allocations should start pinned):
  // it has created a context that is still alive. Lock-free.
  bool InKernel() const;
  // Whether this thread's innermost kernel runs XLA, whose allocator adapter
  // checks every request though it sets no AllocationAttributes. Locks.
  bool InXlaKernel() const;
  // What a request that waited for memory came to.
  enum class Outcome {
    kDone,        // the last attempt's status is final (served, or failed)
    kDeadlocked,  // every kernel holding memory waits too: serve it otherwise
    kNoRelease,   // no other kernel holds memory it could release: the
                  // device cannot hold the request now, whatever the wait
  };
  // Runs `attempt` (an allocation or a pin) again each time another kernel
  // releases memory, while it fails with kResourceExhausted, LMS is on and
  // other kernels are running, for at most kRetryBudget in all. Memory pinned
  // by kernels on other threads comes back when they finish, so a request that
  // fits once they are done waits for that (as TensorFlow's GPU allocator
  // retries) instead of failing. Waiters take turns, and a wait that no
  // running kernel can end is reported as kDeadlocked to the oldest waiter,
  // whose caller then serves the request without device memory: Note [Taking
  // turns]. (A template, so the fast path calls `attempt` with no
  // std::function.) An attempt that unpins what it took when it fails
  // (`releases_on_failure`) must not be woken by its own release: the epoch
  // is read again after it fails, and a release by another kernel in between
  // is seen at the next slice instead.
  // `deadlock_fallback`: the caller can serve a kDeadlocked request
  // otherwise (host memory, inputs read in place); without one (a
  // TensorFlow copy), asynchronous kernels count as running, not blocked,
  // and the request waits for their release (Note [Asynchronous kernels
  // wait for others]).
  template <typename Attempt>
  Status RetryWhileOthersRelease(Attempt attempt, Outcome* outcome,
                                 bool releases_on_failure = false,
                                 bool deadlock_fallback = true) {
    *outcome = Outcome::kDone;
    Status status = attempt();
    if (status.code() != StatusCode::kResourceExhausted || !engine_->lms_enabled()) {
      return status;
    }
    // Note [No waits on TensorFlow's event threads].
    if (OnTensorFlowEventThread()) {
      *outcome = Outcome::kNoRelease;
      return status;
    }
    const Turn turn(this);
    const auto deadline = std::chrono::steady_clock::now() + kRetryBudget;
    int stalled = 0;
    while (true) {
      // Kernels are counted before the attempt and the epoch read before it
      // too: a kernel unpins before it stops counting, so the attempt after
      // the last one ended sees its memory, and a release after the read
      // wakes the wait below.
      // Asynchronous kernels count as blocked (Note [Asynchronous kernels
      // wait for others]): live and asynchronous contexts are read in one
      // load, so no kernel counts as blocked that `live` misses.
      const int64_t contexts = contexts_.load();
      const int64_t live = Live(contexts);
      const int64_t blocked =
          blocked_contexts_.load() + (deadlock_fallback ? Async(contexts) : 0);
      uint64_t epoch = engine_->ReleaseEpoch();
      const bool oldest = turn.oldest();
      if (oldest) {
        status = attempt();
        if (status.code() != StatusCode::kResourceExhausted) break;
        if (releases_on_failure) epoch = engine_->ReleaseEpoch();
        // No other kernel holds memory (this thread's own cannot end before
        // the request returns: Note [Kernel context lifetime]): the request
        // does not fit the device.
        if (live <= turn.own()) {
          *outcome = Outcome::kNoRelease;
          break;
        }
        // Every kernel holding memory waits (for this one, whose turn it
        // is): no release will come. Seen twice with no release between,
        // so a thread between two kernels (freeing the last one's inputs)
        // is not taken for a deadlock.
        stalled = live <= blocked ? stalled + 1 : 0;
        if (stalled >= 2) {
          *outcome = Outcome::kDeadlocked;
          num_deadlocks_.fetch_add(1, std::memory_order_relaxed);
          break;
        }
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      // In slices: a turn passes to this waiter without a release.
      if (engine_->WaitForRelease(epoch, std::min(left, kTurnSlice))) stalled = 0;
    }
    return status;
  }
  static constexpr std::chrono::seconds kRetryBudget{10};
  static constexpr std::chrono::milliseconds kTurnSlice{50};
  // How long a new kernel waits for the waiters before pinning its inputs.
  static constexpr std::chrono::seconds kTurnWait{1};

  // Adds an allocation of `bytes` made pinned on this thread to the current
  // kernel (and to its set, Note [Kernels admitted by their last set]).
  void RecordAllocation(const void* ptr, uint64_t unit_id, size_t bytes);
  // Counts `bytes` that this thread's kernel allocated unpinned (in host
  // memory) in its set.
  static void CountInKernelSet(size_t bytes);

  // Pins the unit holding `data` for one of TensorFlow's own copies (Note
  // [TensorFlow's own copies] in tensorflow_copies.h), waiting for other
  // kernels' releases as an allocation does, except on an event thread.
  Status PinForCopy(const void* data, uint64_t* unit_id);

  // The TensorFlow step of this thread's innermost kernel on this device,
  // or 0 outside kernels (Note [Optional requests] in engine.h).
  int64_t CurrentStep() const;

  // The variable buffers running XLA kernels hold (Note [XLA frees live
  // variables on its error path] in live_variables.h).
  LiveVariables& live_variables() { return live_variables_; }

  // For tests: live contexts of this device, those of asynchronous kernels
  // among them, and those this thread created on this device.
  int64_t LiveContexts() const { return Live(contexts_.load(std::memory_order_relaxed)); }
  int64_t AsyncContexts() const { return Async(contexts_.load(std::memory_order_relaxed)); }
  int64_t ThreadLiveContexts() const;
  // For tests: requests that waited for memory (took a turn), and waits
  // that ended kDeadlocked.
  int64_t NumWaits() const { return num_waits_.load(std::memory_order_relaxed); }
  int64_t NumDeadlocks() const { return num_deadlocks_.load(std::memory_order_relaxed); }
  // For tests: kernels that waited to be admitted (Note [Kernels admitted by
  // their last set]), and the set `kernel` is admitted by (0: none yet).
  int64_t NumAdmissionWaits() const {
    return num_admission_waits_.load(std::memory_order_relaxed);
  }
  int64_t LastSetBytes(const tensorflow::OpKernel* kernel);
  // For tests: the sets of the running kernels admitted by theirs.
  int64_t AdmittedBytes() const { return admitted_bytes_.load(); }

 private:
  // Note [Taking turns]
  // Kernels on several threads (two models trained at once, parallel
  // branches) can each fit alone but not together. Three rules make them
  // take turns instead of all failing after kRetryBudget:
  //   1. Only the oldest waiter retries. A request that starts waiting takes
  //      a ticket; a release goes to the oldest, not to whoever asks next.
  //      Waiters whose thread has live contexts (an allocation inside a
  //      kernel, a kernel nested in another) come before kernels that hold
  //      nothing yet: only the former hold memory that their progress
  //      releases.
  //   2. A kernel that has not started holds nothing while it waits. Its
  //      inputs are pinned all or none (PinInputs): if one does not fit,
  //      the ones taken are unpinned and the kernel waits for its turn. A
  //      new kernel does not even try while anyone waits (up to kTurnWait),
  //      so what finishing kernels release goes to the waiters first.
  //   3. A wait that no kernel can end is broken, not waited out. Running
  //      kernels cannot give back what they hold, so two that each pinned
  //      their inputs and then both need more wait for each other. When the
  //      oldest waiter sees every live context blocked (each waiting
  //      thread counts its live contexts in blocked_contexts_ while it
  //      waits), its caller serves it without device memory: an allocation
  //      is placed in host memory at its address (born evicted: the kernel
  //      reads and writes it in place, over the bus on a GPU; strict mode
  //      reports it as any unpinned touch), a kernel's inputs are pinned as
  //      far as they fit. It then finishes and releases, and the next
  //      waiter's turn comes.
  // Invariant (what lets a waiter trust the count): a context counts in
  // contexts_ (Live) whenever it holds a pin, from before its first pin to
  // after its last unpin. A waiter that sees no other live context knows
  // that no kernel will release memory, and fails at once (the request does
  // not fit the device). So a kernel still pinning its inputs already
  // counts: it holds the ones it pinned, and a waiter that did not see it
  // would fail a request that its release could serve.
  // Waits stay bounded: a waiter that cannot be served gives up after
  // kRetryBudget, newcomers go ahead after kTurnWait, and a deadlock is
  // broken within two kTurnSlice.
  class Turn {
   public:
    // Counts the waiting thread's live contexts of synchronous kernels on
    // this device as blocked while it waits; the wait's time is counted in
    // the engine's statistics.
    explicit Turn(KernelPins* pins);
    ~Turn();
    bool oldest() const;
    // The waiting thread's live contexts of synchronous kernels on this
    // device (its asynchronous ones are counted in Async(contexts_)).
    int64_t own() const { return own_; }

   private:
    static constexpr uint64_t kHoldsNothing = uint64_t{1} << 62;
    KernelPins* const pins_;
    int64_t own_ = 0;
    uint64_t ticket_;
    std::chrono::steady_clock::time_point start_;
    // The wait in TensorFlow's profiler (Note [LMS's work in the trace
    // viewer] in profiler_events.h).
    ScopedActivity span_;
  };
  // This thread's live contexts on this device: all of them, and those of
  // synchronous kernels. Locks the thread's stack.
  void CountOwnContexts(int64_t* all, int64_t* synchronous) const;
  // Called before a new kernel pins its inputs: waits (bounded) while
  // requests are waiting for memory.
  void AwaitTurn();
  // Called before a synchronous kernel counts itself live: waits (bounded)
  // while its last set does not fit beside what is held and what the
  // kernels admitted before it may take (Note [Kernels admitted by their
  // last set]); returns the bytes it counted in admitted_bytes_ (its set, 0
  // if none is known), for the kernel to give back at its end.
  int64_t AwaitRoomFor(const tensorflow::OpKernel* kernel);
  // Moves the engine's release epoch if a kernel waits to be admitted.
  void WakeAdmissionWaiters();

  struct Pin {
    const void* ptr;
    uint64_t unit_id;  // the engine's (Pin returns it, Unpin checks it)
    // An XLA kernel's variable, registered in live_variables_ while pinned.
    tensorflow::Var* variable = nullptr;
  };
  struct Entry {
    // Unique among the contexts `creator` ever created: with the creator, it
    // tells a context at a reused address apart.
    uint64_t serial = 0;
    bool async = false;  // an AsyncOpKernel's (counted in Async(contexts_))
    // A synchronous kernel's OpKernel, and its thread's tally of bytes
    // pinned and allocated when it was created (Note [Kernels admitted by
    // their last set]).
    const tensorflow::OpKernel* kernel = nullptr;
    int64_t tally_at_start = 0;
    int64_t admitted = 0;  // its set in admitted_bytes_
    std::shared_ptr<ThreadContexts> creator;
    std::vector<Pin> pins;
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<void*, Entry> entries LMS_GUARDED_BY(mu);
  };
  static constexpr int kShards = 16;

  Shard& ShardFor(void* context) {
    return shards_[(reinterpret_cast<uintptr_t>(context) >> 6) % kShards];
  }
  // Pins every input of the kernel `params` (its Params*) describes, and the
  // variables its resource inputs name (Note [Variables reached through
  // handles]), without waiting. With `all_or_none`, returns
  // kResourceExhausted if the device cannot take one of them, leaving what
  // was pinned in `pins` for the caller to release; without, skips it.
  Status PinInputs(tensorflow::OpKernelContext* ctx, void* params, std::vector<Pin>* pins,
                   bool all_or_none = true);
  // The slow path of OnContextCreated (Note [Taking turns]): releases
  // `pins`, then takes turns with other waiters and pins all the inputs at
  // once, holding none while it waits; after kRetryBudget, pins what fits.
  // On return the context is counted live and holds `pins`.
  void PinInputsTakingTurns(tensorflow::OpKernelContext* ctx, void* params,
                            std::vector<Pin>* pins);
  // Pins the unit holding `data` (in the evictable range) into `pins`.
  Status PinOne(const void* data, std::vector<Pin>* pins);
  // Pins data[0..count) (count <= kPinBatch, in the evictable range) with
  // one Engine::PinAll into `pins`; returns what PinAll returns.
  Status PinBatch(const void* const* data, size_t count, std::vector<Pin>* pins);
  // PinInputs' part for the variables its resource inputs name, if the
  // kernel touches their data.
  Status PinVariableInputs(tensorflow::OpKernelContext* ctx, void* params,
                           std::vector<Pin>* pins, bool all_or_none);
  // Inputs pinned by one PinAll; a kernel with more takes several.
  static constexpr size_t kPinBatch = 16;
  // `handles` is a DT_RESOURCE input of the kernel `context` runs (`xla`: an
  // XLA kernel's, whose variables are registered with live_variables_). With
  // `all_or_none`, stops at the first kResourceExhausted and returns it;
  // without, skips what the device cannot take.
  Status PinVariables(tensorflow::OpKernelContext* context, const tensorflow::Tensor& handles,
                      bool xla, std::vector<Pin>* pins, bool all_or_none);
  // Removes the context with `serial` from its creator's stack; returns the
  // label of the creator's innermost remaining context (null if none).
  static const char* Forget(ThreadContexts& creator, uint64_t serial, int slot);
  void UnpinAll(const std::vector<Pin>& pins);
  // A context's end (destroyed, or replaced by one at its address): its
  // admitted room, its pins and its count given back, in that order, and the
  // kernels waiting to be admitted woken.
  void Release(const Entry& entry);

  Engine* const engine_;
  // This device's index in each thread's per-device counts (Note [Contexts
  // per device]); kernel_pins.cc hands them out.
  const int slot_;
  LiveVariables live_variables_;
  Shard shards_[kShards];
  // Each synchronous kernel's last set (Note [Kernels admitted by their last
  // set]), by OpKernel. An OpKernel TensorFlow deletes may leave its entry
  // to a kernel later made at its address: a hint, replaced at that one's end.
  struct SetShard {
    std::mutex mu;
    std::unordered_map<const tensorflow::OpKernel*, int64_t> bytes LMS_GUARDED_BY(mu);
  };
  SetShard& SetShardFor(const tensorflow::OpKernel* kernel) {
    return last_sets_[(reinterpret_cast<uintptr_t>(kernel) >> 6) % kShards];
  }
  SetShard last_sets_[kShards];
  static constexpr size_t kMostSetsPerShard = size_t{1} << 16;
  // Live contexts (the low 32 bits: Live) and, among them, those of
  // asynchronous kernels whose inputs are pinned (in units of kAsyncUnit:
  // Async; Note [Asynchronous kernels wait for others]). One word, so a
  // waiter reads both at once.
  std::atomic<int64_t> contexts_{0};
  static constexpr int64_t kAsyncUnit = int64_t{1} << 32;
  static int64_t Live(int64_t contexts) { return contexts & (kAsyncUnit - 1); }
  static int64_t Async(int64_t contexts) { return contexts >> 32; }
  std::mutex turn_mu_;
  std::condition_variable turn_cv_;
  uint64_t next_ticket_ LMS_GUARDED_BY(turn_mu_) = 0;
  std::set<uint64_t> waiting_ LMS_GUARDED_BY(turn_mu_);  // tickets, oldest first
  std::atomic<int> num_waiting_{0};
  // Live contexts of threads waiting for memory or for a turn (Turn,
  // AwaitTurn): they release nothing until their wait ends.
  std::atomic<int64_t> blocked_contexts_{0};
  std::atomic<int64_t> num_waits_{0};
  std::atomic<int64_t> num_deadlocks_{0};
  std::atomic<int64_t> num_admission_waits_{0};
  // The last sets of the running kernels admitted by theirs, and the kernels
  // waiting to be admitted.
  std::atomic<int64_t> admitted_bytes_{0};
  std::atomic<int> admission_waiters_{0};
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_KERNEL_PINS_H_
