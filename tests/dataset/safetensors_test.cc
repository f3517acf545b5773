// safetensors: writer/reader round trips, every header violation rejected
// with an error naming the tensor, and a bounded fuzz campaign over
// malformed files (each rejected with a message or read consistently,
// never a crash).
#include "data/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "common/float16.h"
#include "data_test_util.h"

namespace zinf::data {
namespace {

using test::FreshDir;
using test::ReadFile;

std::vector<std::byte> MakeFile(const std::string& header, size_t data_bytes, uint8_t fill = 0x3C) {
  std::vector<std::byte> f(8 + header.size() + data_bytes, std::byte{fill});
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f[i] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(f.data() + 8, header.data(), header.size());
  return f;
}

TEST(SafetensorsTest, WriterAndReaderRoundTrip) {
  const std::string path = FreshDir() + "/t.safetensors";
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
  std::vector<uint16_t> f16 = {FloatToHalfBits(0.5f), FloatToHalfBits(-65504.0f)};
  std::vector<uint16_t> bf16 = {FloatToBf16Bits(3.0f), FloatToBf16Bits(-1e30f), FloatToBf16Bits(2.0f)};
  std::vector<int32_t> i32 = {7, -8};
  auto w = SafetensorsWriter::Begin(path,
                                    {{"w.f32", "F32", {2, 3}},
                                     {"empty", "F32", {0, 4}},
                                     {"h.f16", "F16", {2}},
                                     {"b.bf16", "BF16", {3, 1}},
                                     {"ints", "I32", {2}},
                                     {"scalar", "F64", {}}},
                                    {{"format", "pt"}});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // w.f32 in two pieces.
  ASSERT_TRUE(w->Write("w.f32", std::as_bytes(std::span(f32).first(4))).ok());
  ASSERT_TRUE(w->Write("w.f32", std::as_bytes(std::span(f32).subspan(4))).ok());
  ASSERT_TRUE(w->Write("h.f16", std::as_bytes(std::span(f16))).ok());
  ASSERT_TRUE(w->Write("b.bf16", std::as_bytes(std::span(bf16))).ok());
  ASSERT_TRUE(w->Write("ints", std::as_bytes(std::span(i32))).ok());
  const double scalar = 0.1;
  ASSERT_TRUE(w->Write("scalar", std::as_bytes(std::span(&scalar, 1))).ok());
  EXPECT_FALSE(std::filesystem::exists(path));  // not before Finish
  ASSERT_TRUE(w->Finish().ok());

  const std::string raw = ReadFile(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);  // data 8-byte aligned, header padded with spaces
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(raw[8 + header_len - 1] == ' ' || raw[8 + header_len - 1] == '}', true);

  auto r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors().size(), 6u);
  EXPECT_EQ(r->metadata().at("format"), "pt");
  const SafetensorsTensor* t = r->Find("w.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, "F32");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->ShapeString(), "[2, 3]");
  std::vector<float> out(6);
  ASSERT_TRUE(SafetensorsReader::ReadAsFloat32(*t, out).ok());
  EXPECT_EQ(std::memcmp(out.data(), f32.data(), 24), 0);
  out.resize(2);
  ASSERT_TRUE(SafetensorsReader::ReadAsFloat32(*r->Find("h.f16"), out).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, -65504.0f}));
  out.resize(3);
  ASSERT_TRUE(SafetensorsReader::ReadAsFloat32(*r->Find("b.bf16"), out).ok());
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[1], Bf16BitsToFloat(FloatToBf16Bits(-1e30f)));
  EXPECT_EQ(r->Find("empty")->num_elems(), 0);
  EXPECT_EQ(r->Find("scalar")->num_elems(), 1);
  EXPECT_EQ(r->Find("scalar")->shape.size(), 0u);
  Status not_float = SafetensorsReader::ReadAsFloat32(*r->Find("ints"), std::span<float>(out.data(), 2));
  EXPECT_NE(not_float.message().find("tensor 'ints': dtype I32 is not a float type"), std::string::npos);
  for (size_t i = 1; i < r->tensors().size(); ++i) {
    EXPECT_LE(r->tensors()[i - 1].offset_bytes, r->tensors()[i].offset_bytes);
  }
}

