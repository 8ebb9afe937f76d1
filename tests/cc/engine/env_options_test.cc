// The environment settings' parsing and checks (engine/env_options.h).
#include <cstdlib>
#include <string>

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

}  // namespace
}  // namespace lms
