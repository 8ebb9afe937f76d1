#include "engine/strict_monitor.h"

#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <mutex>

namespace lms {
namespace {

constexpr int kMaxMonitors = 16;
std::atomic<StrictMonitor*> g_monitors[kMaxMonitors];
struct sigaction g_previous_action;
std::once_flag g_install_once;
int g_install_error = 0;
thread_local const char* t_label = nullptr;

void ForwardToPrevious(int sig, siginfo_t* info, void* context) {
  if (g_previous_action.sa_flags & SA_SIGINFO) {
    if (g_previous_action.sa_sigaction != nullptr) {
      g_previous_action.sa_sigaction(sig, info, context);
      return;
    }
  } else if (g_previous_action.sa_handler != SIG_DFL &&
             g_previous_action.sa_handler != SIG_IGN) {
    g_previous_action.sa_handler(sig);
    return;
  }
  // Default action: restore it and return; the access faults again and the
  // process dies with the signal it would have died with.
  signal(sig, SIG_DFL);
}

void OnSegv(int sig, siginfo_t* info, void* context) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (auto& slot : g_monitors) {
    StrictMonitor* m = slot.load(std::memory_order_acquire);
    if (m != nullptr && m->HandleFault(address)) return;
  }
  ForwardToPrevious(sig, info, context);
}

void InstallHandler() {
  struct sigaction action = {};
  action.sa_sigaction = OnSegv;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGSEGV, &action, &g_previous_action) != 0) g_install_error = 1;
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
  std::call_once(g_install_once, InstallHandler);
  if (g_install_error) {
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
  for (uint64_t s = first_slot; s < first_slot + count; ++s) {
    slots_[s].allocation_address.store(allocation_address);
    slots_[s].allocation_bytes.store(allocation_bytes);
    slots_[s].allocation_id.store(allocation_id, std::memory_order_release);
  }
}

void StrictMonitor::Unwatch(uint64_t first_slot, uint64_t count) {
  for (uint64_t s = first_slot; s < first_slot + count; ++s) {
    slots_[s].allocation_id.store(0, std::memory_order_release);
  }
}

bool StrictMonitor::HandleFault(uintptr_t address) {
  if (address < base_ || address >= base_ + num_slots_ * granule_bytes_) {
    return false;
  }
  const uint64_t s = (address - base_) / granule_bytes_;
  const uint64_t id = slots_[s].allocation_id.load(std::memory_order_acquire);
  if (id == 0) return false;
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
  // The slot maps the allocation's host granule, so granting access serves
  // the right bytes; the engine remaps the slot on page-in or free.
  void* slot_address = reinterpret_cast<void*>(base_ + s * granule_bytes_);
  slots_[s].allocation_id.store(0, std::memory_order_release);
  return mprotect(slot_address, granule_bytes_, PROT_READ | PROT_WRITE) == 0;
}

std::vector<UnpinnedTouch> StrictMonitor::Report() const {
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
  const uint64_t n = std::min<uint64_t>(next_touch_.load(), kMaxTouches);
  for (uint64_t i = 0; i < n; ++i) touches_[i].complete.store(false);
  next_touch_.store(0);
  dropped_.store(0);
}

void StrictMonitor::SetThreadLabel(const char* label) { t_label = label; }

}  // namespace lms
