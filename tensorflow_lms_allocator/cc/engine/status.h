// The engine's error type. The engine never throws: every failure is a Status
// whose message names the cause, so the TensorFlow adapter can turn it into
// TensorFlow's own errors (ResourceExhausted for kResourceExhausted) without
// exceptions crossing the TensorFlow boundary.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STATUS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STATUS_H_

#include <memory>
#include <string>
#include <utility>

namespace lms {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller passed something that can never work
  kNotFound,            // an address the engine did not hand out, or freed
  kFailedPrecondition,  // a call out of order (unpin without pin)
  kResourceExhausted,   // not enough device memory, host memory or addresses
  kInternal,            // the OS or driver refused an operation
};

const char* StatusCodeName(StatusCode code);

class Status {
 public:
  // OK: one null pointer. Every allocate and free makes and destroys one, so
  // an OK status must cost no more than that (a std::string member cost a
  // measurable part of an allocate+free pair).
  Status() = default;
  Status(StatusCode code, std::string message)
      : rep_(code == StatusCode::kOk ? nullptr : new Rep{code, std::move(message)}) {}
  Status(const Status& other) : rep_(other.rep_ ? new Rep(*other.rep_) : nullptr) {}
  Status& operator=(const Status& other) {
    if (this != &other) rep_.reset(other.rep_ ? new Rep(*other.rep_) : nullptr);
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // Empty for OK.
  const std::string& message() const;
  // "RESOURCE_EXHAUSTED: <message>", or "OK".
  std::string ToString() const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::unique_ptr<Rep> rep_;
};

inline Status InvalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status NotFound(std::string m) {
  return Status(StatusCode::kNotFound, std::move(m));
}
inline Status FailedPrecondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status ResourceExhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status Internal(std::string m) {
  return Status(StatusCode::kInternal, std::move(m));
}

// Formats a byte count for messages: "3.0 MiB (3145728 bytes)".
std::string FormatBytes(size_t bytes);

// Formats an address for messages: "0x7f12a0000000".
std::string FormatAddress(const void* ptr);

}  // namespace lms

#define LMS_RETURN_IF_ERROR(expr)        \
  do {                                   \
    ::lms::Status lms_status_ = (expr);  \
    if (!lms_status_.ok()) return lms_status_; \
  } while (0)

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_STATUS_H_
