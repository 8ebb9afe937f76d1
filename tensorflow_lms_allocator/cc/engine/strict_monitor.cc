#include "engine/strict_monitor.h"

#include <signal.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace lms {
namespace {

constexpr int kMaxMonitors = 16;
std::atomic<StrictMonitor*> g_monitors[kMaxMonitors];
thread_local const char* t_label = nullptr;
// (bytes, allocations of that size) since t_label was set; a kernel makes
// few allocations, so a short list.
thread_local std::vector<std::pair<uint64_t, uint32_t>> t_label_sizes;
// The last fault this thread retried on an unwatched slot, and when.
thread_local uintptr_t t_retried_address = 0;
thread_local int64_t t_retried_ns = 0;

// Note [Strict mode's own signal stack]
// The fault handler runs on the thread that touched, and without an
// alternate stack the kernel pushes its frame onto that thread's own stack,
// below the stack pointer. Code that keeps data below its stack pointer
// (oneDNN's JIT gemm kernels do, past the ABI's 128-byte red zone) then
// finds it overwritten: a strict-mode run of a matmul whose output was
// placed in host memory died in free() with "corrupted size vs. prev_size"
// in 3 of 3 runs, none without strict mode. So every thread that uses an
// engine in strict mode (they allocate and pin through it) gets an
// alternate stack of its own, unless it has one (Python's faulthandler
// gives the main thread one), and the handler is installed SA_ONSTACK.
// The stack is the thread's until it exits; then it is disabled, if it is
// still the thread's, and unmapped.
constexpr size_t kSignalStackBytes = 256 << 10;  // forwarded handlers run on it too

struct SignalStack {
  void* base = nullptr;
  bool checked = false;
  ~SignalStack() {
    if (base == nullptr) return;
    stack_t current;
    if (sigaltstack(nullptr, &current) == 0 && current.ss_sp == base &&
        !(current.ss_flags & SS_ONSTACK)) {
      stack_t off = {};
      off.ss_flags = SS_DISABLE;
      sigaltstack(&off, nullptr);
      munmap(base, kSignalStackBytes);
    }
    // Still in use or replaced: left mapped (a thread's last moments).
  }
};
thread_local SignalStack t_signal_stack;

int64_t MonotonicNs() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// Note [Keeping the strict handler first]
// Another library may install its own SIGSEGV handler after ours; Python's
// faulthandler.enable() (pytest calls it) is the common case. Its handler
// then sees an unpinned touch first, reports a fatal error and re-raises, and
// the process dies although the touch was harmless. So InstallHandler() is
// idempotent and checks who is installed: Watch() (every eviction, a slow
// path), Report() and ClearReport() call it, and so does the Python package
// right after faulthandler.enable(). If another handler replaced ours, ours
// goes back on top and the other becomes the one we forward to, so faults
// that are not ours still reach it (faulthandler still dumps tracebacks).
//
// A forwarded handler may hand the signal back: faulthandler restores its
// own predecessor (ours) and re-raises. A second, nested entry therefore
// forwards to the action that was installed before strict mode ever was
// (usually the default), never around the loop again.
//
// The handler reads g_chain[g_chain_index] and g_original; both are written
// only under g_install_mu, with the index published after the entry.
std::mutex g_install_mu;
struct sigaction g_chain[2];
std::atomic<int> g_chain_index{0};
struct sigaction g_original;
bool g_installed_once = false;  // guarded by g_install_mu
// The older chain entry is what we chained to before the current one (set
// by a re-install over another handler, cleared by DropChainedHandler).
bool g_older_entry_valid = false;  // guarded by g_install_mu
std::atomic<int> g_forwarding{0};

void CallAction(const struct sigaction& action, int sig, siginfo_t* info, void* context) {
  if (action.sa_flags & SA_SIGINFO) {
    if (action.sa_sigaction != nullptr) {
      action.sa_sigaction(sig, info, context);
      return;
    }
  } else if (action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN) {
    action.sa_handler(sig);
    return;
  }
  // Default action: restore it and return; the access faults again and the
  // process dies with the signal it would have died with.
  signal(sig, SIG_DFL);
}

void ForwardToPrevious(int sig, siginfo_t* info, void* context) {
  const bool nested = g_forwarding.fetch_add(1, std::memory_order_acq_rel) > 0;
  const struct sigaction& next =
      nested ? g_original : g_chain[g_chain_index.load(std::memory_order_acquire)];
  CallAction(next, sig, info, context);
  g_forwarding.fetch_sub(1, std::memory_order_acq_rel);
}

void OnSegv(int sig, siginfo_t* info, void* context) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (auto& slot : g_monitors) {
    StrictMonitor* m = slot.load(std::memory_order_acquire);
    if (m != nullptr && m->HandleFault(address)) return;
  }
  ForwardToPrevious(sig, info, context);
}

bool IsOurs(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) && action.sa_sigaction == OnSegv;
}

