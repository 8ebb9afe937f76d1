// The checker: which device ranges queued or running stream work references,
// and the violations the fake recorded.
//
// Every stream operation that touches memory (a copy, a kernel) is registered
// with its ranges when it is enqueued and completed after it ran, so between
// the two the range is "in flight". cuMemUnmap, cuMemSetAccess and
// cuMemAddressFree are not ordered after stream work by the real driver: an
// in-flight range hit by one of them is a race the backend must prevent, and
// the fake records it. Other violations (work touching memory without device
// access, an alias of an unmapped range) are recorded through Record.
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_CHECKER_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lms {
namespace cu {
namespace fake {

struct DeviceRange {
  uint64_t address = 0;
  size_t bytes = 0;
  bool writes = false;
};

// Registers in-flight work and returns its id; `what` describes it for
// violation texts ("cuMemcpyAsync(dst=0x..., ...) on stream 0x...").
uint64_t RegisterWork(std::string what, std::vector<DeviceRange> ranges);
void MarkWorkRunning(uint64_t id);
void CompleteWork(uint64_t id);

// Records a violation for every in-flight work item that references a byte
// of [address, address + bytes); `call` names the driver call. Returns
// whether there was any.
bool CheckNoWorkInFlight(const char* call, uint64_t address, size_t bytes);

void RecordViolation(std::string text);
size_t ViolationCount();
std::string ViolationText();
void ClearViolations();
size_t WorkInFlight();
size_t WorkRunning();

// Copies between memory of devices without a peer path, which the driver
// stages through host memory (device_work.cc), since the last reset.
void CountStagedCopy();
uint64_t StagedCopies();
void ResetStagedCopies();

// "[0x7f0000000000, +2097152)"
std::string DescribeRange(uint64_t address, size_t bytes);

}  // namespace fake
}  // namespace cu
}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_FAKE_CUDA_CHECKER_H_
