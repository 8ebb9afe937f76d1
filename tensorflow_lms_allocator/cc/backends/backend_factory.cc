#include "backends/backend_factory.h"

#include "backends/cuda_backend.h"
#include "backends/posix_backend.h"

namespace lms {

Status ParseBackendKind(const std::string& name, BackendKind* kind) {
  if (name == "posix") {
    *kind = BackendKind::kPosix;
  } else if (name == "cuda") {
    *kind = BackendKind::kCuda;
  } else {
    return InvalidArgument("unknown backend '" + name + "'; use \"posix\" or \"cuda\"");
  }
  return Status::Ok();
}

const char* BackendKindName(BackendKind kind) {
  return kind == BackendKind::kCuda ? "cuda" : "posix";
}

Status CreateBackend(const BackendSpec& spec, std::unique_ptr<Backend>* out) {
  switch (spec.kind) {
    case BackendKind::kPosix:
      return PosixBackend::Create(spec.granule_bytes, out, spec.huge_pages);
    case BackendKind::kCuda: {
      std::unique_ptr<CudaBackend> cuda;
      LMS_RETURN_IF_ERROR(CudaBackend::Create(spec.device_ordinal, spec.granule_bytes,
                                              spec.allow_growth, &cuda,
                                              spec.peer_ordinals));
      *out = std::move(cuda);
      return Status::Ok();
    }
  }
  return InvalidArgument("unknown backend kind");
}

Status CheckBackendSupport(const BackendSpec& spec) {
  switch (spec.kind) {
    case BackendKind::kPosix:
      return Status::Ok();
    case BackendKind::kCuda:
      return CudaBackend::CheckDeviceSupport(spec.device_ordinal);
  }
  return InvalidArgument("unknown backend kind");
}

}  // namespace lms
