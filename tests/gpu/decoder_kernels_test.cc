// The CUDA kernels of gpu/decoder_kernels.h (RMSNorm, RoPE, SwiGLU) against
// their CPU twins in model/decoder_layers.h. Skipped (not passed) without a
// CUDA device; the argument checks (DecoderKernelArgsTest) run everywhere.
//
// Tolerance: 0 ulp everywhere (bits equal; a NaN matches any NaN). Both
// sides evaluate math/decoder_math.h's functions with contraction off, the
// row sums of RMSNorm add in the 16 lanes of math/lane_math.h and its weight
// gradient in ColumnChunkRows' chunks, and RoPE reads the CPU's own table.
// Every buffer is compared whole, so an element a kernel must leave alone
// (the v heads of a fused qkv, the q heads when the k heads are rotated)
// is checked too.
#include "gpu/decoder_kernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/float16.h"
#include "gpu/cuda_probe.h"
#include "model/decoder_layers.h"
#include "model/gpt_config.h"
#include "model/parallel.h"
#include "test_util.h"

namespace zinf::gpu {
namespace {

using model::RowSet;
using test::SplitMix64;
using test::UniformFloats;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

void ExpectSameFloats(const std::vector<float>& gpu, const std::vector<float>& cpu, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t mismatches = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (Bits(gpu[i]) == Bits(cpu[i]) || (std::isnan(gpu[i]) && std::isnan(cpu[i]))) continue;
    if (++mismatches <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " (0x" << std::hex << Bits(gpu[i]) << ") vs cpu "
                    << cpu[i] << " (0x" << Bits(cpu[i]) << ")" << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

// A device copy of a host vector, freed on destruction.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n_, 1) * sizeof(float)), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  float* get() const { return p_; }
  // Waits for the device, then copies back.
  std::vector<float> ToHost() const {
    std::vector<float> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
};

StridedRows Strided(const RowSet& r) { return StridedRows{r.rows, r.n, r.per_token, r.token_stride}; }

// The heads of a fused qkv [tokens, (H + 2 H_kv)·D]: the query heads at
// offset 0, the key heads at offset H·D.
struct Qkv {
  int64_t tokens, heads, kv_heads, head_dim;
  int64_t stride() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t elems() const { return tokens * stride(); }
  RowSet QueryRows() const { return RowSet{tokens * heads, head_dim, heads, stride()}; }
  RowSet KeyRows() const { return RowSet{tokens * kv_heads, head_dim, kv_heads, stride()}; }
  int64_t key_offset() const { return heads * head_dim; }
};

class DecoderKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  model::ModelThreads threads_{1};
};

// One RMSNorm forward and backward over `rows` of a buffer of `elems`
// floats starting at `offset`, on both sides. accumulate: the backward adds
// to a separate dx; otherwise it writes dx over dy (in place, as the q/k
// norm does). in_place_forward: y is x.
void CheckRmsNorm(const model::ModelThreads& th, int64_t elems, int64_t offset, const RowSet& rows, bool accumulate,
                  bool in_place_forward, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows.rows << ", n " << rows.n << ", per_token " << rows.per_token
                                    << ", token_stride " << rows.token_stride << ", offset " << offset
                                    << (accumulate ? ", accumulate" : ", in place")
                                    << (in_place_forward ? ", forward in place" : ""));
  const float eps = 1e-6f;
  const size_t n = static_cast<size_t>(elems);
  const std::vector<float> x = UniformFloats(seed, n, -3.0f, 5.0f);
  const std::vector<float> w = UniformFloats(seed + 1, static_cast<size_t>(rows.n), 0.5f, 1.5f);
  std::vector<float> y = in_place_forward ? x : UniformFloats(seed + 2, n, -1.0f, 1.0f);
  std::vector<float> rstd(static_cast<size_t>(rows.rows));
  std::vector<float> dy = UniformFloats(seed + 3, n, -1.0f, 1.0f);
  std::vector<float> dx = UniformFloats(seed + 4, n, -0.1f, 0.1f);
  std::vector<float> dw = UniformFloats(seed + 5, static_cast<size_t>(rows.n), -0.1f, 0.1f);  // accumulates

  DeviceFloats gx(x), gw(w), gy(y), grstd(rstd), gdy(dy), gdx(dx), gdw(dw);
  // The forward's input is x (or, in place, y holding x).
  const float* cpu_in = (in_place_forward ? y.data() : x.data()) + offset;
  model::RmsNormForward<float>(th, y.data() + offset, rstd.data(), cpu_in, w.data(), rows, eps);
  const float* gpu_in = (in_place_forward ? gy.get() : gx.get()) + offset;
  ASSERT_TRUE(RmsNormForward(gpu_in, gw.get(), gy.get() + offset, grstd.get(), Strided(rows), eps, nullptr).ok());
  ExpectSameFloats(gy.ToHost(), y, "y");
  ExpectSameFloats(grstd.ToHost(), rstd, "rstd");

  // Backward from x (the forward's input) and the stored rstd.
  float* cpu_dx = accumulate ? dx.data() : dy.data();
  model::RmsNormBackward<float>(th, cpu_dx + offset, accumulate, dw.data(), dy.data() + offset, x.data() + offset,
                                w.data(), rstd.data(), rows);
  float* gpu_dx = accumulate ? gdx.get() : gdy.get();
  ASSERT_TRUE(RmsNormBackward(gdy.get() + offset, gx.get() + offset, gw.get(), grstd.get(), gpu_dx + offset, accumulate,
                              gdw.get(), Strided(rows), nullptr)
                  .ok());
  ExpectSameFloats(gdw.ToHost(), dw, "dw");
  ExpectSameFloats(gdx.ToHost(), dx, "dx");
  ExpectSameFloats(gdy.ToHost(), dy, "dy (dx in place)");
}

// Dense rows: shorter than the 16 lanes, one lane group with and without a
// tail, long rows (a lane's elements go by in batches of 8: 773 ends in a
// part batch and a tail, 2048 is a model's row), and the column chunks of lane_math.h (1000 rows: 16
// chunks of 64; 9001 rows: 127 chunks of 71).
TEST_F(DecoderKernelTest, RmsNormOnDenseRowsMatchesTheCpuBitForBit) {
  uint64_t seed = 100;
  for (const auto& [R, n] : {std::pair<int64_t, int64_t>{37, 1},
                             {37, 15},
                             {37, 16},
                             {37, 17},
                             {37, 773},
                             {1000, 64},
                             {9001, 40},
                             {64, 2048}}) {
    CheckRmsNorm(threads_, R * n, 0, RowSet::Dense(R, n), true, false, seed += 10);
    CheckRmsNorm(threads_, R * n, 0, RowSet::Dense(R, n), false, true, seed += 10);
  }
}

// The q/k norm's rows: each head of a fused qkv, with head sizes below,
// at and between multiples of 16, grouped-query heads, and enough tokens
// for several column chunks.
TEST_F(DecoderKernelTest, RmsNormOnQkvHeadsMatchesTheCpuBitForBit) {
  uint64_t seed = 300;
  for (const Qkv& q :
       {Qkv{13, 4, 2, 8}, Qkv{13, 4, 4, 16}, Qkv{70, 6, 2, 20}, Qkv{300, 4, 1, 128}, Qkv{33, 8, 8, 64}}) {
    CheckRmsNorm(threads_, q.elems(), 0, q.QueryRows(), false, false, seed += 10);
    CheckRmsNorm(threads_, q.elems(), q.key_offset(), q.KeyRows(), false, false, seed += 10);
    CheckRmsNorm(threads_, q.elems(), q.key_offset(), q.KeyRows(), true, true, seed += 10);
  }
}

// RoPE on the q and k heads of a fused qkv, positions wrapping over the
// batch rows, with the CPU's table (plain and with Llama 3 scaling).
TEST_F(DecoderKernelTest, RopeMatchesTheCpuBitForBit) {
  for (const auto& [head_dim, llama3] : {std::pair<int64_t, bool>{8, false}, {20, false}, {64, true}, {128, true}}) {
    for (const auto& [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 2}, {3, 3}, {6, 1}}) {
      SCOPED_TRACE(::testing::Message() << "D " << head_dim << (llama3 ? " llama3" : "") << ", H " << heads << ", H_kv "
                                        << kv_heads);
      model::GptConfig c = std::move(model::GptPreset("tiny-llama")).value();
      c.num_heads = heads;
      c.num_kv_heads = kv_heads;
      c.head_dim_size = head_dim;
      c.rope_theta = 500000.0;
      c.rope_scaling.llama3 = llama3;
      c.rope_scaling.factor = 32.0;
      c.rope_scaling.original_max_position = 64;  // so that every band of the scaling shows at D = 64
      const int64_t batch = 3, seq_len = 37;
      const model::RopeTable table = model::RopeTable::For(c, seq_len);
      const Qkv q{batch * seq_len, heads, kv_heads, head_dim};
      std::vector<float> x = UniformFloats(500 + head_dim + heads, static_cast<size_t>(q.elems()), -2.0f, 2.0f);
      DeviceFloats gx(x), gcos(table.cos), gsin(table.sin);

      model::RopeForward<float>(threads_, x.data(), q.QueryRows(), seq_len, table);
      model::RopeForward<float>(threads_, x.data() + q.key_offset(), q.KeyRows(), seq_len, table);
      ASSERT_TRUE(RopeForward(gx.get(), Strided(q.QueryRows()), seq_len, gcos.get(), gsin.get(), nullptr).ok());
      ASSERT_TRUE(
          RopeForward(gx.get() + q.key_offset(), Strided(q.KeyRows()), seq_len, gcos.get(), gsin.get(), nullptr).ok());
      ExpectSameFloats(gx.ToHost(), x, "rotated");

      model::RopeBackward<float>(threads_, x.data(), q.QueryRows(), seq_len, table);
      model::RopeBackward<float>(threads_, x.data() + q.key_offset(), q.KeyRows(), seq_len, table);
      ASSERT_TRUE(RopeBackward(gx.get(), Strided(q.QueryRows()), seq_len, gcos.get(), gsin.get(), nullptr).ok());
      ASSERT_TRUE(
          RopeBackward(gx.get() + q.key_offset(), Strided(q.KeyRows()), seq_len, gcos.get(), gsin.get(), nullptr).ok());
      ExpectSameFloats(gx.ToHost(), x, "rotated back");
    }
  }
}

TEST_F(DecoderKernelTest, SwiGluMatchesTheCpuBitForBit) {
  for (const auto& [rows, inter] : {std::pair<int64_t, int64_t>{37, 1}, {37, 17}, {129, 300}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << ", inter " << inter);
    const size_t n_in = static_cast<size_t>(rows * 2 * inter), n_out = static_cast<size_t>(rows * inter);
    std::vector<float> x = UniformFloats(700 + inter, n_in, -12.0f, 12.0f);
    const float specials[] = {0.0f,   -0.0f,  100.0f, -100.0f,
                              1e-40f, -90.0f, 90.0f,  std::numeric_limits<float>::infinity()};
    for (size_t i = 0; i < std::size(specials) && i < n_in; ++i) x[i * 3 % n_in] = specials[i];
    const std::vector<float> dy = UniformFloats(701 + inter, n_out, -1.0f, 1.0f);
    std::vector<float> out(n_out), dx(n_in);
    model::SwiGluForward<float>(threads_, out.data(), x.data(), rows, inter);
    model::SwiGluBackward<float>(threads_, dx.data(), x.data(), dy.data(), rows, inter);

    DeviceFloats gx(x), gdy(dy), gout(std::vector<float>(n_out, NAN)), gdx(std::vector<float>(n_in, NAN));
    ASSERT_TRUE(SwiGluForward(gx.get(), gout.get(), rows, inter, nullptr).ok());
    ASSERT_TRUE(SwiGluBackward(gx.get(), gdy.get(), gdx.get(), rows, inter, nullptr).ok());
    ExpectSameFloats(gout.ToHost(), out, "swiglu");
    ExpectSameFloats(gdx.ToHost(), dx, "swiglu grad");
  }
}

// A device buffer of bf16 bits (all ones at first: NaN, so an element a
// kernel missed shows), freed on destruction.
class DeviceBf16 {
 public:
  explicit DeviceBf16(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n_, 1) * 2), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0xff, std::max<size_t>(n_, 1) * 2), cudaSuccess);
  }
  explicit DeviceBf16(const std::vector<uint16_t>& values) : DeviceBf16(values.size()) {
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(p_, values.data(), n_ * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBf16() { cudaFree(p_); }
  DeviceBf16(const DeviceBf16&) = delete;
  DeviceBf16& operator=(const DeviceBf16&) = delete;
  uint16_t* get() const { return p_; }
  std::vector<uint16_t> ToHost() const {
    std::vector<uint16_t> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  uint16_t* p_ = nullptr;
  size_t n_;
};

// Every element of a bf16 output is the fp32 output rounded to nearest
// even, as the CPU rounds a product's operand (NaN to some NaN).
void ExpectRoundingOf(const std::vector<uint16_t>& got, const std::vector<float>& fp32, const char* what) {
  ASSERT_EQ(got.size(), fp32.size()) << what;
  size_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const uint16_t want = FloatToBf16Bits(fp32[i]);
    if (got[i] == want || (std::isnan(fp32[i]) && std::isnan(Bf16BitsToFloat(got[i])))) continue;
    if (++mismatches <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: 0x" << std::hex << got[i] << " vs 0x" << want << std::dec << " ("
                    << fp32[i] << ")";
    }
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

// The bf16-output kernels (a norm's output or SwiGLU's, forward and
// backward, kept in bf16 alone with bf16 products): the fp32 kernels'
// results rounded, and the same rstd. Dense rows as the model's, with tails.
TEST_F(DecoderKernelTest, Bf16OutputsAreTheFp32OutputsRounded) {
  for (const auto& [R, n] : {std::pair<int64_t, int64_t>{37, 15}, {37, 773}, {64, 2048}, {1000, 64}}) {
    SCOPED_TRACE(::testing::Message() << "rms rows " << R << ", n " << n);
    const size_t elems = static_cast<size_t>(R * n);
    DeviceFloats gx(UniformFloats(900 + n, elems, -3.0f, 5.0f)), gw(UniformFloats(901 + n, n, 0.5f, 1.5f));
    DeviceFloats gy{std::vector<float>(elems)}, grstd{std::vector<float>(R)}, grstd16{std::vector<float>(R)};
    DeviceBf16 gy16(elems);
    ASSERT_TRUE(
        RmsNormForward(gx.get(), gw.get(), gy.get(), grstd.get(), StridedRows::Dense(R, n), 1e-5f, nullptr).ok());
    ASSERT_TRUE(
        RmsNormForwardBf16(gx.get(), gw.get(), gy16.get(), grstd16.get(), StridedRows::Dense(R, n), 1e-5f, nullptr)
            .ok());
    ExpectRoundingOf(gy16.ToHost(), gy.ToHost(), "rmsnorm y");
    ExpectSameFloats(grstd16.ToHost(), grstd.ToHost(), "rmsnorm rstd");
  }
  for (const auto& [rows, inter] : {std::pair<int64_t, int64_t>{37, 17}, {129, 300}, {64, 2048}}) {
    SCOPED_TRACE(::testing::Message() << "swiglu rows " << rows << ", inter " << inter);
    const size_t n_in = static_cast<size_t>(rows * 2 * inter), n_out = static_cast<size_t>(rows * inter);
    DeviceFloats gx(UniformFloats(950 + inter, n_in, -12.0f, 12.0f)),
        gdy(UniformFloats(951 + inter, n_out, -1.0f, 1.0f));
    DeviceFloats gout{std::vector<float>(n_out)}, gdx{std::vector<float>(n_in)};
    DeviceBf16 gout16(n_out), gdx16(n_in);
    ASSERT_TRUE(SwiGluForward(gx.get(), gout.get(), rows, inter, nullptr).ok());
    ASSERT_TRUE(SwiGluForwardBf16(gx.get(), gout16.get(), rows, inter, nullptr).ok());
    ASSERT_TRUE(SwiGluBackward(gx.get(), gdy.get(), gdx.get(), rows, inter, nullptr).ok());
    ASSERT_TRUE(SwiGluBackwardBf16(gx.get(), gdy.get(), gdx16.get(), rows, inter, nullptr).ok());
    ExpectRoundingOf(gout16.ToHost(), gout.ToHost(), "swiglu");
    ExpectRoundingOf(gdx16.ToHost(), gdx.ToHost(), "swiglu grad");
  }
}

// SwiGLU from bf16 inputs (model::SwiGluInBf16): the fp32 kernels' results
// for the widened inputs, rounded.
TEST_F(DecoderKernelTest, SwiGluFromBf16InputsIsTheFp32Rounded) {
  for (const auto& [rows, inter] : {std::pair<int64_t, int64_t>{37, 17}, {129, 304}, {64, 2048}}) {
    SCOPED_TRACE(::testing::Message() << "swiglu rows " << rows << ", inter " << inter);
    const size_t n_in = static_cast<size_t>(rows * 2 * inter), n_out = static_cast<size_t>(rows * inter);
    std::vector<float> x = UniformFloats(960 + inter, n_in, -12.0f, 12.0f),
                       dy = UniformFloats(961 + inter, n_out, -1.0f, 1.0f);
    std::vector<uint16_t> x16(n_in), dy16(n_out);
    for (size_t i = 0; i < n_in; ++i) x[i] = Bf16BitsToFloat(x16[i] = FloatToBf16Bits(x[i]));
    for (size_t i = 0; i < n_out; ++i) dy[i] = Bf16BitsToFloat(dy16[i] = FloatToBf16Bits(dy[i]));
    DeviceFloats gx(x), gdy(dy), gout{std::vector<float>(n_out)}, gdx{std::vector<float>(n_in)};
    DeviceBf16 gx16(x16), gdy16(dy16), gout16(n_out), gdx16(n_in);
    ASSERT_TRUE(SwiGluForward(gx.get(), gout.get(), rows, inter, nullptr).ok());
    ASSERT_TRUE(SwiGluForwardBf16(gx16.get(), gout16.get(), rows, inter, nullptr).ok());
    ASSERT_TRUE(SwiGluBackward(gx.get(), gdy.get(), gdx.get(), rows, inter, nullptr).ok());
    ASSERT_TRUE(SwiGluBackwardBf16(gx16.get(), gdy16.get(), gdx16.get(), rows, inter, nullptr).ok());
    ExpectRoundingOf(gout16.ToHost(), gout.ToHost(), "swiglu");
    ExpectRoundingOf(gdx16.ToHost(), gdx.ToHost(), "swiglu grad");
  }
}

// RoPE forward and backward on q and k kept in bf16 (model::QkvInBf16), in
// place: the CPU's rotation of the widened values, rounded; v's columns
// kept. Heads of 64 and 128 (eight pairs a thread) and 20 (one).
TEST_F(DecoderKernelTest, RopeOnBf16RowsIsTheCpuRounded) {
  for (const int64_t head_dim : {int64_t{20}, int64_t{64}, int64_t{128}}) {
    SCOPED_TRACE(::testing::Message() << "D " << head_dim);
    model::GptConfig c = std::move(model::GptPreset("tiny-llama")).value();
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim_size = head_dim;
    const int64_t batch = 3, seq_len = 37;
    const model::RopeTable table = model::RopeTable::For(c, seq_len);
    const Qkv q{batch * seq_len, 4, 2, head_dim};
    std::vector<float> x = UniformFloats(520 + head_dim, static_cast<size_t>(q.elems()), -2.0f, 2.0f);
    std::vector<uint16_t> x16(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = Bf16BitsToFloat(x16[i] = FloatToBf16Bits(x[i]));
    DeviceBf16 gx(x16);
    DeviceFloats gcos(table.cos), gsin(table.sin);
    model::RopeForward<float>(threads_, x.data(), q.QueryRows(), seq_len, table);
    model::RopeForward<float>(threads_, x.data() + q.key_offset(), q.KeyRows(), seq_len, table);
    ASSERT_TRUE(RopeForwardBf16(gx.get(), Strided(q.QueryRows()), seq_len, gcos.get(), gsin.get(), nullptr).ok());
    ASSERT_TRUE(
        RopeForwardBf16(gx.get() + q.key_offset(), Strided(q.KeyRows()), seq_len, gcos.get(), gsin.get(), nullptr)
            .ok());
    ExpectRoundingOf(gx.ToHost(), x, "rotated");
    // Backward from the rounded rotation, as the model's d(qkv) goes.
    const std::vector<uint16_t> r16 = gx.ToHost();
    for (size_t i = 0; i < x.size(); ++i) x[i] = Bf16BitsToFloat(r16[i]);
    model::RopeBackward<float>(threads_, x.data(), q.QueryRows(), seq_len, table);
    model::RopeBackward<float>(threads_, x.data() + q.key_offset(), q.KeyRows(), seq_len, table);
    ASSERT_TRUE(RopeBackwardBf16(gx.get(), Strided(q.QueryRows()), seq_len, gcos.get(), gsin.get(), nullptr).ok());
    ASSERT_TRUE(
        RopeBackwardBf16(gx.get() + q.key_offset(), Strided(q.KeyRows()), seq_len, gcos.get(), gsin.get(), nullptr)
            .ok());
    ExpectRoundingOf(gx.ToHost(), x, "rotated back");
  }
}

// Argument checks happen before any CUDA call, so these run without a GPU.
TEST(DecoderKernelArgsTest, KernelsRefuseBadShapes) {
  float x = 0;
  const StridedRows bad_n{4, 0, 1, 0}, short_stride{8, 4, 2, 7}, odd{2, 3, 1, 3};
  EXPECT_EQ(RmsNormForward(&x, &x, &x, &x, bad_n, 1e-6f, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormForward(&x, &x, &x, &x, short_stride, 1e-6f, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormForward(&x, &x, &x, &x, StridedRows::Dense(1, 4), 0.0f, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RmsNormBackward(&x, &x, &x, &x, &x, true, &x, short_stride, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForward(&x, odd, 4, &x, &x, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeBackward(&x, StridedRows::Dense(2, 4), 0, &x, &x, nullptr).code(), StatusCode::kInvalidArgument);
  uint16_t x16 = 0;
  EXPECT_EQ(RopeForwardBf16(&x16, odd, 4, &x, &x, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RopeForwardBf16(nullptr, StridedRows::Dense(2, 4), 4, &x, &x, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluForward(&x, &x, 4, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluBackward(&x, &x, &x, -1, 4, nullptr).code(), StatusCode::kInvalidArgument);
  // A bf16 output may not overlap the fp32 input (it would be read after
  // another thread's write).
  float buf[64] = {};
  auto* half = reinterpret_cast<uint16_t*>(buf);
  Status st = RmsNormForwardBf16(buf, buf, half + 8, buf + 40, StridedRows::Dense(2, 8), 1e-6f, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("y overlaps x"), std::string::npos) << st.ToString();
  // A bad shape is refused before the overlap is measured from it.
  EXPECT_EQ(RmsNormForwardBf16(buf, buf, half + 64, buf + 40, StridedRows{2, 8, 0, 8}, 1e-6f, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluForwardBf16(buf, half + 4, 2, 4, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluBackwardBf16(buf, buf + 32, half + 64, 2, 4, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluBackwardBf16(buf, buf + 48, half + 16, 2, 4, nullptr).code(), StatusCode::kInvalidArgument);
  // From bf16 inputs (x: halves [0, 16), two rows of gate | up of 4), likewise.
  const uint16_t* half_in = half;
  EXPECT_EQ(SwiGluForwardBf16(half_in, half + 8, 2, 4, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluBackwardBf16(half_in, half_in + 16, half + 20, 2, 4, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluBackwardBf16(half_in, half_in + 40, half + 8, 2, 4, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluForwardBf16(half_in, nullptr, 2, 4, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SwiGluForwardBf16(half_in, half + 16, 2, 0, nullptr).code(), StatusCode::kInvalidArgument);
  // Nothing to do is no error, and touches no device.
  EXPECT_TRUE(RmsNormForward(nullptr, nullptr, nullptr, nullptr, StridedRows::Dense(0, 8), 1e-6f, nullptr).ok());
  EXPECT_TRUE(SwiGluForward(nullptr, nullptr, 0, 8, nullptr).ok());
}

}  // namespace
}  // namespace zinf::gpu
