#include "tf_adapter/profiler_events.h"

#include <memory>
#include <string>
#include <vector>

#include "tsl/profiler/lib/scoped_annotation.h"
#include "tsl/profiler/lib/scoped_memory_debug_annotation.h"
#include "tsl/profiler/lib/traceme.h"
#include "tsl/profiler/lib/traceme_encode.h"

namespace lms {

namespace {

// BFC's level for its memory events; our spans use the same, so a session
// that shows one shows the other (the profiler records host events up to
// ProfilerOptions.host_tracer_level, 2 by default).
constexpr int kLevel = tsl::profiler::TraceMeLevel::kInfo;

// The annotations of this thread's open spans, innermost last (spans nest on
// their thread: ScopedActivity).
thread_local std::vector<std::unique_ptr<tsl::profiler::ScopedAnnotation>> t_annotations;

}  // namespace

bool ProfilerRecording() { return tsl::profiler::TraceMe::Active(kLevel); }

void RecordMemoryEvent(MemoryEvent event, const std::string& allocator, const Statistics& s,
                       int64_t limit, const void* ptr, size_t requested_bytes,
                       size_t allocation_bytes) {
  tsl::profiler::TraceMe::InstantActivity(
      [&] {
        const tsl::profiler::MemoryDebugAnnotation& annotation =
            tsl::profiler::ScopedMemoryDebugAnnotation::CurrentAnnotation();
        const int64_t zero = 0;
        return tsl::profiler::TraceMeEncode(
            event == MemoryEvent::kAllocation ? "MemoryAllocation" : "MemoryDeallocation",
            {{"allocator_name", allocator},
             {"bytes_reserved", zero},
             {"bytes_allocated", s.bytes_in_use},
             {"bytes_available", limit - s.bytes_in_use},
             {"fragmentation", zero},
             {"peak_bytes_in_use", s.peak_bytes_in_use},
             {"requested_bytes", static_cast<int64_t>(requested_bytes)},
             {"allocation_bytes", static_cast<int64_t>(allocation_bytes)},
             {"addr", reinterpret_cast<uint64_t>(ptr)},
             {"tf_op", annotation.pending_op_name},
             {"id", annotation.pending_step_id},
             {"region_type", annotation.pending_region_type},
             {"data_type", annotation.pending_data_type},
             {"shape", annotation.pending_shape_func()},
             {"lms_device_bytes", s.bytes_reserved},
             {"lms_device_limit", s.bytes_limit},
             {"lms_bytes_evicted", s.current_bytes_reclaimed},
             {"lms_host_bytes", s.host_bytes_in_use}});
      },
      kLevel);
}

int64_t TraceMeObserver::Begin(Activity what, uint64_t bytes, uint64_t units) {
  t_annotations.push_back(std::make_unique<tsl::profiler::ScopedAnnotation>(ActivityName(what)));
  return tsl::profiler::TraceMe::ActivityStart(
      [&] {
        if (bytes == 0 && units == 0) return std::string(ActivityName(what));
        return tsl::profiler::TraceMeEncode(ActivityName(what),
                                            {{"bytes", bytes}, {"units", units}});
      },
      kLevel);
}

void TraceMeObserver::End(int64_t token) {
  tsl::profiler::TraceMe::ActivityEnd(token);
  if (!t_annotations.empty()) t_annotations.pop_back();
}

TraceMeObserver* TraceMeObserver::Get() {
  static TraceMeObserver* const observer = new TraceMeObserver();
  return observer;
}

}  // namespace lms
