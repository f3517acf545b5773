// Every layer's backward against central finite differences of its forward,
// in double precision on tiny shapes (odd sizes, so the 16-lane loops have
// tails), and the fp32 per-element math against libm.
//
// The objective is J = Σ out ⊙ R for a fixed random R, so dJ/dout = R is
// what each backward receives. With step h = 1e-6 in double, the central
// difference is accurate to about h² |f'''| + ε |J| / h ≈ 1e-10 here; the
// tolerance 1e-7 + 1e-6 |g| leaves two to three orders of margin while any
// wrong term (a missing factor, a transposed index) is off by O(|g|).
#include "model/layers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "common/float16.h"
#include "model/gemm.h"
#include "math/gpt_math.h"

namespace zinf::model {
namespace {

using Vec = std::vector<double>;

Vec Random(size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (double& x : v) x = d(rng);
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Compares analytic[i] with the central difference of objective() in x[i].
void ExpectMatchesFiniteDifferences(const std::string& what, Vec& x, const Vec& analytic,
                                    const std::function<double()>& objective) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  constexpr double kStep = 1e-6;
  double max_err = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kStep;
    const double plus = objective();
    x[i] = saved - kStep;
    const double minus = objective();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * kStep);
    const double err = std::abs(analytic[i] - numeric);
    max_err = std::max(max_err, err);
    EXPECT_LE(err, 1e-7 + 1e-6 * std::abs(numeric))
        << what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric;
  }
  ::testing::Test::RecordProperty(what + "_max_abs_err", std::to_string(max_err));
}

const ModelThreads& Serial() {
  static const ModelThreads threads(1);
  return threads;
}

TEST(LayerGradTest, Encoder) {
  std::mt19937_64 rng(1);
  const int64_t B = 2, T = 3, C = 5, V = 4, kMaxT = 4;
  const std::vector<int32_t> tokens = {1, 3, 1, 0, 1, 2};  // token 1 three times: the scatter must add
  Vec wte = Random(V * C, rng), wpe = Random(kMaxT * C, rng), r = Random(B * T * C, rng);
  auto objective = [&] {
    Vec out(B * T * C);
    EncoderForward<double>(Serial(), out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return Dot(out, r);
  };
  Vec dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  EncoderBackward<double>(Serial(), dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
  ExpectMatchesFiniteDifferences("dwte", wte, dwte, objective);
  ExpectMatchesFiniteDifferences("dwpe", wpe, dwpe, objective);
}

TEST(LayerGradTest, LayerNorm) {
  for (int64_t C : {7, 37}) {
    SCOPED_TRACE("C=" + std::to_string(C));
    std::mt19937_64 rng(2);
    const int64_t rows = 5;
    Vec x = Random(rows * C, rng, -2, 3), w = Random(C, rng, 0.5, 1.5), b = Random(C, rng), r = Random(rows * C, rng);
    auto objective = [&] {
      Vec out(rows * C), mean(rows), rstd(rows);
      LayerNormForward<double>(Serial(), out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C);
      return Dot(out, r);
    };
    Vec out(rows * C), mean(rows), rstd(rows);
    LayerNormForward<double>(Serial(), out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C);
    // dinp accumulates: start it at 1 and subtract.
    Vec dx(x.size(), 1.0), dw(C, 0.0), db(C, 0.0);
    LayerNormBackward<double>(Serial(), dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), rows, C);
    for (double& v : dx) v -= 1.0;
    ExpectMatchesFiniteDifferences("dx", x, dx, objective);
    ExpectMatchesFiniteDifferences("dw", w, dw, objective);
    ExpectMatchesFiniteDifferences("db", b, db, objective);
  }
}

TEST(LayerGradTest, Linear) {
  std::mt19937_64 rng(3);
  const int64_t rows = 5, in = 6, out_dim = 7;
  Vec x = Random(rows * in, rng), w = Random(in * out_dim, rng), bias = Random(out_dim, rng),
      r = Random(rows * out_dim, rng);
  auto objective = [&] {
    Vec out(rows * out_dim);
    LinearForward<double>(Serial(), out.data(), x.data(), w.data(), bias.data(), rows, in, out_dim);
    return Dot(out, r);
  };
  Vec dx(x.size(), 123.0);  // overwritten (accumulate_dinp = false)
  Vec dw(w.size(), 0.0), dbias(out_dim, 0.0);
  LinearBackward<double>(Serial(), dx.data(), false, dw.data(), dbias.data(), r.data(), x.data(), w.data(), rows, in,
                         out_dim);
  ExpectMatchesFiniteDifferences("dx", x, dx, objective);
  ExpectMatchesFiniteDifferences("dw", w, dw, objective);
  ExpectMatchesFiniteDifferences("dbias", bias, dbias, objective);
}

TEST(LayerGradTest, CausalAttention) {
  std::mt19937_64 rng(4);
  const int64_t B = 2, T = 5, C = 6, H = 2;
  Vec qkv = Random(B * T * 3 * C, rng, -2, 2), r = Random(B * T * C, rng);
  Vec att(B * H * T * T);
  auto objective = [&] {
    Vec out(B * T * C);
    AttentionForward<double>(Serial(), out.data(), att.data(), qkv.data(), B, T, C, H);
    return Dot(out, r);
  };
  objective();
  // The mask: no query attends to a later key, and each row sums to 1.
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t i = 0; i < T; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < T; ++j) {
        const double a = att[(bh * T + i) * T + j];
        if (j > i) {
          EXPECT_EQ(a, 0.0);
        }
        sum += a;
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
    }
  }
  Vec dqkv(qkv.size(), 77.0), datt(att.size());  // dqkv is overwritten
  AttentionBackward<double>(Serial(), dqkv.data(), datt.data(), r.data(), qkv.data(), att.data(), B, T, C, H);
  ExpectMatchesFiniteDifferences("dqkv", qkv, dqkv, objective);
}

