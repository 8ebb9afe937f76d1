// The test-extension C API of the fake CUDA driver (build/fake_cuda/
// libfakecuda.so): what a test needs beyond the driver API to drive it and
// to see what it caught.
//
// The fake implements the driver functions of LMS_CUDA_DRIVER_FUNCTIONS in
// tensorflow_lms_allocator/cc/backends/cuda_driver_api.h and exports only
// cuGetProcAddress_v2, cuGetProcAddress and the fake_cuda_* functions below,
// so a test loads it exactly as the CUDA backend loads libcuda.so.1: dlopen,
// dlsym of cuGetProcAddress_v2, everything else through it. It is not named
// libcuda.so.1 because TensorFlow would load it as the real driver.
//
// What it models (Note [Fake CUDA driver]):
//   - Physical memory: two pools, each a memfd with a capacity cap (device
//     and host-located memory); a handle from cuMemCreate owns an extent.
//   - Device virtual addresses: cuMemAddressReserve reserves PROT_NONE host
//     address space, so a host touch of device memory faults as it would on
//     a GPU. Stream workers and "kernels" reach mapped memory through a
//     private alias of each reservation (fake_cuda_device_alias). Host-
//     located memory given host access by cuMemSetAccess is also mapped
//     read/write at its own address.
//   - Streams: one worker thread per stream runs copies, event records,
//     event waits, host functions and kernels in order, asynchronously to
//     the caller. An address is resolved when the work executes; work that
//     touches memory without device access at that moment records a
//     violation and makes the context's sticky error
//     CUDA_ERROR_ILLEGAL_ADDRESS. A copy is the exception: memory on a
//     device the stream's device has no peer path to is reached through its
//     own device (the driver stages such copies through host memory), and
//     counted (fake_cuda_staged_copies).
//   - Peer paths between devices (FAKE_CUDA_NO_P2P, fake_cuda_set_peer_access):
//     cuDeviceCanAccessPeer answers from them, and cuMemSetAccess refuses,
//     with CUDA_ERROR_INVALID_DEVICE, to grant a device access to memory
//     located on a device it has no peer path to (host-located memory may be
//     granted to any device).
//   - The checker: cuMemUnmap, cuMemSetAccess and cuMemAddressFree on a
//     range that queued or running stream work references record a
//     violation (the real driver does not order these calls after stream
//     work; on a GPU this is a silent race or a fault).
//
// Using it from a test (the Makefile builds libfakecuda.so and the sanitizer
// variants libfakecuda_asan.so / libfakecuda_tsan.so, which a binary built
// with the same sanitizer must load):
//
//   setenv("TF_LMS_CUDA_DRIVER_PATH", "build/fake_cuda/libfakecuda_asan.so", 1);
//   ... create the CUDA backend, which dlopens that path ...
//   void* fake = dlopen("build/fake_cuda/libfakecuda_asan.so", RTLD_NOW);  // same instance
//   auto violations = reinterpret_cast<decltype(&fake_cuda_violation_count)>(
//       dlsym(fake, "fake_cuda_violation_count"));
//   EXPECT_EQ(violations(), 0u);
//
// (Linking the test against the library works too: dlopen of the same file
// returns the instance already loaded.)
//
// Where it differs from a real driver (what it does not enforce or model):
//   - No legacy or per-thread default stream: stream 0 is
//     CUDA_ERROR_INVALID_HANDLE. cuStreamDestroy waits for the stream's work
//     (the real one returns at once). Host functions may call the driver
//     (the real driver forbids it; a host function synchronizing its own
//     stream deadlocks here).
//   - After a sticky error, only the synchronizing calls (cuStreamSynchronize,
//     cuEventSynchronize, cuEventQuery, cuMemcpyHtoD/DtoH) return it, and
//     later stream work still runs; other calls keep working so a test can
//     clean up. The error clears when the primary context's last reference
//     is released (or at fake_cuda_reset).
//   - Copies are between device addresses (a reservation) only: no pageable
//     or registered host pointers in cuMemcpyAsync. A range crossing two
//     reservations is not mapped, even if they are adjacent.
//   - cuMemGetAllocationGranularity needs cuInit but no context. Access is
//     tracked per granule; cuMemSetAccess needs granule-aligned ranges. Host
//     access (HOST or HOST_NUMA) is accepted for any host-located memory,
//     whichever of the two it was created at; HOST_NUMA node ids other than 0
//     are CUDA_ERROR_INVALID_VALUE.
//   - Attributes 141 and 145 answer as a real driver does: a driver older
//     than 12.9 (FAKE_CUDA_DRIVER_VERSION / fake_cuda_set_driver_version)
//     does not know 141, nor one older than 13.0 145, and returns
//     CUDA_ERROR_INVALID_VALUE for them; HOST_NUMA cuMemCreate still works
//     from 12.2 on (per fake_cuda_set_host_vmm_supported).
//   - cuGetProcAddress_v2 is exported whatever the driver version knob says
//     (a real 11.x driver has only cuGetProcAddress); asking for the CUDA 12
//     ABI of an older "driver" is VERSION_NOT_SUFFICIENT.
//   - Memory is only as fast and as large as the host's: device memory is
//     ordinary RAM behind a memfd; pages are returned when a handle's
//     extent goes back to its pool (and a new handle reads zeros, which a
//     real driver does not promise).
//   - TSan does not see races between a host access at a device address and
//     stream work (they go through different mappings): the checker, not
//     TSan, catches stream-ordering bugs. Copies racing an unmap are made
//     safe (they finish into scratch memory); a kernel still using its alias
//     when its range is unmapped is a race TSan reports too. Stream work that
//     touches memory outside its declared ranges is not checked.
//   - Events have no timing (cuEventElapsedTime is not there); the
//     INTERPROCESS and BLOCKING_SYNC flags are accepted and ignored.
//   - Time: everything runs at the host's speed. The timing model
//     (fake_cuda_timing_enable) says instead how long the calls and the
//     stream work would take on a GPU we measured, on a modeled clock.
//
// Every function here is thread-safe. Knobs take effect for calls made after
// they are set. Environment variables read at load and by fake_cuda_reset():
//   FAKE_CUDA_DEVICE_MB, FAKE_CUDA_HOST_MB   pool caps (default 1024 each)
//   FAKE_CUDA_DRIVER_VERSION                 default 12040
//   FAKE_CUDA_DEVICE_COUNT                   default 1 (at most 8)
//   FAKE_CUDA_COPY_DELAY_US                  default 0
//   FAKE_CUDA_HOST_VMM                       1 (default) or 0
//   FAKE_CUDA_REFUSE_HOST_CREATE             0 (default) to 3: the mask of
//                                            fake_cuda_refuse_host_create
//   FAKE_CUDA_PRINT_VIOLATIONS               1: also print each violation to
//                                            stderr as it is recorded
//   FAKE_CUDA_MAP_OFFSET_ZERO_ONLY           1: fake_cuda_set_map_offset_zero_only
//   FAKE_CUDA_NO_P2P                         pairs of devices with no peer
//                                            path between them, "0-2,1-2";
//                                            default none (every pair has one)
//   FAKE_CUDA_TIMING                         a timing model preset (h200,
//                                            h100); default none (off)
// A bad value makes cuInit fail with CUDA_ERROR_INVALID_VALUE after printing
// the variable and the value to stderr.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_FAKE_CUDA_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_FAKE_CUDA_H_

