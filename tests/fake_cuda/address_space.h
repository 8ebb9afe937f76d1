// Device virtual addresses: reservations, mappings and their access, and the
// alias through which stream work reaches mapped memory (Note [Fake CUDA
// driver] in fake_cuda.h).
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_ADDRESS_SPACE_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_ADDRESS_SPACE_H_

#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <string>

namespace lms {
namespace cu {
namespace fake {

// The alias of [address, address + bytes) for work running on `device`, if
// the range lies in one reservation and every byte is mapped with device
// access (READWRITE when `writes`); otherwise null, with the reason in *why.
// The alias stays valid until the range is unmapped.
void* ResolveForDevice(int device, uint64_t address, size_t bytes, bool writes,
                       std::string* why);

// Held shared by stream work while it moves bytes through an alias, and
// exclusively by cuMemUnmap while it replaces the alias of a range that work
// in flight references (a violation already recorded), so a racing copy
// writes before or after the replacement, never while the mapping changes.
// Taken after Memory().mu, never while holding it in the other order.
std::shared_mutex& AliasMutex();

// The device whose memory backs every byte of [address, address + bytes),
// or -1 if the range is not wholly mapped inside one reservation, or maps
// host-located memory or memory of several devices.
int DeviceHolding(uint64_t address, size_t bytes);

// Whether [address, address + bytes) lies in one reservation: what a copy
// call checks when it is enqueued (mappings are checked when it runs).
bool InsideOneReservation(uint64_t address, size_t bytes);

// Unmaps and frees every reservation and frees every handle; returns how
// many mappings, reservations and handles there were. Only with no stream
// work in flight (the aliases go).
size_t DestroyAllMemory();

}  // namespace fake
}  // namespace cu
}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_ADDRESS_SPACE_H_
