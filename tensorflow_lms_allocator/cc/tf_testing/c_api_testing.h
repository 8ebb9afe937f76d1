// Test-only C entry points of the TensorFlow adapter: probes of its inner
// workings (an allocator called exactly as TensorFlow calls it, a GPU's
// allocator asked for without a GPU, TensorFlow's copies run through their
// hook with a stand-in for GPUUtil, kernel-context and turn counters).
//
// Built into libtf_lms_adapter.so only with the CMake option
// LMS_TEST_ENTRY_POINTS=ON, which `make build` sets for the tests; wheels
// and `pip install` leave it off, so users' libraries export none of these
// (tests/test_install.py lists the wheel's symbols). Python declares them
// from this header when it is installed next to the library.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_TESTING_C_API_TESTING_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_TESTING_C_API_TESTING_H_

#include <stddef.h>
#include <stdint.h>

#include "tf_adapter/statistics_c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// For tests: the allocator of LMS device `device` ("CPU:0", "GPU:0") called
// exactly as TensorFlow calls it, AllocateRaw(alignment, num_bytes,
// AllocationAttributes) with retry_on_failure as given. *ptr is null (and the
// message says why) if the allocation failed; TF_LMS_NOT_FOUND if there is no
// such LMS device.
TF_LMS_EXPORT int tf_lms_test_allocate_raw(const char* device, size_t alignment,
                                           size_t num_bytes, int retry_on_failure,
                                           void** ptr, char* message,
                                           size_t message_len);
// With TF_LMS_POLICY=learned: reclaims on LMS device `device` take the
// learned order (on != 0, the default) or LRU's while the policy goes on
// learning (Engine::SetLearnedOrder): benchmarks/policy.py sets the two side
// by side in one process. TF_LMS_FAILED_PRECONDITION under LRU.
TF_LMS_EXPORT int tf_lms_test_set_learned_order(const char* device, int on, char* message,
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
// Makes later tf_lms_test_gpu_allocator calls name the other GPUs of
// [0, count) as its peers, as TensorFlow's GPU device factory names every
// other GPU it creates (0, the default: none).
TF_LMS_EXPORT void tf_lms_test_set_gpu_count(int count);
// Maps TfDeviceId `tf_device_id` to CUDA device `platform_device_id`, as
// TensorFlow's GPU device factory does for each logical GPU (several logical
// GPUs on one CUDA device, tf.config.set_logical_device_configuration).
// TF_LMS_FAILED_PRECONDITION if the id is mapped to another device already.
TF_LMS_EXPORT int tf_lms_test_map_gpu(int tf_device_id, int platform_device_id,
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

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_TESTING_C_API_TESTING_H_
