// The C entry points of the TensorFlow adapter (libtf_lms_adapter.so), which
// the Python package calls through ctypes: these, and the statistics that a
// patched TensorFlow exports too (statistics_c_api.h, with the error codes
// and how errors cross the boundary: a TfLmsCode and a message naming the
// cause, for a setting the variable, its value and what is valid).
//
// Lifecycle: Python loads the interposer (global scope) before TensorFlow,
// imports TensorFlow, loads this library (private scope) and calls
// tf_lms_configure(). The emulated device's engine is created on
// TensorFlow's first GetCPUAllocator call, when TensorFlow creates its
// devices; from then on the settings are fixed.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_C_API_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_C_API_H_

#include <stddef.h>
#include <stdint.h>

#include "tf_adapter/statistics_c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// Checks the TensorFlow version, reads and validates the environment
// (TF_LMS_ENABLED, TF_LMS_DEFRAG_ENABLED, TF_LMS_STRICT,
// TF_LMS_CPU_DEVICE_MEMORY_MB, TF_GPU_HOST_MEM_LIMIT_IN_MB), checks that the
// emulated device can be created with those values (by creating and
// discarding one), and registers the hooks with the interposer.
//   TF_LMS_INVALID_ARGUMENT     a value that cannot give a working device
//   TF_LMS_RESOURCE_EXHAUSTED   valid values, but the process cannot reserve
//                               the memory (e.g. `ulimit -v`)
//   TF_LMS_FAILED_PRECONDITION  another TensorFlow version; no interposer;
//                               TensorFlow created its devices after an
//                               earlier call failed (too late to apply)
// May be called again after a failure (a corrected environment); nothing is
// changed by a failed call.
TF_LMS_EXPORT int tf_lms_configure(const char* tf_version, char* message,
                                   size_t message_len);

// TF_LMS_FAILED_PRECONDITION (with the reason) if TensorFlow asked for the
// emulated device and it could not be created; TF_LMS_OK otherwise (created,
// not yet asked for, or none configured). The Python package checks it when
// TensorFlow's eager context creates its devices, so the first op raises the
// reason even on paths that do not survive a failed allocation.
TF_LMS_EXPORT int tf_lms_device_status(char* message, size_t message_len);

// Settings that can change until TensorFlow creates its devices, by name:
// "lms_enabled", "lms_defrag_enabled". Setting a different value after the
// devices exist is TF_LMS_FAILED_PRECONDITION; the same value is OK.
// tf_lms_get_flag also reads "strict" (TF_LMS_STRICT, fixed at import).
TF_LMS_EXPORT int tf_lms_set_flag(const char* setting, int enabled, char* message,
                                  size_t message_len);
TF_LMS_EXPORT int tf_lms_get_flag(const char* setting, int* enabled, char* message,
                                  size_t message_len);

// Strict mode: puts its SIGSEGV handler back on top after another library
// installed one (call it right after faulthandler.enable()), chaining to the
// newcomer; with `chained_handler_removed`, after that library removed its
// handler again (faulthandler.disable()). No-op without strict mode.
TF_LMS_EXPORT void tf_lms_keep_fault_handler_first(int chained_handler_removed);

// Access traces of `device`'s engine (Note [Access trace format] in
// engine/trace_recorder.h): every allocate, free, pin, unpin, eviction and
// page-in from now until tf_lms_stop_trace, at most `max_bytes` of file.
//   TF_LMS_NOT_FOUND            no such LMS device
//   TF_LMS_FAILED_PRECONDITION  a trace is already being recorded (start) or
//                               none is (stop)
//   TF_LMS_INVALID_ARGUMENT     max_bytes cannot hold one event
//   TF_LMS_INTERNAL             the file cannot be created or written
TF_LMS_EXPORT int tf_lms_start_trace(const char* device, const char* path,
                                     uint64_t max_bytes, char* message,
                                     size_t message_len);
// Finishes the file; *events recorded, *dropped after the cap was reached.
TF_LMS_EXPORT int tf_lms_stop_trace(const char* device, uint64_t* events,
                                    uint64_t* dropped, uint64_t* max_bytes,
                                    char* message, size_t message_len);

// Strict mode's report as lines "address allocation_id allocation_address
// allocation_bytes label\n", in a buffer the caller frees with
// tf_lms_free_string. Null if there is no LMS device.
TF_LMS_EXPORT char* tf_lms_unpinned_touches(void);
TF_LMS_EXPORT void tf_lms_clear_unpinned_touches(void);

// For tests: the allocator of LMS device `device` ("CPU:0", "GPU:0") called
// exactly as TensorFlow calls it, AllocateRaw(alignment, num_bytes,
// AllocationAttributes) with retry_on_failure as given. *ptr is null (and the
// message says why) if the allocation failed; TF_LMS_NOT_FOUND if there is no
// such LMS device.
TF_LMS_EXPORT int tf_lms_test_allocate_raw(const char* device, size_t alignment,
                                           size_t num_bytes, int retry_on_failure,
                                           void** ptr, char* message,
                                           size_t message_len);