// Puts OnSegv on top of whatever handles SIGSEGV now (see the note).
// Returns false if sigaction failed.
bool InstallHandler() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  struct sigaction current;
  if (sigaction(SIGSEGV, nullptr, &current) != 0) return false;
  if (IsOurs(current)) return true;
  g_older_entry_valid = g_installed_once;
  if (!g_installed_once) g_original = current;
  g_installed_once = true;
  const int next = 1 - g_chain_index.load(std::memory_order_relaxed);
  g_chain[next] = current;
  g_chain_index.store(next, std::memory_order_release);
  struct sigaction action = {};
  action.sa_sigaction = OnSegv;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  return sigaction(SIGSEGV, &action, nullptr) == 0;
}

// The handler we chain to was uninstalled by its owner and put its own
// predecessor back (faulthandler.disable() restores ours): chain to what we
// chained to before it, which the double buffer still holds.
void DropChainedHandler() {
  std::lock_guard<std::mutex> lock(g_install_mu);
  struct sigaction current;
  if (sigaction(SIGSEGV, nullptr, &current) != 0 || !IsOurs(current)) return;
  if (!g_older_entry_valid) return;
  g_older_entry_valid = false;
  g_chain_index.store(1 - g_chain_index.load(std::memory_order_relaxed),
                      std::memory_order_release);
}

}  // namespace

StrictMonitor::StrictMonitor(uintptr_t base, uint64_t slots,
                             size_t granule_bytes)
    : base_(base),
      num_slots_(slots),
      granule_bytes_(granule_bytes),
      slots_(new Slot[slots]),
      touches_(new Touch[kMaxTouches]) {}

Status StrictMonitor::Create(uintptr_t base, uint64_t slots,
                             size_t granule_bytes,
                             std::unique_ptr<StrictMonitor>* out) {
  if (!InstallHandler()) {
    return Internal("strict mode (TF_LMS_STRICT=1) could not install its "
                    "SIGSEGV handler");
  }
  std::unique_ptr<StrictMonitor> m(new StrictMonitor(base, slots, granule_bytes));
  for (auto& slot : g_monitors) {
    StrictMonitor* expected = nullptr;
    if (slot.compare_exchange_strong(expected, m.get())) {
      *out = std::move(m);
      return Status::Ok();
    }
  }
  return ResourceExhausted("strict mode (TF_LMS_STRICT=1) supports at most 16 "
                           "engines in one process");
}

StrictMonitor::~StrictMonitor() {
  for (auto& slot : g_monitors) {
    StrictMonitor* expected = this;
    slot.compare_exchange_strong(expected, nullptr);
  }
}

void StrictMonitor::Watch(uint64_t first_slot, uint64_t count,
                          uint64_t allocation_id, uintptr_t allocation_address,
                          uint64_t allocation_bytes) {
  // Before the slots become inaccessible: our handler must see their faults.
  InstallHandler();
  for (uint64_t s = first_slot; s < first_slot + count; ++s) {
    slots_[s].allocation_address.store(allocation_address);
    slots_[s].allocation_bytes.store(allocation_bytes);
    slots_[s].grant.store(kNotGranted, std::memory_order_release);
    slots_[s].allocation_id.store(allocation_id, std::memory_order_release);
    slots_[s].paging_in.store(false, std::memory_order_release);
  }
}

void StrictMonitor::BeginPageIn(uint64_t first_slot, uint64_t count) {
  for (uint64_t s = first_slot; s < first_slot + count; ++s) {
    slots_[s].paging_in.store(true, std::memory_order_release);
  }
}

void StrictMonitor::Unwatch(uint64_t first_slot, uint64_t count) {
  for (uint64_t s = first_slot; s < first_slot + count; ++s) {
    slots_[s].allocation_id.store(0, std::memory_order_release);
    slots_[s].paging_in.store(false, std::memory_order_release);
  }
}

bool StrictMonitor::Open(uint64_t first_slot, uint64_t count) {
  // Accessible before unwatched: a touch in between must not find its slot
  // unwatched and inaccessible, which the handler passes on as a crash.
  const bool opened =
      mprotect(SlotAddress(first_slot), count * granule_bytes_, PROT_READ | PROT_WRITE) == 0;
  if (opened) Unwatch(first_slot, count);
  return opened;
}

bool StrictMonitor::Close(uint64_t first_slot, uint64_t count, uint64_t allocation_id,
                          uintptr_t allocation_address, uint64_t allocation_bytes) {
  // Watched before inaccessible, as for an eviction's mapping.
  Watch(first_slot, count, allocation_id, allocation_address, allocation_bytes);
  return mprotect(SlotAddress(first_slot), count * granule_bytes_, PROT_NONE) == 0;
}