TEST(LayerGradTest, Gelu) {
  std::mt19937_64 rng(5);
  const int64_t n = 41;
  Vec x = Random(n, rng, -6, 6), r = Random(n, rng);
  auto objective = [&] {
    Vec out(n);
    GeluForward<double>(Serial(), out.data(), x.data(), n);
    return Dot(out, r);
  };
  Vec dx(n);
  GeluBackward<double>(Serial(), dx.data(), x.data(), r.data(), n);
  ExpectMatchesFiniteDifferences("dx", x, dx, objective);
}

TEST(LayerGradTest, SoftmaxCrossEntropy) {
  std::mt19937_64 rng(6);
  const int64_t rows = 4, V = 19;
  const std::vector<int32_t> targets = {2, -1, 18, 0};  // row 1 is ignored
  Vec logits = Random(rows * V, rng, -4, 4);
  auto objective = [&] {
    Vec probs(rows * V), losses(rows);
    const int64_t valid = SoftmaxCrossEntropyForward<double>(Serial(), probs.data(), losses.data(), logits.data(),
                                                             targets.data(), rows, V);
    EXPECT_EQ(valid, 3);
    EXPECT_EQ(losses[1], 0.0);
    double sum = 0;
    for (double l : losses) sum += l;
    return sum / static_cast<double>(valid);
  };
  objective();
  Vec probs(rows * V), losses(rows);
  SoftmaxCrossEntropyForward<double>(Serial(), probs.data(), losses.data(), logits.data(), targets.data(), rows, V);
  // In place, as the model does it.
  SoftmaxCrossEntropyBackward<double>(Serial(), probs.data(), probs.data(), targets.data(), rows, V, 1.0 / 3.0);
  ExpectMatchesFiniteDifferences("dlogits", logits, probs, objective);
}

// ParallelGemm (fp32, tiled over threads) against a plain double loop, for
// every transposition, beta 0 and 1, and sizes that leave partial tiles.
TEST(LayerGradTest, ParallelGemmMatchesPlainLoops) {
  std::mt19937_64 rng(7);
  const int64_t m = 600, n = 900, k = 21;
  const GemmTiles tiles = GemmTilesFor(m, n, k);
  EXPECT_LT(tiles.tile_m, m);
  EXPECT_LT(tiles.tile_n, n);
  const Vec a64 = Random(m * k, rng), b64 = Random(k * n, rng), c64 = Random(m * n, rng);
  const std::vector<float> a(a64.begin(), a64.end()), b(b64.begin(), b64.end());
  const ModelThreads threads(2);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb << " beta=" << beta);
        std::vector<float> c(c64.begin(), c64.end());
        const int64_t lda = ta ? m : k, ldb = tb ? k : n;
        ParallelGemm<float>(threads, ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, beta, c.data(), n);
        double max_err = 0;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t l = 0; l < k; ++l) {
              s += static_cast<double>(a[ta ? l * lda + i : i * lda + l]) * b[tb ? j * ldb + l : l * ldb + j];
            }
            const double expected = 0.5 * s + beta * static_cast<double>(static_cast<float>(c64[i * n + j]));
            max_err = std::max(max_err, std::abs(c[i * n + j] - expected));
          }
        }
        EXPECT_LT(max_err, 1e-5);  // |terms| <= 1, k = 21: a few fp32 ulps of ~4
      }
    }
  }
}