TEST(SafetensorsTest, WriterEnforcesOrderAndSizes) {
  const std::string dir = FreshDir();
  const std::vector<float> four(4, 1.0f);
  {
    auto w = SafetensorsWriter::Begin(dir + "/a.safetensors", {{"a", "F32", {2}}, {"b", "F32", {2}}});
    ASSERT_TRUE(w.ok());
    Status s = w->Write("b", std::as_bytes(std::span(four).first(2)));
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("bytes for 'b' while 'a' is being written (0 of 8 bytes)"), std::string::npos)
        << s.ToString();
    s = w->Write("a", std::as_bytes(std::span(four)));
    EXPECT_NE(s.message().find("tensor 'a' is 8 bytes; got 16"), std::string::npos) << s.ToString();
    ASSERT_TRUE(w->Write("a", std::as_bytes(std::span(four).first(2))).ok());
    s = w->Finish();
    EXPECT_NE(s.message().find("tensor 'b' has 0 of 8 bytes"), std::string::npos) << s.ToString();
  }  // dropped unfinished: nothing left behind
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "temporary file left behind";
  EXPECT_FALSE(SafetensorsWriter::Begin(dir + "/b.safetensors", {{"a", "F32", {1}}, {"a", "F32", {1}}}).ok());
  EXPECT_FALSE(SafetensorsWriter::Begin(dir + "/b.safetensors", {{"a", "Q4", {1}}}).ok());
  EXPECT_FALSE(SafetensorsWriter::Begin(dir + "/b.safetensors", {{"__metadata__", "F32", {1}}}).ok());
  EXPECT_FALSE(SafetensorsWriter::Begin(dir + "/b.safetensors", {{"a", "F32", {-1}}}).ok());
  auto bad_dir = SafetensorsWriter::Begin(dir + "/no/such/dir/c.safetensors", {{"a", "F32", {1}}});
  ASSERT_FALSE(bad_dir.ok());
  EXPECT_NE(bad_dir.status().message().find("no/such/dir/c.safetensors"), std::string::npos);
}

struct BadCase {
  std::string header;
  size_t data_bytes;
  std::string needle;
};

