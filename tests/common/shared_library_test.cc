#include "common/shared_library.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace zinf {
namespace {

TEST(SharedLibraryTest, OpensTheFirstCandidateThatLoadsAndResolves) {
  auto lib = SharedLibrary::Open("libc", {"/nonexistent/libc.so.6", "libc.so.6"}, "a test", "none");
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  EXPECT_EQ(lib->path(), "libc.so.6");
  pid_t (*get_pid)() = nullptr;
  ASSERT_TRUE(lib->Resolve("getpid", get_pid).ok());
  EXPECT_EQ(get_pid(), ::getpid());
}

TEST(SharedLibraryTest, MissingLibraryNamesEveryCandidateAndTheRemedy) {
  auto lib = SharedLibrary::Open("Nope", {"/nonexistent/libnope.so.1", "libnope.so.1"}, "needed by nothing",
                                 "install libnope");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kNotFound);
  const std::string m = lib.status().message();
  EXPECT_EQ(m.rfind("Nope could not be loaded (needed by nothing): tried /nonexistent/libnope.so.1 (", 0), 0u) << m;
  EXPECT_NE(m.find(", libnope.so.1 ("), std::string::npos) << m;
  EXPECT_NE(m.find("; install libnope"), std::string::npos) << m;
}

TEST(SharedLibraryTest, MissingSymbolNamesLibraryAndSymbol) {
  auto lib = SharedLibrary::Open("libc", {"libc.so.6"}, "a test", "none");
  ASSERT_TRUE(lib.ok());
  void (*fn)() = nullptr;
  Status s = lib->Resolve("zinf_no_such_symbol", fn);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("libc: libc.so.6 has no symbol zinf_no_such_symbol"), std::string::npos) << s.ToString();
  EXPECT_EQ(fn, nullptr);
}

}  // namespace
}  // namespace zinf
