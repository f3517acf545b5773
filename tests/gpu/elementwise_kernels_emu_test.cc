// The elementwise kernels (gpu/elementwise_kernels.cuh: casts, the residual
// add, GELU and its gradient, the bias broadcast) run without a GPU through
// the SIMT emulation, launched as kernels.cu launches them, on both paths:
// groups of eight elements through 16-byte accesses (the arrays aligned)
// and one element a thread (an array one element off its alignment), each
// bit for bit against the CPU (cpu/cast.h's SIMD casts, model/layers'
// per-element math). Lengths leave tails of every size, and a one-block
// grid makes each thread take several groups.
#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/float16.h"
#include "cpu/cast.h"
#include "gpu/elementwise_kernels.cuh"
#include "test_util.h"

namespace zinf::gpu {
namespace {

using test::OffsetBuffer;
using test::SplitMix64;
using test::UniformFloats;

Status Emulate(unsigned blocks, const std::function<void()>& kernel) {
  emu::LaunchConfig c;
  c.grid = emu::Dim3{blocks, 1, 1};
  c.block = emu::Dim3{elementwise::kThreads, 1, 1};
  return emu::Launch(c, kernel);
}

// Random bits: every exponent, NaNs and infinities among them, for 16-bit
// types too.
std::vector<unsigned char> RandomBytes(uint64_t seed, size_t bytes) {
  std::vector<unsigned char> b(bytes);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t z = SplitMix64(seed + i);
    std::memcpy(b.data() + i, &z, std::min<size_t>(8, bytes - i));
  }
  return b;
}

size_t DifferentBits(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d += FloatToBits(a[i]) != FloatToBits(b[i]);
  return d;
}

constexpr size_t kLengths[] = {1, 7, 8, 9, 15, 1000, 4099};

template <DType kSrc, DType kDst>
void CheckCast() {
  SCOPED_TRACE(std::string(DTypeName(kSrc)) + " -> " + std::string(DTypeName(kDst)));
  constexpr size_t kSrcBytes = DTypeSizeBytes(kSrc), kDstBytes = DTypeSizeBytes(kDst);
  tbb::task_arena arena(1);
  for (const size_t n : kLengths) {
    for (const size_t offset : {size_t{0}, size_t{1}}) {
      SCOPED_TRACE(::testing::Message() << n << " elements, offset " << offset);
      // A source with every kind of value; its 16-bit or 32-bit words.
      OffsetBuffer<unsigned char> src(RandomBytes(n * 31 + offset, n * kSrcBytes), offset * kSrcBytes);
      std::vector<unsigned char> want(n * kDstBytes);
      ASSERT_TRUE(cpu::Cast(arena, src.data(), kSrc, want.data(), kDst, n).ok());
      for (const bool one_block : {false, true}) {
        OffsetBuffer<unsigned char> dst(std::vector<unsigned char>(n * kDstBytes, 0xab), offset * kDstBytes);
        const bool vector = elementwise::CastVector(src.data(), dst.data());
        ASSERT_EQ(vector, offset == 0);
        const unsigned blocks = one_block ? 1 : elementwise::BlocksForElements(n, vector);
        ASSERT_TRUE(
            Emulate(blocks, [&] { elementwise::CastKernel<kSrc, kDst>(src.data(), dst.data(), n, vector); }).ok());
        // NaNs compare by bits too: both sides quiet them the same way.
        EXPECT_EQ(dst.Values(), want) << (one_block ? "one block" : "the launch's grid");
      }
    }
  }
}

// Every pair gpu::Cast sends to the kernel (a cast to the same type is a
// copy there, which keeps a NaN's payload as the CPU's does).
TEST(ElementwiseKernelsEmuTest, CastsMatchTheCpuBitForBit) {
  CheckCast<DType::kFloat32, DType::kBFloat16>();
  CheckCast<DType::kFloat32, DType::kFloat16>();
  CheckCast<DType::kBFloat16, DType::kFloat32>();
  CheckCast<DType::kBFloat16, DType::kFloat16>();
  CheckCast<DType::kFloat16, DType::kFloat32>();
  CheckCast<DType::kFloat16, DType::kBFloat16>();
}

// A vector access at an address the hardware would fault on is the
// emulation's error, naming it: the alignment rule is checked, not assumed.
TEST(ElementwiseKernelsEmuTest, AMisalignedGroupIsAnError) {
  OffsetBuffer<float> src(std::vector<float>(64, 1.0f), 1);
  OffsetBuffer<uint16_t> dst(64, 0);
  const Status st =
      Emulate(1, [&] { elementwise::CastKernel<DType::kFloat32, DType::kBFloat16>(src.data(), dst.data(), 64, true); });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("16-byte global load"), std::string::npos) << st.message();
}

