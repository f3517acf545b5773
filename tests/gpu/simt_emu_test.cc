// The SIMT emulation (gpu/simt_emu.h) against what PTX specifies: the
// m16n8k16 fragment layouts of mma.sync, ldmatrix with and without .trans,
// shfl.xor, __syncthreads, and cp.async's landing; and the rules it enforces
// (a divergent warp, a lane gone from its warp, a deadlock, a misaligned or
// out-of-range shared address). Runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/float16.h"
#include "gpu/simt.cuh"

namespace zinf::gpu {
namespace {

using emu::CopyTiming;
using emu::Dim3;
using emu::LaunchConfig;

LaunchConfig OneBlock(unsigned threads, size_t smem = 0) {
  LaunchConfig c;
  c.block = Dim3{threads, 1, 1};
  c.smem_bytes = smem;
  return c;
}

float Bf16(uint16_t b) { return Bf16BitsToFloat(b); }

// A value exact in bf16: i / 8 - 4 for a small pseudo-random i.
uint16_t SmallBf16(int seed) { return FloatToBf16Bits(static_cast<float>((seed * 37 + 11) % 64) / 8.0f - 4.0f); }

TEST(SimtEmuTest, MmaComputesTheTileFromTheDocumentedFragments) {
  uint16_t A[16][16], B[16][8];
  float C[16][8], D[16][8];
  for (int i = 0; i < 16; ++i) {
    for (int k = 0; k < 16; ++k) A[i][k] = SmallBf16(i * 16 + k);
  }
  for (int k = 0; k < 16; ++k) {
    for (int j = 0; j < 8; ++j) B[k][j] = SmallBf16(1000 + k * 8 + j);
  }
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) C[i][j] = static_cast<float>(i - j) * 0.25f;
  }
  auto pack = [](uint16_t lo, uint16_t hi) { return lo | static_cast<uint32_t>(hi) << 16; };
  const Status st = emu::Launch(OneBlock(32), [&] {
    // PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type".
    const int lane = static_cast<int>(threadIdx.x), g = lane / 4, c = lane % 4;
    const uint32_t a[4] = {pack(A[g][2 * c], A[g][2 * c + 1]), pack(A[g + 8][2 * c], A[g + 8][2 * c + 1]),
                           pack(A[g][2 * c + 8], A[g][2 * c + 9]), pack(A[g + 8][2 * c + 8], A[g + 8][2 * c + 9])};
    const uint32_t b0 = pack(B[2 * c][g], B[2 * c + 1][g]), b1 = pack(B[2 * c + 8][g], B[2 * c + 9][g]);
    float d[4] = {C[g][2 * c], C[g][2 * c + 1], C[g + 8][2 * c], C[g + 8][2 * c + 1]};
    simt::MmaBf16(d, a, b0, b1);
    D[g][2 * c] = d[0];
    D[g][2 * c + 1] = d[1];
    D[g + 8][2 * c] = d[2];
    D[g + 8][2 * c + 1] = d[3];
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      double want = C[i][j];
      for (int k = 0; k < 16; ++k) want += static_cast<double>(Bf16(A[i][k])) * Bf16(B[k][j]);
      EXPECT_EQ(D[i][j], static_cast<float>(want)) << i << "," << j;  // small sums of multiples of 1/64: exact
    }
  }
}

TEST(SimtEmuTest, LdmatrixGivesEachLaneItsRowPairOrColumnPair) {
  // Four 8×8 matrices of b16, matrix i's row r at byte (i·8 + r)·32 (rows
  // 32 bytes apart, 16 of them padding); element value i·64 + r·8 + col.
  constexpr int kPitch = 16;  // b16 elements a row
  for (bool trans : {false, true}) {
    SCOPED_TRACE(trans ? "trans" : "plain");
    uint32_t got[32][4];
    const Status st = emu::Launch(OneBlock(32, 32 * kPitch * 2), [&] {
      auto* smem = reinterpret_cast<uint16_t*>(emu::DynamicSmem());
      const int lane = static_cast<int>(threadIdx.x);
      for (int col = 0; col < 8; ++col) smem[lane * kPitch + col] = static_cast<uint16_t>(lane * 8 + col);
      simt::SyncThreads();
      uint32_t m[4];
      if (trans)
        simt::LoadMatricesTrans(m, smem + lane * kPitch);  // lane 8i + r: matrix i, row r
      else
        simt::LoadMatrices(m, smem + lane * kPitch);
      std::memcpy(got[lane], m, sizeof(m));
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < 4; ++i) {
        const int g = lane / 4, c = lane % 4;
        // plain: row g, columns 2c, 2c + 1; trans: column g, rows 2c, 2c + 1
        const uint32_t lo = trans ? i * 64 + 2 * c * 8 + g : i * 64 + g * 8 + 2 * c;
        const uint32_t hi = trans ? lo + 8 : lo + 1;
        EXPECT_EQ(got[lane][i], lo | hi << 16) << "lane " << lane << " matrix " << i;
      }
    }
  }
}

