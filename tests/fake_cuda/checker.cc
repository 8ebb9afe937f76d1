#include "checker.h"

#include <atomic>
#include <cstdio>
#include <map>
#include <utility>

#include "engine/mutex.h"
#include "knobs.h"

namespace lms {
namespace cu {
namespace fake {
namespace {

struct Work {
  std::string what;
  std::vector<DeviceRange> ranges;
  bool running = false;
};

struct CheckerState {
  Mutex mu;
  uint64_t next_id LMS_GUARDED_BY(mu) = 1;
  // Work from enqueue to completion, by id (enqueue order).
  std::map<uint64_t, Work> in_flight LMS_GUARDED_BY(mu);
  std::vector<std::string> violations LMS_GUARDED_BY(mu);
};

// Never destroyed: stream workers may complete work during exit.
CheckerState& State() {
  static CheckerState* state = new CheckerState;
  return *state;
}

void Append(CheckerState& s, std::string text) LMS_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (GetKnobs().print_violations) {
    std::fprintf(stderr, "fake CUDA driver violation: %s\n", text.c_str());
  }
  s.violations.push_back(std::move(text));
}

bool Overlaps(const DeviceRange& r, uint64_t address, size_t bytes) {
  return r.bytes > 0 && bytes > 0 && r.address < address + bytes &&
         address < r.address + r.bytes;
}

}  // namespace

std::string DescribeRange(uint64_t address, size_t bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "[0x%llx, +%zu)",
                static_cast<unsigned long long>(address), bytes);
  return text;
}

uint64_t RegisterWork(std::string what, std::vector<DeviceRange> ranges) {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  const uint64_t id = s.next_id++;
  s.in_flight[id] = Work{std::move(what), std::move(ranges), false};
  return id;
}

void MarkWorkRunning(uint64_t id) {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  auto it = s.in_flight.find(id);
  if (it != s.in_flight.end()) it->second.running = true;
}

void CompleteWork(uint64_t id) {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  s.in_flight.erase(id);
}

bool CheckNoWorkInFlight(const char* call, uint64_t address, size_t bytes) {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  bool hit = false;
  for (const auto& [id, work] : s.in_flight) {
    for (const DeviceRange& r : work.ranges) {
      if (!Overlaps(r, address, bytes)) continue;
      Append(s, std::string(call) + " of " + DescribeRange(address, bytes) + " hits " +
                    DescribeRange(r.address, r.bytes) + " of " +
                    (work.running ? "running " : "queued ") + work.what);
      hit = true;
      break;
    }
  }
  return hit;
}

void RecordViolation(std::string text) {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  Append(s, std::move(text));
}

size_t ViolationCount() {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  return s.violations.size();
}

std::string ViolationText() {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  std::string text;
  for (const std::string& v : s.violations) text += v + "\n";
  return text;
}

void ClearViolations() {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  s.violations.clear();
}

namespace {
std::atomic<uint64_t> g_staged_copies{0};
}  // namespace

void CountStagedCopy() { g_staged_copies.fetch_add(1, std::memory_order_relaxed); }

uint64_t StagedCopies() { return g_staged_copies.load(std::memory_order_relaxed); }

void ResetStagedCopies() { g_staged_copies.store(0, std::memory_order_relaxed); }

size_t WorkInFlight() {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  return s.in_flight.size();
}

size_t WorkRunning() {
  CheckerState& s = State();
  MutexLock lock(s.mu);
  size_t running = 0;
  for (const auto& [id, work] : s.in_flight) running += work.running ? 1 : 0;
  return running;
}

}  // namespace fake
}  // namespace cu
}  // namespace lms