TEST(SafetensorsTest, EveryHeaderViolationIsNamed) {
  const std::string ok_a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::vector<BadCase> cases = {
      {"", 0, "header does not start with '{'"},
      {"   {}", 0, "header does not start with '{'"},
      {"{\"a\": ", 0, "not valid JSON"},
      {"{" + ok_a + ", " + ok_a + "}", 8, "repeats the key 'a'"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "dtype": "F16"}})", 8,
       "repeats the key 'dtype'"},
      {"[1]", 0, "header does not start with '{'"},
      {R"({"a": 1})", 0, "tensor 'a': expected an object"},
      {R"({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}})", 8, "tensor 'a': unknown dtype 'Q4'"},
      {R"({"a": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}})", 8, "tensor 'a': dtype is not a string"},
      {R"({"a": {"shape": [2], "data_offsets": [0, 8]}})", 8, "tensor 'a': missing field 'dtype'"},
      {R"({"a": {"dtype": "F32", "data_offsets": [0, 8]}})", 8, "tensor 'a': missing field 'shape'"},
      {R"({"a": {"dtype": "F32", "shape": [2]}})", 8, "tensor 'a': missing field 'data_offsets'"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1}})", 8, "tensor 'a': unknown field 'x'"},
      {R"({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})", 8, "tensor 'a': shape is not an array"},
      {R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8,
       "tensor 'a': shape [-2] has a dimension"},
      {R"({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})", 8,
       "tensor 'a': shape [2.0] has a dimension"},
      {R"({"a": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}})", 4,
       "more than the limit of 8"},
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8,
       "has too many elements"},
      {R"({"a": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 8]}})", 8, "overflows"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8,
       "tensor 'a': data_offsets [8, 0) ends before it begins"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8, "tensor 'a': data_offsets [0] is not two"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, -8]}})", 8, "is not two non-negative integers"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", 8,
       "tensor 'a': data_offsets [0, 16) run past the data buffer (8 bytes)"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, "hold 8 bytes, but F32 [3] needs 12"},
      {"{" + ok_a + R"(, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12,
       "tensor 'b' [4, 12) overlaps tensor 'a' [0, 8)"},
      {"{" + ok_a + R"(, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}})", 16,
       "data bytes [8, 12) before tensor 'b' belong to no tensor"},
      {"{" + ok_a + "}", 12, "data bytes [8, 12) after the last tensor 'a' belong to no tensor"},
      {R"({"__metadata__": {"k": 1}})", 0, "__metadata__ 'k' is not a string"},
      {R"({"__metadata__": [1]})", 0, "__metadata__ is not an object"},
      {R"({"a": {"dtype": "F32", "shape": [[2]], "data_offsets": [0, 8]}})", 8, "nests 4 levels deep"},
      {"{\"\xff\": 1}", 0, "not valid JSON (or not UTF-8)"},
      {R"({"": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}})", 0, "a tensor has an empty name"},
  };
  for (const BadCase& c : cases) {
    const std::vector<std::byte> file = MakeFile(c.header, c.data_bytes);
    auto r = SafetensorsReader::Parse(file, "f.safetensors");
    ASSERT_FALSE(r.ok()) << "accepted: " << c.header;
    EXPECT_EQ(r.status().message().rfind("f.safetensors: ", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << "header: " << c.header << "\nerror:  " << r.status().message() << "\nwanted: " << c.needle;
  }
  // The file itself.
  std::vector<std::byte> tiny(5);
  EXPECT_NE(SafetensorsReader::Parse(tiny, "f").status().message().find("file is 5 bytes, shorter than the 8-byte"),
            std::string::npos);
  std::vector<std::byte> past = MakeFile("{}", 0);
  past[0] = std::byte{200};
  EXPECT_NE(SafetensorsReader::Parse(past, "f").status().message().find(
                "header length 200 bytes runs past the end of the file (10 bytes)"),
            std::string::npos);
  past[5] = std::byte{1};
  EXPECT_NE(SafetensorsReader::Parse(past, "f").status().message().find("exceeds the limit"), std::string::npos);
  auto missing = SafetensorsReader::Open(FreshDir() + "/none.safetensors");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  // And valid corner cases.
  EXPECT_TRUE(SafetensorsReader::Parse(MakeFile("{}", 0)).ok());
  EXPECT_TRUE(SafetensorsReader::Parse(MakeFile("{}      ", 0)).ok());
  EXPECT_TRUE(SafetensorsReader::Parse(MakeFile(R"({"z": {"dtype": "BOOL", "shape": [0, 5], "data_offsets": [0, 0]},
      "a": {"dtype": "U8", "shape": [], "data_offsets": [0, 1]}})",
                                                1))
                  .ok());
}

// What a successful parse must guarantee, whatever the input.
void CheckInvariants(const SafetensorsReader& r, std::span<const std::byte> file) {
  uint64_t covered = 0;
  for (const SafetensorsTensor& t : r.tensors()) {
    ASSERT_FALSE(t.name.empty());
    ASSERT_GT(SafetensorsDTypeBytes(t.dtype), 0u);
    ASSERT_EQ(static_cast<uint64_t>(t.num_elems()) * SafetensorsDTypeBytes(t.dtype), t.data.size());
    ASSERT_GE(t.data.data(), file.data());
    ASSERT_LE(t.data.data() + t.data.size(), file.data() + file.size());
    ASSERT_EQ(t.offset_bytes, covered);
    covered += t.data.size();
    // Touch every byte: a bad span would fault here under the sanitizers.
    uint8_t x = 0;
    for (std::byte b : t.data) x ^= static_cast<uint8_t>(b);
    (void)x;
  }
}

