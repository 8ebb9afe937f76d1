// The environment settings' parsing and checks (engine/env_options.h), the
// cgroup memory limit that bounds the host limit's default, and a GPU's share
// of the host limit.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/env_options.h"
#include "harness.h"

namespace lms {
namespace {

using lms_test::Contains;

TEST(EnvironmentValuesAreCheckedAndNamed) {
  size_t bytes = 0;
  bool present = false;
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "12x", 1);
  Status s = HostLimitFromEnv(&bytes);
  EXPECT_TRUE(Contains(s.message(), "TF_GPU_HOST_MEM_LIMIT_IN_MB='12x'"));
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "0", 1);
  EXPECT_TRUE(!HostLimitFromEnv(&bytes).ok());
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "-2", 1);
  EXPECT_TRUE(Contains(HostLimitFromEnv(&bytes).message(), "is negative"));
  // Zero, one and an odd number of MiB against 2 MiB granules.
  std::string rounded;
  bytes = 0;
  EXPECT_TRUE(Contains(CheckMemorySetting("X", &bytes, 2 << 20, size_t{1} << 30, &rounded)
                           .message(), "less than one granule"));
  bytes = size_t{1} << 20;
  EXPECT_TRUE(!CheckMemorySetting("X", &bytes, 2 << 20, size_t{1} << 30, &rounded).ok());
  bytes = size_t{533} << 20;
  EXPECT_OK(CheckMemorySetting("X", &bytes, 2 << 20, size_t{1} << 30, &rounded));
  EXPECT_EQ(bytes, size_t{532} << 20);
  EXPECT_TRUE(Contains(rounded, "X=533 is not a whole number of 2 MiB granules: using 532"));
  setenv("TF_GPU_HOST_MEM_LIMIT_IN_MB", "3", 1);
  EXPECT_OK(HostLimitFromEnv(&bytes));
  EXPECT_EQ(bytes, size_t{3} << 20);
  unsetenv("TF_GPU_HOST_MEM_LIMIT_IN_MB");
  EXPECT_OK(HostLimitFromEnv(&bytes));
  EXPECT_EQ(bytes, kDefaultHostLimitBytes);
  bool flag = false;
  setenv("TF_LMS_STRICT", "maybe", 1);
  EXPECT_TRUE(Contains(FlagFromEnv("TF_LMS_STRICT", &present, &flag).message(),
                       "TF_LMS_STRICT='maybe'"));
  unsetenv("TF_LMS_STRICT");
}

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;

// A cgroup mount root in a temporary directory: the files a test writes
// under it are removed, with their directories, when it goes.
class FakeCgroups {
 public:
  FakeCgroups() {
    char dir[] = "/tmp/lms_cgroup_test_XXXXXX";
    if (mkdtemp(dir) != nullptr) root_ = dir;
    made_.push_back(root_);
  }
  ~FakeCgroups() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) {
      if (unlink(it->c_str()) != 0) rmdir(it->c_str());
    }
  }
  const std::string& root() const { return root_; }

  // Writes `text` to root()/`path` ("a/b/memory.max"), making its folders.
  void Write(const std::string& path, const std::string& text) {
    std::string dir = root_;
    for (size_t at = path.find('/'); at != std::string::npos; at = path.find('/', at + 1)) {
      dir = root_ + "/" + path.substr(0, at);
      if (mkdir(dir.c_str(), 0755) == 0) made_.push_back(dir);
    }
    const std::string file = root_ + "/" + path;
    std::FILE* f = std::fopen(file.c_str(), "w");
    if (f == nullptr) return;
    std::fputs(text.c_str(), f);
    std::fclose(f);
    made_.push_back(file);
  }

 private:
  std::string root_;
  std::vector<std::string> made_;  // in order of creation
};

TEST(CgroupV2LimitIsTheProcesssCgroupsMemoryMax) {
  FakeCgroups cgroups;
  ASSERT_TRUE(!cgroups.root().empty());
  cgroups.Write("user.slice/job.scope/memory.max", "8589934592\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "0::/user.slice/job.scope\n"), 8 * kGiB);
  // A container's namespace root: the path is "/", the file at the mount root.
  FakeCgroups container;
  container.Write("memory.max", "3221225472\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(container.root(), "0::/\n"), 3 * kGiB);
}

TEST(CgroupV2MaxIsNoLimit) {
  FakeCgroups cgroups;
  cgroups.Write("job/memory.max", "max\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "0::/job\n"), 0u);
}

TEST(CgroupV2SmallestLimitOfTheCgroupAndItsAncestorsWins) {
  FakeCgroups cgroups;
  // The kernel enforces every ancestor's limit: the outer 4 GiB binds the
  // innermost's 16 GiB, whatever lies between ("max").
  cgroups.Write("outer/memory.max", "4294967296\n");
  cgroups.Write("outer/middle/memory.max", "max\n");
  cgroups.Write("outer/middle/inner/memory.max", "17179869184\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "0::/outer/middle/inner\n"), 4 * kGiB);
  // A cgroup below a limited one without a file of its own still has it.
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "0::/outer/middle/other\n"), 4 * kGiB);
  // A sibling of the limited cgroup is not limited by it.
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "0::/elsewhere\n"), 0u);
}

