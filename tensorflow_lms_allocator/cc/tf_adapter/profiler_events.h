// ProfilerEvents: LMS's device in TensorFlow's profiler.
//
// Note [Memory events for the profiler]. TensorBoard's Memory Profile tool
// reads the host events named MemoryAllocation and MemoryDeallocation that
// an allocator records under an active profiler session (TensorFlow's BFC
// allocator: AddTraceMe in xla/tsl/framework/bfc_allocator.cc), one per
// allocation and free, with the allocator's figures after it and what
// TensorFlow's annotation says of the op (ScopedMemoryDebugAnnotation:
// the op, step, region, data type and shape of the tensor being made). LMS
// records the same events with the same argument names, so the tool shows
// LMS's device as it shows BFC's:
//   - bytes_allocated is everything allocated and live, resident or evicted
//     (the engine's bytes_in_use: what the program holds, as TensorFlow's
//     get_memory_info reports it); peak_bytes_in_use its peak;
//   - bytes_available is the limit TensorFlow sees minus bytes_allocated:
//     with LMS on that limit is the device's memory plus the host budget
//     (Note [The limit TensorFlow sees] in lms_allocator.cc), so the tool's
//     capacity is what LMS can hold, not the device alone;
//   - bytes_reserved is 0 and fragmentation 0: BFC reports its stack region
//     and its free-chunk fragmentation there, and LMS has neither (any free
//     granule serves any allocation: addresses are remapped, not searched);
//   - LMS's own figures follow as extra arguments, which the Memory Profile
//     ignores and the trace viewer shows with the event:
//     lms_device_bytes (device memory taken: resident units and cached
//     granules), lms_device_limit (the device's capacity), lms_bytes_evicted
//     (the evicted units' bytes, whole granules) and lms_host_bytes (the host
//     memory backing them).
// Nothing is recorded with the profiler off: TraceMe's check is one relaxed
// load, and the figures are gathered only when it passes. Host memory served
// in place of device memory outside kernels (HostFallback) is not the
// device's and is not recorded, as BFC records nothing it did not allocate.
// Nor is a variable's free that an XLA kernel's error path defers to the
// kernel's end (KernelPins frees it through the engine): the Memory Profile
// shows that buffer live until the capture ends.
//
// Note [LMS's work in the trace viewer]. Evictions, page-ins and waits for
// other kernels' memory are spans (TraceMe activities) on the thread that did
// them, named "LMS <what>" with their bytes and units as arguments, so the
// trace viewer shows them beside the ops they delay (TraceMe's info level,
// as the memory events). The engine calls an ActivityObserver
// (engine/activity_observer.h), which never depends on TensorFlow; this is
// TensorFlow's side of it. Each span is also a ScopedAnnotation, TensorFlow's
// own mechanism for naming the GPU work a scope issues: on a GPU, under a
// session, the CUDA copies an eviction or page-in issues carry its name in
// the trace viewer (TensorFlow's GPU tracer reads the annotation when the
// copy is issued), and where NVTX is on (Nsight Systems) the span is an NVTX
// range instead (then the copies are not named). Spans are taken only while a
// profiler session records, so Nsight Systems alone shows none. Neither has
// run on a GPU. A span's bytes and units are those it set out to move: a
// victim whose eviction a pin abandons, or whose remap fails, still counts.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PROFILER_EVENTS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PROFILER_EVENTS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/activity_observer.h"
#include "engine/engine.h"

namespace lms {

// Whether a profiler session records TraceMe events of the info level now.
bool ProfilerRecording();

enum class MemoryEvent { kAllocation, kDeallocation };

// Records a MemoryAllocation or MemoryDeallocation event of the allocator
// named `allocator` for `ptr`, after its engine served or freed it: `stats`
// are the engine's statistics then, `limit` the limit TensorFlow sees. Call
// only when ProfilerRecording() (checked again inside, so a session that
// just stopped records nothing).
void RecordMemoryEvent(MemoryEvent event, const std::string& allocator, const Statistics& stats,
                       int64_t limit, const void* ptr, size_t requested_bytes,
                       size_t allocation_bytes);

// The ActivityObserver that records the engine's spans as TraceMe activities
// (Note [LMS's work in the trace viewer]). Stateless and thread-safe.
class TraceMeObserver : public ActivityObserver {
 public:
  bool Active() const override { return ProfilerRecording(); }
  int64_t Begin(Activity what, uint64_t bytes, uint64_t units) override;
  void End(int64_t token) override;

  // One instance serves every engine of the process.
  static TraceMeObserver* Get();
};

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_PROFILER_EVENTS_H_
