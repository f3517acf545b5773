#include "zinf/status.h"

#include <gtest/gtest.h>

#include <string>

namespace zinf {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CodeAndMessage) {
  Status s = IoError("pread /x offset=0 len=4096: Input/output error (errno 5)");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.ToString(), "IoError: pread /x offset=0 len=4096: Input/output error (errno 5)");
}

TEST(StatusTest, ContextIsPrependedInOrder) {
  Status s = DataLoss("checksum mismatch").WithContext("read tensor 7").WithContext("prefetch unit 12");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "prefetch unit 12: read tensor 7: checksum mismatch");
}

TEST(StatusTest, ContextOnOkStaysOk) {
  Status s = Status::Ok().WithContext("anything");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, EveryCodeHasAName) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c)
    EXPECT_NE(StatusCodeName(static_cast<StatusCode>(c)), "Unknown") << c;
}

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  ZINF_ASSIGN_OR_RETURN(int h, Half(x));
  ZINF_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  ZINF_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(ResultTest, ValueAndError) {
  auto ok = Quarter(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 2);
  auto bad = Quarter(6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "odd: 3");
  EXPECT_EQ(bad.value_or(-1), -1);
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

TEST(ResultTest, OkStatusWithoutValueBecomesInternal) {
  Result<int> r = Status::Ok();
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> r = NotFound("no such unit");
  EXPECT_DEATH((void)r.value(), "no such unit");
}

}  // namespace
}  // namespace zinf
