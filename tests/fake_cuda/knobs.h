// The fake driver's knobs: what a test (or the environment) changes about the
// driver it fakes. Atomics, read without a lock: a knob takes effect for the
// calls that start after it is set, which is all a test can observe anyway.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_KNOBS_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_KNOBS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace lms {
namespace cu {
namespace fake {

// The most devices the fake models (the bound of per-device arrays).
constexpr int kMaxDevices = 8;

// The first driver versions that know device attributes 141
// (HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) and 145
// (HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED); older ones answer
// CUDA_ERROR_INVALID_VALUE, as they do for every attribute they do not know.
constexpr int kHostNumaAttributeDriver = 12090;
constexpr int kHostAttributeDriver = 13000;

struct Knobs {
  // What cuDriverGetVersion reports; cuGetProcAddress refuses newer ABIs,
  // HOST_NUMA memory needs >= 12020 and HOST memory >= 13000.
  std::atomic<int> driver_version{12040};
  std::atomic<int> device_count{1};
  // Bit (a * kMaxDevices + b) set: device a cannot access memory located on
  // device b (cuDeviceCanAccessPeer answers 0, cuMemSetAccess refuses to
  // grant a access to b's memory). 0, the default: every pair can.
  std::atomic<uint64_t> no_peer_access{0};
  // Host-located VMM (attributes 141 and 145, HOST_NUMA / HOST cuMemCreate).
  std::atomic<bool> host_vmm_supported{true};
  // Bit 0: cuMemCreate refuses HOST_NUMA; bit 1: HOST (attributes unchanged).
  std::atomic<int> refuse_host_create{0};
  // cuMemMap refuses a nonzero offset (CUDA_ERROR_INVALID_VALUE), as cuda.h's
  // parameter note "currently must be zero" says, although its description
  // allows one.
  std::atomic<bool> map_offset_zero_only{false};
  // Sleep before each copy moves bytes, to widen race windows.
  std::atomic<unsigned> copy_delay_us{0};
  // n > 0: the n-th next call fails (see ConsumeCountdown).
  std::atomic<int> fail_create_countdown{0};
  std::atomic<int> fail_map_countdown{0};
  std::atomic<int> fail_map_error{2};  // CUDA_ERROR_OUT_OF_MEMORY
  // Changed only while no handle, mapping or reservation is alive
  // (fake_cuda_set_granularity), so every live object agrees with it.
  std::atomic<size_t> granularity{size_t{2} << 20};
  std::atomic<size_t> device_capacity{size_t{1024} << 20};
  std::atomic<size_t> host_capacity{size_t{1024} << 20};
  // Each violation is also printed to stderr when it is recorded.
  std::atomic<bool> print_violations{false};
  // Set when an environment variable had a bad value: cuInit fails.
  std::atomic<bool> environment_error{false};
};

Knobs& GetKnobs();

// The unmap gate (fake_cuda_hold_unmaps): while held, cuMemUnmap waits here
// before it does anything, counted in UnmapsWaiting.
void HoldUnmaps(bool hold);
void WaitWhileUnmapsHeld();
int UnmapsWaiting();

// Sets every knob to its default, then applies the FAKE_CUDA_* environment
// variables (fake_cuda.h lists them).
void LoadKnobsFromEnvironment();

// Whether `device` can access memory located on `peer` (both valid
// ordinals): what cuDeviceCanAccessPeer(&can, device, peer) answers, so false
// for a device and itself, as on a real driver.
bool CanAccessPeer(int device, int peer);

// Sets whether devices a and b can access each other's memory (both ways,
// as FAKE_CUDA_NO_P2P names pairs). a and b in [0, kMaxDevices), a != b.
void SetPeerAccess(int a, int b, bool can_access);

// Counts one call against an armed countdown: true for the call that brings
// it from 1 to 0 (the n-th after arming), false otherwise or when disarmed.
bool ConsumeCountdown(std::atomic<int>& countdown);

}  // namespace fake
}  // namespace cu
}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_KNOBS_H_
