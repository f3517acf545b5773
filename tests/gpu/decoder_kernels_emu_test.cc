// The decoder kernels (gpu/decoder_kernels.cuh: RMSNorm rows on half-warps,
// its weight gradient, SwiGLU, each with fp32 or bf16 outputs), run without
// a GPU through the SIMT emulation (gpu/simt_emu.h), launched as
// decoder_kernels.cu launches them, against the CPU layers
// (model/decoder_layers.h) bit for bit (RoPE too) — the kernels add in the CPU's
// 16-lane order through half-warp shuffles, which the emulation keeps — and
// the bf16 outputs against the fp32 ones rounded. The same comparisons as
// tests/gpu/decoder_kernels_test.cc's, which need a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/float16.h"
#include "gpu/decoder_kernels.cuh"
#include "model/decoder_layers.h"
#include "model/parallel.h"
#include "test_util.h"

namespace zinf::gpu {
namespace {

using model::RowSet;
using test::SplitMix64;
using test::UniformFloats;

Status Emulate(unsigned blocks, unsigned threads, uint64_t seed, const std::function<void()>& kernel) {
  emu::LaunchConfig c;
  c.grid = emu::Dim3{blocks, 1, 1};
  c.block = emu::Dim3{threads, 1, 1};
  c.schedule_seed = seed;
  return emu::Launch(c, kernel);
}

StridedRows Strided(const RowSet& r) { return StridedRows{r.rows, r.n, r.per_token, r.token_stride}; }

size_t DifferentBits(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += FloatToBits(a[i]) != FloatToBits(b[i]);
  return d;
}
size_t NotRounded(const std::vector<uint16_t>& got, const std::vector<float>& fp32) {
  size_t d = got.size() == fp32.size() ? 0 : 1;
  for (size_t i = 0; i < got.size() && i < fp32.size(); ++i) d += got[i] != FloatToBf16Bits(fp32[i]);
  return d;
}

// RMSNorm forward (fp32 and bf16 out) and backward (dx added to a separate
// buffer, and the weight gradient) over `rows` of a buffer of `elems`.
void CheckRmsNorm(int64_t elems, const RowSet& rows, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows.rows << ", n " << rows.n << ", per_token " << rows.per_token);
  const float eps = 1e-6f;
  const size_t n = static_cast<size_t>(elems);
  const model::ModelThreads th(1);
  const std::vector<float> x = UniformFloats(seed, n, -3.0f, 5.0f);
  const std::vector<float> w = UniformFloats(seed + 1, static_cast<size_t>(rows.n), 0.5f, 1.5f);
  const std::vector<float> dy = UniformFloats(seed + 3, n, -1.0f, 1.0f);
  const std::vector<float> dx0 = UniformFloats(seed + 4, n, -0.1f, 0.1f);
  const std::vector<float> dw0 = UniformFloats(seed + 5, static_cast<size_t>(rows.n), -0.1f, 0.1f);
  // The CPU: y over a copy of x (rows not in the set keep x's values).
  std::vector<float> y = x, rstd(static_cast<size_t>(rows.rows)), dx = dx0, dw = dw0;
  model::RmsNormForward<float>(th, y.data(), rstd.data(), x.data(), w.data(), rows, eps);
  model::RmsNormBackward<float>(th, dx.data(), true, dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows);

