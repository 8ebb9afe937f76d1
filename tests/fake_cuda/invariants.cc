// fake_cuda_check_invariants: the bookkeeping equations of memory_state.h,
// checked from scratch, so a test (of the fake or of a backend over it) can
// assert after any step that the fake's own state is consistent.
#include <map>
#include <string>

#include "checker.h"
#include "entry_points.h"
#include "fake_cuda.h"
#include "memory_state.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

// Appends a line to *broken for each equation that does not hold.
void CheckPool(MemoryState& m, bool host, std::string* broken)
    LMS_EXCLUSIVE_LOCKS_REQUIRED(m.mu) {
  const Pool& pool = PoolOf(m, host);
  const char* name = host ? "host pool" : "device pool";
  size_t held = 0;
  for (const auto& [id, h] : m.handles) held += h.host == host ? h.size : 0;
  if (held != pool.used) *broken += std::string(name) + ": used != sum of handle sizes\n";
  uint64_t free_bytes = 0;
  for (const auto& [offset, bytes] : pool.free_extents) free_bytes += bytes;
  if (free_bytes + pool.used != kPoolSpan) {
    *broken += std::string(name) + ": used + free extents != the pool's span\n";
  }
}

}  // namespace
}  // namespace fake
}  // namespace cu
}  // namespace lms

FAKE_CUDA_EXPORT size_t fake_cuda_check_invariants(void) noexcept {
  namespace fake = lms::cu::fake;
  fake::MemoryState& m = fake::Memory();
  std::string broken;
  {
    lms::MutexLock lock(m.mu);
    fake::CheckPool(m, false, &broken);
    fake::CheckPool(m, true, &broken);
    std::map<uint64_t, int> mappings_of;
    const size_t g = fake::GetKnobs().granularity;
    uint64_t previous_end = 0;
    for (const auto& [address, mapping] : m.mappings) {
      ++mappings_of[mapping.handle];
      if (address < previous_end) broken += "mappings overlap\n";
      previous_end = address + mapping.size;
      auto r = m.reservations.upper_bound(address);
      if (r == m.reservations.begin() ||
          std::prev(r)->first + std::prev(r)->second.size < address + mapping.size) {
        broken += "a mapping is not inside one reservation\n";
      }
      if (mapping.device_access.size() != mapping.size / g ||
          mapping.host_access.size() != mapping.size / g) {
        broken += "a mapping's access is not one entry per granule\n";
      }
      if (m.handles.count(mapping.handle) == 0) broken += "a mapping of a freed handle\n";
    }
    for (const auto& [id, h] : m.handles) {
      if (h.mappings != mappings_of[id]) broken += "a handle's mapping count is wrong\n";
      if (h.released && h.mappings == 0) broken += "a released, unmapped handle is kept\n";
    }
  }
  size_t count = 0;
  for (char c : broken) count += c == '\n';
  if (count > 0) fake::RecordViolation("fake_cuda_check_invariants: " + broken);
  return count;
}
