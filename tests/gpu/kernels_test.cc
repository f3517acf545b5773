// The CUDA kernels of gpu/kernels.h against their CPU twins. Skipped (not
// passed) without a CUDA device.
//
// Tests that only check arguments (GpuKernelArgsTest) run everywhere.
//
// Tolerances:
//   Adam, casts, GELU, LayerNorm (forward and backward), column sums, the
//   causal attention softmax (forward and backward), softmax probabilities,
//   the cross-entropy gradient, embedding forward and backward: 0 ulp
//   (bits equal; a NaN matches any NaN, as NaN payloads are not specified).
//   The kernels evaluate the same per-element functions with contraction
//   off, and the row and column sums add in the CPU layers' order.
//   Cross-entropy loss: |gpu - cpu| <= 1e-6 · max(1, |cpu|). The loss takes
//   a log, which is the device's logf (within 1 ulp) on the GPU and the C
//   library's on the CPU; a few ulp after the two additions that follow.
#include "gpu/kernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "common/float16.h"
#include "cpu/adam.h"
#include "cpu/kernels.h"
#include "cpu/norm.h"
#include "gpu/cuda_probe.h"
#include "math/lane_math.h"
#include "model/layers.h"
#include "model/parallel.h"
#include "test_util.h"

namespace zinf::gpu {
namespace {

using test::SplitMix64;
// Uniform in [lo, hi), reproducible from (seed, i).
float Uniform(uint64_t seed, size_t i, float lo, float hi) {
  const uint64_t bits = SplitMix64(seed * 0x100000001b3ull ^ i);
  return lo + (hi - lo) * static_cast<float>(bits >> 40) / 16777216.0f;
}

std::vector<float> RandomFloats(uint64_t seed, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Uniform(seed, i, lo, hi);
  return v;
}

template <class T>
std::vector<T> Zeros(size_t n) {
  return std::vector<T>(n);
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Equal bits, or both NaN.
::testing::AssertionResult SameFloat(float gpu, float cpu) {
  if (Bits(gpu) == Bits(cpu) || (std::isnan(gpu) && std::isnan(cpu))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "gpu " << gpu << " (0x" << std::hex << Bits(gpu) << ") vs cpu " << cpu
                                       << " (0x" << Bits(cpu) << ")";
}

void ExpectSameFloats(const std::vector<float>& gpu, const std::vector<float>& cpu, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t mismatches = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const auto same = SameFloat(gpu[i], cpu[i]);
    if (!same && ++mismatches <= 5) ADD_FAILURE() << what << "[" << i << "]: " << same.message();
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

// A device copy of a host vector, freed on destruction.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(size_, 1) * sizeof(T)), cudaSuccess);
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  // Waits for the device, then copies back.
  std::vector<T> ToHost() const {
    std::vector<T> host(size_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, size_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

class GpuKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  model::ModelThreads threads_{1};
};

int DTypeIndex(DType d) { return static_cast<int>(d); }

TEST_F(GpuKernelTest, AdamMatchesTheScalarTwinBitForBit) {
  constexpr size_t kN = 100003;  // not a multiple of any block size
  const DType grad_dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const cpu::AdamMode modes[] = {cpu::AdamMode::kAdam, cpu::AdamMode::kAdamW};
  for (cpu::AdamMode mode : modes) {
    for (DType grad_dtype : grad_dtypes) {
      for (int copy = 0; copy < 3; ++copy) {
        SCOPED_TRACE(::testing::Message() << "mode " << static_cast<int>(mode) << " grad dtype "
                                          << DTypeIndex(grad_dtype) << " copy " << copy);
        cpu::AdamOptions options;
        options.lr = 3e-3;
        options.weight_decay = 0.05;
        options.mode = mode;
        std::vector<float> p = RandomFloats(1, kN, -1.0f, 1.0f);
        std::vector<float> m = RandomFloats(2, kN, -0.01f, 0.01f);
        std::vector<float> v = RandomFloats(3, kN, 0.0f, 1e-4f);
        const std::vector<float> g32 = RandomFloats(4, kN, -2.0f, 2.0f);
        std::vector<uint8_t> grads(kN * DTypeSizeBytes(grad_dtype));
        if (grad_dtype == DType::kFloat32) {
          std::memcpy(grads.data(), g32.data(), grads.size());
        } else {
          ASSERT_TRUE(cpu::ScalarKernels().cast[0][DTypeIndex(grad_dtype)] != nullptr);
          cpu::ScalarKernels().cast[0][DTypeIndex(grad_dtype)](g32.data(), grads.data(), kN);
        }
        const DType copy_dtype = copy == 2 ? DType::kFloat16 : DType::kBFloat16;
        std::vector<uint16_t> cpu_copy(kN, 0);

        DeviceArray<float> dp(p), dm(m), dv(v);
        DeviceArray<uint8_t> dg(grads);
        DeviceArray<uint16_t> dcopy(cpu_copy);
        for (int64_t step = 1; step <= 3; ++step) {
          auto constants = cpu::MakeAdamStepConstants(options, step, 0.5);
          ASSERT_TRUE(constants.ok());
          cpu::ScalarKernels().adam[DTypeIndex(grad_dtype)][copy](*constants, p.data(), m.data(), v.data(),
                                                                  grads.data(), copy ? cpu_copy.data() : nullptr, kN);
          ASSERT_TRUE(gpu::AdamStep(*constants, dp.get(), dm.get(), dv.get(), dg.get(), grad_dtype,
                                    copy ? dcopy.get() : nullptr, copy_dtype, kN, nullptr)
                          .ok());
        }
        ExpectSameFloats(dp.ToHost(), p, "params");
        ExpectSameFloats(dm.ToHost(), m, "exp_avg");
        ExpectSameFloats(dv.ToHost(), v, "exp_avg_sq");
        if (copy) {
          EXPECT_EQ(dcopy.ToHost(), cpu_copy);
        }
      }
    }
  }
}

// Argument checks happen before any CUDA call, so these run without a GPU.
TEST(GpuKernelArgsTest, AdamRefusesBadDTypes) {
  math::AdamStepConstants c;
  float x = 0;
  EXPECT_EQ(gpu::AdamStep(c, &x, &x, &x, &x, static_cast<DType>(7), nullptr, DType::kBFloat16, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu::AdamStep(c, &x, &x, &x, &x, DType::kFloat32, &x, DType::kFloat32, 1, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// The norm partials against the CPU's SumSquaresBlocks (scalar twin and the
// best SIMD level) for sizes around the block and lane boundaries, with wide
// magnitudes (so the order of additions shows) and blocks holding inf/NaN.
TEST_F(GpuKernelTest, NormPartialsMatchTheCpuBitForBit) {
  tbb::task_arena arena(2);
  const size_t sizes[] = {1, 15, 17, 65535, 65536, 65537, 3 * 65536 + 1000, 20 * 65536 + 7};
  for (size_t n : sizes) {
    SCOPED_TRACE(::testing::Message() << "n " << n);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i)
      x[i] = std::ldexp(Uniform(9, i, -1.0f, 1.0f), static_cast<int>(SplitMix64(i) % 40) - 20);
    if (n > 3 * 65536) {
      x[65536 + 5] = INFINITY;
      x[2 * 65536 + 77] = NAN;
    }
    DeviceArray<float> gx(x);
    // From the start (16-byte aligned: vector loads) and from element 1
    // (4-byte aligned: the scalar loads).
    for (size_t skip : {size_t{0}, size_t{1}}) {
      if (skip >= n) continue;
      SCOPED_TRACE(::testing::Message() << "from element " << skip);
      const size_t m = n - skip;
      const size_t blocks = cpu::NumNormBlocks(m);
      std::vector<double> cpu(blocks), cpu_scalar(blocks);
      ASSERT_TRUE(zinf::cpu::SumSquaresBlocks(arena, x.data() + skip, DType::kFloat32, m, cpu).ok());
      ASSERT_TRUE(
          zinf::cpu::SumSquaresBlocks(arena, x.data() + skip, DType::kFloat32, m, cpu_scalar, cpu::SimdLevel::kScalar)
              .ok());
      DeviceArray<double> gout(std::vector<double>(blocks, -1.0));
      ASSERT_TRUE(SumSquaresBlocks(gx.get() + skip, m, gout.get(), nullptr).ok());
      const std::vector<double> gpu = gout.ToHost();
      for (size_t b = 0; b < blocks; ++b) {
        uint64_t g, c, s;
        std::memcpy(&g, &gpu[b], 8);
        std::memcpy(&c, &cpu[b], 8);
        std::memcpy(&s, &cpu_scalar[b], 8);
        EXPECT_EQ(c, s) << "block " << b << ": the CPU levels disagree";
        if (std::isnan(cpu[b])) {
          EXPECT_TRUE(std::isnan(gpu[b])) << "block " << b;
        } else {
          EXPECT_EQ(g, c) << "block " << b << ": gpu " << gpu[b] << " cpu " << cpu[b];
        }
      }
    }
  }
}

TEST_F(GpuKernelTest, AddInPlaceMatchesTheCpuSum) {
  constexpr size_t kN = 300007;
  std::vector<float> a = RandomFloats(11, kN, -3.0f, 3.0f);
  const std::vector<float> b = RandomFloats(12, kN, -1e-3f, 1e-3f);
  DeviceArray<float> ga(a), gb(b);
  ASSERT_TRUE(AddInPlace(ga.get(), gb.get(), kN, nullptr).ok());
  for (size_t i = 0; i < kN; ++i) a[i] = a[i] + b[i];
  ExpectSameFloats(ga.ToHost(), a, "accumulated");
}

// Every 16-bit pattern, and fp32 patterns that cover NaNs, infinities,
// denormals and the rounding boundaries, in each direction.
TEST_F(GpuKernelTest, CastMatchesTheScalarTwinBitForBit) {
  constexpr size_t kN32 = size_t{1} << 20;
  std::vector<uint8_t> fp32(kN32 * 4);
  for (size_t i = 0; i < kN32; ++i) {
    uint32_t u = static_cast<uint32_t>(SplitMix64(i));
    if (i < 65536) u = static_cast<uint32_t>(i) << 16 | (i & 1 ? 0x8000u : 0x7fffu);  // bf16 ties and near-ties
    if (i >= 65536 && i < 131072) u = static_cast<uint32_t>(i - 65536) << 13;         // the fp16 grid, and denormals
    std::memcpy(fp32.data() + 4 * i, &u, 4);
  }
  std::vector<uint8_t> all16(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    std::memcpy(all16.data() + 2 * i, &h, 2);
  }
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  for (DType src : dtypes) {
    for (DType dst : dtypes) {
      if (src == dst) continue;
      SCOPED_TRACE(::testing::Message() << "src " << DTypeIndex(src) << " dst " << DTypeIndex(dst));
      const std::vector<uint8_t>& input = src == DType::kFloat32 ? fp32 : all16;
      const size_t n = input.size() / DTypeSizeBytes(src);
      std::vector<uint8_t> cpu_out(n * DTypeSizeBytes(dst));
      cpu::ScalarKernels().cast[DTypeIndex(src)][DTypeIndex(dst)](input.data(), cpu_out.data(), n);
      DeviceArray<uint8_t> din(input);
      DeviceArray<uint8_t> dout(Zeros<uint8_t>(cpu_out.size()));
      ASSERT_TRUE(gpu::Cast(din.get(), src, dout.get(), dst, n, nullptr).ok());
      EXPECT_TRUE(dout.ToHost() == cpu_out);
    }
  }
}

TEST_F(GpuKernelTest, GeluMatchesTheCpuLayersBitForBit) {
  constexpr size_t kN = 65537;
  std::vector<float> x = RandomFloats(10, kN, -12.0f, 12.0f);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = std::numeric_limits<float>::infinity();
  x[3] = -std::numeric_limits<float>::infinity();
  x[4] = 1e-40f;
  x[5] = 100.0f;
  x[6] = -100.0f;
  const std::vector<float> dy = RandomFloats(11, kN, -1.0f, 1.0f);
  std::vector<float> cpu_y(kN), cpu_dx(kN);
  model::GeluForward(threads_, cpu_y.data(), x.data(), static_cast<int64_t>(kN));
  model::GeluBackward(threads_, cpu_dx.data(), x.data(), dy.data(), static_cast<int64_t>(kN));

  DeviceArray<float> dx_in(x), ddy(dy), dy_out(Zeros<float>(kN)), ddx(Zeros<float>(kN));
  ASSERT_TRUE(GeluForward(dx_in.get(), dy_out.get(), kN, nullptr).ok());
  ASSERT_TRUE(GeluBackward(dx_in.get(), ddy.get(), ddx.get(), kN, nullptr).ok());
  ExpectSameFloats(dy_out.ToHost(), cpu_y, "gelu");
  ExpectSameFloats(ddx.ToHost(), cpu_dx, "gelu grad");
}

// GELU's and LayerNorm's bf16-output forms (with bf16 products the model
// keeps those outputs in bf16 alone): the fp32 kernels' outputs rounded to
// nearest even, and the same statistics.
TEST_F(GpuKernelTest, Bf16OutputsAreTheFp32OutputsRounded) {
  auto expect_rounding = [](const std::vector<uint16_t>& got, const std::vector<float>& fp32, const char* what) {
    ASSERT_EQ(got.size(), fp32.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      differ += got[i] != FloatToBf16Bits(fp32[i]) && !(std::isnan(fp32[i]) && std::isnan(Bf16BitsToFloat(got[i])));
    }
    EXPECT_EQ(differ, 0u) << what;
  };
  constexpr size_t kN = 65537;
  std::vector<float> x = RandomFloats(30, kN, -12.0f, 12.0f);
  x[0] = std::numeric_limits<float>::infinity();
  x[1] = 1e-40f;
  DeviceArray<float> gx(x), gy(Zeros<float>(kN));
  DeviceArray<uint16_t> gy16(std::vector<uint16_t>(kN, 0xffff));
  ASSERT_TRUE(GeluForward(gx.get(), gy.get(), kN, nullptr).ok());
  ASSERT_TRUE(GeluForwardBf16(gx.get(), gy16.get(), kN, nullptr).ok());
  expect_rounding(gy16.ToHost(), gy.ToHost(), "gelu");
  for (const auto& [kRows, cols] : {std::pair<int64_t, int64_t>{37, 17}, {1000, 768}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << kRows << ", cols " << cols);
    const size_t n = static_cast<size_t>(kRows * cols);
    DeviceArray<float> lx(RandomFloats(31 + cols, n, -3.0f, 5.0f)), lw(RandomFloats(32 + cols, cols, 0.5f, 1.5f));
    DeviceArray<float> lb(RandomFloats(33 + cols, cols, -0.5f, 0.5f)), ly(Zeros<float>(n));
    DeviceArray<float> mean(Zeros<float>(kRows)), rstd(Zeros<float>(kRows)), mean16(Zeros<float>(kRows)),
        rstd16(Zeros<float>(kRows));
    DeviceArray<uint16_t> ly16(std::vector<uint16_t>(n, 0xffff));
    ASSERT_TRUE(
        LayerNormForward(lx.get(), lw.get(), lb.get(), ly.get(), mean.get(), rstd.get(), kRows, cols, nullptr).ok());
    ASSERT_TRUE(
        LayerNormForwardBf16(lx.get(), lw.get(), lb.get(), ly16.get(), mean16.get(), rstd16.get(), kRows, cols, nullptr)
            .ok());
    expect_rounding(ly16.ToHost(), ly.ToHost(), "layernorm y");
    ExpectSameFloats(mean16.ToHost(), mean.ToHost(), "mean");
    ExpectSameFloats(rstd16.ToHost(), rstd.ToHost(), "rstd");
  }
}

// Rows in one column chunk (37), several (1000: 16 chunks of 64 rows, the
// last partial) and the most (9001: 127 chunks of 71 rows; lane_math.h).
TEST_F(GpuKernelTest, LayerNormMatchesTheCpuLayersBitForBit) {
  for (const auto& [kRows, cols] :
       {std::pair<int64_t, int64_t>{37, 1}, {37, 15}, {37, 16}, {37, 17}, {37, 773}, {1000, 33}, {9001, 40}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << kRows << ", cols " << cols);
    const size_t n = static_cast<size_t>(kRows * cols);
    const std::vector<float> x = RandomFloats(20 + cols, n, -3.0f, 5.0f);
    const std::vector<float> w = RandomFloats(21 + cols, cols, 0.5f, 1.5f);
    const std::vector<float> b = RandomFloats(22 + cols, cols, -0.5f, 0.5f);
    const std::vector<float> dy = RandomFloats(23 + cols, n, -1.0f, 1.0f);
    std::vector<float> y(n), mean(kRows), rstd(kRows);
    std::vector<float> dx = RandomFloats(24 + cols, n, -0.1f, 0.1f);  // the backward accumulates
    std::vector<float> dw = RandomFloats(25 + cols, cols, -0.1f, 0.1f);
    std::vector<float> db = RandomFloats(26 + cols, cols, -0.1f, 0.1f);

    DeviceArray<float> gx(x), gw(w), gb(b), gdy(dy), gy(y), gmean(mean), grstd(rstd), gdx(dx), gdw(dw), gdb(db);
    model::LayerNormForward(threads_, y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kRows, cols);
    model::LayerNormBackward(threads_, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                             rstd.data(), kRows, cols);
    ASSERT_TRUE(
        LayerNormForward(gx.get(), gw.get(), gb.get(), gy.get(), gmean.get(), grstd.get(), kRows, cols, nullptr).ok());
    ASSERT_TRUE(LayerNormBackward(gdy.get(), gx.get(), gw.get(), gmean.get(), grstd.get(), gdx.get(), gdw.get(),
                                  gdb.get(), kRows, cols, nullptr)
                    .ok());
    ExpectSameFloats(gy.ToHost(), y, "y");
    ExpectSameFloats(gmean.ToHost(), mean, "mean");
    ExpectSameFloats(grstd.ToHost(), rstd, "rstd");
    ExpectSameFloats(gdx.ToHost(), dx, "dx");
    ExpectSameFloats(gdw.ToHost(), dw, "dw");
    ExpectSameFloats(gdb.ToHost(), db, "db");
  }
}

// Rows that are not a multiple of the kernels' batch of rows loaded ahead
// (16) or of a column chunk (64 rows; 71 at 9001 rows, lane_math.h), and
// columns that are not a multiple of a warp.
TEST_F(GpuKernelTest, ColumnSumMatchesTheCpuLayersBitForBit) {
  for (int64_t rows : {int64_t{1}, int64_t{31}, int64_t{32}, int64_t{100}, int64_t{4099}, int64_t{9001}}) {
    for (int64_t cols : {int64_t{1}, int64_t{33}, int64_t{768}}) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << ", cols " << cols);
      const std::vector<float> x = RandomFloats(40 + rows + cols, static_cast<size_t>(rows * cols), -1.0f, 1.0f);
      std::vector<float> out = RandomFloats(41 + cols, static_cast<size_t>(cols), -0.1f, 0.1f);  // accumulates
      DeviceArray<float> gx(x), gout(out);
      model::ColumnSumAccumulate(threads_, out.data(), x.data(), rows, cols);
      ASSERT_TRUE(ColumnSumAccumulate(gx.get(), gout.get(), rows, cols, nullptr).ok());
      ExpectSameFloats(gout.ToHost(), out, "column sums");
    }
  }
}

// The CPU twin is math/lane_math.h's row functions; T covers rows shorter
// than the 16 lanes, tails of every length and several matrices.
TEST_F(GpuKernelTest, CausalSoftmaxMatchesTheCpuRowsBitForBit) {
  for (int64_t T : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{37}, int64_t{130}}) {
    SCOPED_TRACE(::testing::Message() << "T " << T);
    const int64_t kMatrices = 3;
    const size_t n = static_cast<size_t>(kMatrices * T * T);
    std::vector<float> att = RandomFloats(50 + T, n, -6.0f, 6.0f);
    std::vector<float> datt = RandomFloats(51 + T, n, -1.0f, 1.0f);
    const float scale = 0.125f;
    DeviceArray<float> gatt(att), gdatt(datt);
    for (int64_t r = 0; r < kMatrices * T; ++r) math::CausalSoftmaxRow(att.data() + r * T, r % T, T);
    for (int64_t r = 0; r < kMatrices * T; ++r) {
      math::CausalSoftmaxBackwardRow(att.data() + r * T, datt.data() + r * T, r % T, T, scale);
    }
    ASSERT_TRUE(CausalSoftmaxForward(gatt.get(), kMatrices, T, nullptr).ok());
    ASSERT_TRUE(CausalSoftmaxBackward(gatt.get(), gdatt.get(), kMatrices, T, scale, nullptr).ok());
    ExpectSameFloats(gatt.ToHost(), att, "softmax");
    ExpectSameFloats(gdatt.ToHost(), datt, "softmax gradient");
  }
}

TEST_F(GpuKernelTest, SoftmaxCrossEntropyMatchesTheCpuLayers) {
  const int64_t kRows = 29;
  // The loss kernel goes by tiles of 2048: one whole tile, a tile and 17
  // (its lanes end one element into the second tile, then the tail), many.
  for (int64_t vocab :
       {int64_t{1}, int64_t{16}, int64_t{31}, int64_t{1000}, int64_t{2048}, int64_t{2065}, int64_t{50257}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    const size_t n = static_cast<size_t>(kRows * vocab);
    const std::vector<float> logits = RandomFloats(30 + vocab, n, -8.0f, 8.0f);
    std::vector<int32_t> targets(kRows);
    for (int64_t r = 0; r < kRows; ++r)
      targets[r] = r % 7 == 3 ? -1 : static_cast<int32_t>(SplitMix64(vocab * 100 + r) % vocab);
    constexpr float kScale = 1.0f / 29.0f;

    std::vector<float> probs(n), losses(kRows), dlogits(n);
    model::SoftmaxCrossEntropyForward(threads_, probs.data(), losses.data(), logits.data(), targets.data(), kRows,
                                      vocab);
    model::SoftmaxCrossEntropyBackward(threads_, dlogits.data(), probs.data(), targets.data(), kRows, vocab, kScale);

    DeviceArray<float> glogits(logits), gprobs(Zeros<float>(n)), glosses(Zeros<float>(kRows)),
        gdlogits(Zeros<float>(n));
    DeviceArray<int32_t> gtargets(targets);
    ASSERT_TRUE(SoftmaxCrossEntropyForward(glogits.get(), gtargets.get(), gprobs.get(), glosses.get(), kRows, vocab,
                                           vocab, nullptr)
                    .ok());
    ASSERT_TRUE(
        SoftmaxCrossEntropyBackward(gprobs.get(), gtargets.get(), gdlogits.get(), kRows, vocab, vocab, kScale, nullptr)
            .ok());
    const std::vector<float> gpu_probs = gprobs.ToHost();
    ExpectSameFloats(gpu_probs, probs, "probs");
    ExpectSameFloats(gdlogits.ToHost(), dlogits, "dlogits");
    const std::vector<float> gpu_losses = glosses.ToHost();
    for (int64_t r = 0; r < kRows; ++r) {
      EXPECT_NEAR(gpu_losses[r], losses[r], 1e-6 * std::max(1.0, std::fabs(static_cast<double>(losses[r]))))
          << "row " << r;
    }

    // In place (probs = logits, then dlogits = probs) gives the same bits.
    ASSERT_TRUE(SoftmaxCrossEntropyForward(glogits.get(), gtargets.get(), glogits.get(), glosses.get(), kRows, vocab,
                                           vocab, nullptr)
                    .ok());
    ExpectSameFloats(glogits.ToHost(), gpu_probs, "in-place probs");
    ExpectSameFloats(glosses.ToHost(), gpu_losses, "in-place losses");
    ASSERT_TRUE(
        SoftmaxCrossEntropyBackward(glogits.get(), gtargets.get(), glogits.get(), kRows, vocab, vocab, kScale, nullptr)
            .ok());
    ExpectSameFloats(glogits.ToHost(), dlogits, "in-place dlogits");

    // Rows ld = vocab + 5 apart (in place): each row's bits as above, the
    // padding between the rows untouched.
    const int64_t ld = vocab + 5;
    constexpr float kPad = 7.0f;
    std::vector<float> padded(static_cast<size_t>(kRows * ld), kPad);
    for (int64_t r = 0; r < kRows; ++r) std::copy_n(logits.data() + r * vocab, vocab, padded.data() + r * ld);
    DeviceArray<float> gpadded(padded);
    const auto rows_of = [&](const std::vector<float>& x) {
      std::vector<float> dense(n);
      for (int64_t r = 0; r < kRows; ++r) std::copy_n(x.data() + r * ld, vocab, dense.data() + r * vocab);
      return dense;
    };
    const auto padding_kept = [&](const std::vector<float>& x) {
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t j = vocab; j < ld; ++j) {
          if (x[r * ld + j] != kPad) return false;
        }
      }
      return true;
    };
    ASSERT_TRUE(SoftmaxCrossEntropyForward(gpadded.get(), gtargets.get(), gpadded.get(), glosses.get(), kRows, vocab,
                                           ld, nullptr)
                    .ok());
    std::vector<float> host = gpadded.ToHost();
    ExpectSameFloats(rows_of(host), probs, "probs with a row stride");
    EXPECT_TRUE(padding_kept(host));
    ExpectSameFloats(glosses.ToHost(), gpu_losses, "losses with a row stride");
    ASSERT_TRUE(
        SoftmaxCrossEntropyBackward(gpadded.get(), gtargets.get(), gpadded.get(), kRows, vocab, ld, kScale, nullptr)
            .ok());
    host = gpadded.ToHost();
    ExpectSameFloats(rows_of(host), dlogits, "dlogits with a row stride");
    EXPECT_TRUE(padding_kept(host));
  }
}

// The fused loss gradient for bf16 products: the CPU's backward with scale
// 1, then (scale / count) times it, then rounded to bf16, bit for bit; rows
// without a target are zeros; no count gives zeros too.
TEST_F(GpuKernelTest, SoftmaxCrossEntropyBackwardBf16IsTheThreeStepsFused) {
  const int64_t kRows = 23;
  for (int64_t vocab : {int64_t{1}, int64_t{31}, int64_t{1000}, int64_t{50257}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    const int64_t ld = (vocab + 7) / 8 * 8;  // as the CUDA stages pad the logits' rows
    const size_t n = static_cast<size_t>(kRows * vocab);
    const std::vector<float> logits = RandomFloats(60 + vocab, n, -8.0f, 8.0f);
    std::vector<int32_t> targets(kRows);
    for (int64_t r = 0; r < kRows; ++r)
      targets[r] = r % 5 == 2 ? -1 : static_cast<int32_t>(SplitMix64(vocab * 7 + r) % vocab);
    std::vector<float> probs(n), losses(kRows), dlogits(n);
    const int64_t valid = model::SoftmaxCrossEntropyForward(threads_, probs.data(), losses.data(), logits.data(),
                                                            targets.data(), kRows, vocab);
    model::SoftmaxCrossEntropyBackward(threads_, dlogits.data(), probs.data(), targets.data(), kRows, vocab, 1.0f);
    const float kLossScale = 1024.0f;
    for (const float count : {static_cast<float>(valid), 0.0f}) {
      const float k = count > 0 ? kLossScale / count : 0.0f;
      // Rows ld apart in probs and the result; the result's padding untouched.
      std::vector<uint16_t> want(static_cast<size_t>(kRows * ld), 0xffff);
      std::vector<float> probs_ld(static_cast<size_t>(kRows * ld), 0.0f);
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t j = 0; j < vocab; ++j) {
          want[r * ld + j] = FloatToBf16Bits(k * dlogits[r * vocab + j]);
          probs_ld[r * ld + j] = probs[r * vocab + j];
        }
      }
      DeviceArray<float> gprobs(probs_ld), gcount(std::vector<float>{count});
      DeviceArray<int32_t> gtargets(targets);
      DeviceArray<uint16_t> gout(std::vector<uint16_t>(want.size(), 0xffff));
      ASSERT_TRUE(SoftmaxCrossEntropyBackwardBf16(gprobs.get(), gtargets.get(), gout.get(), kRows, vocab, ld,
                                                  kLossScale, gcount.get(), nullptr)
                      .ok());
      const std::vector<uint16_t> got = gout.ToHost();
      size_t differ = 0;
      for (size_t i = 0; i < want.size(); ++i) differ += got[i] != want[i];
      EXPECT_EQ(differ, 0u) << "count " << count;
    }
  }
  EXPECT_EQ(SoftmaxCrossEntropyBackwardBf16(nullptr, nullptr, nullptr, 1, 1, 1, 1.0f, nullptr, nullptr).code(),
            StatusCode::kInvalidArgument);
}

// The chunked loss's backward gradient straight from the logits: the bits
// of the softmax kernel's probabilities through the fused bf16 gradient,
// padding untouched, ignored rows zero, and a zero count.
TEST_F(GpuKernelTest, SoftmaxCrossEntropyGradBf16IsForwardThenBackwardBf16) {
  const int64_t kRows = 19;
  for (int64_t vocab : {int64_t{1}, int64_t{17}, int64_t{2049}, int64_t{50257}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    const int64_t ld = (vocab + 7) / 8 * 8;
    const size_t n = static_cast<size_t>(kRows * ld);
    std::vector<float> logits = RandomFloats(80 + vocab, n, -30.0f, 30.0f);
    logits[3] = -std::numeric_limits<float>::infinity();
    std::vector<int32_t> targets(kRows);
    for (int64_t r = 0; r < kRows; ++r)
      targets[r] = r % 4 == 1 ? -1 : static_cast<int32_t>(SplitMix64(vocab * 3 + r) % vocab);
    for (const float count : {11.0f, 0.0f}) {
      DeviceArray<float> gl(logits), gprobs(Zeros<float>(n)), glosses(Zeros<float>(kRows)),
          gcount(std::vector<float>{count});
      DeviceArray<int32_t> gt(targets);
      DeviceArray<uint16_t> want(std::vector<uint16_t>(n, 0xffff)), got(std::vector<uint16_t>(n, 0xffff));
      ASSERT_TRUE(
          SoftmaxCrossEntropyForward(gl.get(), gt.get(), gprobs.get(), glosses.get(), kRows, vocab, ld, nullptr).ok());
      ASSERT_TRUE(SoftmaxCrossEntropyBackwardBf16(gprobs.get(), gt.get(), want.get(), kRows, vocab, ld, 512.0f,
                                                  gcount.get(), nullptr)
                      .ok());
      ASSERT_TRUE(
          SoftmaxCrossEntropyGradBf16(gl.get(), gt.get(), got.get(), kRows, vocab, ld, 512.0f, gcount.get(), nullptr)
              .ok());
      const std::vector<uint16_t> a = want.ToHost(), b = got.ToHost();
      size_t differ = 0;
      for (size_t i = 0; i < n; ++i) differ += a[i] != b[i];
      EXPECT_EQ(differ, 0u) << "count " << count;
    }
  }
  float buf[16] = {};
  EXPECT_EQ(
      SoftmaxCrossEntropyGradBf16(buf, nullptr, reinterpret_cast<uint16_t*>(buf), 1, 8, 8, 1.0f, buf, nullptr).code(),
      StatusCode::kInvalidArgument);
  const int32_t target = 0;
  const Status st =
      SoftmaxCrossEntropyGradBf16(buf, &target, reinterpret_cast<uint16_t*>(buf + 2), 1, 8, 8, 1.0f, buf + 12, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("overlaps"), std::string::npos) << st.ToString();
}

TEST_F(GpuKernelTest, EmbeddingMatchesTheCpuLayers) {
  const int64_t kBatch = 16, kSeqLen = 8, kChannels = 33, kVocab = 13;  // each token repeats about 10 times
  const int64_t rows = kBatch * kSeqLen;
  std::vector<int32_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>(SplitMix64(500 + r) % kVocab);
  const std::vector<float> wte = RandomFloats(40, kVocab * kChannels, -1.0f, 1.0f);
  const std::vector<float> wpe = RandomFloats(41, kSeqLen * kChannels, -1.0f, 1.0f);
  const std::vector<float> dout = RandomFloats(42, rows * kChannels, -1.0f, 1.0f);
  const std::vector<float> dwte0 = RandomFloats(43, kVocab * kChannels, -0.1f, 0.1f);
  const std::vector<float> dwpe0 = RandomFloats(44, kSeqLen * kChannels, -0.1f, 0.1f);

  std::vector<float> out(rows * kChannels), dwte = dwte0, dwpe = dwpe0;
  model::EncoderForward(threads_, out.data(), tokens.data(), wte.data(), wpe.data(), kBatch, kSeqLen, kChannels);
  model::EncoderBackward(threads_, dwte.data(), dwpe.data(), dout.data(), tokens.data(), kBatch, kSeqLen, kChannels);

  DeviceArray<int32_t> gtokens(tokens);
  DeviceArray<float> gwte(wte), gwpe(wpe), gdout(dout), gout(Zeros<float>(out.size()));
  ASSERT_TRUE(
      EmbeddingForward(gtokens.get(), gwte.get(), gwpe.get(), gout.get(), rows, kSeqLen, kChannels, nullptr).ok());
  ExpectSameFloats(gout.ToHost(), out, "out");
  // Without positions: a plain gather.
  ASSERT_TRUE(EmbeddingForward(gtokens.get(), gwte.get(), nullptr, gout.get(), rows, kSeqLen, kChannels, nullptr).ok());
  const std::vector<float> gathered = gout.ToHost();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < kChannels; ++c)
      ASSERT_TRUE(SameFloat(gathered[r * kChannels + c], wte[tokens[r] * kChannels + c])) << r << ", " << c;
  }
  // bf16 token embeddings read in place (bf16 parameters): the CPU's rows
  // of their widened values.
  {
    std::vector<uint16_t> wte16(wte.size());
    std::vector<float> wte_wide(wte.size()), want16(out.size());
    for (size_t i = 0; i < wte.size(); ++i) {
      wte16[i] = FloatToBf16Bits(wte[i]);
      wte_wide[i] = Bf16BitsToFloat(wte16[i]);
    }
    model::EncoderForward(threads_, want16.data(), tokens.data(), wte_wide.data(), wpe.data(), kBatch, kSeqLen,
                          kChannels);
    DeviceArray<uint16_t> gwte16(wte16);
    ASSERT_TRUE(
        EmbeddingForward(gtokens.get(), gwte16.get(), gwpe.get(), gout.get(), rows, kSeqLen, kChannels, nullptr).ok());
    ExpectSameFloats(gout.ToHost(), want16, "out from bf16 wte");
  }

  // Backward adds each element's rows in row order, as the CPU does: the
  // same bits, run after run (twice here, and with a batch of rows that is
  // not a power of two, so the sort's padding is in play).
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    DeviceArray<float> gdwte_run(dwte0), gdwpe_run(dwpe0);
    DeviceArray<uint64_t> work(Zeros<uint64_t>(EmbeddingBackwardWorkspaceBytes(rows) / 8));
    ASSERT_TRUE(EmbeddingBackward(gdout.get(), gtokens.get(), gdwte_run.get(), gdwpe_run.get(), rows, kSeqLen,
                                  kChannels, work.get(), EmbeddingBackwardWorkspaceBytes(rows), nullptr)
                    .ok());
    ExpectSameFloats(gdwte_run.ToHost(), dwte, "dwte");
    ExpectSameFloats(gdwpe_run.ToHost(), dwpe, "dwpe");
  }
  const int64_t odd_rows = rows - 3;  // a partial last sequence
  std::vector<float> dwte_odd = dwte0, dwpe_odd = dwpe0;
  std::vector<float> dout_odd(dout.begin(), dout.begin() + odd_rows * kChannels);
  std::vector<int32_t> tokens_odd(tokens.begin(), tokens.begin() + odd_rows);
  for (int64_t r = 0; r < odd_rows; ++r) {
    for (int64_t c = 0; c < kChannels; ++c) {
      dwte_odd[tokens_odd[r] * kChannels + c] += dout_odd[r * kChannels + c];
      dwpe_odd[(r % kSeqLen) * kChannels + c] += dout_odd[r * kChannels + c];
    }
  }
  DeviceArray<float> gdwte_odd(dwte0), gdwpe_odd(dwpe0);
  DeviceArray<uint64_t> work(Zeros<uint64_t>(EmbeddingBackwardWorkspaceBytes(odd_rows) / 8));
  ASSERT_TRUE(EmbeddingBackward(gdout.get(), gtokens.get(), gdwte_odd.get(), gdwpe_odd.get(), odd_rows, kSeqLen,
                                kChannels, work.get(), EmbeddingBackwardWorkspaceBytes(odd_rows), nullptr)
                  .ok());
  ExpectSameFloats(gdwte_odd.ToHost(), dwte_odd, "dwte, odd rows");
  ExpectSameFloats(gdwpe_odd.ToHost(), dwpe_odd, "dwpe, odd rows");
}

TEST(GpuKernelArgsTest, RowKernelsRefuseBadShapes) {
  float x = 0;
  int32_t t = 0;
  EXPECT_EQ(LayerNormForward(&x, &x, &x, &x, &x, &x, 1, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SoftmaxCrossEntropyForward(&x, &t, &x, &x, -1, 4, 4, nullptr).code(), StatusCode::kInvalidArgument);
  // A row stride below the vocabulary.
  EXPECT_EQ(SoftmaxCrossEntropyForward(&x, &t, &x, &x, 1, 4, 3, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SoftmaxCrossEntropyBackward(&x, &t, &x, 1, 4, 3, 1.0f, nullptr).code(), StatusCode::kInvalidArgument);
  uint16_t h = 0;
  EXPECT_EQ(SoftmaxCrossEntropyBackwardBf16(&x, &t, &h, 1, 4, 3, 1.0f, &x, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingForward(&t, &x, nullptr, &x, 1, 0, 1, nullptr).code(), StatusCode::kInvalidArgument);
  // Embedding backward's sort keys: 8 bytes a row, rows rounded up to a
  // power of two; a smaller or misaligned workspace is refused before any
  // launch.
  EXPECT_EQ(EmbeddingBackwardWorkspaceBytes(1), 8u);
  EXPECT_EQ(EmbeddingBackwardWorkspaceBytes(128), 1024u);
  EXPECT_EQ(EmbeddingBackwardWorkspaceBytes(129), 2048u);
  uint64_t small[2] = {};
  EXPECT_EQ(EmbeddingBackward(&x, &t, &x, nullptr, 3, 3, 1, small, sizeof small, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingBackward(&x, &t, &x, nullptr, 2, 2, 1, reinterpret_cast<char*>(small) + 4, 12, nullptr).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EmbeddingBackward(&x, &t, &x, nullptr, 2, 2, 1, nullptr, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(LayerNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 8, nullptr).ok());
  // A bf16 output over its fp32 input is refused (another thread's write
  // would land before the read).
  float buf[32] = {};
  auto* half = reinterpret_cast<uint16_t*>(buf);
  EXPECT_EQ(GeluForwardBf16(buf, half + 2, 16, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerNormForwardBf16(buf, buf, buf, half + 2, buf + 24, buf + 28, 2, 8, nullptr).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::gpu