// AlignedGemmPieces: the pieces of an unaligned product, run one Gemm each at
// their offsets, give the whole product (every transposition, leading
// dimensions wider than the operands, beta 0 and 1, k cut or not); each
// size is a multiple of the alignment or below it; an aligned product is
// one piece. The pieces and the whole call are each held to the exact
// product (in double) within the fp32 error bound of a chain of k + 4
// roundings: OpenBLAS may sum an element in another order in a smaller
// call (its Haswell kernels, picked on AMD EPYC, do: 1.4e-6 apart with k = 35),
// so the bits of the whole call are not the pieces' target. A piece at a
// wrong offset is off by hundredths or more; the bound is about 1e-5.
TEST(LayerGradTest, AlignedGemmPiecesMakeTheWholeProduct) {
  EXPECT_EQ(AlignedGemmPieces(64, 128, 32, 8, true).size(), 1u);
  EXPECT_EQ(AlignedGemmPieces(5, 7, 3, 8, true).size(), 1u);  // each below the alignment
  EXPECT_EQ(AlignedGemmPieces(67, 129, 35, 8, false).size(), 4u);
  std::mt19937_64 rng(11);
  const int64_t m = 67, n = 129, k = 35, pad = 3;
  for (bool split_k : {false, true}) {
    const std::vector<GemmPiece> pieces = AlignedGemmPieces(m, n, k, 8, split_k);
    ASSERT_EQ(pieces.size(), split_k ? 8u : 4u);
    for (const GemmPiece& p : pieces) {
      for (const int64_t size : {p.m, p.n, split_k ? p.k : 0}) EXPECT_TRUE(size % 8 == 0 || size < 8) << size;
      if (!split_k) {
        EXPECT_EQ(p.k, k);
      }
    }
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (float beta : {0.0f, 1.0f}) {
          SCOPED_TRACE(::testing::Message()
                       << "split_k=" << split_k << " ta=" << ta << " tb=" << tb << " beta=" << beta);
          const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
          const Vec a64 = Random((ta ? k : m) * lda, rng), b64 = Random((tb ? n : k) * ldb, rng);
          const Vec c64 = Random(m * ldc, rng);
          const std::vector<float> a(a64.begin(), a64.end()), b(b64.begin(), b64.end()), c0(c64.begin(), c64.end());
          std::vector<float> whole = c0, cut = c0;
          Gemm<float>(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, beta, whole.data(), ldc);
          for (const GemmPiece& p : pieces) {
            Gemm<float>(ta, tb, p.m, p.n, p.k, 0.5f, a.data() + p.AOffset(ta, lda), lda, b.data() + p.BOffset(tb, ldb),
                        ldb, p.k0 == 0 ? beta : 1.0f, cut.data() + p.COffset(ldc), ldc);
          }
          // |fl(x) - x| <= gamma(k + 4) · (|alpha| Σ|a||b| + |beta c|), gamma(r) = r u / (1 - r u):
          // any order of the k products' sums, with or without FMA, the
          // alpha and beta terms, and the second part of a cut k added onto the first.
          const double u = std::ldexp(1.0, -24), gamma = (k + 4) * u / (1 - (k + 4) * u);
          int bad = 0;
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const size_t at = static_cast<size_t>(i * ldc + j);
              if (j >= n) {  // the padding columns: untouched
                if (cut[at] != c0[at] && ++bad <= 5) ADD_FAILURE() << "padding C[" << i << "," << j << "] written";
                continue;
              }
              double exact = 0, magnitude = 0;
              for (int64_t l = 0; l < k; ++l) {
                const double x =
                    static_cast<double>(a[ta ? l * lda + i : i * lda + l]) * b[tb ? j * ldb + l : l * ldb + j];
                exact += x;
                magnitude += std::abs(x);
              }
              exact = 0.5 * exact + beta * static_cast<double>(c0[at]);
              const double bound = gamma * (0.5 * magnitude + std::abs(beta * static_cast<double>(c0[at])));
              for (const float got : {cut[at], whole[at]}) {
                if (std::abs(got - exact) > bound && ++bad <= 5) {
                  ADD_FAILURE() << "C[" << i << "," << j << "] = " << got << ", exact " << exact << ", bound " << bound
                                << " (pieces " << cut[at] << ", whole call " << whole[at] << ")";
                }
              }
            }
          }
          EXPECT_EQ(bad, 0);
        }
      }
    }
  }
}

