#include "common/units.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(ParseSizeTest, Accepted) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("512K"), 512u * 1024);
  EXPECT_EQ(*ParseSize("512k"), 512u * 1024);
  EXPECT_EQ(*ParseSize("4G"), 4ull << 30);
  EXPECT_EQ(*ParseSize("4GB"), 4ull << 30);
  EXPECT_EQ(*ParseSize("4GiB"), 4ull << 30);
  EXPECT_EQ(*ParseSize("1.5G"), 3ull << 29);
  EXPECT_EQ(*ParseSize("8M"), 8ull << 20);
  EXPECT_EQ(*ParseSize("2T"), 2ull << 40);
  EXPECT_EQ(*ParseSize("1e9"), 1000000000u);
  EXPECT_EQ(*ParseSize("5e8"), 500000000u);
  EXPECT_EQ(*ParseSize(" 7 "), 7u);
  EXPECT_EQ(*ParseSize("0"), 0u);
  EXPECT_EQ(*ParseSize("100B"), 100u);
}

TEST(ParseSizeTest, RejectedWithTheTextInTheMessage) {
  for (const char* bad : {"", "-1", "4X", "1.5", "abc", "4GG", "1e99", "20000P", "G", "1.2.3", "4 Gb/s", "15E"}) {
    auto r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("'" + std::string(bad) + "'"), std::string::npos) << r.status().message();
  }
}

TEST(ParseCountTest, DecimalSuffixes) {
  EXPECT_EQ(*ParseCount("124M"), 124000000u);
  EXPECT_EQ(*ParseCount("1.5B"), 1500000000u);
  EXPECT_EQ(*ParseCount("1.5G"), 1500000000u);
  EXPECT_EQ(*ParseCount("350K"), 350000u);
  EXPECT_EQ(*ParseCount("7e9"), 7000000000u);
  EXPECT_EQ(*ParseCount("2T"), 2000000000000u);
  for (const char* bad : {"1.5GiB", "12X", "-3", "0.5", ""}) {
    auto r = ParseCount(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("invalid count '" + std::string(bad) + "'"), std::string::npos);
  }
}

TEST(ParseParamCountTest, BoundedSoStateBytesFitInt64) {
  EXPECT_EQ(ParseParamCount("1.5B").value(), 1500000000);
  EXPECT_EQ(ParseParamCount("576460752303423488").value(), kMaxParamCount);
  for (const char* text : {"0", "576460752303423489", "1e19", "18446744073709551615", "-1", "x"}) {
    auto r = ParseParamCount(text);
    EXPECT_FALSE(r.ok()) << text;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().message();
    }
  }
}

TEST(FormatTest, BytesAndCounts) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(4ull << 30), "4.00 GiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatCount(124e6), "124.00 M");
  EXPECT_EQ(FormatCount(999), "999");
}

}  // namespace
}  // namespace zinf
