#include "backends/cuda_driver.h"

#include <dlfcn.h>

#include <string>

namespace lms {

Status CudaDriver::Load(std::unique_ptr<CudaDriver>* out) {
  return LoadFrom(CudaDriverPathFromEnv(), out);
}

Status CudaDriver::LoadFrom(const std::string& path, std::unique_ptr<CudaDriver>* out) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return FailedPrecondition("no NVIDIA driver: " + path + " could not be loaded (" +
                              (why != nullptr ? why : "unknown reason") +
                              "); LMS on a GPU needs the NVIDIA driver installed");
  }
  // Only the bootstrap is looked up by name, and only in this handle.
  auto get_v2 = reinterpret_cast<cu::PFN_cuGetProcAddress_v2>(
      dlsym(handle, "cuGetProcAddress_v2"));
  auto get_v1 = get_v2 != nullptr
                    ? nullptr
                    : reinterpret_cast<cu::PFN_cuGetProcAddress>(
                          dlsym(handle, "cuGetProcAddress"));
  if (get_v2 == nullptr && get_v1 == nullptr) {
    dlclose(handle);  // nothing of it was used
    return FailedPrecondition("the NVIDIA driver " + path +
                              " has no cuGetProcAddress: it predates CUDA 11.3, and "
                              "LMS needs a CUDA 12 driver");
  }
  std::unique_ptr<CudaDriver> driver(new CudaDriver());
  driver->library_ = path;
  std::string missing;
  auto resolve = [&](const char* name, void** pfn) {
    int symbol_status = cu::CU_GET_PROC_ADDRESS_SUCCESS;
    const cu::CUresult r =
        get_v2 != nullptr
            ? get_v2(name, pfn, cu::kCudaAbiVersion, cu::CU_GET_PROC_ADDRESS_DEFAULT,
                     &symbol_status)
            : get_v1(name, pfn, cu::kCudaAbiVersion, cu::CU_GET_PROC_ADDRESS_DEFAULT);
    if (r != cu::CUDA_SUCCESS || symbol_status != cu::CU_GET_PROC_ADDRESS_SUCCESS ||
        *pfn == nullptr) {
      *pfn = nullptr;
      missing += (missing.empty() ? "" : ", ") + std::string(name);
    }
  };
#define LMS_CUDA_RESOLVE(name, ret, params) \
  resolve(#name, reinterpret_cast<void**>(&driver->name));
  LMS_CUDA_DRIVER_FUNCTIONS(LMS_CUDA_RESOLVE)
#undef LMS_CUDA_RESOLVE
  if (!missing.empty()) {
    // Most likely an older driver: say which, if it can tell (cuDriverGetVersion
    // exists at every ABI since CUDA 2.2).
    cu::PFN_cuDriverGetVersion get_version = nullptr;
    int version = 0;
    int symbol_status = 0;
    const cu::CUresult r =
        get_v2 != nullptr
            ? get_v2("cuDriverGetVersion", reinterpret_cast<void**>(&get_version), 2020,
                     cu::CU_GET_PROC_ADDRESS_DEFAULT, &symbol_status)
            : get_v1("cuDriverGetVersion", reinterpret_cast<void**>(&get_version), 2020,
                     cu::CU_GET_PROC_ADDRESS_DEFAULT);
    const bool known = r == cu::CUDA_SUCCESS && get_version != nullptr &&
                       get_version(&version) == cu::CUDA_SUCCESS;
    dlclose(handle);  // nothing of it was used
    const std::string abi = std::to_string(cu::kCudaAbiVersion / 1000) + "." +
                            std::to_string(cu::kCudaAbiVersion % 1000 / 10);
    if (known && version < cu::kCudaAbiVersion) {
      return FailedPrecondition(
          "the NVIDIA driver " + path + " is for CUDA " + std::to_string(version / 1000) +
          "." + std::to_string(version % 1000 / 10) +
          ": too old; LMS needs a driver for CUDA 12.2 or newer (host-located virtual "
          "memory for evicted tensors)");
    }
    return FailedPrecondition("the NVIDIA driver " + path + " does not provide " + missing +
                              " at the CUDA " + abi +
                              " ABI; LMS needs a driver for CUDA 12.2 or newer");
  }
  *out = std::move(driver);
  return Status::Ok();
}

std::string CudaDriver::ErrorName(cu::CUresult result) const {
  const char* name = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(result, &name) != cu::CUDA_SUCCESS ||
      name == nullptr) {
    return "CUresult " + std::to_string(result);
  }
  return std::string(name) + " (" + std::to_string(result) + ")";
}

Status CudaDriver::Check(cu::CUresult result, const std::string& call) const {
  if (result == cu::CUDA_SUCCESS) return Status::Ok();
  std::string m = call + " failed: " + ErrorName(result);
  const char* text = nullptr;
  if (cuGetErrorString != nullptr && cuGetErrorString(result, &text) == cu::CUDA_SUCCESS &&
      text != nullptr) {
    m += std::string(": ") + text;
  }
  return result == cu::CUDA_ERROR_OUT_OF_MEMORY ? ResourceExhausted(m) : Internal(m);
}

}  // namespace lms
