// The fake driver's GPU timing model (fake_cuda_timing_enable in
// fake_cuda.h): a modeled clock, apart from the real one, that says how long
// the driver calls and the stream work would take on a real GPU.
//
// Note [Timing model]. Off by default; while off nothing here costs more than
// one relaxed load. While on:
//   - The host has a modeled clock per modeled thread (kClocks; HostNow is
//     the calling thread's). Each driver call advances it by that call's
//     cost on the modeled GPU (Costs: the VMM calls per handle, from our own
//     driver_timing runs; launches and event calls, assumed), and a host wait
//     (cuEventSynchronize, cuStreamSynchronize) advances it to the modeled
//     moment the awaited work completes. A real thread charges clock 0 until
//     it selects another (UseClock), so calls from several real threads are
//     modeled as one thread making them in turn unless the caller says which
//     modeled thread makes them: a benchmark that drives the engine from one
//     real thread selects clock 1 around the calls a helper thread would
//     make, and models what orders the two (the engine's lock) itself.
//   - The driver takes one VMM call (cuMemCreate, cuMemRelease, cuMemMap,
//     cuMemSetAccess, cuMemUnmap) at a time: such a call starts no sooner
//     than the last one, from any clock, ended (remapping from several
//     threads was no faster on our H200: docs/decisions/0017). The time a
//     clock waited for another's VMM call is counted (driver_wait_ns). With
//     one clock nothing waits: its own calls end before it makes the next.
//   - Each stream has a modeled tail: the moment its last enqueued operation
//     completes. An operation starts at the latest of: the host's clock when
//     it is enqueued, its stream's tail, the events it waits for (the record
//     a cuStreamWaitEvent names completes at the tail its stream had when the
//     record was enqueued) and the engine it runs on being free.
//   - Engines, per device: compute (kernels, one at a time), copy to host,
//     copy to device, copy on the device. Copies of one direction run one at a
//     time in enqueue order; the directions and compute run at once.
//   - Work is scheduled when it is enqueued (every dependency is known by
//     then), so the model is exact for the order the calls were made in and
//     independent of the real worker threads, which still move the real bytes
//     and enforce every rule of the driver as before.
// What it leaves out: the engine's own CPU time between driver calls (its
// statistics measure that on the real clock); locks outside the driver;
// kernels running at once on a device; the PCIe/NVLink contention of two copy
// directions (each runs at its measured one-way rate); caches of any kind.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_TIMING_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_TIMING_H_

#include <cstddef>
#include <cstdint>

namespace lms {
namespace cu {
namespace fake {
namespace timing {

enum class Engine : int { kCompute, kCopyToHost, kCopyToDevice, kCopyOnDevice, kCount };

// Modeled host threads: clock 0 launches kernels, the others are helpers.
constexpr int kClocks = 4;

// The driver calls whose host cost the model charges.
enum class Call : int {
  kCreate,   // cuMemCreate, per handle
  kRelease,  // cuMemRelease, per handle
  kMap,      // cuMemMap, per handle
  kAccess,   // cuMemSetAccess, per handle the range covers
  kUnmap,    // cuMemUnmap, per handle
  kLaunch,   // a kernel or cuMemcpyAsync enqueued
  kRecord,   // cuEventRecord
  kWait,     // cuStreamWaitEvent
  kSync,     // the return from a host wait, and cuEventQuery
  kCount
};

// Whether the model is on (a relaxed load).
bool Enabled();
// Turns it on with a named preset ("h200", "h100"), clocks and totals at
// zero; false, and nothing changed, for an unknown name.
bool Enable(const char* preset);
void Disable();

// Makes the calling thread's later calls charge `clock` (0 <= clock <
// kClocks), first moving that clock to `not_before_ns` if it is earlier (the
// moment the modeled thread was woken, or took a lock). False, and nothing
// changed, for a clock out of range.
bool UseClock(int clock, uint64_t not_before_ns);
// Makes every real thread that never selected a clock (UseClock) charge
// `clock` instead of 0, each of its calls starting no sooner than clock 0's
// time at that call: a thread of the code under test (the CUDA backend's
// unmap thread) that clock 0's thread hands work to. The hand-over is not a
// driver call, so the model takes clock 0's time when the real thread gets
// to the call; that is no sooner than the hand-over, and later by what clock
// 0's thread called meanwhile in real time, so two runs may differ a little.
// Its VMM calls take no real time, so each first waits (real time, at most 2
// ms) until clock 0 has reached the end of its last one: a thread with many
// calls to make otherwise books the driver far ahead of clock 0 at once, and
// clock 0's next VMM call waits for all of them, not the one under way.
// 0 (the default; Enable restores it): such threads charge clock 0. False,
// and nothing changed, for a clock out of range.
bool OtherThreadsClock(int clock);
// `clock`'s time (0 for a clock out of range).
uint64_t ClockNow(int clock);

// A question to the model, not a property of any driver: what would a step
// take if some VMM calls cost nothing? Bit 0 of `mask`: every VMM call on
// device-located memory; bit 1: cuMemMap, cuMemSetAccess and cuMemUnmap of
// host-located memory; bit 2: cuMemCreate and cuMemRelease of host-located
// memory; bit 3: every cuMemUnmap, on either memory (the most unmaps made on
// a thread of their own could give). Such calls then take no time and hold
// the driver for none. Enable clears it.
void FreeVmm(int mask);

// Advances the calling thread's clock by the cost of `call` on a handle of
// `handle_bytes` of host-located (`host_memory`) or device memory; the VMM
// calls cost per handle plus per 2 MiB of it, the others a fixed cost. A
// VMM call first waits for the driver to be done with the last one.
void Charge(Call call, bool host_memory = false, size_t handle_bytes = 0);
// Advances the calling thread's clock by `ns` of host work the caller states.
void ChargeHostWork(uint64_t ns);
// The calling thread's clock.
uint64_t HostNow();
// A host wait for work that completes at `done_ns`: the calling thread's
// clock moves there if it is later (counted as waiting), then pays kSync.
void HostWaitUntil(uint64_t done_ns);

// Schedules an operation of `ns` on `engine` of `device`, on a stream whose
// tail is `tail` (its earliest start besides the calling thread's clock);
// returns its end, the stream's new tail. kCount as the engine: no engine
// (an event record, a wait), `ns` is then 0. A kernel that starts after the
// compute engine's previous one ended counts the gap as idle (Totals).
uint64_t Schedule(uint64_t tail, int device, Engine engine, uint64_t ns);
// How long a copy of `bytes` takes on `engine`.
uint64_t CopyNs(Engine engine, size_t bytes);

struct Totals {
  uint64_t host_now_ns = 0;  // clock 0's
  uint64_t busy_ns[static_cast<int>(Engine::kCount)] = {};
  uint64_t host_call_ns[static_cast<int>(Call::kCount)] = {};
  uint64_t host_work_ns = 0;
  uint64_t host_wait_ns = 0;
  uint64_t host_waits = 0;
  // VMM calls' waits for the driver to end another clock's VMM call.
  uint64_t driver_wait_ns = 0;
  // Compute engines idle between two kernels, by what the later one waited
  // for: its launch (the host was late) or its stream (an event it waits
  // for, a copy's: the stream's tail was later than the host's clock).
  uint64_t compute_idle_host_ns = 0;
  uint64_t compute_idle_stream_ns = 0;
};
Totals GetTotals();

}  // namespace timing
}  // namespace fake
}  // namespace cu
}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_TIMING_H_
