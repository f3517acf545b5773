// Paths for tests: the source tree, the build tree, and a scratch directory
// for tests that need disk ($ZINF_TEST_DIR when set, else <build>/test-scratch;
// each test stays under 2 GB there).
#pragma once

#include <sys/stat.h>

#include <cstdlib>
#include <string>

namespace zinf::test {

inline std::string SourceDir() { return ZINF_TEST_SOURCE_DIR; }
inline std::string BinaryDir() { return ZINF_TEST_BINARY_DIR; }

// Created on first use.
inline std::string TestDir() {
  const char* env = std::getenv("ZINF_TEST_DIR");
  std::string dir = env && *env ? env : ZINF_TEST_DIR_DEFAULT;
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      ::mkdir(partial.c_str(), 0755);
    }
  }
  return dir;
}

}  // namespace zinf::test
