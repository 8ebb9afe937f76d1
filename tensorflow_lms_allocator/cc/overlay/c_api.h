// The C entry points of the TensorFlow adapter (libtf_lms_adapter.so), which
// the Python package calls through ctypes (the tests' own are in
// tf_testing/c_api_testing.h): these, and the statistics that a
// patched TensorFlow exports too (statistics_c_api.h, with the error codes
// and how errors cross the boundary: a TfLmsCode and a message naming the
// cause, for a setting the variable, its value and what is valid).
//
// Lifecycle: Python loads the interposer (global scope) before TensorFlow,
// imports TensorFlow, loads this library (private scope) and calls
// tf_lms_configure(). The emulated device's engine is created on
// TensorFlow's first GetCPUAllocator call, when TensorFlow creates its
// devices; from then on the settings are fixed.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_OVERLAY_C_API_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_OVERLAY_C_API_H_

#include <stddef.h>
#include <stdint.h>

#include "tf_adapter/statistics_c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

// Checks the TensorFlow version, reads and validates the environment (every
// variable ReadSettings in settings.h reads), checks that the
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

// Holds `bytes` of `device`'s memory (rounded up to whole granules) pinned
// in device memory until tf_lms_release_device_memory: the device then
// trains as one with that much less memory would, evicting where it did not
// before. What is live is evicted to make room, so a hold can be taken and
// given back between steps. *held is the handle to give back.
//   TF_LMS_NOT_FOUND            no such LMS device
//   TF_LMS_INVALID_ARGUMENT     bytes is 0 or more than the device has
//   TF_LMS_RESOURCE_EXHAUSTED   what is pinned now leaves no room for it
TF_LMS_EXPORT int tf_lms_hold_device_memory(const char* device, uint64_t bytes,
                                            void** held, char* message,
                                            size_t message_len);
// Gives back a hold of `device`; TF_LMS_NOT_FOUND if `held` is not one.
TF_LMS_EXPORT int tf_lms_release_device_memory(const char* device, void* held,
                                               char* message, size_t message_len);

// Strict mode's report as lines "address allocation_id allocation_address
// allocation_bytes label\n", in a buffer the caller frees with
// tf_lms_free_string. Null if there is no LMS device.
TF_LMS_EXPORT char* tf_lms_unpinned_touches(void);
TF_LMS_EXPORT void tf_lms_clear_unpinned_touches(void);

// Whether CUDA device `ordinal` (as the driver numbers devices after
// CUDA_VISIBLE_DEVICES) can run LMS: the driver, the device and its virtual
// memory support, queried without creating a CUDA context. TF_LMS_OK, or
// TF_LMS_FAILED_PRECONDITION with a message naming the GPU, the driver
// version and what LMS requires.
TF_LMS_EXPORT int tf_lms_check_gpu(int ordinal, char* message, size_t message_len);

// For tests and tools: what the engine knows about the live allocation
// containing `address`, as out[0..5) = {allocation id, its first byte,
// requested bytes, evicted (0/1), pin count}. Returns 1 (out untouched) if
// there is no LMS device or no live allocation contains `address`.
TF_LMS_EXPORT int tf_lms_inspect(const void* address, int64_t* out);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_OVERLAY_C_API_H_