// out = a + b into a third buffer and in place over a, and GELU forward
// (fp32 and bf16) and backward (in place over dy), against the CPU's
// per-element math.
TEST(ElementwiseKernelsEmuTest, AddAndGeluMatchTheCpuBitForBit) {
  for (const size_t n : kLengths) {
    for (const size_t offset : {size_t{0}, size_t{1}}) {
      SCOPED_TRACE(::testing::Message() << n << " elements, offset " << offset);
      const std::vector<float> a = UniformFloats(n + 1, n, -6.0f, 6.0f), b = UniformFloats(n + 2, n, -6.0f, 6.0f);
      std::vector<float> sum(n), gelu(n), grad(n);
      for (size_t i = 0; i < n; ++i) {
        sum[i] = a[i] + b[i];
        gelu[i] = math::Gelu(a[i]);
        grad[i] = math::GeluGrad(a[i]) * b[i];
      }
      const OffsetBuffer<float> ga(a, offset), gb(b, offset);
      OffsetBuffer<float> out(n, offset), in_place(a, offset), y(n, offset), dx(b, offset);
      OffsetBuffer<uint16_t> y16(n, offset);
      const bool vector = elementwise::AddVector(ga.data(), gb.data(), out.data());
      ASSERT_EQ(vector, offset == 0);
      for (const bool one_block : {false, true}) {
        SCOPED_TRACE(one_block ? "one block" : "the launch's grid");
        const unsigned blocks = one_block ? 1 : elementwise::BlocksForElements(n, vector);
        in_place = OffsetBuffer<float>(a, offset);
        dx = OffsetBuffer<float>(b, offset);
        ASSERT_TRUE(Emulate(blocks, [&] {
                      elementwise::AddKernel(ga.data(), gb.data(), out.data(), n, vector);
                      elementwise::AddKernel(in_place.data(), gb.data(), in_place.data(), n, vector);
                      elementwise::GeluForwardKernel<float>(ga.data(), y.data(), n, vector);
                      elementwise::GeluForwardKernel<uint16_t>(ga.data(), y16.data(), n, vector);
                      elementwise::GeluBackwardKernel(ga.data(), dx.data(), dx.data(), n, vector);
                    }).ok());
        EXPECT_EQ(DifferentBits(out.Values(), sum), 0u) << "a + b";
        EXPECT_EQ(DifferentBits(in_place.Values(), sum), 0u) << "a += b";
        EXPECT_EQ(DifferentBits(y.Values(), gelu), 0u) << "gelu";
        size_t not_rounded = 0;
        for (size_t i = 0; i < n; ++i) not_rounded += y16.data()[i] != FloatToBf16Bits(gelu[i]);
        EXPECT_EQ(not_rounded, 0u) << "bf16 gelu";
        EXPECT_EQ(DifferentBits(dx.Values(), grad), 0u) << "gelu grad";
      }
    }
  }
}

// A row broadcast over rows: whole groups in a row (cols 24) and not (cols 12).
TEST(ElementwiseKernelsEmuTest, BroadcastRowRepeatsTheRow) {
  for (const int64_t cols : {int64_t{24}, int64_t{12}}) {
    SCOPED_TRACE(::testing::Message() << "cols " << cols);
    const int64_t rows = 37;
    const size_t n = static_cast<size_t>(rows * cols);
    const OffsetBuffer<float> row(UniformFloats(5, static_cast<size_t>(cols), -1.0f, 1.0f), 0);
    OffsetBuffer<float> out(n, 0);
    const bool vector = elementwise::BroadcastVector(row.data(), out.data(), cols);
    ASSERT_EQ(vector, cols % 8 == 0);
    ASSERT_TRUE(Emulate(elementwise::BlocksForElements(n, vector), [&] {
                  elementwise::BroadcastRowKernel(row.data(), out.data(), n, cols, vector);
                }).ok());
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) wrong += out.data()[i] != row.data()[i % static_cast<size_t>(cols)];
    EXPECT_EQ(wrong, 0u);
  }
}

}  // namespace
}  // namespace zinf::gpu
