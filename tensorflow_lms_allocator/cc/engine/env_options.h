// Every setting LMS reads from the environment, read in one place into typed
// options with their defaults, with errors that name the variable and the
// value. Every front end (the TensorFlow adapter, the Python binding, the
// benchmarks) goes through here, so a setting means the same thing everywhere.
//
// Note [One place for settings]
// No other file under cc/ reads the environment (Python reads it only to know
// whether LMS is asked for and whether the emulated device is, before any of
// this is loaded: overlay/activation.py).
// The engine (EngineOptions' member defaults),
// the Python binding (its keyword defaults) and TensorFlow's path
// (ReadSettingsFromEnv) take their defaults from the constants below, and
// kSettings lists each variable with its default as the README's settings
// table and docs/settings.md state it (tests/test_documents.py checks
// both against it, and the defaults ReadSettingsFromEnv gives against it).
// Where a front end's default differs on purpose, it says so here: LMS is on
// for an engine made directly (EngineOptions: why else make one) and off for
// TensorFlow until asked for (kDefaultLmsEnabled).
//
// Two levels of checking:
//   - MegabytesFromEnv / FlagFromEnv / HostLimitFromEnv check the syntax
//     (a whole number of MiB, a boolean). The engine's own Python API uses
//     them with whatever granule size it is given.
//   - CheckMemorySetting checks that a size gives a working device: at least
//     one granule and no more than the machine's memory; a value that is not
//     a whole number of granules is rounded down, and the caller says so
//     (never silently). ReadSettingsFromEnv applies it to
//     TF_LMS_CPU_DEVICE_MEMORY_MB and TF_GPU_HOST_MEM_LIMIT_IN_MB.
#ifndef TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_
#define TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/reclaim_policy.h"
#include "engine/small_pages.h"
#include "engine/status.h"

