// CudaBackend's creation and destruction: the driver, the device and what it
// supports, the primary context, the granule and the copy stream.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "backends/cuda_backend.h"
#include "backends/cuda_context.h"
#include "backends/pinned_host_budget.h"

namespace lms {
namespace {

std::string VersionString(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

bool IsPowerOfTwo(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

// The driver version that introduced host-located VMM memory at a NUMA node
// (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA): CUDA 12.2. Drivers
// before 12.9 do not know device attribute 141 that reports it, and answer
// the query with CUDA_ERROR_INVALID_VALUE.
constexpr int kHostNumaVmmDriver = 12020;
// CU_MEM_LOCATION_TYPE_HOST (no NUMA node) and attribute 145: CUDA 13.0.
constexpr int kHostVmmDriver = 13000;

// What LMS needs of the host side, for every "cannot hold evicted tensors".
std::string HostVmmRequirement(const std::string& device) {
  return device +
         " cannot hold evicted tensors: LMS maps them from host memory "
         "created with cuMemCreate at a host location, which needs an "
         "NVIDIA driver for CUDA 12.2 or newer (CUDA 12.2 introduced "
         "CU_MEM_LOCATION_TYPE_HOST_NUMA allocations; CUDA 13.0 added "
         "CU_MEM_LOCATION_TYPE_HOST) and a GPU and system that support it";
}

}  // namespace

CudaBackend::CudaBackend(std::unique_ptr<CudaDriver> driver, int ordinal)
    : driver_(std::move(driver)), ordinal_(ordinal) {}

Status CudaBackend::Create(int ordinal, size_t min_granule_bytes, bool allow_growth,
                           std::unique_ptr<CudaBackend>* out,
                           const std::vector<int>& peer_ordinals) {
  std::unique_ptr<CudaDriver> driver;
  LMS_RETURN_IF_ERROR(CudaDriver::Load(&driver));
  std::unique_ptr<CudaBackend> backend(new CudaBackend(std::move(driver), ordinal));
  backend->allow_growth_ = allow_growth;
  LMS_RETURN_IF_ERROR(backend->Init(min_granule_bytes));
  LMS_RETURN_IF_ERROR(backend->GrantPeers(peer_ordinals));
  CudaBackend* b = backend.get();
  backend->unmapper_ = std::make_unique<UnmapThread>(
      [b](uintptr_t address, size_t bytes) { return b->UnmapOnThread(address, bytes); });
  *out = std::move(backend);
  return Status::Ok();
}

Status CudaBackend::CheckDeviceSupport(int ordinal) {
  std::unique_ptr<CudaDriver> driver;
  LMS_RETURN_IF_ERROR(CudaDriver::Load(&driver));
  CudaBackend probe(std::move(driver), ordinal);  // never retains a context
  return probe.InitDevice();
}

Status CudaBackend::InitDevice() {
  const CudaDriver& d = *driver_;
  const cu::CUresult init = d.cuInit(0);
  if (init != cu::CUDA_SUCCESS) {
    return FailedPrecondition("no usable NVIDIA GPU: cuInit failed with " +
                              d.ErrorName(init) + " (driver library " + d.library() + ")");
  }
  int count = 0;
  LMS_RETURN_IF_ERROR(d.Check(d.cuDeviceGetCount(&count), "cuDeviceGetCount"));
  if (ordinal_ < 0 || ordinal_ >= count) {
    return FailedPrecondition("GPU " + std::to_string(ordinal_) +
                              " does not exist: the NVIDIA driver sees " +
                              std::to_string(count) + " GPU(s)");
  }
  LMS_RETURN_IF_ERROR(d.Check(d.cuDeviceGet(&device_, ordinal_), "cuDeviceGet"));
  return CheckSupport();
}

Status CudaBackend::GrantPeers(const std::vector<int>& peer_ordinals) {
  const CudaDriver& d = *driver_;
  const int rw = cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  access_ = {{{cu::CU_MEM_LOCATION_TYPE_DEVICE, device_}, rw}};
  skipped_peers_.clear();
  int count = 0;
  LMS_RETURN_IF_ERROR(d.Check(d.cuDeviceGetCount(&count), "cuDeviceGetCount"));
  for (int peer : peer_ordinals) {
    if (peer < 0 || peer >= count) {
      return InvalidArgument("peer GPU " + std::to_string(peer) + " of GPU " +
                             std::to_string(ordinal_) + " does not exist: the NVIDIA driver "
                             "sees " + std::to_string(count) + " GPU(s)");
    }
    cu::CUdevice device = 0;
    LMS_RETURN_IF_ERROR(d.Check(d.cuDeviceGet(&device, peer), "cuDeviceGet of a peer GPU"));
    const bool known = std::any_of(access_.begin(), access_.end(), [&](const auto& a) {
      return a.location.id == device;
    });
    if (known || std::find(skipped_peers_.begin(), skipped_peers_.end(), peer) !=
                     skipped_peers_.end()) {
      continue;
    }
    // Note [Access to mapped memory]: the peer reads and writes this
    // device's memory, so the question is whether it can access memory
    // located here (cuda.h's order: the accessing device, then the one the
    // memory is on).
    int can_access = 0;
    LMS_RETURN_IF_ERROR(d.Check(d.cuDeviceCanAccessPeer(&can_access, device, device_),
                                "cuDeviceCanAccessPeer(GPU " + std::to_string(peer) +
                                    ", GPU " + std::to_string(ordinal_) + ")"));
    if (can_access == 0) {
      skipped_peers_.push_back(peer);
      continue;
    }
    access_.push_back({{cu::CU_MEM_LOCATION_TYPE_DEVICE, device}, rw});
  }
  if (!skipped_peers_.empty()) {
    // Said once, at creation: nothing is wrong, but copies between these
    // GPUs run at host-memory speed, which a user tuning placement wants to
    // know.
    std::fprintf(stderr, "tensorflow_lms_allocator: %s\n", SkippedPeersMessage().c_str());
  }
  return Status::Ok();
}

std::string CudaBackend::SkippedPeersMessage() const {
  if (skipped_peers_.empty()) return "";
  std::string gpus;
  for (size_t i = 0; i < skipped_peers_.size(); ++i) {
    gpus += (i == 0 ? "" : i + 1 == skipped_peers_.size() ? " and " : ", ") +
            std::to_string(skipped_peers_[i]);
  }
  const std::string self = "GPU " + std::to_string(ordinal_);
  return (skipped_peers_.size() == 1 ? "GPU " : "GPUs ") + gpus +
         " cannot access the memory of " + self +
         " peer to peer (cuDeviceCanAccessPeer): LMS does not grant " +
         (skipped_peers_.size() == 1 ? "it" : "them") + " access to " + self +
         "'s tensors, and TensorFlow's copies between " + self +
         " and " + (skipped_peers_.size() == 1 ? "it" : "them") +
         " are staged by the driver through host memory";
}

Status CudaBackend::Init(size_t min_granule_bytes) {
  LMS_RETURN_IF_ERROR(InitDevice());
  const CudaDriver& d = *driver_;
  LMS_RETURN_IF_ERROR(d.Check(d.cuDevicePrimaryCtxRetain(&context_, device_),
                              "cuDevicePrimaryCtxRetain"));
  context_retained_ = true;
  ScopedCudaContext scope(d, context_);
  LMS_RETURN_IF_ERROR(scope.status());
  if (!IsPowerOfTwo(min_granule_bytes)) {
    return InvalidArgument("granule size " + std::to_string(min_granule_bytes) +
                           " is not a power of two");
  }
  size_t granule = min_granule_bytes;
  LMS_RETURN_IF_ERROR(Granularity(PoolKind::kDevice, &granule));
  LMS_RETURN_IF_ERROR(ChooseHostLocation(granule));
  map_at_offset_ = ProbeMapAtOffset(PoolKind::kDevice);
  host_map_at_offset_ = ProbeMapAtOffset(PoolKind::kHost);
  LMS_RETURN_IF_ERROR(d.Check(d.cuStreamCreate(&copy_stream_, cu::CU_STREAM_NON_BLOCKING),
                              "cuStreamCreate (the LMS copy stream)"));
  LMS_RETURN_IF_ERROR(d.Check(d.cuEventCreate(&copies_done_, cu::CU_EVENT_DISABLE_TIMING),
                              "cuEventCreate"));
  for (cu::CUevent& event : copy_events_) {
    LMS_RETURN_IF_ERROR(
        d.Check(d.cuEventCreate(&event, cu::CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
  }
  return Status::Ok();
}

Status CudaBackend::CheckSupport() {
  const CudaDriver& d = *driver_;
  int version = 0;
  LMS_RETURN_IF_ERROR(d.Check(d.cuDriverGetVersion(&version), "cuDriverGetVersion"));
  char name[256] = {};
  LMS_RETURN_IF_ERROR(
      d.Check(d.cuDeviceGetName(name, sizeof(name) - 1, device_), "cuDeviceGetName"));
  description_ = std::string(name) + " (GPU " + std::to_string(ordinal_) +
                 "), driver " + VersionString(version);
  int vmm = 0;
  const cu::CUresult vmm_query = d.cuDeviceGetAttribute(
      &vmm, cu::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_);
  if (vmm_query != cu::CUDA_SUCCESS || vmm == 0) {
    return FailedPrecondition(
        description_ + " does not support CUDA virtual memory management "
        "(device attribute VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), which LMS needs to "
        "keep every tensor at its address while its memory moves");
  }
  int host = 0;
  const bool host_supported =
      version >= kHostVmmDriver &&
      d.cuDeviceGetAttribute(&host, cu::CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             device_) == cu::CUDA_SUCCESS &&
      host != 0;
  int numa = 0;
  const cu::CUresult numa_query = d.cuDeviceGetAttribute(
      &numa, cu::CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_);
  // A 12.2-12.8 driver supports HOST_NUMA but cannot say so: it does not
  // know attribute 141 and answers CUDA_ERROR_INVALID_VALUE. Init then
  // creates one host granule to find out (ChooseHostLocation).
  host_support_unreported_ = numa_query == cu::CUDA_ERROR_INVALID_VALUE;
  const bool numa_supported =
      version >= kHostNumaVmmDriver &&
      ((numa_query == cu::CUDA_SUCCESS && numa != 0) || host_support_unreported_);
  if (!numa_supported && !host_supported) {
    std::string m = HostVmmRequirement(description_);
    m += version < kHostNumaVmmDriver
             ? "; this driver is too old: upgrade the NVIDIA driver"
             : "; this GPU reports no support (device attributes "
               "HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and "
               "HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED are 0)";
    return FailedPrecondition(m);
  }
  int node = -1;
  if (d.cuDeviceGetAttribute(&node, cu::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device_) !=
          cu::CUDA_SUCCESS ||
      node < 0) {
    node = 0;  // -1: the system has no NUMA; node 0 is all of its memory
  }
  // Preferred: the GPU's own NUMA node; HOST only where HOST_NUMA is refused
  // (Note [Where host memory is made]).
  host_candidates_.clear();
  if (numa_supported) {
    host_candidates_.push_back(HostLocation{cu::CU_MEM_LOCATION_TYPE_HOST_NUMA, node});
  }
  if (host_supported) host_candidates_.push_back(HostLocation{cu::CU_MEM_LOCATION_TYPE_HOST, 0});
  host_location_ = host_candidates_.front();
  if (host_support_unreported_ && !host_supported) {
    // No context needed: the cheapest question the driver may refuse when
    // the GPU or system lacks host-located VMM. Init's ChooseHostLocation asks
    // the decisive one (cuMemCreate).
    const cu::CUmemAllocationProp prop = AllocationProp(PoolKind::kHost);
    size_t g = 0;
    const cu::CUresult r =
        d.cuMemGetAllocationGranularity(&g, &prop, cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != cu::CUDA_SUCCESS) return HostPoolUnsupported("cuMemGetAllocationGranularity", r);
  }
  return Status::Ok();
}

Status CudaBackend::Granularity(PoolKind pool, size_t* granule) const {
  const CudaDriver& d = *driver_;
  const cu::CUmemAllocationProp prop = AllocationProp(pool);
  size_t g = 0;
  LMS_RETURN_IF_ERROR(d.Check(
      d.cuMemGetAllocationGranularity(&g, &prop, cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM),
      "cuMemGetAllocationGranularity"));
  if (!IsPowerOfTwo(g)) {
    return Internal("the driver's allocation granularity " + std::to_string(g) + " for " +
                    description_ + " is not a power of two");
  }
  if (g > *granule) *granule = g;
  return Status::Ok();
}

Status CudaBackend::ChooseHostLocation(size_t device_granule) {
  const CudaDriver& d = *driver_;
  std::string refused;
  cu::CUresult last = cu::CUDA_SUCCESS;
  for (const HostLocation& location : host_candidates_) {
    host_location_ = location;
    size_t granule = device_granule;
    const Status known = Granularity(PoolKind::kHost, &granule);
    cu::CUresult r = cu::CUDA_ERROR_NOT_SUPPORTED;
    if (known.ok()) {
      const cu::CUmemAllocationProp prop = AllocationProp(PoolKind::kHost);
      cu::CUmemGenericAllocationHandle h = 0;
      r = d.cuMemCreate(&h, granule, &prop, 0);
      // Host memory running out says nothing about support.
      if (r == cu::CUDA_ERROR_OUT_OF_MEMORY) {
        return d.Check(r, "cuMemCreate of one host granule (probing host-located VMM "
                          "support on " + description_ + ")");
      }
      if (r == cu::CUDA_SUCCESS) {
        d.cuMemRelease(h);
        granule_ = granule;
        return Status::Ok();
      }
    }
    last = r;
    refused += std::string(refused.empty() ? "" : ", ") + LocationName(location) + ": " +
               (known.ok() ? "cuMemCreate failed with " + d.ErrorName(r) : known.message());
  }
  if (host_support_unreported_ && host_candidates_.size() == 1) {
    return HostPoolUnsupported("cuMemCreate", last);
  }
  return FailedPrecondition(HostVmmRequirement(description_) +
                            "; the device attributes say it is supported, but the driver "
                            "refused host memory at every location (" + refused +
                            "): a container or system without NUMA support, or an IOMMU "
                            "setting, can cause this");
}

std::string CudaBackend::LocationName(const HostLocation& location) {
  return location.type == cu::CU_MEM_LOCATION_TYPE_HOST_NUMA
             ? "HOST_NUMA node " + std::to_string(location.id)
             : std::string("HOST");
}

Status CudaBackend::HostPoolUnsupported(const char* call, cu::CUresult r) const {
  return FailedPrecondition(
      HostVmmRequirement(description_) +
      "; this driver cannot report support (device attribute "
      "HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is known from CUDA 12.9 on), "
      "and " + call + " of host memory at NUMA node " +
      std::to_string(host_location_.id) + " failed with " + driver_->ErrorName(r) +
      ": this GPU or system does not support it (or upgrade the NVIDIA driver)");
}

bool CudaBackend::ProbeMapAtOffset(PoolKind pool) {
  // One handle of two granules, its second granule mapped on its own (Note
  // [Device memory in runs]). Any failure, of the probe's own memory
  // included, leaves the pool's memory mapped a piece at a time: slower
  // remaps, never a wrong one.
  const CudaDriver& d = *driver_;
  bool maps = false;
  const cu::CUmemAllocationProp prop = AllocationProp(pool);
  cu::CUmemGenericAllocationHandle h = 0;
  if (d.cuMemCreate(&h, 2 * granule_, &prop, 0) != cu::CUDA_SUCCESS) return false;
  cu::CUdeviceptr at = 0;
  if (d.cuMemAddressReserve(&at, granule_, granule_, 0, 0) == cu::CUDA_SUCCESS) {
    if (d.cuMemMap(at, granule_, granule_, h, 0) == cu::CUDA_SUCCESS) {
      maps = d.cuMemUnmap(at, granule_) == cu::CUDA_SUCCESS;
    }
    d.cuMemAddressFree(at, granule_);
  }
  d.cuMemRelease(h);
  return maps;
}

cu::CUmemAllocationProp CudaBackend::AllocationProp(PoolKind pool) const {
  cu::CUmemAllocationProp prop{};
  prop.type = cu::CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = cu::CU_MEM_HANDLE_TYPE_NONE;
  if (pool == PoolKind::kDevice) {
    prop.location = cu::CUmemLocation{cu::CU_MEM_LOCATION_TYPE_DEVICE, device_};
  } else {
    prop.location = cu::CUmemLocation{host_location_.type, host_location_.id};
  }
  return prop;
}

CudaBackend::~CudaBackend() {
  if (!context_retained_) return;
  // With a context that cannot be made current, the unmap thread's requests
  // fail; it still ends before the context is released.
  {
    ScopedCudaContext scope(*driver_, context_);
    if (scope.status().ok()) {
      // Nothing of ours may run while the memory goes.
      if (copy_stream_ != nullptr) driver_->cuStreamSynchronize(copy_stream_);
      for (const auto& [base, slots] : ranges_) UnmapRetired(/*wait=*/true, base, slots.size());
      // The unmap thread's last requests end, and are taken back, before
      // the memory goes: a failed one (requeued above) stays retired, for
      // UnmapSlots to try once more on this thread.
      uint64_t last = 0;
      for (const Retired& r : retired_) last = std::max(last, r.unmap_ticket);
      (void)WaitForUnmap(last);
      unmapper_.reset();
      for (const auto& [base, slots] : ranges_) {
        UnmapSlots(base, slots.size());
        driver_->cuMemAddressFree(base, slots.size() * granule_);
      }
      for (PoolKind kind : {PoolKind::kDevice, PoolKind::kHost}) {
        Pool& pool = pools_[static_cast<int>(kind)];
        // Only a pool CreatePool completed was added to the budget. Its
        // granules go back before its limit leaves, so the budget never
        // holds more than its limit (another GPU would be refused meanwhile).
        const size_t limit =
            kind == PoolKind::kHost && pool.window != 0 ? pool.handles.size() * granule_ : 0;
        DestroyWindow(kind, &pool);
        if (limit > 0) PinnedHostBudget::Process().RemovePool(limit);
      }
      {
        MutexLock lock(streams_mu_);
        for (const FencedStream& fenced : fenced_) {
          for (cu::CUevent event : fenced.epochs) driver_->cuEventDestroy(event);
        }
        fenced_.clear();
      }
      if (copies_done_ != nullptr) driver_->cuEventDestroy(copies_done_);
      for (cu::CUevent event : copy_events_) {
        if (event != nullptr) driver_->cuEventDestroy(event);
      }
      if (copy_stream_ != nullptr) driver_->cuStreamDestroy(copy_stream_);
    }
  }
  unmapper_.reset();
  driver_->cuDevicePrimaryCtxRelease(device_);
}

}  // namespace lms
