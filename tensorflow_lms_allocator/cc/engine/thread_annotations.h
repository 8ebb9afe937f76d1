// Clang thread-safety annotations in the style of TensorFlow's
// tsl/platform/thread_annotations.h.
//
// The engine has no TensorFlow dependency, so it carries its own copies.
// Under GCC they expand to nothing; `make test` compiles the engine with
// clang -Wthread-safety -Werror (make test-thread-safety), which makes every
// LMS_GUARDED_BY a check: the engine locks an lms::Mutex (engine/mutex.h)
// through a MutexLock.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define LMS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define LMS_THREAD_ANNOTATION(x)
#endif

#define LMS_CAPABILITY(x) LMS_THREAD_ANNOTATION(capability(x))
#define LMS_SCOPED_CAPABILITY LMS_THREAD_ANNOTATION(scoped_lockable)
#define LMS_GUARDED_BY(x) LMS_THREAD_ANNOTATION(guarded_by(x))
#define LMS_PT_GUARDED_BY(x) LMS_THREAD_ANNOTATION(pt_guarded_by(x))
#define LMS_EXCLUSIVE_LOCKS_REQUIRED(...) \
  LMS_THREAD_ANNOTATION(exclusive_locks_required(__VA_ARGS__))
#define LMS_LOCKS_EXCLUDED(...) \
  LMS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define LMS_ACQUIRE(...) LMS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define LMS_RELEASE(...) LMS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// For a function that takes a lock and returns holding it, or releases one it
// did not take, where its caller's annotations cannot say so (an override of
// an unannotated virtual: the fork handlers').
#define LMS_NO_THREAD_SAFETY_ANALYSIS LMS_THREAD_ANNOTATION(no_thread_safety_analysis)

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_THREAD_ANNOTATIONS_H_
