#include "knobs.h"

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "timing.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

// Parses `name` as an integer in [min, max] into *out; an unset variable
// leaves *out alone. A bad value is reported and flagged (cuInit fails).
void ReadEnv(const char* name, long long min, long long max, long long* out) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < min || value > max) {
    std::fprintf(stderr,
                 "fake CUDA driver: %s=%s is not an integer in [%lld, %lld]; "
                 "cuInit will fail\n",
                 name, text, min, max);
    GetKnobs().environment_error = true;
    return;
  }
  *out = value;
}

// Parses FAKE_CUDA_NO_P2P, pairs of device ordinals that cannot access each
// other's memory ("0-2,1-2"), into a no_peer_access mask; an unset or empty
// variable is 0. A bad value is reported and flagged (cuInit fails).
uint64_t ReadNoPeerAccessEnv() {
  const char* name = "FAKE_CUDA_NO_P2P";
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  uint64_t mask = 0;
  const char* at = text;
  for (;;) {
    char* end = nullptr;
    const long a = std::strtol(at, &end, 10);
    const bool a_ok = end != at && *end == '-';
    const char* b_text = a_ok ? end + 1 : end;
    const long b = std::strtol(b_text, &end, 10);
    const bool ok = a_ok && end != b_text && a >= 0 && a < kMaxDevices && b >= 0 &&
                    b < kMaxDevices && a != b && (*end == ',' || *end == '\0');
    if (!ok) {
      std::fprintf(stderr,
                   "fake CUDA driver: %s=%s is not a list of pairs of distinct device "
                   "ordinals in [0, %d) such as \"0-2,1-2\"; cuInit will fail\n",
                   name, text, kMaxDevices);
      GetKnobs().environment_error = true;
      return 0;
    }
    mask |= uint64_t{1} << (a * kMaxDevices + b);
    mask |= uint64_t{1} << (b * kMaxDevices + a);
    if (*end == '\0') return mask;
    at = end + 1;
  }
}

}  // namespace

Knobs& GetKnobs() {
  static Knobs* knobs = new Knobs;  // never destroyed: workers may outlive exit
  return *knobs;
}

namespace {

struct UnmapGate {
  std::mutex mu;
  std::condition_variable released;
  bool held = false;
  int waiting = 0;
};

UnmapGate& Gate() {
  static UnmapGate* gate = new UnmapGate;  // never destroyed, as the knobs
  return *gate;
}

}  // namespace

void HoldUnmaps(bool hold) {
  UnmapGate& g = Gate();
  std::lock_guard<std::mutex> lock(g.mu);
  g.held = hold;
  if (!hold) g.released.notify_all();
}

void WaitWhileUnmapsHeld() {
  UnmapGate& g = Gate();
  std::unique_lock<std::mutex> lock(g.mu);
  if (!g.held) return;
  ++g.waiting;
  g.released.wait(lock, [&] { return !g.held; });
  --g.waiting;
}

int UnmapsWaiting() {
  UnmapGate& g = Gate();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.waiting;
}

void LoadKnobsFromEnvironment() {
  HoldUnmaps(false);
  Knobs& k = GetKnobs();
  k.environment_error = false;
  long long device_mb = 1024, host_mb = 1024, version = 12040, devices = 1,
            delay_us = 0, host_vmm = 1, refuse_host = 0, print = 0, offset_zero = 0;
  ReadEnv("FAKE_CUDA_DEVICE_MB", 0, 1 << 20, &device_mb);
  ReadEnv("FAKE_CUDA_HOST_MB", 0, 1 << 20, &host_mb);
  ReadEnv("FAKE_CUDA_DRIVER_VERSION", 1000, 99999, &version);
  ReadEnv("FAKE_CUDA_DEVICE_COUNT", 0, kMaxDevices, &devices);
  ReadEnv("FAKE_CUDA_COPY_DELAY_US", 0, 10000000, &delay_us);
  ReadEnv("FAKE_CUDA_HOST_VMM", 0, 1, &host_vmm);
  ReadEnv("FAKE_CUDA_REFUSE_HOST_CREATE", 0, 3, &refuse_host);
  ReadEnv("FAKE_CUDA_PRINT_VIOLATIONS", 0, 1, &print);
  ReadEnv("FAKE_CUDA_MAP_OFFSET_ZERO_ONLY", 0, 1, &offset_zero);
  k.device_capacity = static_cast<size_t>(device_mb) << 20;
  k.host_capacity = static_cast<size_t>(host_mb) << 20;
  k.driver_version = static_cast<int>(version);
  k.device_count = static_cast<int>(devices);
  k.copy_delay_us = static_cast<unsigned>(delay_us);
  k.host_vmm_supported = host_vmm != 0;
  k.refuse_host_create = static_cast<int>(refuse_host);
  k.print_violations = print != 0;
  k.map_offset_zero_only = offset_zero != 0;
  k.no_peer_access = ReadNoPeerAccessEnv();
  k.fail_create_countdown = 0;
  k.fail_map_countdown = 0;
  k.fail_map_error = 2;
  k.granularity = size_t{2} << 20;
  // The timing model (timing.h): FAKE_CUDA_TIMING names a preset.
  const char* preset = std::getenv("FAKE_CUDA_TIMING");
  if (preset == nullptr || *preset == '\0') {
    timing::Disable();
  } else if (!timing::Enable(preset)) {
    std::fprintf(stderr, "fake CUDA driver: FAKE_CUDA_TIMING=%s: not a preset (h200, h100)\n",
                 preset);
    k.environment_error = true;
  }
}

bool CanAccessPeer(int device, int peer) {
  if (device == peer) return false;
  return ((GetKnobs().no_peer_access.load() >> (device * kMaxDevices + peer)) & 1) == 0;
}

void SetPeerAccess(int a, int b, bool can_access) {
  const uint64_t bits =
      (uint64_t{1} << (a * kMaxDevices + b)) | (uint64_t{1} << (b * kMaxDevices + a));
  if (can_access) {
    GetKnobs().no_peer_access.fetch_and(~bits);
  } else {
    GetKnobs().no_peer_access.fetch_or(bits);
  }
}

bool ConsumeCountdown(std::atomic<int>& countdown) {
  int value = countdown.load();
  while (value > 0) {
    if (countdown.compare_exchange_weak(value, value - 1)) return value == 1;
  }
  return false;
}

}  // namespace fake
}  // namespace cu
}  // namespace lms
