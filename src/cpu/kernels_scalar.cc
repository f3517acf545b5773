// The scalar twin: plain loops over adam_math.h and float16.h, one element at
// a time. It is the reference every SIMD level is tested against bit for bit,
// and the level used where no SIMD level is available (or ZINF_SIMD=scalar).
// Compiled with the baseline flags only.
#include <cstring>

#include "math/dtype_access.h"
#include "common/float16.h"
#include "cpu/kernels.h"

namespace zinf::cpu {
namespace {

template <DType kGrad, ParamCopy kCopy>
void AdamScalar(const math::AdamStepConstants& c, float* params, float* exp_avg, float* exp_avg_sq, const void* grads,
                void* param_copy, size_t num_elems) {
  const math::AdamCoefficients<float> k(c);
  for (size_t i = 0; i < num_elems; ++i) {
    float p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    math::AdamUpdate(k, math::LoadAsFloat<kGrad>(grads, i), p, m, v);
    params[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if constexpr (kCopy == ParamCopy::kBf16) math::StoreFromFloat<DType::kBFloat16>(param_copy, i, p);
    if constexpr (kCopy == ParamCopy::kFp16) math::StoreFromFloat<DType::kFloat16>(param_copy, i, p);
    if constexpr (kCopy == ParamCopy::kFp32) static_cast<float*>(param_copy)[i] = p;
  }
}

template <DType kType>
void SumSquaresScalar(const void* data, size_t num_elems, double lanes[math::kNormLanes]) {
  for (int l = 0; l < math::kNormLanes; ++l) lanes[l] = 0.0;
  for (size_t i = 0; i < num_elems; ++i) {
    const double x = math::LoadAsFloat<kType>(data, i);
    lanes[i % math::kNormLanes] += x * x;  // x * x is exact in double (24-bit mantissa squared)
  }
}

template <DType kSrc, DType kDst>
void CastScalar(const void* src, void* dst, size_t num_elems) {
  for (size_t i = 0; i < num_elems; ++i) math::StoreFromFloat<kDst>(dst, i, math::LoadAsFloat<kSrc>(src, i));
}

template <DType kGrad>
void FillAdamRow(KernelTable& t) {
  constexpr int g = static_cast<int>(kGrad);
  t.adam[g][0] = &AdamScalar<kGrad, ParamCopy::kNone>;
  t.adam[g][1] = &AdamScalar<kGrad, ParamCopy::kBf16>;
  t.adam[g][2] = &AdamScalar<kGrad, ParamCopy::kFp16>;
  t.adam[g][3] = &AdamScalar<kGrad, ParamCopy::kFp32>;
}

KernelTable MakeScalarTable() {
  KernelTable t{};
  t.level = SimdLevel::kScalar;
  FillAdamRow<DType::kFloat32>(t);
  FillAdamRow<DType::kBFloat16>(t);
  FillAdamRow<DType::kFloat16>(t);
  t.sum_squares[0] = &SumSquaresScalar<DType::kFloat32>;
  t.sum_squares[1] = &SumSquaresScalar<DType::kBFloat16>;
  t.sum_squares[2] = &SumSquaresScalar<DType::kFloat16>;
  t.cast[0][1] = &CastScalar<DType::kFloat32, DType::kBFloat16>;
  t.cast[0][2] = &CastScalar<DType::kFloat32, DType::kFloat16>;
  t.cast[1][0] = &CastScalar<DType::kBFloat16, DType::kFloat32>;
  t.cast[1][2] = &CastScalar<DType::kBFloat16, DType::kFloat16>;
  t.cast[2][0] = &CastScalar<DType::kFloat16, DType::kFloat32>;
  t.cast[2][1] = &CastScalar<DType::kFloat16, DType::kBFloat16>;
  return t;
}

}  // namespace

const KernelTable& ScalarKernels() {
  static const KernelTable table = MakeScalarTable();
  return table;
}

}  // namespace zinf::cpu
