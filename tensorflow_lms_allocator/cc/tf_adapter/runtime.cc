#include "tf_adapter/runtime.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "tf_adapter/gpu_devices.h"
#include "tf_adapter/gpu_streams.h"
#include "tsl/platform/logging.h"

namespace lms {
namespace {

constexpr char kEmulatedDeviceName[] = "lms_emulated_device";
// The budget of TensorFlow's unused allocator for a GPU LMS serves.
constexpr size_t kUnusedTensorFlowBudgetBytes = size_t{1} << 20;

// TF_GPU_ALLOCATOR picks TensorFlow's own GPU allocator (cuda_malloc_async,
// bfc, ...); a GPU LMS serves uses LMS's instead. Said once per process, as
// a warning rather than an error: the program runs, with LMS, as the user
// also asked (TF_LMS_ENABLED or set_lms_enabled).
void WarnIfAnotherAllocatorIsAsked(const std::string& gpu) {
  static std::atomic<bool> warned{false};
  const std::string asked = TensorFlowGpuAllocatorFromEnv();
  if (asked.empty() || warned.exchange(true)) return;
  LOG(WARNING) << "tensorflow_lms_allocator: TF_GPU_ALLOCATOR=" << asked
               << " is ignored for " << gpu
               << ": LMS serves it with its own allocator (TensorFlow's is made on a "
                  "1 MiB budget and never used). Unset TF_GPU_ALLOCATOR, or disable LMS "
                  "(TF_LMS_ENABLED=0) to use TensorFlow's";
}

}  // namespace

Runtime::Runtime()
    : devices_([](LmsDevice* device, void* device_context) {
        const Status s = device->AddFencedQueues(GpuDeviceContextStreams(device_context));
        if (!s.ok()) {
          LOG(ERROR) << "tensorflow_lms_allocator: " << device->allocator()->Name()
                     << ": TensorFlow's streams could not be fenced: " << s.ToString();
        }
      }) {}

Runtime& Runtime::Get() {
  static Runtime* runtime = new Runtime();  // never destroyed: TF outlives us
  return *runtime;
}

LmsDeviceSpec Runtime::EmulatedDeviceSpec() const {
  LmsDeviceSpec spec;
  spec.name = kEmulatedDeviceName;
  spec.backend.kind = BackendKind::kPosix;
  spec.backend.granule_bytes = settings_.granule_bytes;
  spec.backend.huge_pages = settings_.huge_pages;
  spec.engine = settings_.engine;
  spec.prefetch = settings_.prefetch;
  return spec;
}

Status Runtime::DeviceCreationError(const Status& cause) const {
  return Status(cause.code(), "the emulated device (" + DescribeEmulatedDevice(settings_) +
                                  ") could not be created: " + cause.ToString() +
                                  "; lower these values or raise the process's "
                                  "limits (ulimit -v)");
}

Status Runtime::Configure() {
  MutexLock lock(mu_);
  if (settings_fixed_ && !configured_) {
    return FailedPrecondition(
        "TensorFlow created its devices after the earlier import of "
        "tensorflow_lms_allocator failed, so they run without LMS and the settings "
        "can no longer apply in this process; start a new Python process with the "
        "corrected setting");
  }
  if (configured_) return Status::Ok();  // the package was imported already
  Settings settings;
  LMS_RETURN_IF_ERROR(ReadSettings(&settings));
  settings_ = settings;
  if (settings.engine.device_bytes != 0) {
    // Create the device once and discard it: the pools are sparse files and
    // the address ranges are only reserved, so this costs a few system calls,
    // and whatever would make the device fail at TensorFlow's first op fails
    // here, at import, naming the settings.
    std::unique_ptr<LmsDevice> trial;
    Status s = LmsDevice::Create(EmulatedDeviceSpec(), &trial);
    if (!s.ok()) return DeviceCreationError(s);
  }
  configured_ = true;
  return Status::Ok();
}

Status Runtime::DeviceStatus() {
  MutexLock lock(mu_);
  return device_error_.empty() ? Status::Ok() : FailedPrecondition(device_error_);
}

Status Runtime::SetFlag(const char* name, bool enabled) {
  MutexLock lock(mu_);
  bool* flag = FlagNamed(settings_, name);
  if (flag == nullptr) {
    return InvalidArgument(std::string("unknown LMS setting '") + (name ? name : "") +
                           "'; use lms_enabled or lms_defrag_enabled");
  }
  const bool is_lms = std::strcmp(name, "lms_enabled") == 0;
  if (settings_fixed_ && *flag != enabled) {
    return FailedPrecondition(
        std::string(is_lms ? "LMS" : "LMS defragmentation") +
        " must be set before TensorFlow creates its devices (before the first op or "
        "tf.config call that lists logical devices); set it right after importing "
        "tensorflow, or use the environment variable " +
        (is_lms ? "TF_LMS_ENABLED" : "TF_LMS_DEFRAG_ENABLED"));
  }
  *flag = enabled;
  return Status::Ok();
}

Status Runtime::GetFlag(const char* name, bool* enabled) {
  MutexLock lock(mu_);
  bool* flag = FlagNamed(settings_, name, /*readable_only=*/true);
  if (flag == nullptr) {
    return InvalidArgument(std::string("unknown LMS setting '") + (name ? name : "") +
                           "'; use lms_enabled, lms_defrag_enabled or strict");
  }
  *enabled = *flag;
  return Status::Ok();
}

bool Runtime::StrictConfigured() {
  MutexLock lock(mu_);
  return configured_ && settings_.engine.strict;
}

void* Runtime::CpuAllocator(void* original) {
  MutexLock lock(mu_);
  if (device_ != nullptr) return device_->allocator();
  if (unavailable_ != nullptr) return unavailable_.get();
  const bool first = !cpu_asked_;
  cpu_asked_ = true;
  settings_fixed_ = true;
  if (!configured_ || settings_.engine.device_bytes == 0 || !first) return original;
  Status s = LmsDevice::Create(EmulatedDeviceSpec(), &device_);
  if (!s.ok()) {
    device_error_ = DeviceCreationError(s).message();
    LOG(ERROR) << "tensorflow_lms_allocator: " << device_error_
               << "; every allocation on CPU:0 fails";
    // Not `original`: that would run the program uncapped, without LMS.
    unavailable_ =
        std::make_unique<UnavailableDeviceAllocator>(kEmulatedDeviceName, device_error_);
    return unavailable_.get();
  }
  devices_.Add(device_.get(), /*emulated=*/true);
  LOG(INFO) << device_->Describe("CPU:0, the emulated device (TF_LMS_CPU_DEVICE_MEMORY_MB)");
  return device_->allocator();
}

void Runtime::CreateGpuDevice(GpuEntry* entry, const EngineOptions& engine,
                              const void* options, int tf_device_id, size_t total_bytes,
                              const void* peer_gpu_ids) {
  LmsDeviceSpec spec;
  // The granule is the setting's; the driver's wins if larger.
  Status s = GpuDeviceSpec(engine, settings_.prefetch, settings_.granule_bytes, options,
                           tf_device_id, total_bytes, peer_gpu_ids, &spec);
  if (s.ok()) s = LmsDevice::Create(spec, &entry->device);
  if (s.ok()) {
    devices_.Add(entry->device.get(), /*emulated=*/false);
    LOG(INFO) << entry->device->Describe(GpuDeviceName(tf_device_id));
    WarnIfAnotherAllocatorIsAsked(GpuDeviceName(tf_device_id));
    return;
  }
  const std::string name = GpuDeviceName(tf_device_id);
  entry->error = "LMS is enabled but " + name + " cannot run it: " + s.ToString();
  LOG(ERROR) << "tensorflow_lms_allocator: " << entry->error << "; every allocation on "
             << name << " fails (disable LMS to run on TensorFlow's own allocator)";
  // Not TensorFlow's allocator: the user asked for LMS, and running without
  // it would fail later, less clearly, or silently use less memory.
  entry->unavailable = std::make_unique<UnavailableDeviceAllocator>(
      name + "_lms", entry->error);
}

void* Runtime::GpuAllocator(void* get_original, void* self, const void* options,
                            int tf_device_id, size_t total_bytes, const void* peer_gpu_ids) {
  using GetGpuAllocatorFn = void* (*)(void*, const void*, int, size_t, const void*);
  auto original = reinterpret_cast<GetGpuAllocatorFn>(get_original);
  void* lms = GpuAllocatorIfEnabled(options, tf_device_id, total_bytes, peer_gpu_ids);
  // Outside our lock: TensorFlow's allocator may take its time (it reserves
  // the GPU's memory) and must not wait on ours.
  if (lms == nullptr) return original(self, options, tf_device_id, total_bytes, peer_gpu_ids);
  // TensorFlow's own allocator is made as well, on a budget that takes
  // nothing, and never used: GPUProcessState::GetGpuHostAllocator (the
  // pinned host memory of every GPU-to-host copy) finds a GPU's
  // StreamExecutor only through the allocators GetGPUAllocator made, and
  // CHECK-fails with none. Its BFC allocator creates device memory only when
  // asked to allocate, which nobody does; TensorFlow makes one allocator per
  // GPU, so asking again returns the same one.
  original(self, options, tf_device_id, kUnusedTensorFlowBudgetBytes, peer_gpu_ids);
  return lms;
}

void* Runtime::GpuAllocatorIfEnabled(const void* options, int tf_device_id,
                                     size_t total_bytes, const void* peer_gpu_ids) {
  MutexLock lock(mu_);
  settings_fixed_ = true;
  if (!configured_) return nullptr;
  const EngineOptions engine = GpuEngineOptions(settings_, options);
  if (!engine.lms_enabled) return nullptr;
  GpuEntry& entry = gpus_[tf_device_id];
  if (entry.device == nullptr && entry.unavailable == nullptr) {
    CreateGpuDevice(&entry, engine, options, tf_device_id, total_bytes, peer_gpu_ids);
  }
  if (entry.device != nullptr) return entry.device->allocator();
  return entry.unavailable.get();
}

void Runtime::WarnIfServingNothing() {
  if (looked_for_devices_.exchange(true)) return;
  MutexLock lock(mu_);
  // A device that could not be made has said why already (LOG(ERROR)).
  if (!configured_ || !settings_.engine.lms_enabled || device_ != nullptr ||
      unavailable_ != nullptr || !gpus_.empty()) {
    return;
  }
  LOG(WARNING) << "tensorflow_lms_allocator: LMS is enabled but serves no device: "
                  "TensorFlow created no GPU device (none is visible to it, or "
                  "CUDA_VISIBLE_DEVICES hides them) and TF_LMS_CPU_DEVICE_MEMORY_MB is not "
                  "set, so TensorFlow's own allocators serve every tensor. Set "
                  "TF_LMS_CPU_DEVICE_MEMORY_MB=<MiB> before starting Python to run the CPU "
                  "device as an emulated GPU with that much memory";
}

void Runtime::OnContextCreated(void* context, void* params) {
  if (!looked_for_devices_.load(std::memory_order_relaxed)) WarnIfServingNothing();
  LmsDevice* device = devices_.ForParams(params);
  if (device != nullptr) {
    device->pins()->OnContextCreated(context, params);
    device->NoteKernelStarted();
  }
}

void Runtime::OnContextDestroyed(void* context) {
  // Only the pins that recorded the context act on it.
  devices_.ForEach(
      [context](LmsDevice* device) { device->pins()->OnContextDestroyed(context); });
}

LmsDevice* Runtime::DeviceNamed(const std::string& name, Status* status) {
  if (name == "CPU:0") {
    LmsAllocator* allocator = DeviceAllocator(status);
    if (allocator == nullptr) return nullptr;
    MutexLock lock(mu_);
    return device_.get();
  }
  MutexLock lock(mu_);
  for (const auto& [id, entry] : gpus_) {
    if (GpuDeviceName(id) != name) continue;
    if (entry.device != nullptr) return entry.device.get();
    *status = FailedPrecondition(entry.error);
    return nullptr;
  }
  std::string served;
  for (const std::string& n : DeviceNamesLocked()) served += (served.empty() ? "" : ", ") + n;
  *status = NotFound(
      name + " has no LMS allocator" +
      (settings_.engine.lms_enabled ? std::string(": TensorFlow has not created it (or it is "
                                           "not a GPU TensorFlow sees)")
                             : std::string(": LMS is not enabled (set TF_LMS_ENABLED=1 "
                                           "or call tf.config.experimental."
                                           "set_lms_enabled(True) first)")) +
      (served.empty() ? "; LMS serves no device in this process" : "; LMS serves " + served));
  return nullptr;
}

std::vector<std::string> Runtime::DeviceNames() {
  MutexLock lock(mu_);
  return DeviceNamesLocked();
}

std::vector<std::string> Runtime::DeviceNamesLocked() {
  std::vector<std::string> names;
  if (device_ != nullptr) names.push_back("CPU:0");
  for (const auto& [id, entry] : gpus_) {
    if (entry.device != nullptr) names.push_back(GpuDeviceName(id));
  }
  return names;
}

LmsAllocator* Runtime::DeviceAllocator(Status* status) {
  MutexLock lock(mu_);
  if (device_ != nullptr) return device_->allocator();
  if (!device_error_.empty()) {
    *status = FailedPrecondition(device_error_);
  } else if (configured_ && settings_.engine.device_bytes != 0) {
    *status = FailedPrecondition("TensorFlow has not created its devices yet");
  } else {
    *status = NotFound(
        "CPU:0 has no LMS allocator: set TF_LMS_CPU_DEVICE_MEMORY_MB=<MiB> before "
        "starting Python to run the CPU device as an emulated GPU");
  }
  return nullptr;
}

Engine* Runtime::DeviceEngine() {
  Status ignored;
  LmsAllocator* allocator = DeviceAllocator(&ignored);
  return allocator != nullptr ? &allocator->engine() : nullptr;
}

}  // namespace lms
