// A minimal test harness for the engine's C++ tests, which run under the
// sanitizers without any third-party dependency. Each TEST registers itself;
// main() runs them all and ends with "N passed, N failed".
#ifndef TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_HARNESS_H_
#define TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_HARNESS_H_

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace lms_test {

struct TestCase {
  const char* name;
  std::function<void()> body;
};

inline std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

inline int& Failures() {
  static int failures = 0;
  return failures;
}

struct Registrar {
  Registrar(const char* name, std::function<void()> body) {
    Registry().push_back({name, std::move(body)});
  }
};

// Whether `text` contains `part`: what an error message must name.
inline bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline int RunAll(int argc, char** argv) {
  int passed = 0, failed = 0;
  for (const TestCase& t : Registry()) {
    if (argc > 1 && std::string(t.name).find(argv[1]) == std::string::npos) continue;
    const int before = Failures();
    t.body();
    if (Failures() == before) {
      ++passed;
      std::printf("[ OK ] %s\n", t.name);
    } else {
      ++failed;
      std::printf("[FAIL] %s\n", t.name);
    }
    std::fflush(stdout);
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace lms_test

#define TEST(name)                                               \
  static void name();                                            \
  static ::lms_test::Registrar name##_registrar(#name, name);    \
  static void name()

// A test with a fixture: a struct with `bool SetUp()`, whose members the
// body uses. It is made before the body, which runs only if SetUp() returns
// true, and destroyed after it: its destructor is where the checks every
// test of the fixture ends with belong. ASSERT_TRUE leaves the body, not the
// fixture.
#define TEST_F(fixture, name)                                    \
  struct name##_Test : fixture {                                 \
    void Body();                                                 \
  };                                                             \
  static void name() {                                           \
    name##_Test test;                                            \
    if (test.SetUp()) test.Body();                               \
  }                                                              \
  static ::lms_test::Registrar name##_registrar(#name, name);    \
  void name##_Test::Body()

#define EXPECT_TRUE(cond)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::printf("  %s:%d: expected %s\n", __FILE__, __LINE__, #cond);    \
      ++::lms_test::Failures();                                            \
    }                                                                      \
  } while (0)

#define ASSERT_TRUE(cond)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::printf("  %s:%d: expected %s\n", __FILE__, __LINE__, #cond);    \
      ++::lms_test::Failures();                                            \
      return;                                                              \
    }                                                                      \
  } while (0)

#define EXPECT_EQ(a, b)                                                        \
  do {                                                                         \
    const auto lms_a_ = (a);                                                   \
    const auto lms_b_ = (b);                                                   \
    if (!(lms_a_ == lms_b_)) {                                                 \
      std::printf("  %s:%d: expected %s == %s (%lld vs %lld)\n", __FILE__,    \
                  __LINE__, #a, #b, static_cast<long long>(lms_a_),            \
                  static_cast<long long>(lms_b_));                             \
      ++::lms_test::Failures();                                                \
    }                                                                          \
  } while (0)

#define EXPECT_OK(expr)                                                        \
  do {                                                                         \
    const ::lms::Status lms_s_ = (expr);                                       \
    if (!lms_s_.ok()) {                                                        \
      std::printf("  %s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,      \
                  lms_s_.ToString().c_str());                                  \
      ++::lms_test::Failures();                                                \
    }                                                                          \
  } while (0)

#endif  // TENSORFLOW_LMS_ALLOCATOR_TESTS_CC_HARNESS_H_
