// The checks of the single-threaded C++ tests: EXPECT(condition) prints the
// failed condition and its line, and counts it; main returns 1 if any failed.
#pragma once

#include <cstdio>

namespace openreg_test {

inline int failed = 0;

inline void check(bool ok, const char* what, int line) {
  if (!ok) {
    std::printf("  FAILED line %d: %s\n", line, what);
    ++failed;
  }
}

} // namespace openreg_test

#define EXPECT(...) ::openreg_test::check(static_cast<bool>(__VA_ARGS__), #__VA_ARGS__, __LINE__)
