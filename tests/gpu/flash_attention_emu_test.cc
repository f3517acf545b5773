// flash attention's CUDA kernels (gpu/flash_attention_kernels.cuh), run
// without a GPU through the SIMT emulation (gpu/simt_emu.h), launched with
// the shapes flash_attention.cu gives them, against the CPU twin
// (model/flash_attention.h):
//   - both operand paths: tiles rounded from fp32 as they load, and bf16
//     copies brought in by cp.async into two buffers a tile;
//   - cp.async landing at once and only at the wait, and threads scheduled
//     in shuffled orders: a missing barrier or wait changes the results;
//   - ragged T, groups of query heads on one kv head, head_dim 64 and 128.
// The emulation adds each mma's products in k order, so within the
// tolerance of the GPU test (tests/gpu/flash_attention_gpu_test.cc), not bit
// for bit with a GPU; the two operand paths, each schedule and each copy
// timing must give the same bits as one another.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "common/float16.h"
#include "gpu/flash_attention_kernels.cuh"
#include "model/attention_problem.h"

namespace zinf::gpu {
namespace {

using math::AttentionShape;
using math::AttentionTensors;
using model::ModelThreads;
using model::test::AttentionProblem;
using model::test::AttentionResult;
using model::test::ExpectCloseToTwin;
using model::test::ScaledMaxError;

Status Launch(const flash::LaunchShape& l, const emu::LaunchConfig& base, const std::function<void()>& kernel) {
  emu::LaunchConfig c = base;
  c.grid = emu::Dim3{l.grid_x, l.grid_y, 1};
  c.block = emu::Dim3{l.threads, 1, 1};
  c.smem_bytes = static_cast<size_t>(l.smem);
  return emu::Launch(c, kernel);
}

// Forward then backward, as FlashAttentionForward and FlashAttentionBackward
// launch them (flash_attention.cu).
template <int D, bool kAsync>
Status Emulate(const AttentionShape& s, const AttentionTensors& t, const emu::LaunchConfig& base) {
  ZINF_RETURN_IF_ERROR(Launch(flash::ForwardLaunch<D, kAsync>(s), base,
                              [&] { flash::FlashForwardKernel<D, kAsync, flash::kForwardTiles<D>>(s, t); }));
  ZINF_RETURN_IF_ERROR(Launch(flash::DeltaLaunch(s), base, [&] { flash::FlashDeltaKernel<D>(s, t); }));
  ZINF_RETURN_IF_ERROR(
      Launch(flash::BackwardKvLaunch<D, kAsync>(s), base, [&] { flash::FlashBackwardKvKernel<D, kAsync>(s, t); }));
  return Launch(flash::BackwardQLaunch<D, kAsync>(s), base, [&] { flash::FlashBackwardQKernel<D, kAsync>(s, t); });
}

struct Variant {
  bool copies;  // the bf16 copies through cp.async
  emu::CopyTiming timing;
  uint64_t schedule_seed;
};

AttentionResult OnEmulator(const AttentionProblem& p, const Variant& v) {
  AttentionResult r;
  r.out.assign(p.OutElems(), NAN);  // unwritten shows
  r.lse.assign(p.StatElems(), NAN);
  r.dqkv.assign(p.qkv.size(), NAN);
  std::vector<float> delta(p.StatElems(), NAN);
  AttentionTensors t = p.Tensors(p.qkv.data(), r.out.data(), r.lse.data(), p.dout.data(), delta.data(), r.dqkv.data());
  // The copies as the model makes them: every element rounded to nearest
  // even, 16-byte aligned (as operator new gives them).
  std::vector<uint16_t> qkv16(p.qkv.size()), dout16(p.dout.size());
  if (v.copies) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(qkv16.data()) % 16, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(dout16.data()) % 16, 0u);
    for (size_t i = 0; i < p.qkv.size(); ++i) qkv16[i] = FloatToBf16Bits(p.qkv[i]);
    for (size_t i = 0; i < p.dout.size(); ++i) dout16[i] = FloatToBf16Bits(p.dout[i]);
    t.q16 = qkv16.data();
    t.k16 = qkv16.data() + (t.k - t.q);
    t.v16 = qkv16.data() + (t.v - t.q);
    t.dout16 = dout16.data();
  }
  emu::LaunchConfig base;
  base.copies = v.timing;
  base.schedule_seed = v.schedule_seed;
  const int64_t D = p.shape.head_dim;
  Status st;
  if (D == 64)
    st = v.copies ? Emulate<64, true>(p.shape, t, base) : Emulate<64, false>(p.shape, t, base);
  else
    st = v.copies ? Emulate<128, true>(p.shape, t, base) : Emulate<128, false>(p.shape, t, base);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Case {
  int64_t B, T, H, Hkv, D;
};

void CheckCase(const Case& c, const std::vector<Variant>& variants) {
  const AttentionProblem p = AttentionProblem::Random(c.B, c.T, c.H, c.Hkv, c.D, 40 + c.T, 2.0f);
  SCOPED_TRACE(p.Describe());
  const AttentionResult first = OnEmulator(p, variants[0]);
  ExpectCloseToTwin(p, first, p.Twin(ModelThreads(1, DType::kBFloat16)), 1e-3);
  for (size_t i = 1; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    SCOPED_TRACE(::testing::Message() << "copies " << v.copies << ", copies land "
                                      << (v.timing == emu::CopyTiming::kAtIssue ? "at issue" : "at the wait")
                                      << ", schedule " << v.schedule_seed);
    const AttentionResult r = OnEmulator(p, v);
    EXPECT_TRUE(SameBits(r.out, first.out));
    EXPECT_TRUE(SameBits(r.lse, first.lse));
    EXPECT_TRUE(SameBits(r.dqkv, first.dqkv));
  }
}

const std::vector<Variant> kAllVariants = {
    {false, emu::CopyTiming::kAtWait, 0}, {true, emu::CopyTiming::kAtWait, 0},   {true, emu::CopyTiming::kAtIssue, 0},
    {true, emu::CopyTiming::kAtWait, 11}, {true, emu::CopyTiming::kAtIssue, 12}, {false, emu::CopyTiming::kAtWait, 13},
};

TEST(FlashAttentionEmuTest, HeadDim64MatchesTheTwinOnEveryPathAndSchedule) {
  CheckCase(Case{1, 5, 1, 1, 64}, kAllVariants);    // one partial block
  CheckCase(Case{1, 130, 4, 2, 64}, kAllVariants);  // ragged, two query heads a kv head
}

TEST(FlashAttentionEmuTest, HeadDim128MatchesTheTwinOnEveryPathAndSchedule) {
  CheckCase(Case{2, 70, 2, 1, 128}, kAllVariants);
}

TEST(FlashAttentionEmuTest, WholeBlocksAndBatchRows) {
  CheckCase(Case{3, 64, 2, 2, 64}, {kAllVariants[0], kAllVariants[1]});
}

// The head_dim 64 forward takes 128 queries a block (two row tiles a warp);
// with one (64 queries, as head_dim 128) every row sees the same key blocks
// in the same order, so the bits are the same.
TEST(FlashAttentionEmuTest, TwoRowTilesAWarpGiveTheBitsOfOne) {
  static_assert(flash::kForwardTiles<64> == 2);
  for (const int64_t T : {int64_t{5}, int64_t{64}, int64_t{130}, int64_t{200}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const AttentionProblem p = AttentionProblem::Random(2, T, 4, 2, 64, 60 + T, 2.0f);
    auto forward = [&](bool two) {
      AttentionResult r;
      r.out.assign(p.OutElems(), NAN);
      r.lse.assign(p.StatElems(), NAN);
      const AttentionTensors t = p.Tensors(p.qkv.data(), r.out.data(), r.lse.data(), nullptr, nullptr, nullptr);
      emu::LaunchConfig base;
      base.schedule_seed = 21;
      const Status st = two ? Launch(flash::ForwardLaunch<64, false>(p.shape), base,
                                     [&] { flash::FlashForwardKernel<64, false, 2>(p.shape, t); })
                            : Launch(flash::ForwardLaunch<64, false, 1>(p.shape), base,
                                     [&] { flash::FlashForwardKernel<64, false, 1>(p.shape, t); });
      EXPECT_TRUE(st.ok()) << st.ToString();
      return r;
    };
    const AttentionResult one = forward(false), two = forward(true);
    EXPECT_TRUE(SameBits(one.out, two.out));
    EXPECT_TRUE(SameBits(one.lse, two.lse));
    EXPECT_LE(ScaledMaxError(two.out, p.Twin(ModelThreads(1, DType::kBFloat16)).out), 1e-3);
  }
}

// O and dO kept in bf16 alone (AttentionTensors::out16, a null dout: the
// model's AttentionInBf16), and dq, dk, dv written in bf16 alone (dq16 ...:
// QkvInBf16): the forward writes O rounded, and backward, its δ summing the
// bf16 values, gives the roundings of what the fp32 tensors give holding O
// and dO rounded, as the CPU model holds them.
TEST(FlashAttentionEmuTest, Bf16OutputsAndGradientsGiveTheBitsOfTheirRoundings) {
  for (const int64_t D : {int64_t{64}, int64_t{128}}) {
    const AttentionProblem p = AttentionProblem::Random(2, 70, 4, 2, D, 77 + D, 2.0f);
    SCOPED_TRACE(p.Describe());
    std::vector<uint16_t> qkv16(p.qkv.size()), dout16(p.dout.size());
    std::vector<float> dout_rounded(p.dout.size());
    for (size_t i = 0; i < p.qkv.size(); ++i) qkv16[i] = FloatToBf16Bits(p.qkv[i]);
    for (size_t i = 0; i < p.dout.size(); ++i)
      dout_rounded[i] = Bf16BitsToFloat(dout16[i] = FloatToBf16Bits(p.dout[i]));
    const auto with_copies = [&](AttentionTensors t) {
      t.q16 = qkv16.data();
      t.k16 = qkv16.data() + (t.k - t.q);
      t.v16 = qkv16.data() + (t.v - t.q);
      t.dout16 = dout16.data();
      return t;
    };
    emu::LaunchConfig base;
    base.schedule_seed = 31;
    const auto forward = [&](const AttentionTensors& t) {
      return D == 64 ? Launch(flash::ForwardLaunch<64, true>(p.shape), base,
                              [&] { flash::FlashForwardKernel<64, true, flash::kForwardTiles<64>>(p.shape, t); })
                     : Launch(flash::ForwardLaunch<128, true>(p.shape), base,
                              [&] { flash::FlashForwardKernel<128, true, flash::kForwardTiles<128>>(p.shape, t); });
    };
    const auto backward = [&](const AttentionTensors& t) -> Status {
      if (D == 64) {
        ZINF_RETURN_IF_ERROR(
            Launch(flash::DeltaLaunch(p.shape), base, [&] { flash::FlashDeltaKernel<64>(p.shape, t); }));
        ZINF_RETURN_IF_ERROR(Launch(flash::BackwardKvLaunch<64, true>(p.shape), base,
                                    [&] { flash::FlashBackwardKvKernel<64, true>(p.shape, t); }));
        return Launch(flash::BackwardQLaunch<64, true>(p.shape), base,
                      [&] { flash::FlashBackwardQKernel<64, true>(p.shape, t); });
      }
      ZINF_RETURN_IF_ERROR(
          Launch(flash::DeltaLaunch(p.shape), base, [&] { flash::FlashDeltaKernel<128>(p.shape, t); }));
      ZINF_RETURN_IF_ERROR(Launch(flash::BackwardKvLaunch<128, true>(p.shape), base,
                                  [&] { flash::FlashBackwardKvKernel<128, true>(p.shape, t); }));
      return Launch(flash::BackwardQLaunch<128, true>(p.shape), base,
                    [&] { flash::FlashBackwardQKernel<128, true>(p.shape, t); });
    };

    // fp32 O, rounded in place between forward and backward; fp32 dO rounded.
    AttentionResult want;
    want.out.assign(p.OutElems(), NAN);
    want.lse.assign(p.StatElems(), NAN);
    want.dqkv.assign(p.qkv.size(), NAN);
    std::vector<float> delta(p.StatElems(), NAN);
    const AttentionTensors tw = with_copies(
        p.Tensors(p.qkv.data(), want.out.data(), want.lse.data(), dout_rounded.data(), delta.data(), want.dqkv.data()));
    ASSERT_TRUE(forward(tw).ok());
    std::vector<uint16_t> want_out16(want.out.size());
    for (size_t i = 0; i < want.out.size(); ++i) {
      want_out16[i] = FloatToBf16Bits(want.out[i]);
      want.out[i] = Bf16BitsToFloat(want_out16[i]);
    }
    ASSERT_TRUE(backward(tw).ok());

    // O, dO and d(qkv) in bf16 alone.
    AttentionResult got;
    got.lse.assign(p.StatElems(), NAN);
    std::vector<uint16_t> out16(p.OutElems(), 0x7fc1), dqkv16(p.qkv.size(), 0x7fc1);  // a NaN: unwritten shows
    std::vector<float> unused(p.qkv.size());
    AttentionTensors tg =
        with_copies(p.Tensors(p.qkv.data(), nullptr, got.lse.data(), nullptr, delta.data(), unused.data()));
    tg.out16 = out16.data();
    tg.dq16 = dqkv16.data();
    tg.dk16 = dqkv16.data() + (tg.dk - tg.dq);
    tg.dv16 = dqkv16.data() + (tg.dv - tg.dq);
    tg.dq = tg.dk = tg.dv = nullptr;
    ASSERT_TRUE(math::CheckAttentionShape(p.shape, tg, true).ok());
    ASSERT_TRUE(forward(tg).ok());
    ASSERT_TRUE(backward(tg).ok());
    EXPECT_EQ(out16, want_out16);
    EXPECT_TRUE(SameBits(got.lse, want.lse));
    size_t not_rounded = 0;
    for (size_t i = 0; i < dqkv16.size(); ++i) not_rounded += dqkv16[i] != FloatToBf16Bits(want.dqkv[i]);
    EXPECT_EQ(not_rounded, 0u);
    // And the δ from rounded values is not the δ from fp32 ones: the
    // comparison can tell them apart.
    AttentionResult fp32 = OnEmulator(p, Variant{true, emu::CopyTiming::kAtWait, 31});
    EXPECT_FALSE(SameBits(fp32.dqkv, want.dqkv));
  }
}

}  // namespace
}  // namespace zinf::gpu
