// An access trace: what an engine was asked to do, in order, with time, the
// thread and the op running on it, written to a file for replay and timelines
// (tensorflow_lms_allocator/trace.py reads it).
//
// Note [Access trace format]
// Little-endian, in this order:
//   header   8 bytes "LMSTRACE", u32 version (1), u32 record size (40);
//   records  one per event, beginning with the allocations already live when
//            the trace started (allocate events flagged "live at start", in
//            address order, each unit's pins after its allocations), so that a
//            trace is self-contained: every address it pins or frees was
//            allocated in it;
//              u64 time_ns   since the trace started (steady clock)
//              u64 address   the allocation's (or unit's) address
//              u64 bytes     requested bytes (allocate), unit bytes (evict,
//                            page-in), 0 otherwise
//              u64 unit_id   the id Pin returns (allocate, pin, unpin), else 0
//              u32 thread    the OS thread id
//              u16 op        index into the op table; 0 = no op known
//              u8  event     1 allocate, 2 free, 3 pin, 4 unpin, 5 evict,
//                            6 page-in
//              u8  flags     bit 0 (allocate): born pinned (its kernel
//                            unpins it without a pin event); bit 1 (allocate,
//                            pin): live when the trace started, a snapshot
//                            event at time 0 rather than a call; bit 2
//                            (allocate): unclaimed, made outside any kernel
//                            and not evictable until its first pin (Note
//                            [Writers outside kernels] in engine.h)
//   trailer  a JSON object {"ops": [...], "events": N, "dropped": D,
//            "max_bytes": M}, then u64 its length, then 8 bytes "LMSTREND".
// A trace whose records would pass max_bytes stops recording there and
// counts the events it dropped, so a forgotten trace cannot fill the disk.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_TRACE_RECORDER_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_TRACE_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/status.h"

namespace lms {

enum class TraceEvent : uint8_t {
  kAllocate = 1,
  kFree = 2,
  kPin = 3,
  kUnpin = 4,
  kEvict = 5,
  kPageIn = 6,
};

struct TraceSummary {
  uint64_t events = 0;   // recorded
  uint64_t dropped = 0;  // not recorded: the cap was reached
  uint64_t max_bytes = 0;
  std::string path;
};

// Not thread-safe: the engine calls it under its own lock, which also puts
// the records in the order the engine saw the calls.
class TraceRecorder {
 public:
  // kInvalidArgument if max_bytes cannot hold one record; kInternal naming
  // the path if the file cannot be created.
  static Status Open(const std::string& path, uint64_t max_bytes,
                     std::unique_ptr<TraceRecorder>* recorder);
  ~TraceRecorder();

  // `op` is the running op's name (ThreadLabel), or nullptr.
  void Record(TraceEvent event, uintptr_t address, uint64_t bytes, uint64_t unit_id,
              const char* op, uint8_t flags = 0);
  static constexpr uint8_t kBornPinned = 1;
  static constexpr uint8_t kLiveAtStart = 2;
  static constexpr uint8_t kUnclaimed = 4;

  // Writes the trailer and closes the file. kInternal if a write failed.
  Status Finish(TraceSummary* summary);

 private:
  TraceRecorder(std::FILE* file, std::string path, uint64_t max_records);
  uint16_t OpIndex(const char* op);

  std::FILE* file_;
  const std::string path_;
  const uint64_t max_records_;
  const std::chrono::steady_clock::time_point start_;
  uint64_t events_ = 0;
  uint64_t dropped_ = 0;
  bool write_failed_ = false;
  std::unordered_map<std::string, uint16_t> op_index_;
  std::vector<std::string> ops_;  // ops_[i - 1] is op i
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_TRACE_RECORDER_H_