// bf16 operands: bit for bit the fp32 product of the operands rounded to
// bf16 (to nearest even, as every 16-bit store in zinf), for every
// transposition and leading dimensions wider than the operands, through
// ParallelGemm and OperandGemm; and not the fp32 product of the originals.
TEST(LayerGradTest, Bf16OperandsGiveTheFp32ProductOfRoundedOperands) {
  std::mt19937_64 rng(11);
  const int64_t m = 600, n = 900, k = 37;
  auto round = [](std::vector<float> v) {
    for (float& x : v) x = Bf16BitsToFloat(FloatToBf16Bits(x));
    return v;
  };
  const ModelThreads bf16(2, DType::kBFloat16), fp32(2);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "ta=" << ta << " tb=" << tb);
      const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5;
      const Vec a64 = Random((ta ? k : m) * lda, rng), b64 = Random((tb ? n : k) * ldb, rng);
      const std::vector<float> a(a64.begin(), a64.end()), b(b64.begin(), b64.end());
      const std::vector<float> ra = round(a), rb = round(b);
      ASSERT_NE(ra, a);  // the rounding changes the operands
      const Vec c64 = Random(m * n, rng);
      const std::vector<float> c0(c64.begin(), c64.end());
      std::vector<float> got = c0, want = c0, plain = c0;
      ParallelGemm<float>(bf16, ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, got.data(), n);
      ParallelGemm<float>(fp32, ta, tb, m, n, k, 0.5f, ra.data(), lda, rb.data(), ldb, 1.0f, want.data(), n);
      ParallelGemm<float>(fp32, ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, plain.data(), n);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
      EXPECT_NE(got, plain);
      // One (row-tile-sized) product on the calling thread.
      const int64_t mt = 64;
      std::vector<float> got1(mt * n, 0.0f), want1(mt * n, 0.0f);
      OperandGemm<float>(DType::kBFloat16, ta, tb, mt, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, got1.data(), n);
      Gemm<float>(ta, tb, mt, n, k, 1.0f, ra.data(), lda, rb.data(), ldb, 0.0f, want1.data(), n);
      EXPECT_EQ(std::memcmp(got1.data(), want1.data(), got1.size() * sizeof(float)), 0);
    }
  }
}

// The fp32 exp is the one approximation in the model's math: within 2 ulp
// of libm's double exp over the range it covers, exactly 1 at 0, 0 far below.
TEST(GptMathTest, Fp32ExpIsWithinTwoUlp) {
  double max_ulp = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.0007f) {
    const double exact = std::exp(static_cast<double>(x));
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
    max_ulp = std::max(max_ulp, std::abs(static_cast<double>(math::Exp(x)) - exact) / ulp);
  }
  EXPECT_LE(max_ulp, 2.0);
  RecordProperty("exp_max_ulp", std::to_string(max_ulp));
  EXPECT_EQ(math::Exp(0.0f), 1.0f);
  EXPECT_EQ(math::Exp(-100.0f), 0.0f);
  EXPECT_EQ(math::Exp(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(math::Exp(NAN)));
}

// fp32 GELU and its derivative against the textbook tanh form in double.
TEST(GptMathTest, Fp32GeluMatchesTheTanhFormula) {
  for (float x = -10.0f; x <= 10.0f; x += 0.001f) {
    const double xd = x;
    const double u = std::sqrt(2.0 / M_PI) * (xd + 0.044715 * xd * xd * xd);
    const double th = std::tanh(u);
    const double gelu = 0.5 * xd * (1.0 + th);
    const double grad =
        0.5 * (1.0 + th) + 0.5 * xd * (1.0 - th * th) * std::sqrt(2.0 / M_PI) * (1.0 + 3 * 0.044715 * xd * xd);
    ASSERT_NEAR(math::Gelu(x), gelu, 1e-6 * std::max(1.0, std::abs(gelu))) << x;
    ASSERT_NEAR(math::GeluGrad(x), grad, 2e-6) << x;
  }
}

}  // namespace
}  // namespace zinf::model
