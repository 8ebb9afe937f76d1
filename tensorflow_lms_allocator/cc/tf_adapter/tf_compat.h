// What moved in TensorFlow's C++ API between the versions the runtime overlay
// builds for (2.16 to 2.21), in one place: the adapter's sources are the same
// for every version and ask this header instead of testing versions
// themselves. docs/tensorflow-versions.md lists each difference and where it
// was found.
//
// LMS_TF_MAJOR_VERSION and LMS_TF_MINOR_VERSION come from the overlay's build
// (CMakeLists.txt asks the installed TensorFlow; from 2.20 its headers no
// longer define TF_MINOR_VERSION). The source patch builds these files inside one
// TensorFlow tree, the one its series is for: without the definitions, that.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_TF_COMPAT_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_TF_COMPAT_H_

#ifndef LMS_TF_MINOR_VERSION
#define LMS_TF_MAJOR_VERSION 2
#define LMS_TF_MINOR_VERSION 21
#endif

#if LMS_TF_MAJOR_VERSION != 2 || LMS_TF_MINOR_VERSION < 16
#error "the TensorFlow adapter builds for TensorFlow 2.16 to 2.21"
#endif

// tsl's allocator and device ids moved from tsl/framework/ to
// xla/tsl/framework/ in 2.18 (the same classes, in namespace tsl).
#if LMS_TF_MINOR_VERSION >= 18
#define LMS_TSL_ALLOCATOR_H "xla/tsl/framework/allocator.h"
#else
#define LMS_TSL_ALLOCATOR_H "tsl/framework/allocator.h"
#endif

// So did the profiler's TraceMe recorder and annotation stack (the adapter's
// tests read them; the adapter records through tsl/profiler/lib/, which
// stayed).
#if LMS_TF_MINOR_VERSION >= 18
#define LMS_TSL_TRACEME_RECORDER_H "xla/tsl/profiler/backends/cpu/traceme_recorder.h"
#define LMS_TSL_ANNOTATION_STACK_H "xla/tsl/profiler/backends/cpu/annotation_stack.h"
#else
#define LMS_TSL_TRACEME_RECORDER_H "tsl/profiler/backends/cpu/traceme_recorder.h"
#define LMS_TSL_ANNOTATION_STACK_H "tsl/profiler/backends/cpu/annotation_stack.h"
#endif

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_TF_ADAPTER_TF_COMPAT_H_