namespace lms {

// TensorFlow's default for TF_GPU_HOST_MEM_LIMIT_IN_MB: 64 GiB.
inline constexpr size_t kDefaultHostLimitBytes = size_t{1} << 36;
// TF_LMS_POLICY's: the learned order moved no more bytes than LRU in every
// case `make bench-policy` replays, and 4-33% fewer on CNNs
// (docs/decisions/0002-learned-policy-default.md).
inline constexpr PolicyKind kDefaultPolicy = PolicyKind::kLearned;
// TF_LMS_GRANULE_MB's: 2 MiB, as on current NVIDIA GPUs; at most 1 GiB.
inline constexpr size_t kDefaultGranuleBytes = size_t{2} << 20;
inline constexpr size_t kMaxGranuleBytes = size_t{1} << 30;
// TF_LMS_ENABLED's: TensorFlow's devices run without LMS until asked for.
inline constexpr bool kDefaultLmsEnabled = false;
// TF_LMS_DEFRAG_ENABLED's: a remap moves no data and costs a mapping call,
// while the eviction it spares copies the allocation.
inline constexpr bool kDefaultDefragEnabled = true;
// TF_LMS_STRICT's.
inline constexpr bool kDefaultStrict = false;
// TF_LMS_UNMAP_EVICTED's: off, since a touch of an evicted tensor without a
// pin then faults (on a GPU the CUDA context dies); on the GPU model it
// shortened steps under pressure by 0.02-0.23 of the ideal step
// (docs/decisions/0020-evicted-tensors-unmapped.md), never measured on a GPU.
inline constexpr bool kDefaultUnmapEvicted = false;
// TF_LMS_PREFETCH's: on the 2-core emulated device it moved more bytes and
// gained no step time (docs/decisions/0003-prefetch-off-by-default.md).
inline constexpr bool kDefaultPrefetch = false;
// TF_LMS_HOST_AHEAD_MB's: 1 GiB of pinned host memory per GPU made at its
// creation, so that the first evictions (on an H200, making 64 MiB took ten
// times its copy) need not make it (Note [Host memory made ahead] in
// engine.h).
inline constexpr size_t kDefaultHostAheadBytes = size_t{1} << 30;
// TF_LMS_CUDA_DRIVER_PATH names the CUDA driver library to load instead of
// libcuda.so.1 (a testing knob: the tests' fake driver).
inline constexpr char kCudaDriverPathEnv[] = "TF_LMS_CUDA_DRIVER_PATH";
inline constexpr char kDefaultCudaDriverPath[] = "libcuda.so.1";

// The emulated device's memory in transparent huge pages (TF_LMS_HUGE_PAGES):
// as the machine allows (kAuto: kAdvise, else kCollapse, else kOff), or one
// way whatever the machine (tests take each path on machines that refuse it;
// it stays correct, only slower). The POSIX backend says what each means.
enum class HugePages { kAuto, kAdvise, kCollapse, kOff };

struct EngineOptions {
  // The device pool's size: the device's memory (rounded down to granules).
  size_t device_bytes = 0;
  // The host pool's size: swap space for evicted allocations
  // (TF_GPU_HOST_MEM_LIMIT_IN_MB, or a GPU's share of it). Zero disables
  // eviction's destination.
  size_t host_bytes = 0;
  // Requests below this many bytes are packed into small-object pages
  // (evicted a page at a time). Zero means one granule.
  size_t small_object_threshold = 0;
  // Small objects below this many bytes share pages only with each other
  // (Note [Size classes] in small_pages.h). Zero: one class for all.
  size_t tiny_object_threshold = SmallPages::kTinyBytes;
  // Evict inactive allocations when the device pool runs out. Off, the engine
  // is a plain capped allocator. On for an engine made directly; TensorFlow's
  // devices start from kDefaultLmsEnabled (Settings).
  bool lms_enabled = true;
  // Remap granules cached at free address ranges to where they are needed.
  // Off, granules cached at a free range serve only allocations placed there
  // (classic fragmentation).
  bool defrag_enabled = kDefaultDefragEnabled;
  // Map evicted memory with no access and report unpinned touches.
  bool strict = kDefaultStrict;
  // Leave an evicted unit's address with nothing mapped unless it is
  // touched in place: a touch without a pin then faults (Note [Evicted
  // tensors unmapped] in engine.h). Strict mode wins where both are on.
  bool unmap_evicted = kDefaultUnmapEvicted;
  // Which inactive allocations a reclaim evicts first: LRU, or the learned
  // farthest-next-use order (Note [Learned eviction] in learned_policy.h).
  PolicyKind policy = kDefaultPolicy;
  // Host memory made when the engine is created, so that evictions need not
  // make it (Note [Host memory made ahead] in engine.h; TF_LMS_HOST_AHEAD_MB;
  // at most host_bytes). Zero for an engine made directly.
  size_t host_ahead_bytes = 0;
  // Where host_bytes is one device's share of a process-wide limit (a GPU's
  // share of TF_GPU_HOST_MEM_LIMIT_IN_MB, HostShareBytes): that limit and
  // the number of devices that split it, for messages. The engine reads
  // neither. 0 and 1: host_bytes is the limit itself.
  size_t host_limit_bytes = 0;
  size_t host_limit_devices = 1;
};

// What the environment asks of every LMS device TensorFlow makes: the
// engine's options (device_bytes is the emulated device's, 0: none;
// host_bytes the process's TF_GPU_HOST_MEM_LIMIT_IN_MB: the emulated
// device's host pool, split among the GPUs (HostShareBytes); a GPU's
// GPUOptions may turn more on, gpu_devices.h) and the front ends' own.
struct Settings {
  EngineOptions engine = [] {
    EngineOptions options;
    options.lms_enabled = kDefaultLmsEnabled;
    options.host_ahead_bytes = kDefaultHostAheadBytes;
    return options;
  }();
  // TF_LMS_PREFETCH: with the learned policy, page in ahead of use.
  bool prefetch = kDefaultPrefetch;
  // TF_LMS_GRANULE_MB: the memory behind one mapping, the unit in which every
  // allocation of a granule or more is rounded up and evicted (the emulated
  // device's granule; a GPU's is the larger of this and its driver's). A GPU
  // driver's remap costs per mapping, not per byte, so on a GPU a larger
  // granule moves a swapped byte faster
  // (docs/decisions/0006-granule-size-on-gpus.md).
  size_t granule_bytes = kDefaultGranuleBytes;
  // TF_LMS_HUGE_PAGES: auto or off.
  HugePages huge_pages = HugePages::kAuto;
};

// One variable LMS reads, its default as the documents state it, and
// whether it is a user's setting (the README's table) or another's variable
// LMS reads too (TensorFlow's, or a testing knob: docs/settings.md).
struct SettingInfo {
  const char* name;
  const char* default_value;
  bool in_readme;
};

inline constexpr std::array<SettingInfo, 14> kSettings = {{
    {"TF_LMS_ENABLED", "off", true},
    {"TF_LMS_DEFRAG_ENABLED", "on", true},
    {"TF_LMS_CPU_DEVICE_MEMORY_MB", "unset", true},
    {"TF_GPU_HOST_MEM_LIMIT_IN_MB", "65536", true},
    {"TF_LMS_POLICY", "learned", true},
    {"TF_LMS_PREFETCH", "off", true},
    {"TF_LMS_HOST_AHEAD_MB", "1024", true},
    {"TF_LMS_GRANULE_MB", "2", true},
    {"TF_LMS_HUGE_PAGES", "auto", true},
    {"TF_LMS_STRICT", "off", true},
    {"TF_LMS_UNMAP_EVICTED", "off", true},
    {kCudaDriverPathEnv, kDefaultCudaDriverPath, false},
    {"TF_GPU_ALLOCATOR", "unset", false},
    {"TF_FORCE_GPU_ALLOW_GROWTH", "unset", false},
}};

// Reads every TF_LMS_* variable of kSettings and TF_GPU_HOST_MEM_LIMIT_IN_MB
// into *out, each absent one at its default. kInvalidArgument names the
// variable, its value and what is valid. *notes receives one line per value
// used otherwise than written (a size rounded down to whole granules) or
// that does nothing (prefetching without the learned policy), for the
// caller to log, also when a later setting is refused (*out is then
// untouched).
Status ReadSettingsFromEnv(Settings* out, std::vector<std::string>* notes);

// The CUDA driver library to load: TF_LMS_CUDA_DRIVER_PATH, else
// libcuda.so.1.
std::string CudaDriverPathFromEnv();

// TF_GPU_ALLOCATOR (TensorFlow's choice of its own GPU allocator), or "".
std::string TensorFlowGpuAllocatorFromEnv();

// Whether TF_FORCE_GPU_ALLOW_GROWTH is set to a boolean, which overrides a
// GPU's allow_growth as in TensorFlow (*value: the one set). TensorFlow reads
// it as "true"/"false" and reports a value it rejects itself, so only a valid
// one counts here.
bool ForcedGpuAllowGrowthFromEnv(bool* value);

// Reads a whole number of MiB from `name`. Unset or empty leaves *bytes as
// it is and sets *present to false. Anything but digits (a negative number
// is said to be one), or a value that overflows, is kInvalidArgument naming
// the variable and the value. Zero is read as zero: the caller's range check
// says what is valid.
Status MegabytesFromEnv(const char* name, bool* present, size_t* bytes);

// Reads a boolean ("1", "true", "0", "false", any case) from `name`.
Status FlagFromEnv(const char* name, bool* present, bool* value);

// The host pool's size: TF_GPU_HOST_MEM_LIMIT_IN_MB (not zero), else 64 GiB.
Status HostLimitFromEnv(size_t* bytes);

// The machine's physical memory (sysconf(_SC_PHYS_PAGES) pages). Neither the
// emulated device nor the host pool can hold more than this, so it bounds
// both settings; the host pool is a sparse file, so a limit costs nothing
// until evicted tensors fill it.
size_t MachineMemoryBytes();

// The largest valid value of a memory setting: `machine_bytes` rounded down
// to whole granules.
size_t MaxMemorySettingBytes(size_t granule_bytes, size_t machine_bytes);

// Checks that *bytes, read from the environment variable `name`, gives a
// working pool of `granule_bytes` granules on a machine with `machine_bytes`
// of memory: between one granule and MaxMemorySettingBytes.
// kInvalidArgument otherwise, naming the variable, its value and the valid
// range. A value that is not a whole number of granules is rounded down in
// *bytes and *rounded says so in one line (untouched otherwise), for the
// caller to log. `granule_bytes` must be a multiple of 1 MiB.
Status CheckMemorySetting(const char* name, size_t* bytes, size_t granule_bytes,
                          size_t machine_bytes, std::string* rounded);

// TF_GPU_HOST_MEM_LIMIT_IN_MB's default on a machine with `machine_bytes`
// in a cgroup limited to `cgroup_bytes` (0: no limit, CgroupMemoryLimitBytes):
// TensorFlow's 64 GiB, or the smaller of the two memories if less, rounded
// down to whole granules (so the default is valid on every machine and in
// every container; the cgroup's limit covers the whole process, so a pool
// that filled it would still meet the kernel's OOM killer first).
size_t DefaultHostLimitBytes(size_t granule_bytes, size_t machine_bytes,
                             size_t cgroup_bytes);

// The memory limit of the cgroup a process is in, or 0 where none is set.
// `proc_self_cgroup` is the text of /proc/self/cgroup; `cgroup_root` is
// where the hierarchies are mounted (/sys/fs/cgroup). The limit is the
// smallest of the cgroup's and its ancestors' up to the mount root (the
// kernel enforces each of them):
//   - cgroup v2, the `0::/path` line: `memory.max` of cgroup_root/path and
//     up, each a number of bytes or "max" (none);
//   - cgroup v1, the `N:...memory...:/path` line: `memory.limit_in_bytes` of
//     cgroup_root/memory/path and up, where an unlimited cgroup reads about
//     2^63 (any value of 2^62 or more counts as none).
// A file that is missing or unreadable sets no limit. In a container the
// path is often "/" (the namespace's root, which its mount shows), and
// where the path is one of the host's the mount root still has the
// container's limit; a path that leaves the mount ("..") is read at the
// mount root only.
size_t CgroupMemoryLimitBytes(const std::string& cgroup_root,
                              const std::string& proc_self_cgroup);

// CgroupMemoryLimitBytes of this process: /sys/fs/cgroup, /proc/self/cgroup.
size_t ProcessCgroupMemoryLimitBytes();

// One device's share of a host memory limit that `devices` devices split
// (TF_GPU_HOST_MEM_LIMIT_IN_MB among the GPUs TensorFlow creates): the
// limit divided evenly, rounded down to whole granules, and at least one
// granule, so that every GPU can evict. The shares add up to no more than
// the limit unless it holds fewer granules than there are devices. A zero
// limit (no host pool) stays zero; zero devices count as one.
size_t HostShareBytes(size_t limit_bytes, size_t devices, size_t granule_bytes);

}  // namespace lms

#endif  // TENSORFLOW_LMS_ALLOCATOR_CC_ENGINE_ENV_OPTIONS_H_
