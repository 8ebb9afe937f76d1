// StrictMonitor: strict mode's report of unpinned touches.
//
// In strict mode an evicted allocation's host granules are mapped with no
// access rights. A read or write that did not go through Pin() then faults;
// the SIGSEGV handler installed here records the touch (address, owning
// allocation, its size, and the label the touching thread set, e.g. the op
// it was running), grants access to that one granule (it is mapped from the
// host pool, so the bytes are right) and lets the instruction run again.
// Each evicted granule therefore reports its first unpinned touch, and the
// program behaves exactly as without strict mode, only with a report.
//
// While a watched unit is being paged in, a touch is recorded and then waits
// until the engine has mapped the device memory (or, if the page-in failed,
// the no-access host mapping again, which it then touches as before): access
// granted to the host mapping then could let a write land after the page-in
// copied it, and be lost. The engine watches slots before it maps them with
// no access, so no touch ever finds an inaccessible slot unwatched.
//
// Faults outside every watched slot go to the handler that was installed
// before, or crash as they would have. A fault on an unwatched slot in the
// range runs once more first: the slot may have been paged in between the
// touch and the handler's look (a second fault at once is passed on).
//
// The handler stays first even if another is installed later (Python's
// faulthandler.enable(), which pytest calls): it is put back on top, with
// the newcomer chained behind it, before every eviction makes memory
// inaccessible and on every report query; see Note [Keeping the strict
// handler first] in strict_monitor.cc. A handler installed after an eviction
// and before the evicted memory's first unpinned touch sees that touch first,
// unless the caller calls EnsureHandlerFirst() right after installing it (the
// Python package does so after faulthandler.enable()).
//
// Thread-safety: Watch/Unwatch are called under the engine's lock (and take
// the handler-installation mutex after it, never before); the handler runs
// on any thread and reads only atomics and the chain entries it publishes; Report() may race with
// new touches and returns the ones complete when it looked.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STRICT_MONITOR_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STRICT_MONITOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/status.h"

namespace lms {

struct UnpinnedTouch {
  uintptr_t address = 0;             // the faulting address
  uint64_t allocation_id = 0;        // the evicted allocation it falls in
  uintptr_t allocation_address = 0;  // that allocation's first byte
  uint64_t allocation_bytes = 0;     // and its requested size
  std::string label;                 // the touching thread's label, if any
};

class StrictMonitor {
 public:
  static constexpr size_t kMaxTouches = 4096;

  // Installs the fault handler (once per process) and watches the slots of
  // [base, base + slots * granule_bytes).
  static Status Create(uintptr_t base, uint64_t slots, size_t granule_bytes,
                       std::unique_ptr<StrictMonitor>* out);
  ~StrictMonitor();

  // Slots [first, first + count) hold (or are about to hold) an evicted
  // allocation mapped with no access.
  void Watch(uint64_t first_slot, uint64_t count, uint64_t allocation_id,
             uintptr_t allocation_address, uint64_t allocation_bytes);
  // The watched slots are being paged in: touches wait for Unwatch (the
  // device memory is mapped) or Watch (the page-in failed).
  void BeginPageIn(uint64_t first_slot, uint64_t count);
  void Unwatch(uint64_t first_slot, uint64_t count);
  // Whether slot `s` is watched (Watch, and no Unwatch since).
  bool Watched(uint64_t slot) const {
    return slots_[slot].allocation_id.load(std::memory_order_acquire) != 0;
  }
  // Evicted slots someone holds (a pin, or a writer outside kernels: Note
  // [Strict access follows holders] in engine.h): made readable and
  // writable, then unwatched, so a holder's touch never faults. False if
  // mprotect failed (its touches are then reported, not lost).
  bool Open(uint64_t first_slot, uint64_t count);
  // The reverse, once nobody holds them: watched, then made inaccessible.
  bool Close(uint64_t first_slot, uint64_t count, uint64_t allocation_id,
             uintptr_t allocation_address, uint64_t allocation_bytes);

  std::vector<UnpinnedTouch> Report() const;
  // Touches past kMaxTouches are counted, not recorded.
  uint64_t dropped() const { return dropped_.load(); }
  void ClearReport();

  // Puts strict mode's SIGSEGV handler back on top if another replaced it,
  // chaining to that one. Idempotent; false if sigaction failed. Not async-
  // signal-safe (takes a mutex).
  static bool EnsureHandlerFirst();
  // The handler installed after ours, to which ours forwards, was removed by
  // its owner, who put ours back (faulthandler.disable()): forward to the one
  // before it again. Ours is put back on top if it is not there.
  static void ChainedHandlerRemoved();

  // Gives the calling thread an alternate signal stack, if it has none, for
  // as long as the thread lives (Note [Strict mode's own signal stack] in
  // strict_monitor.cc). Cheap after the first call on a thread.
  static void EnsureSignalStack();

  // Labels the calling thread's later touches (the TensorFlow adapter sets
  // the running op's name). `label` must outlive its use; nullptr clears it.
  static void SetThreadLabel(const char* label);
  // The calling thread's label, or nullptr (access traces name ops with it).
  static const char* ThreadLabel();
  // How many allocations of `bytes` this thread made before, counting this
  // one, since its label was last set: 0 for the first. A kernel that makes
  // two outputs of one size makes them in the same order every step, so the
  // learned policy keys them apart by it. Always 0 without a label; and
  // only a label's first kMaxLabelSizes sizes are counted (later ones are
  // all 0), so an allocation compares at most that many.
  static uint32_t CountLabelledAllocation(uint64_t bytes);
  static constexpr size_t kMaxLabelSizes = 32;

  // Called from the signal handler: true if the fault was a watched slot and
  // has been recorded and made accessible, or waited for its page-in.
  bool HandleFault(uintptr_t address);
  // How long a touch waits for a page-in before it is passed on as a crash.
  static constexpr int kPageInWaitSeconds = 60;

 private:
  struct Slot {
    std::atomic<uint64_t> allocation_id{0};
    std::atomic<uintptr_t> allocation_address{0};
    std::atomic<uint64_t> allocation_bytes{0};
    std::atomic<bool> paging_in{false};
    // Access to the watched granule: kNotGranted until the first touch, whose
    // handler takes kGranting, records it and opens the granule (kGranted).
    // Other threads that faulted on it meanwhile wait for kGranted and run
    // again: the granule stays watched, so none of them finds it unwatched
    // and passes a harmless touch on as a crash.
    std::atomic<uint8_t> grant{kNotGranted};
  };
  static constexpr uint8_t kNotGranted = 0;
  static constexpr uint8_t kGranting = 1;
  static constexpr uint8_t kGranted = 2;
  struct Touch {
    std::atomic<bool> complete{false};
    uintptr_t address;
    uint64_t allocation_id;
    uintptr_t allocation_address;
    uint64_t allocation_bytes;
    char label[96];
  };

  StrictMonitor(uintptr_t base, uint64_t slots, size_t granule_bytes);
  void* SlotAddress(uint64_t s) const {
    return reinterpret_cast<void*>(base_ + s * granule_bytes_);
  }
  // Adds a touch of slot `s` to the report (async-signal-safe).
  void Record(uint64_t s, uintptr_t address, uint64_t id);

  const uintptr_t base_;
  const uint64_t num_slots_;
  const size_t granule_bytes_;
  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<Touch[]> touches_;
  std::atomic<uint64_t> next_touch_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STRICT_MONITOR_H_