  const StridedRows s = Strided(rows);
  std::vector<float> gy = x, grstd(rstd.size(), NAN), gdx = dx0, gdw = dw0;
  std::vector<uint16_t> gy16(n, 0xffff);
  std::vector<float> grstd16(rstd.size(), NAN);
  const unsigned row_blocks = decoder::BlocksForHalfWarpRows(rows.rows);
  for (uint64_t sched : {uint64_t{0}, uint64_t{3}}) {
    SCOPED_TRACE(::testing::Message() << "schedule " << sched);
    ASSERT_TRUE(Emulate(row_blocks, decoder::kThreads, sched, [&] {
                  decoder::RmsNormForwardKernel<float>(x.data(), w.data(), gy.data(), grstd.data(), s, eps);
                }).ok());
    ASSERT_TRUE(Emulate(row_blocks, decoder::kThreads, sched, [&] {
                  decoder::RmsNormForwardKernel<uint16_t>(x.data(), w.data(), gy16.data(), grstd16.data(), s, eps);
                }).ok());
    EXPECT_EQ(DifferentBits(gy, y), 0u) << "y";
    EXPECT_EQ(DifferentBits(grstd, rstd), 0u) << "rstd";
    EXPECT_EQ(DifferentBits(grstd16, rstd), 0u) << "rstd (bf16 y)";
    size_t unrounded = 0;
    for (int64_t r = 0; r < rows.rows; ++r) {
      for (int64_t c = 0; c < rows.n; ++c) {
        const size_t at = static_cast<size_t>(rows.Offset(r) + c);
        unrounded += gy16[at] != FloatToBf16Bits(y[at]);
      }
    }
    EXPECT_EQ(unrounded, 0u) << "bf16 y";
  }
  // Backward: the weight gradient first (as the launch does), then the rows.
  ASSERT_TRUE(Emulate(static_cast<unsigned>((rows.n + 31) / 32), decoder::kColumnWarps * 32, 7, [&] {
                decoder::RmsNormWeightGradKernel(dy.data(), x.data(), rstd.data(), gdw.data(), s);
              }).ok());
  ASSERT_TRUE(Emulate(row_blocks, decoder::kThreads, 7, [&] {
                decoder::RmsNormBackwardRowsKernel(dy.data(), x.data(), w.data(), rstd.data(), gdx.data(), true, s);
              }).ok());
  EXPECT_EQ(DifferentBits(gdw, dw), 0u) << "dw";
  EXPECT_EQ(DifferentBits(gdx, dx), 0u) << "dx";
}

// Dense rows: shorter than the 16 lanes, with and without a tail, a part
// batch and a tail (773), the large batches, then batches of 8, then single
// elements, then a tail (1480: 92 elements a lane), a model's row (2048),
// several column chunks (1000 rows); and the key heads of a fused qkv.
TEST(DecoderKernelsEmuTest, RmsNormMatchesTheCpuBitForBit) {
  uint64_t seed = 100;
  for (const auto& [R, n] :
       {std::pair<int64_t, int64_t>{37, 1}, {37, 15}, {37, 17}, {9, 773}, {5, 1480}, {4, 2048}, {1000, 8}}) {
    CheckRmsNorm(R * n, RowSet::Dense(R, n), seed += 10);
  }
  const int64_t tokens = 13, heads = 4, kv_heads = 2, D = 20, stride = (heads + 2 * kv_heads) * D;
  CheckRmsNorm(tokens * stride, RowSet{tokens * kv_heads, D, kv_heads, stride}, seed += 10);
}

// SwiGLU forward and backward, fp32 and bf16 outputs, in groups of eight
// where inter and the alignment allow it (inter 304; also launched on one
// block, so a thread takes several groups) and one output a thread
// otherwise (inter 1, 17, 300; and 304 with every array one element off
// its alignment).
TEST(DecoderKernelsEmuTest, SwiGluMatchesTheCpuBitForBit) {
  const model::ModelThreads th(1);
  struct Case {
    int64_t rows, inter;
    size_t offset;  // elements every array starts past a 16-byte boundary
    bool vector;
  };
  for (const Case& k : {Case{37, 1, 0, false}, Case{37, 17, 0, false}, Case{29, 300, 0, false}, Case{29, 304, 0, true},
                        Case{29, 304, 1, false}}) {
    const int64_t rows = k.rows, inter = k.inter;
    SCOPED_TRACE(::testing::Message() << "rows " << rows << ", inter " << inter << ", offset " << k.offset);
    const size_t n_in = static_cast<size_t>(rows * 2 * inter), n_out = static_cast<size_t>(rows * inter);
    const test::OffsetBuffer<float> xb(UniformFloats(700 + inter, n_in, -12.0f, 12.0f), k.offset);
    const test::OffsetBuffer<float> dyb(UniformFloats(701 + inter, n_out, -1.0f, 1.0f), k.offset);
    const float* x = xb.data();
    const float* dy = dyb.data();
    std::vector<float> out(n_out), dx(n_in);
    model::SwiGluForward<float>(th, out.data(), x, rows, inter);
    model::SwiGluBackward<float>(th, dx.data(), x, dy, rows, inter);

    for (const bool one_block : {false, true}) {
      SCOPED_TRACE(one_block ? "one block" : "the launch's grid");
      test::OffsetBuffer<float> gout(n_out, k.offset), gdx(n_in, k.offset);
      test::OffsetBuffer<uint16_t> gout16(n_out, k.offset), gdx16(n_in, k.offset);
      float* go = gout.data();
      float* gd = gdx.data();
      uint16_t* go16 = gout16.data();
      uint16_t* gd16 = gdx16.data();
      const bool vf = decoder::SwiGluVector(x, x, go, inter) && decoder::SwiGluVector(x, x, go16, inter);
      const bool vb = decoder::SwiGluVector(x, dy, gd, inter) && decoder::SwiGluVector(x, dy, gd16, inter);
      ASSERT_EQ(vf, k.vector);
      ASSERT_EQ(vb, k.vector);
      const unsigned blocks = one_block ? 1 : elementwise::BlocksForElements(n_out, k.vector);
      ASSERT_TRUE(Emulate(blocks, decoder::kThreads, 0, [&] {
                    decoder::SwiGluForwardKernel<float>(x, go, rows, inter, vf);
                    decoder::SwiGluForwardKernel<uint16_t>(x, go16, rows, inter, vf);
                    decoder::SwiGluBackwardKernel<float>(x, dy, gd, rows, inter, vb);
                    decoder::SwiGluBackwardKernel<uint16_t>(x, dy, gd16, rows, inter, vb);
                  }).ok());
      EXPECT_EQ(DifferentBits(gout.Values(), out), 0u) << "swiglu";
      EXPECT_EQ(DifferentBits(gdx.Values(), dx), 0u) << "swiglu grad";
      EXPECT_EQ(NotRounded(gout16.Values(), out), 0u) << "bf16 swiglu";
      EXPECT_EQ(NotRounded(gdx16.Values(), dx), 0u) << "bf16 swiglu grad";
    }
  }
}

// SwiGLU from bf16 inputs (model::SwiGluInBf16: the fc output and the
// activation's gradient kept in bf16 alone), bf16 outputs: the CPU's fp32
// SwiGLU of the widened inputs, rounded, in groups of eight and one a
// thread (inter 17, and 304 one element off its alignment).
TEST(DecoderKernelsEmuTest, SwiGluFromBf16InputsIsTheCpuRounded) {
  const model::ModelThreads th(1);
  struct Case {
    int64_t rows, inter;
    size_t offset;
    bool vector;
  };
  for (const Case& k : {Case{37, 17, 0, false}, Case{29, 304, 0, true}, Case{29, 304, 1, false}}) {
    const int64_t rows = k.rows, inter = k.inter;
    SCOPED_TRACE(::testing::Message() << "rows " << rows << ", inter " << inter << ", offset " << k.offset);
    const size_t n_in = static_cast<size_t>(rows * 2 * inter), n_out = static_cast<size_t>(rows * inter);
    std::vector<uint16_t> x16(n_in), dy16(n_out);
    std::vector<float> x(n_in), dy(n_out);  // the bf16 values, widened
    const std::vector<float> xs = UniformFloats(710 + inter, n_in, -12.0f, 12.0f);
    const std::vector<float> dys = UniformFloats(711 + inter, n_out, -1.0f, 1.0f);
    for (size_t i = 0; i < n_in; ++i) x[i] = Bf16BitsToFloat(x16[i] = FloatToBf16Bits(xs[i]));
    for (size_t i = 0; i < n_out; ++i) dy[i] = Bf16BitsToFloat(dy16[i] = FloatToBf16Bits(dys[i]));
    std::vector<float> out(n_out), dx(n_in);
    model::SwiGluForward<float>(th, out.data(), x.data(), rows, inter);
    model::SwiGluBackward<float>(th, dx.data(), x.data(), dy.data(), rows, inter);

    const test::OffsetBuffer<uint16_t> xb(x16, k.offset), dyb(dy16, k.offset);
    test::OffsetBuffer<uint16_t> gout(n_out, k.offset), gdx(n_in, k.offset);
    const uint16_t* gx = xb.data();
    const uint16_t* gdy = dyb.data();
    uint16_t* go = gout.data();
    uint16_t* gd = gdx.data();
    const bool vf = decoder::SwiGluVector(gx, gx, go, inter), vb = decoder::SwiGluVector(gx, gdy, gd, inter);
    ASSERT_EQ(vf, k.vector);
    ASSERT_EQ(vb, k.vector);
    ASSERT_TRUE(Emulate(elementwise::BlocksForElements(n_out, k.vector), decoder::kThreads, 0, [&] {
                  decoder::SwiGluForwardKernel<uint16_t, uint16_t>(gx, go, rows, inter, vf);
                  decoder::SwiGluBackwardKernel<uint16_t, uint16_t, uint16_t>(gx, gdy, gd, rows, inter, vb);
                }).ok());
    EXPECT_EQ(NotRounded(gout.Values(), out), 0u) << "swiglu";
    EXPECT_EQ(NotRounded(gdx.Values(), dx), 0u) << "swiglu grad";
  }
}

// The RoPE tests' rows: the query heads (3) of a fused qkv with one kv
// head, head size D, over two batch rows of seq_len positions, with random
// tables; and the kernel launched over them as decoder_kernels.cu does.
struct RopeCase {
  static constexpr int64_t seq_len = 7, tokens = 2 * seq_len, heads = 3, kv_heads = 1;
  int64_t D, stride;
  RowSet rows;
  model::RopeTable table;
  test::OffsetBuffer<float> cos_t, sin_t;
  RopeCase(int64_t d, uint64_t seed)
      : D(d), stride((heads + 2 * kv_heads) * d), rows{tokens * heads, d, heads, stride}, cos_t(0, 0), sin_t(0, 0) {
    table.seq_len = seq_len;
    table.half = D / 2;
    table.cos = UniformFloats(seed, static_cast<size_t>(seq_len * D / 2), -1.0f, 1.0f);
    table.sin = UniformFloats(seed + 1, static_cast<size_t>(seq_len * D / 2), -1.0f, 1.0f);
    cos_t = test::OffsetBuffer<float>(table.cos, 0);
    sin_t = test::OffsetBuffer<float>(table.sin, 0);
  }
  size_t elems() const { return static_cast<size_t>(tokens * stride); }
  // The CPU's rotation of x, in place.
  void Cpu(bool backward, std::vector<float>& x) const {
    const model::ModelThreads th(1);
    if (backward)
      model::RopeBackward<float>(th, x.data(), rows, seq_len, table);
    else
      model::RopeForward<float>(th, x.data(), rows, seq_len, table);
  }
  template <class T>
  void Emulated(bool backward, T* x) const {
    const bool vector = decoder::RopeVector(x, Strided(rows), cos_t.data(), sin_t.data());
    ASSERT_EQ(vector, D == 32);
    const unsigned blocks = elementwise::BlocksForElements(static_cast<size_t>(rows.rows * D / 2), vector);
    ASSERT_TRUE(Emulate(blocks, decoder::kThreads, 0, [&] {
                  if (backward) {
                    decoder::RopeKernel<true, T>(x, Strided(rows), seq_len, cos_t.data(), sin_t.data(), vector);
                  } else {
                    decoder::RopeKernel<false, T>(x, Strided(rows), seq_len, cos_t.data(), sin_t.data(), vector);
                  }
                }).ok());
  }
};

// RoPE forward and back over the query heads of a fused qkv, positions
// wrapping over two batch rows, against the CPU with the same table: head
// size 20 one pair a thread, 32 eight pairs a thread.
TEST(DecoderKernelsEmuTest, RopeMatchesTheCpuBitForBit) {
  for (const int64_t D : {int64_t{20}, int64_t{32}}) {
    SCOPED_TRACE(::testing::Message() << "head size " << D);
    const RopeCase k(D, 41);
    const std::vector<float> x = UniformFloats(43, k.elems(), -2.0f, 2.0f);
    for (bool backward : {false, true}) {
      SCOPED_TRACE(backward ? "backward" : "forward");
      std::vector<float> want = x;
      k.Cpu(backward, want);
      test::OffsetBuffer<float> got(x, 0);
      k.Emulated(backward, got.data());
      EXPECT_EQ(DifferentBits(got.Values(), want), 0u);
    }
  }
}

// RoPE forward and backward on rows kept in bf16 (model::QkvInBf16), in
// place: the CPU's rotation of the widened values, rounded (the elements of
// other heads kept), eight pairs a thread at head size 32 (rows 16-byte
// aligned) and one at 20.
TEST(DecoderKernelsEmuTest, RopeOnBf16RowsIsTheCpuRounded) {
  for (const int64_t D : {int64_t{20}, int64_t{32}}) {
    SCOPED_TRACE(::testing::Message() << "head size " << D);
    const RopeCase k(D, 51);
    const std::vector<float> xs = UniformFloats(53, k.elems(), -2.0f, 2.0f);
    std::vector<uint16_t> x16(xs.size());
    std::vector<float> x(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) x[i] = Bf16BitsToFloat(x16[i] = FloatToBf16Bits(xs[i]));
    for (const bool backward : {false, true}) {
      SCOPED_TRACE(backward ? "backward" : "forward");
      std::vector<float> want = x;
      k.Cpu(backward, want);
      test::OffsetBuffer<uint16_t> got(x16, 0);
      k.Emulated(backward, got.data());
      const std::vector<uint16_t> out = got.Values();
      EXPECT_EQ(NotRounded(out, want), 0u);
      size_t rotated = 0;  // and the rotation did happen
      for (size_t i = 0; i < x16.size(); ++i) rotated += out[i] != x16[i];
      EXPECT_GT(rotated, x16.size() / 2);
    }
  }
}

}  // namespace
}  // namespace zinf::gpu