TEST(CgroupV1LimitIsTheMemoryHierarchysLimitInBytes) {
  FakeCgroups cgroups;
  cgroups.Write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  cgroups.Write("memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
  // A hybrid machine: v1 controllers beside an empty v2 line.
  const std::string proc = "9:name=systemd:/docker/abc\n"
                           "4:memory:/docker/abc\n"
                           "1:cpu,cpuacct:/docker/abc\n"
                           "0::/\n";
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), proc), 2 * kGiB);
  // The memory controller mounted with others is still found.
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "5:cpu,memory:/docker/abc\n"), 2 * kGiB);
}

TEST(CgroupV1UnlimitedValueIsNoLimit) {
  FakeCgroups cgroups;
  cgroups.Write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  cgroups.Write("memory/job/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "4:memory:/job\n"), 0u);
}

TEST(MissingCgroupFilesSetNoLimit) {
  FakeCgroups cgroups;
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "0::/job\n4:memory:/job\n"), 0u);
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), ""), 0u);
  EXPECT_EQ(CgroupMemoryLimitBytes("/nonexistent/lms_cgroups", "0::/\n"), 0u);
  // A path outside the namespace's mount reads the mount root only.
  cgroups.Write("memory.max", "1073741824\n");
  EXPECT_EQ(CgroupMemoryLimitBytes(cgroups.root(), "0::/../sibling\n"), 1 * kGiB);
}

TEST(TheHostLimitsDefaultHonoursTheCgroupsLimit) {
  const size_t granule = 2 * kMiB;
  // No cgroup limit: TensorFlow's 64 GiB, or the machine's memory if less.
  EXPECT_EQ(DefaultHostLimitBytes(granule, 256 * kGiB, 0), kDefaultHostLimitBytes);
  EXPECT_EQ(DefaultHostLimitBytes(granule, 32 * kGiB, 0), 32 * kGiB);
  // A cgroup limit below both makes the default smaller, in whole granules.
  EXPECT_EQ(DefaultHostLimitBytes(granule, 32 * kGiB, 8 * kGiB + kMiB), 8 * kGiB);
  EXPECT_EQ(DefaultHostLimitBytes(granule, 256 * kGiB, 100 * kGiB), kDefaultHostLimitBytes);
  EXPECT_EQ(DefaultHostLimitBytes(granule, 16 * kGiB, 100 * kGiB), 16 * kGiB);
  // A cgroup of less than a granule still leaves a valid value.
  EXPECT_EQ(DefaultHostLimitBytes(granule, 16 * kGiB, kMiB), granule);
  // The settings read this process's cgroup.
  unsetenv("TF_GPU_HOST_MEM_LIMIT_IN_MB");
  Settings settings;
  std::vector<std::string> notes;
  EXPECT_OK(ReadSettingsFromEnv(&settings, &notes));
  EXPECT_EQ(settings.engine.host_bytes,
            DefaultHostLimitBytes(settings.granule_bytes, MachineMemoryBytes(),
                                  ProcessCgroupMemoryLimitBytes()));
}

TEST(EachGpuGetsAnEqualShareOfTheHostLimitInWholeGranules) {
  const size_t granule = 2 * kMiB;
  const size_t limit = 64 * kGiB;
  EXPECT_EQ(HostShareBytes(limit, 1, granule), limit);
  EXPECT_EQ(HostShareBytes(limit, 2, granule), 32 * kGiB);
  EXPECT_EQ(HostShareBytes(limit, 3, granule), 21844 * kMiB);  // 21845.3 MiB, rounded down
  EXPECT_EQ(HostShareBytes(limit, 8, granule), 8 * kGiB);
  for (size_t gpus : {1, 2, 3, 8}) {
    EXPECT_TRUE(HostShareBytes(limit, gpus, granule) * gpus <= limit);
    EXPECT_EQ(HostShareBytes(limit, gpus, granule) % granule, 0u);
  }
  // Rounded down to the granule asked for: 10 MiB / 3 on 2 MiB granules.
  EXPECT_EQ(HostShareBytes(10 * kMiB, 3, granule), 2 * kMiB);
  EXPECT_EQ(HostShareBytes(100 * kMiB, 3, 8 * kMiB), 32 * kMiB);
  // Never zero: a limit of fewer granules than GPUs still gives each one.
  EXPECT_EQ(HostShareBytes(2 * kMiB, 8, granule), granule);
  EXPECT_EQ(HostShareBytes(limit, 0, granule), limit);  // no peers known: one GPU
  EXPECT_EQ(HostShareBytes(0, 4, granule), 0u);         // no host pool stays none
}

}  // namespace
}  // namespace lms