TEST(SimtEmuTest, ShflXorAndSyncThreads) {
  std::vector<float> out(128);
  const Status st = emu::Launch(OneBlock(128, 128 * 4), [&] {
    auto* smem = reinterpret_cast<float*>(emu::DynamicSmem());
    const unsigned t = threadIdx.x;
    const float mine = static_cast<float>(t);
    const float other = simt::ShflXor(mine, 5);  // lane ^ 5, within the warp
    smem[t] = other;
    simt::SyncThreads();
    out[t] = smem[(t + 32) % 128];  // written by another warp before the barrier
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (unsigned t = 0; t < 128; ++t) EXPECT_EQ(out[t], static_cast<float>(((t + 32) % 128) ^ 5)) << t;
}

// Each half-warp shuffles over its own mask, the halves at different
// instructions: lane j of a half reads lane src of its half.
TEST(SimtEmuTest, HalfWarpsShuffleOnTheirOwn) {
  std::vector<float> out(32);
  const Status st = emu::Launch(OneBlock(32), [&] {
    const unsigned t = threadIdx.x, members = 0xffffu << (t & 16u);
    float v = static_cast<float>(t);
    if (t < 16) v = simt::ShflIdx(members, v, 3, 16) + 100.0f;  // one more shuffle than the upper half
    out[t] = simt::ShflIdx(members, v, 5, 16);
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (unsigned t = 0; t < 32; ++t) EXPECT_EQ(out[t], t < 16 ? 103.0f : 21.0f) << t;
  const Status outside = emu::Launch(OneBlock(32), [] { (void)simt::ShflIdx(0x0000ffffu, 1.0f, 20, 32); });
  EXPECT_NE(outside.ToString().find("outside the member mask"), std::string::npos) << outside.ToString();
}

TEST(SimtEmuTest, CpAsyncLandsAtIssueOrAtTheWait) {
  alignas(16) const float src[4] = {1, 2, 3, 4};
  for (CopyTiming timing : {CopyTiming::kAtIssue, CopyTiming::kAtWait}) {
    float before = 0, after = 0, zeroed = -1;
    LaunchConfig c = OneBlock(32, 64);
    c.copies = timing;
    const Status st = emu::Launch(c, [&] {
      auto* smem = reinterpret_cast<float*>(emu::DynamicSmem());
      if (threadIdx.x == 0) {
        simt::CpAsync16(smem, src, true);
        simt::CpAsync16(smem + 4, src, false);  // zero-filled
        simt::CpAsyncCommit();
        before = smem[2];
        simt::CpAsyncWaitAll();
        after = smem[2];
        zeroed = smem[7];
      }
    });
    ASSERT_TRUE(st.ok()) << st.ToString();
    if (timing == CopyTiming::kAtIssue)
      EXPECT_EQ(before, 3.0f);
    else
      EXPECT_TRUE(std::isnan(before)) << before;  // shared memory starts as 0xff bytes
    EXPECT_EQ(after, 3.0f);
    EXPECT_EQ(zeroed, 0.0f);
  }
}

// Each broken rule fails the launch with a message naming it.
void ExpectBroken(const LaunchConfig& c, const std::function<void()>& kernel, const std::string& words) {
  const Status st = emu::Launch(c, kernel);
  ASSERT_FALSE(st.ok()) << "expected: " << words;
  EXPECT_NE(st.ToString().find(words), std::string::npos) << st.ToString();
}

TEST(SimtEmuTest, RefusesWhatTheHardwareLeavesUndefined) {
  ExpectBroken(
      OneBlock(32),
      [] {
        if (threadIdx.x < 16) {
          (void)simt::ShflXor(1.0f, 1);
        } else {
          float d[4] = {};
          const uint32_t a[4] = {};
          simt::MmaBf16(d, a, 0, 0);
        }
      },
      "divergent warp");
  ExpectBroken(
      OneBlock(32),
      [] {
        if (threadIdx.x == 3) return;
        (void)simt::ShflXor(1.0f, 1);
      },
      "returned");
  ExpectBroken(
      OneBlock(32),
      [] {
        if (threadIdx.x < 16)
          (void)simt::ShflXor(1.0f, 1);
        else
          simt::SyncThreads();
      },
      "deadlock");
  ExpectBroken(
      OneBlock(32, 256),
      [] {
        uint32_t m[4];
        simt::LoadMatrices(m, emu::DynamicSmem() + 8);
      },
      "not 16-byte aligned");
  ExpectBroken(
      OneBlock(32, 256),
      [] {
        uint32_t m[4];
        simt::LoadMatrices(m, emu::DynamicSmem() + 256);
      },
      "outside the block's 256 bytes");
  alignas(16) static const float src[4] = {};
  ExpectBroken(
      OneBlock(32, 64), [] { simt::CpAsync16(emu::DynamicSmem() + 64, src, true); }, "outside");
  const Status st = emu::Launch(OneBlock(48), [] {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

TEST(SimtEmuTest, BarrierCountsReturnedThreadsAsArrived) {
  int passed = 0;
  const Status st = emu::Launch(OneBlock(64), [&] {
    if (threadIdx.x >= 32) return;  // a whole warp leaves
    simt::SyncThreads();
    ++passed;
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(passed, 32);
}

TEST(SimtEmuTest, GridRunsEveryBlock) {
  std::vector<int> seen(6 * 4, 0);
  LaunchConfig c = OneBlock(32);
  c.grid = Dim3{6, 4, 1};
  c.schedule_seed = 7;
  const Status st = emu::Launch(c, [&] {
    if (threadIdx.x == 0) ++seen[blockIdx.y * gridDim.x + blockIdx.x];
  });
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (int s : seen) EXPECT_EQ(s, 1);
}

}  // namespace
}  // namespace zinf::gpu
