// The adapter's C++ unit tests (tests/cc/adapter/*_test.cc):
// one binary built with the package's test entry points against TensorFlow's
// framework library, with no TensorFlow runtime (CMakeLists.txt, adapter_test;
// `make test-adapter` runs it).
#include "harness.h"

int main(int argc, char** argv) { return lms_test::RunAll(argc, argv); }
