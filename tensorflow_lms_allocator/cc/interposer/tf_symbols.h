/* The mangled names of the TensorFlow functions the interposer replaces, for
 * the TensorFlow it is built against (2.16 to 2.21). Two things in them move
 * between these versions, and nothing else does (build_scripts/
 * check_wheel_symbols.py checks every name against each version's CPU and GPU
 * wheel):
 *   - absl's inline namespace, part of every name with an absl::Status in it
 *     (lts_20230802 in 2.16-2.19, lts_20250127 in 2.20, lts_20250814 in
 *     2.21): taken from the absl/base/options.h TensorFlow ships, so it is
 *     always the one its libraries were built with;
 *   - OpKernelContext's destructor, virtual from 2.20 on, which adds the
 *     deleting destructor D0 (there is none to replace before).
 * LMS_TF_MAJOR_VERSION and LMS_TF_MINOR_VERSION come from the build
 * (CMakeLists.txt asks the installed TensorFlow): from 2.20 its headers no
 * longer define TF_MINOR_VERSION themselves. */
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_INTERPOSER_TF_SYMBOLS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_INTERPOSER_TF_SYMBOLS_H_

#include "absl/base/options.h"

#if !defined(LMS_TF_MAJOR_VERSION) || !defined(LMS_TF_MINOR_VERSION)
#error "LMS_TF_MAJOR_VERSION and LMS_TF_MINOR_VERSION must be defined (CMakeLists.txt)"
#endif
#if LMS_TF_MAJOR_VERSION != 2 || LMS_TF_MINOR_VERSION < 16
#error "tensorflow_lms_allocator supports TensorFlow 2.16 to 2.21"
#endif

#define LMS_STRINGIFY_(x) #x
#define LMS_STRINGIFY(x) LMS_STRINGIFY_(x)

/* "N4absl12lts_YYYYMMDD6StatusE": an LTS namespace name is 12 characters. */
#define LMS_ABSL_NAMESPACE LMS_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME)
_Static_assert(sizeof(LMS_ABSL_NAMESPACE) == 13,
               "absl's inline namespace is not an LTS name (lts_YYYYMMDD)");
#define LMS_ABSL_STATUS "N4absl12" LMS_ABSL_NAMESPACE "6StatusE"
/* std::function<void(const absl::Status&)>, TensorFlow's StatusCallback. */
#define LMS_STATUS_CALLBACK "St8functionIFvRK" LMS_ABSL_STATUS "EE"

#define LMS_TF_HAS_VIRTUAL_CONTEXT_DTOR (LMS_TF_MINOR_VERSION >= 20)

#define LMS_GPU_TO_CPU                                                            \
  "_ZN10tensorflow7GPUUtil18CopyGPUTensorToCPUEPNS_6DeviceEPKNS_13DeviceContextEPKN" \
  "S_6TensorEPS6_" LMS_STATUS_CALLBACK
#define LMS_CPU_TO_GPU                                                             \
  "_ZN10tensorflow7GPUUtil18CopyCPUTensorToGPUEPKNS_6TensorEPKNS_13DeviceContextEPNS" \
  "_6DeviceEPS1_" LMS_STATUS_CALLBACK "b"
#define LMS_GPU_TO_SAME_GPU                                                            \
  "_ZN10tensorflow7GPUUtil22CopyGPUTensorToSameGPUEPNS_6DeviceEPKNS_13DeviceContextEPKN" \
  "S_6TensorEPS6_" LMS_STATUS_CALLBACK
#define LMS_DEVICE_TO_DEVICE                                                        \
  "_ZN10tensorflow7GPUUtil18DeviceToDeviceCopyEPNS_13DeviceContextES2_PNS_6DeviceES4_" \
  "N3tsl19AllocatorAttributesES6_PKNS_6TensorEPS7_i" LMS_STATUS_CALLBACK

#endif /* TENSORFLOW_LMS_ALLOCATOR_CC_INTERPOSER_TF_SYMBOLS_H_ */
