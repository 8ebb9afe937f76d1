// The C entry points both ways into TensorFlow export: the LMS devices and
// their statistics, which Python reads through ctypes. The runtime overlay's
// package finds them in libtf_lms_adapter.so, with the rest of its C API
// (c_api.h); a TensorFlow built with the LMS patch series exports them from
// the library its GPU runtime is linked into (libtensorflow_framework.so.2),
// where tf.config.experimental's statistics functions look for them.
//
// One way for errors to cross the boundary: every call that can fail returns
// a TfLmsCode and writes a message naming the cause into the caller's buffer.
// The caller chooses its exception type from the code alone, never from the
// message text; tf_lms_code_name() gives the code's name, so a caller in
// another language needs no copy of the numbers. No C++ exception leaves
// these functions.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_STATISTICS_C_API_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_STATISTICS_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#include <string>

#include "engine/status.h"

extern "C" {
#endif

#define TF_LMS_EXPORT __attribute__((visibility("default")))

// What went wrong. The values are the canonical codes of absl::StatusCode
// (and TensorFlow's errors), so they read the same in a TensorFlow log.
typedef enum TfLmsCode {
  TF_LMS_OK = 0,
  // A setting or argument that can never work (a bad environment value, an
  // unknown setting name).
  TF_LMS_INVALID_ARGUMENT = 3,
  // There is no LMS device where one was asked for.
  TF_LMS_NOT_FOUND = 5,
  // Not enough memory or address space (creating the device, allocating).
  TF_LMS_RESOURCE_EXHAUSTED = 8,
  // A call out of order or in the wrong process state: a setting changed
  // after TensorFlow created its devices, another TensorFlow version, the
  // interposer not loaded, a device that could not be created.
  TF_LMS_FAILED_PRECONDITION = 9,
  // The OS refused something it should not have.
  TF_LMS_INTERNAL = 13,
} TfLmsCode;

// "OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED",
// "FAILED_PRECONDITION", "INTERNAL"; "UNKNOWN" for any other value.
TF_LMS_EXPORT const char* tf_lms_code_name(int code);

// The statistics (statistics.h), in a fixed order of names.
TF_LMS_EXPORT int tf_lms_num_statistics(void);
TF_LMS_EXPORT const char* tf_lms_statistic_name(int i);  // null if out of range
// Fills values[0..count) in tf_lms_statistic_name order for `device`, an LMS
// device's name as tf_lms_device_names lists it ("CPU:0", "GPU:1").
//   TF_LMS_NOT_FOUND            no such LMS device (LMS off, not created, or
//                               not a device TensorFlow sees)
//   TF_LMS_FAILED_PRECONDITION  it was asked for but could not be created
TF_LMS_EXPORT int tf_lms_get_statistics(const char* device, int64_t* values, int count,
                                        char* message, size_t message_len);
// The LMS devices TensorFlow created, one name per line: the emulated device
// ("CPU:0") first, then GPUs by TensorFlow id ("GPU:0"). A buffer the caller
// frees with tf_lms_free_string.
TF_LMS_EXPORT char* tf_lms_device_names(void);
TF_LMS_EXPORT void tf_lms_free_string(char* s);

#ifdef __cplusplus
}  // extern "C"

namespace lms {

// `code`, with `message` written to the caller's buffer `out` (if any).
int FailToC(TfLmsCode code, const std::string& message, char* out, size_t out_len);
// TF_LMS_OK, or the status's code with its message written to `out`.
int ReportToC(const Status& status, char* out, size_t out_len);

}  // namespace lms
#endif  // __cplusplus

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_STATISTICS_C_API_H_
