// Clang thread-safety annotations in the style of TensorFlow's
// tsl/platform/thread_annotations.h. The engine has no TensorFlow dependency,
// so it carries its own copies; under GCC they expand to nothing.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define LMS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define LMS_THREAD_ANNOTATION(x)
#endif

#define LMS_GUARDED_BY(x) LMS_THREAD_ANNOTATION(guarded_by(x))
#define LMS_PT_GUARDED_BY(x) LMS_THREAD_ANNOTATION(pt_guarded_by(x))
#define LMS_EXCLUSIVE_LOCKS_REQUIRED(...) \
  LMS_THREAD_ANNOTATION(exclusive_locks_required(__VA_ARGS__))
#define LMS_LOCKS_EXCLUDED(...) \
  LMS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_