// A bounded random campaign: valid files mutated at the byte level (flips,
// truncation, splices, header-length edits) and at the JSON level (numbers,
// names and dtypes swapped for hostile values). Every input must either be
// rejected with a message naming the file or parse to a consistent reader.
// A sharded checkpoint's file may hold a hundred thousand tensors: the header
// parses in one pass (a parser that rescanned each object's members took
// minutes here) and every name is found, each at its own offset.
TEST(SafetensorsTest, AHundredThousandTensorsParseAndAreEachFound) {
  constexpr int kTensors = 100000;
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i) {
    if (i) header += ",";
    header += "\"t." + std::to_string(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
              std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  }
  header += "}";
  const std::vector<std::byte> file = MakeFile(header, 4 * kTensors);
  auto r = SafetensorsReader::Parse(file, "many.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors().size(), size_t{kTensors});
  for (int i = 0; i < kTensors; ++i) {
    const SafetensorsTensor* t = r->Find("t." + std::to_string(i));
    ASSERT_NE(t, nullptr) << i;
    ASSERT_EQ(t->data.data(), file.data() + 8 + header.size() + 4 * size_t(i)) << i;
  }
  EXPECT_EQ(r->Find("t.100000"), nullptr);
  EXPECT_EQ(r->Find("t."), nullptr);
}

TEST(SafetensorsTest, FuzzedHeadersAreRejectedOrReadConsistently) {
  std::mt19937_64 rng(20240613);
  const std::vector<std::string> seeds = {
      R"({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}, "__metadata__": {"format": "pt"}})",
      R"({"wte.weight": {"dtype": "F16", "shape": [3, 2], "data_offsets": [0, 12]}, "h.0.attn.bias": {"dtype": "U8", "shape": [], "data_offsets": [12, 13]}})",
      R"({"x": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})",
  };
  const std::vector<size_t> seed_data = {32, 13, 8};
  const std::vector<std::string> hostile = {"-1",
                                            "18446744073709551615",
                                            "18446744073709551616",
                                            "1e308",
                                            "0.5",
                                            "null",
                                            "[]",
                                            "{}",
                                            "\"F32\"",
                                            "\"\\u0000\"",
                                            "true",
                                            "[0,0]",
                                            "9223372036854775807",
                                            "[[[[1]]]]",
                                            "\"__metadata__\""};
  const char kJsonChars[] = "{}[]\",:0123456789 -.eE\\u";
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const size_t which = rng() % seeds.size();
    std::string header = seeds[which];
    size_t data_bytes = seed_data[which];
    switch (rng() % 5) {
      case 0:  // JSON-level: replace a number, word or string with a hostile token
      case 1: {
        for (int k = 0, edits = 1 + rng() % 3; k < edits && !header.empty(); ++k) {
          size_t pos = rng() % header.size();
          size_t end = pos;
          while (end < header.size() && (std::isalnum(static_cast<unsigned char>(header[end])) || header[end] == '"'))
            ++end;
          header.replace(pos, std::max<size_t>(end - pos, 1), hostile[rng() % hostile.size()]);
        }
        break;
      }
      case 2:  // character-level noise in the header
        for (int k = 0, edits = 1 + rng() % 4; k < edits && !header.empty(); ++k) {
          header[rng() % header.size()] = kJsonChars[rng() % (sizeof(kJsonChars) - 1)];
        }
        break;
      case 3:  // data size off by a little
        data_bytes = data_bytes + (rng() % 9) - 4;
        if (data_bytes > 64) data_bytes = 0;
        break;
      default:
        break;
    }
    std::vector<std::byte> file = MakeFile(header, data_bytes, static_cast<uint8_t>(rng()));
    switch (rng() % 4) {
      case 0:  // byte flips anywhere, including the length prefix
        for (int k = 0, flips = 1 + rng() % 4; k < flips; ++k)
          file[rng() % file.size()] ^= std::byte(1u << (rng() % 8));
        break;
      case 1:  // truncation
        file.resize(rng() % (file.size() + 1));
        break;
      case 2: {  // a header length that lies
        const uint64_t lie = rng() % 3 == 0 ? rng() : rng() % (file.size() + 16);
        for (int i = 0; i < 8; ++i) file[i] = static_cast<std::byte>(lie >> (8 * i));
        break;
      }
      default:
        break;
    }
    auto r = SafetensorsReader::Parse(file, "fuzz.safetensors");
    if (r.ok()) {
      ++accepted;
      CheckInvariants(*r, file);
      if (HasFatalFailure()) {
        ADD_FAILURE() << "iteration " << iter;
        return;
      }
    } else {
      ++rejected;
      ASSERT_EQ(r.status().message().rfind("fuzz.safetensors: ", 0), 0u) << r.status().message();
      ASSERT_GT(r.status().message().size(), std::string("fuzz.safetensors: ").size() + 10);
      ASSERT_TRUE(r.status().code() == StatusCode::kInvalidArgument || r.status().code() == StatusCode::kDataLoss)
          << r.status().ToString();
    }
  }
  std::printf("fuzz: %d accepted, %d rejected\n", accepted, rejected);
  EXPECT_GT(accepted, 250);  // the campaign reaches valid files, not only garbage
  EXPECT_GT(rejected, 5000);
}

}  // namespace
}  // namespace zinf::data