// RequestedSize and AllocatedSize of a live allocation.
TF_LMS_EXPORT int tf_lms_test_allocation_sizes(const char* device, const void* ptr,
                                               size_t* requested, size_t* allocated);
TF_LMS_EXPORT int tf_lms_test_deallocate_raw(const char* device, void* ptr);
// The bytes_limit of the allocator statistics TensorFlow reads
// (Allocator::GetStats), which a GPU device reports as its memory (Note [The
// limit TensorFlow sees] in lms_allocator.cc).
TF_LMS_EXPORT int tf_lms_test_tensorflow_bytes_limit(const char* device,
                                                     int64_t* bytes_limit);
// Whether CUDA device `ordinal` (as the driver numbers devices after
// CUDA_VISIBLE_DEVICES) can run LMS: the driver, the device and its virtual
// memory support, queried without creating a CUDA context. TF_LMS_OK, or
// TF_LMS_FAILED_PRECONDITION with a message naming the GPU, the driver
// version and what LMS requires.
TF_LMS_EXPORT int tf_lms_check_gpu(int ordinal, char* message, size_t message_len);

// For tests without a GPU: asks for GPU `tf_device_id`'s allocator as
// TensorFlow's GPU device factory does (GPUProcessState::GetGPUAllocator with
// the GPUOptions serialized in gpu_options[0..gpu_options_len) (default ones
// if it is empty) and a budget of `total_bytes`), mapping TfDeviceId n to
// CUDA device n if TensorFlow has not. With LMS enabled (by the settings or
// the GPUOptions) that makes the GPU's LMS device over the CUDA backend (the
// driver TF_LMS_CUDA_DRIVER_PATH names can be the tests' fake driver).
// TF_LMS_FAILED_PRECONDITION with the reason if LMS is off or the device
// cannot run LMS; TF_LMS_INVALID_ARGUMENT if the GPUOptions do not parse.
TF_LMS_EXPORT int tf_lms_test_gpu_allocator(int tf_device_id, size_t total_bytes,
                                            const void* gpu_options, size_t gpu_options_len,
                                            char* message, size_t message_len);
// TensorFlow's GetGPUAllocator itself needs a GPU: tf_lms_test_gpu_allocator
// calls a stand-in that makes nothing and records the budget it was asked
// for. Writes the first `max` budgets to out[]; returns how many there were.
TF_LMS_EXPORT int tf_lms_test_tensorflow_gpu_allocator_budgets(size_t* out, int max);

// For tests: out[0..2) = {live kernel contexts in the process, live contexts
// the calling thread created}. Returns 1 (out untouched) if there is no LMS
// device.
TF_LMS_EXPORT int tf_lms_kernel_contexts(int64_t* out);

// For tests: out[0..2) = {requests that waited for memory (took a turn),
// waits that every running kernel was in too and that ended by serving the
// oldest without device memory} (Note [Taking turns] in kernel_pins.h).
// Returns 1 (out untouched) if there is no LMS device.
TF_LMS_EXPORT int tf_lms_turns(int64_t* out);

// For tests and tools: what the engine knows about the live allocation
// containing `address`, as out[0..5) = {allocation id, its first byte,
// requested bytes, evicted (0/1), pin count}. Returns 1 (out untouched) if
// there is no LMS device or no live allocation contains `address`.
TF_LMS_EXPORT int tf_lms_inspect(const void* address, int64_t* out);

// For tests without a GPU: one of TensorFlow's own copies (Note
// [TensorFlow's own copies] in tensorflow_copies.h) run through the copy hook
// exactly as the interposer runs it on a GPU wheel, with a stand-in for
// GPUUtil's function that enqueues as a stream does (it returns at once and
// completes the copy `delay_ms` later on another thread). `kind`: 0
// device-to-host, 1 host-to-device, 2 within the device, 3 device-to-device.
// The copy's LMS tensors (`bytes` each, from `device`'s allocator, the
// destination of kind 3 from `dst_device`'s if it names another LMS device,
// as a copy between two GPUs; the source holds a pattern) are evicted first;
// with `fill_device`, the source's device is then
// filled with pinned memory so that nothing can be paged in. out[0..10) =
// {the copy was enqueued (0/1), the absl code `done` received, the source's
// {evicted, pin count} when it was enqueued, the destination's (-1 for host
// memory), the pin count of the first LMS tensor while the copy is in
// flight, pins left on them after `done`, the destination holds the pattern
// (0/1), page-ins on both devices}. `message` receives `done`'s error message.
TF_LMS_EXPORT int tf_lms_test_tensorflow_copy(const char* device, const char* dst_device,
                                              int kind, size_t bytes, int delay_ms,
                                              int fill_device, int64_t* out, char* message,
                                              size_t message_len);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_C_API_H_
