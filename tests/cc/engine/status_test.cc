// Status (engine/status.h): copies and moves keep the code and message.
#include <string>
#include <utility>

#include "engine/status.h"
#include "harness.h"

namespace lms {
namespace {

TEST(StatusIsCopiedAndMovedWithItsMessage) {
  const Status ok;
  EXPECT_TRUE(ok.ok());
  EXPECT_TRUE(ok.code() == StatusCode::kOk);
  EXPECT_TRUE(ok.message() == std::string());
  EXPECT_TRUE(ok.ToString() == std::string("OK"));
  Status error = ResourceExhausted("no room");
  Status copy = error;
  EXPECT_TRUE(copy.ToString() == std::string("RESOURCE_EXHAUSTED: no room"));
  EXPECT_TRUE(error.message() == std::string("no room"));  // the copy is deep
  Status moved = std::move(copy);
  EXPECT_TRUE(moved.code() == StatusCode::kResourceExhausted);
  copy = moved;
  EXPECT_TRUE(copy.message() == std::string("no room"));
  copy = ok;
  EXPECT_TRUE(copy.ok());
  const Status& same = error;
  error = same;  // self-assignment keeps the message
  EXPECT_TRUE(error.message() == std::string("no room"));
}

}  // namespace
}  // namespace lms