bool StrictMonitor::HandleFault(uintptr_t address) {
  if (address < base_ || address >= base_ + num_slots_ * granule_bytes_) {
    return false;
  }
  const uint64_t s = (address - base_) / granule_bytes_;
  const uint64_t id = slots_[s].allocation_id.load(std::memory_order_acquire);
  const bool paging_in = slots_[s].paging_in.load(std::memory_order_acquire);
  // Only async-signal-safe calls below: atomics, clock_gettime, nanosleep,
  // mprotect.
  if (id == 0 && !paging_in) {
    // Stale, if the slot was watched when this thread touched it and was
    // paged in (or opened) before the handler looked: run the touch once
    // more. Faulting again at once, it is a real crash (freed memory).
    const int64_t now = MonotonicNs();
    if (t_retried_address == address && now - t_retried_ns < 100 * 1000 * 1000) {
      t_retried_address = 0;
      return false;
    }
    t_retried_address = address;
    t_retried_ns = now;
    return true;
  }
  const struct timespec pause = {0, 20 * 1000};
  const long max_waits = kPageInWaitSeconds * 50000L;
  if (paging_in) {
    if (id != 0) Record(s, address, id);
    for (long waits = 0; slots_[s].paging_in.load(std::memory_order_acquire); ++waits) {
      if (waits >= max_waits) return false;
      nanosleep(&pause, nullptr);
    }
    return true;  // the instruction runs again, on the new mapping
  }
  uint8_t expected = kNotGranted;
  if (!slots_[s].grant.compare_exchange_strong(expected, kGranting,
                                               std::memory_order_acq_rel)) {
    // Another thread's touch is opening it (or has): run again once it has.
    for (long waits = 0; slots_[s].grant.load(std::memory_order_acquire) == kGranting;
         ++waits) {
      if (waits >= max_waits) return false;
      nanosleep(&pause, nullptr);
    }
    return true;
  }
  Record(s, address, id);
  // The slot maps the allocation's host granule, so granting access serves
  // the right bytes; the engine remaps the slot on page-in or free.
  const bool opened = mprotect(SlotAddress(s), granule_bytes_, PROT_READ | PROT_WRITE) == 0;
  slots_[s].grant.store(kGranted, std::memory_order_release);
  return opened;
}

void StrictMonitor::Record(uint64_t s, uintptr_t address, uint64_t id) {
  const uint64_t n = next_touch_.fetch_add(1);
  if (n < kMaxTouches) {
    Touch& t = touches_[n];
    t.address = address;
    t.allocation_id = id;
    t.allocation_address = slots_[s].allocation_address.load();
    t.allocation_bytes = slots_[s].allocation_bytes.load();
    size_t i = 0;
    if (t_label != nullptr) {
      for (; i + 1 < sizeof(t.label) && t_label[i] != '\0'; ++i) {
        t.label[i] = t_label[i];
      }
    }
    t.label[i] = '\0';
    t.complete.store(true, std::memory_order_release);
  } else {
    dropped_.fetch_add(1);
  }
}

bool StrictMonitor::EnsureHandlerFirst() { return InstallHandler(); }

void StrictMonitor::EnsureSignalStack() {
  SignalStack& mine = t_signal_stack;
  if (mine.checked) return;
  mine.checked = true;
  stack_t current;
  if (sigaltstack(nullptr, &current) != 0 || !(current.ss_flags & SS_DISABLE)) return;
  void* base = mmap(nullptr, kSignalStackBytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (base == MAP_FAILED) return;  // the handler runs on the thread's stack
  stack_t stack = {};
  stack.ss_sp = base;
  stack.ss_size = kSignalStackBytes;
  if (sigaltstack(&stack, nullptr) != 0) {
    munmap(base, kSignalStackBytes);
    return;
  }
  mine.base = base;
}

void StrictMonitor::ChainedHandlerRemoved() {
  DropChainedHandler();
  InstallHandler();
}

std::vector<UnpinnedTouch> StrictMonitor::Report() const {
  InstallHandler();
  std::vector<UnpinnedTouch> out;
  const uint64_t n = std::min<uint64_t>(next_touch_.load(), kMaxTouches);
  for (uint64_t i = 0; i < n; ++i) {
    const Touch& t = touches_[i];
    if (!t.complete.load(std::memory_order_acquire)) continue;
    out.push_back(UnpinnedTouch{t.address, t.allocation_id, t.allocation_address,
                                t.allocation_bytes, t.label});
  }
  return out;
}

void StrictMonitor::ClearReport() {
  InstallHandler();
  const uint64_t n = std::min<uint64_t>(next_touch_.load(), kMaxTouches);
  for (uint64_t i = 0; i < n; ++i) touches_[i].complete.store(false);
  next_touch_.store(0);
  dropped_.store(0);
}

void StrictMonitor::SetThreadLabel(const char* label) {
  t_label = label;
  t_label_sizes.clear();
}

const char* StrictMonitor::ThreadLabel() { return t_label; }

uint32_t StrictMonitor::CountLabelledAllocation(uint64_t bytes) {
  // Without a label nothing is keyed, so nothing is counted: a thread that
  // never sets one (tf.data's, a copy's) would otherwise collect every size
  // it ever allocated and scan them all on each allocation (8 us a pair in
  // allocator_bench's trace, against 91 ns).
  if (t_label == nullptr) return 0;
  for (auto& [size, count] : t_label_sizes) {
    if (size == bytes) return count++;
  }
  if (t_label_sizes.size() < kMaxLabelSizes) t_label_sizes.emplace_back(bytes, 1);
  return 0;
}

}  // namespace lms