#include <stddef.h>

#ifdef __cplusplus
#define FAKE_CUDA_NOEXCEPT noexcept
extern "C" {
#else
#define FAKE_CUDA_NOEXCEPT
#endif

// A device address range a kernel reads, or reads and writes.
typedef struct fake_cuda_range {
  unsigned long long address;  // a CUdeviceptr
  size_t bytes;
  int writes;  // nonzero: the kernel writes (needs READWRITE access)
} fake_cuda_range;

// The pools of fake_cuda_set_pool_capacity / fake_cuda_pool_bytes_in_use.
enum { FAKE_CUDA_POOL_DEVICE = 0, FAKE_CUDA_POOL_HOST = 1 };

// --- Kernels ---------------------------------------------------------------

// Enqueues a "kernel" on `stream` (a CUstream): fn(user) runs on the stream's
// worker in stream order. Before it runs, every declared range must be
// mapped with device access for the stream's device (READWRITE where
// `writes`); otherwise the kernel does not run, a violation is recorded and
// the context's sticky error becomes CUDA_ERROR_ILLEGAL_ADDRESS. The ranges
// are what the checker holds the kernel to until it returns. Returns a
// CUresult (the same validation as cuLaunchHostFunc).
int fake_cuda_launch_kernel(void* stream, void (*fn)(void* user), void* user,
                            const fake_cuda_range* ranges, size_t n) FAKE_CUDA_NOEXCEPT;

// fake_cuda_launch_kernel with a duration in the timing model: the kernel
// occupies its device's compute engine for `duration_ns` of modeled time.
// `fn` may be null: the kernel then only resolves its ranges (a touch of
// each, checked as above) and takes its time.
int fake_cuda_launch_kernel_for(void* stream, unsigned long long duration_ns,
                                void (*fn)(void* user), void* user,
                                const fake_cuda_range* ranges, size_t n) FAKE_CUDA_NOEXCEPT;

// The fake's private alias of [address, address + bytes): what a kernel
// dereferences instead of the device address. Null, with a violation
// recorded, unless the whole range lies in one reservation and is mapped
// with device access (for the device of the stream running the caller, else
// of the calling thread's current context, else device 0). The pointer is
// valid while the range stays mapped.
void* fake_cuda_device_alias(unsigned long long address, size_t bytes) FAKE_CUDA_NOEXCEPT;

// --- The checker ------------------------------------------------------------

size_t fake_cuda_violation_count(void) FAKE_CUDA_NOEXCEPT;
// Every violation since the last clear, one per line. The caller frees the
// result with free(); never null.
char* fake_cuda_violations(void) FAKE_CUDA_NOEXCEPT;
void fake_cuda_clear_violations(void) FAKE_CUDA_NOEXCEPT;

// --- Knobs --------------------------------------------------------------------

// Each stream copy (and synchronous copy) sleeps this long before moving
// bytes, to widen race windows.
void fake_cuda_set_copy_delay_us(unsigned microseconds) FAKE_CUDA_NOEXCEPT;
// While `hold` is nonzero, every cuMemUnmap waits before it does anything,
// until a call with 0; fake_cuda_unmaps_waiting says how many wait. A gate
// for tests of which thread unmaps, and what waits for it.
void fake_cuda_hold_unmaps(int hold) FAKE_CUDA_NOEXCEPT;
int fake_cuda_unmaps_waiting(void) FAKE_CUDA_NOEXCEPT;
// The n-th cuMemCreate from now (1 = the next) fails with
// CUDA_ERROR_OUT_OF_MEMORY; 0 disarms. One shot.
void fake_cuda_fail_nth_mem_create(int n) FAKE_CUDA_NOEXCEPT;
// The n-th cuMemMap from now fails with `error` (CUDA_ERROR_OUT_OF_MEMORY or
// CUDA_ERROR_UNKNOWN, as real drivers do); 0 disarms. One shot.
void fake_cuda_fail_nth_mem_map(int n, int error) FAKE_CUDA_NOEXCEPT;
// Whether host-located VMM is supported: attributes 141 and 145 and
// cuMemCreate at HOST_NUMA / HOST. Whatever this says, drivers before 12020
// have no HOST_NUMA location, drivers before 13000 no HOST location, and
// drivers before 12090 / 13000 do not know attribute 141 / 145
// (CUDA_ERROR_INVALID_VALUE).
void fake_cuda_set_host_vmm_supported(int supported) FAKE_CUDA_NOEXCEPT;
// cuMemCreate refuses host memory at the locations of `mask` (bit 0:
// HOST_NUMA, bit 1: HOST) with CUDA_ERROR_NOT_SUPPORTED while the attributes
// still say it is supported: a container or system without NUMA support,
// which NCCL probes for by creating host memory. 0 (the default) refuses none.
void fake_cuda_refuse_host_create(int mask) FAKE_CUDA_NOEXCEPT;
// cuMemMap refuses a nonzero offset into a handle (CUDA_ERROR_NOT_SUPPORTED),
// as the parameter note of cuda.h's cuMemMap comment says ("currently must
// be zero") and as driver 580 did on an H100, device and host memory alike
// (benchmarks/results/gpu-check-engine-h100-overlap.log); by default (0) it
// maps any granularity-aligned sub-range of a handle, as the same comment's
// description says.
void fake_cuda_set_map_offset_zero_only(int zero_only) FAKE_CUDA_NOEXCEPT;
// What cuDriverGetVersion reports and cuGetProcAddress compares against
// (e.g. 11080 for a driver too old for the backend).
void fake_cuda_set_driver_version(int version) FAKE_CUDA_NOEXCEPT;
// The following return 0, or -1 (nothing changed) if the value is out of
// range or, for the device count and granularity, if any handle, mapping,
// reservation, stream or event is alive.
int fake_cuda_set_device_count(int count) FAKE_CUDA_NOEXCEPT;  // 0..8
int fake_cuda_set_granularity(size_t bytes) FAKE_CUDA_NOEXCEPT;  // a power of two >= 4096
int fake_cuda_set_pool_capacity(int pool, size_t bytes) FAKE_CUDA_NOEXCEPT;
// Whether devices a and b (ordinals below 8, a != b) have a peer path, both
// ways: without one, cuDeviceCanAccessPeer answers 0 for the pair,
// cuMemSetAccess refuses to grant either access to the other's memory, and a
// copy between their memories is staged through host memory. Returns 0, or
// -1 (nothing changed) for bad ordinals. fake_cuda_reset() restores
// FAKE_CUDA_NO_P2P.
int fake_cuda_set_peer_access(int a, int b, int can_access) FAKE_CUDA_NOEXCEPT;

// --- The timing model ---------------------------------------------------------
//
// A modeled clock beside the real one (Note [Timing model] in timing.h): each
// driver call advances the host's clock by its cost on a GPU we measured
// (the VMM calls per handle and per 2 MiB, from our driver_timing runs;
// launches and event calls assumed), stream work is scheduled on per-device
// engines (compute; copies to the host, to the device, on the device, each
// one at a time, at the measured rate), and host waits move the host's clock
// to when the awaited work completes. Real work still runs as before.

// Turns the model on with a preset ("h200", "h100"), clocks and totals at
// zero. Returns 0, or -1 (nothing changed) for an unknown name.
int fake_cuda_timing_enable(const char* preset) FAKE_CUDA_NOEXCEPT;
void fake_cuda_timing_disable(void) FAKE_CUDA_NOEXCEPT;
// Advances the calling thread's clock by `ns` of host work (a framework's
// own time).
void fake_cuda_timing_host_work(unsigned long long ns) FAKE_CUDA_NOEXCEPT;
// Modeled host threads: clock 0 (every real thread's until it selects
// another) launches kernels; a benchmark driving the engine from one real
// thread selects clock 1 around what a helper thread would call. Makes the
// calling thread's later calls charge `clock` (0-3), first moving that clock
// to `not_before_ns` if it is earlier (when the helper was woken). The
// driver takes one VMM call at a time, from any clock. Returns 0, or -1
// (nothing changed) for a clock out of range.
int fake_cuda_timing_use_clock(int clock, unsigned long long not_before_ns) FAKE_CUDA_NOEXCEPT;
// Real threads that never selected a clock charge `clock` (0-3) instead of
// 0, each call no sooner than clock 0's time then: threads of the code under
// test that the launching thread hands work to (the CUDA backend's unmap
// thread). Returns 0, or -1 (nothing changed) for a clock out of range;
// fake_cuda_timing_enable restores 0.
int fake_cuda_timing_other_threads_clock(int clock) FAKE_CUDA_NOEXCEPT;
// `clock`'s time (0 for a clock out of range).
unsigned long long fake_cuda_timing_clock(int clock) FAKE_CUDA_NOEXCEPT;
// A what-if of the model, not a driver's behaviour: some VMM calls take no
// time and hold the driver for none. Bit 0 of `mask`: every VMM call on
// device-located memory; bit 1: cuMemMap, cuMemSetAccess and cuMemUnmap of
// host-located memory; bit 2: cuMemCreate and cuMemRelease of host-located
// memory; bit 3: every cuMemUnmap, on either memory. fake_cuda_timing_enable
// clears it.
void fake_cuda_timing_free_vmm(int mask) FAKE_CUDA_NOEXCEPT;

typedef struct fake_cuda_timing {
  unsigned long long host_now_ns;             // clock 0: the launching thread's
  unsigned long long compute_busy_ns;         // kernels, all devices
  unsigned long long copy_to_host_busy_ns;    // copies into host memory
  unsigned long long copy_to_device_busy_ns;  // copies into device memory
  unsigned long long copy_on_device_busy_ns;  // copies within device memory
  unsigned long long host_remap_ns;           // cuMemMap, cuMemSetAccess, cuMemUnmap
  unsigned long long host_create_ns;          // cuMemCreate, cuMemRelease
  unsigned long long host_stream_ns;          // launches, event calls, waits' returns
  unsigned long long host_work_ns;            // fake_cuda_timing_host_work
  unsigned long long host_wait_ns;            // blocked in host waits
  unsigned long long host_waits;              // host waits (cuEventSynchronize, ...)
  // Compute engines idle between kernels: the next one not launched yet (the
  // host late), or launched on a stream held by an event (a copy it waits for).
  unsigned long long compute_idle_host_ns;
  unsigned long long compute_idle_stream_ns;
  // VMM calls waiting for the driver to end another clock's VMM call.
  unsigned long long driver_wait_ns;
} fake_cuda_timing;
// The totals since fake_cuda_timing_enable.
void fake_cuda_timing_totals(fake_cuda_timing* out) FAKE_CUDA_NOEXCEPT;

// --- Observers (for leak checks) ----------------------------------------------

size_t fake_cuda_live_handles(void) FAKE_CUDA_NOEXCEPT;  // created and not released
size_t fake_cuda_live_mappings(void) FAKE_CUDA_NOEXCEPT;
size_t fake_cuda_live_reservations(void) FAKE_CUDA_NOEXCEPT;
size_t fake_cuda_live_streams(void) FAKE_CUDA_NOEXCEPT;
size_t fake_cuda_live_events(void) FAKE_CUDA_NOEXCEPT;
// Copies and kernels enqueued and not yet finished, and those of them that
// are executing now (a test can wait for a copy to be running).
size_t fake_cuda_work_in_flight(void) FAKE_CUDA_NOEXCEPT;
size_t fake_cuda_work_running(void) FAKE_CUDA_NOEXCEPT;
// Copies (cuMemcpyAsync, cuMemcpyHtoD/DtoH) that reached memory of a device
// without a peer path to the copying one, as the driver stages them through
// host memory; fake_cuda_reset() zeroes the count.
unsigned long long fake_cuda_staged_copies(void) FAKE_CUDA_NOEXCEPT;
// Bytes of the pool held by handles, including released handles that are
// still mapped (their memory returns when the last mapping goes).
size_t fake_cuda_pool_bytes_in_use(int pool) FAKE_CUDA_NOEXCEPT;

// Calls of driver function `name` ("cuMemMap") made through the pointers
// cuGetProcAddress handed out since the last reset of the counts (all
// functions together for a null name). fake_cuda_reset() zeroes them too.
unsigned long long fake_cuda_call_count(const char* name) FAKE_CUDA_NOEXCEPT;
void fake_cuda_reset_call_counts(void) FAKE_CUDA_NOEXCEPT;

// Checks the fake's own bookkeeping (memory_state.h): pool usage against
// handle sizes, mapping counts against mappings, mappings inside one
// reservation and disjoint. Returns the number of broken equations (0 when
// consistent) and records them as a violation.
size_t fake_cuda_check_invariants(void) FAKE_CUDA_NOEXCEPT;

// Destroys whatever a test left alive: every stream (after its queued work
// ran, so a stream held by a latch never opened hangs here) and event, then
// every mapping, reservation and handle. Returns how many objects there
// were. For a test harness after a failed test, so the next test starts
// clean; a passing test should have destroyed everything itself.
size_t fake_cuda_destroy_all(void) FAKE_CUDA_NOEXCEPT;

// Restores the state of a freshly loaded library: knobs from the
// environment, no violations, not initialized (cuInit needed again), primary
// contexts released and their sticky errors cleared. Only when nothing is
// alive: returns the number of live handles, mappings, reservations, streams
// and events, and changes nothing, if that is not zero. So a test that ends
// with fake_cuda_reset() == 0 has also checked that it leaked nothing.
size_t fake_cuda_reset(void) FAKE_CUDA_NOEXCEPT;

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_FAKE_CUDA_H_
