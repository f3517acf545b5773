// A straightforward double-precision GPT-2 for the tests: plain loops, no
// BLAS, no threads, no shared code with src/model apart from the config and
// the parameter layout — the oracle GptModel's loss and gradients are checked
// against. Follows the structure of llm.c's train_gpt2.c (the CPU reference
// of the llm.c project) with tanh-GELU, causal attention and a tied LM head.
// Not thread-safe; one object per test.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/gpt_config.h"

namespace zinf::model::test {

using Vec = std::vector<double>;

class GptReference {
 public:
  GptReference(const GptConfig& c, int64_t batch, int64_t seq_len) : c_(c), B_(batch), T_(seq_len) {}

  // Mean cross-entropy over targets >= 0. params: one buffer per unit.
  double Forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                 const std::vector<Vec>& params) {
    tokens_ = tokens;
    targets_ = targets;
    params_ = params;
    const int64_t B = B_, T = T_, C = c_.embed_dim, V = c_.vocab_size, L = c_.num_layers, BT = B * T;
    const EmbeddingLayout e = EmbeddingLayout::For(c_);
    const BlockLayout w = BlockLayout::For(c_);
    const Vec& pe = params[0];
    residual_.assign(L + 1, Vec(BT * C));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < C; ++i) {
          residual_[0][(b * T + t) * C + i] = pe[e.wte + tokens[b * T + t] * C + i] + pe[e.wpe + t * C + i];
        }
      }
    }
    acts_.assign(L, Acts{});
    for (int64_t l = 0; l < L; ++l) {
      const Vec& p = params[l + 1];
      Acts& a = acts_[l];
      LayerNorm(a.ln1, a.ln1_mean, a.ln1_rstd, residual_[l], &p[w.ln1_w], &p[w.ln1_b], BT, C);
      Matmul(a.qkv, a.ln1, &p[w.qkv_w], &p[w.qkv_b], BT, C, 3 * C);
      Attention(a.atty, a.att, a.qkv);
      Vec proj;
      Matmul(proj, a.atty, &p[w.attn_proj_w], &p[w.attn_proj_b], BT, C, C);
      a.res_mid.resize(BT * C);
      for (int64_t i = 0; i < BT * C; ++i) a.res_mid[i] = residual_[l][i] + proj[i];
      LayerNorm(a.ln2, a.ln2_mean, a.ln2_rstd, a.res_mid, &p[w.ln2_w], &p[w.ln2_b], BT, C);
      Matmul(a.fch, a.ln2, &p[w.fc_w], &p[w.fc_b], BT, C, 4 * C);
      a.fch_gelu.resize(a.fch.size());
      for (size_t i = 0; i < a.fch.size(); ++i) a.fch_gelu[i] = Gelu(a.fch[i]);
      Vec mlp;
      Matmul(mlp, a.fch_gelu, &p[w.fc_proj_w], &p[w.fc_proj_b], BT, 4 * C, C);
      for (int64_t i = 0; i < BT * C; ++i) residual_[l + 1][i] = a.res_mid[i] + mlp[i];
    }
    const Vec& pf = params[L + 1];
    LayerNorm(lnf_, lnf_mean_, lnf_rstd_, residual_[L], &pf[0], &pf[C], BT, C);
    probs_.assign(BT * V, 0.0);
    double loss = 0;
    num_targets_ = 0;
    for (int64_t r = 0; r < BT; ++r) {
      double* p = &probs_[r * V];
      for (int64_t v = 0; v < V; ++v) {
        double s = 0;
        for (int64_t i = 0; i < C; ++i) s += lnf_[r * C + i] * pe[e.wte + v * C + i];
        p[v] = s;
      }
      double mx = p[0];
      for (int64_t v = 1; v < V; ++v) mx = std::max(mx, p[v]);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(p[v] - mx);
      for (int64_t v = 0; v < V; ++v) p[v] = std::exp(p[v] - mx) / sum;
      if (targets[r] >= 0) {
        loss += -std::log(p[targets[r]]);
        ++num_targets_;
      }
    }
    return num_targets_ ? loss / num_targets_ : 0.0;
  }

  // Gradients of the mean loss, one buffer per unit (overwritten).
  void Backward(std::vector<Vec>& grads) {
    const int64_t B = B_, T = T_, C = c_.embed_dim, V = c_.vocab_size, L = c_.num_layers, BT = B * T;
    const EmbeddingLayout e = EmbeddingLayout::For(c_);
    const BlockLayout w = BlockLayout::For(c_);
    grads.assign(L + 2, Vec());
    for (int u = 0; u < L + 2; ++u) grads[u].assign(params_[u].size(), 0.0);
    Vec& ge = grads[0];
    const Vec& pe = params_[0];
    // LM head.
    Vec dlnf(BT * C, 0.0);
    for (int64_t r = 0; r < BT; ++r) {
      if (targets_[r] < 0) continue;
      for (int64_t v = 0; v < V; ++v) {
        const double d = (probs_[r * V + v] - (v == targets_[r] ? 1.0 : 0.0)) / num_targets_;
        for (int64_t i = 0; i < C; ++i) {
          dlnf[r * C + i] += d * pe[e.wte + v * C + i];
          ge[e.wte + v * C + i] += d * lnf_[r * C + i];
        }
      }
    }
    Vec dres(BT * C, 0.0);
    Vec& gf = grads[L + 1];
    LayerNormBackward(dres, &gf[0], &gf[C], dlnf, residual_[L], &params_[L + 1][0], lnf_mean_, lnf_rstd_, BT, C);
    for (int64_t l = L - 1; l >= 0; --l) {
      const Vec& p = params_[l + 1];
      Vec& g = grads[l + 1];
      Acts& a = acts_[l];
      Vec dfch_gelu(BT * 4 * C, 0.0), dfch(BT * 4 * C), dln2(BT * C, 0.0);
      MatmulBackward(dfch_gelu, &g[w.fc_proj_w], &g[w.fc_proj_b], dres, a.fch_gelu, &p[w.fc_proj_w], BT, 4 * C, C);
      for (int64_t i = 0; i < BT * 4 * C; ++i) dfch[i] = GeluGrad(a.fch[i]) * dfch_gelu[i];
      MatmulBackward(dln2, &g[w.fc_w], &g[w.fc_b], dfch, a.ln2, &p[w.fc_w], BT, C, 4 * C);
      LayerNormBackward(dres, &g[w.ln2_w], &g[w.ln2_b], dln2, a.res_mid, &p[w.ln2_w], a.ln2_mean, a.ln2_rstd, BT, C);
      Vec datty(BT * C, 0.0), dqkv(BT * 3 * C, 0.0), dln1(BT * C, 0.0);
      MatmulBackward(datty, &g[w.attn_proj_w], &g[w.attn_proj_b], dres, a.atty, &p[w.attn_proj_w], BT, C, C);
      AttentionBackward(dqkv, datty, a.qkv, a.att);
      MatmulBackward(dln1, &g[w.qkv_w], &g[w.qkv_b], dqkv, a.ln1, &p[w.qkv_w], BT, C, 3 * C);
      LayerNormBackward(dres, &g[w.ln1_w], &g[w.ln1_b], dln1, residual_[l], &p[w.ln1_w], a.ln1_mean, a.ln1_rstd, BT, C);
    }
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < C; ++i) {
          const double d = dres[(b * T + t) * C + i];
          ge[e.wte + tokens_[b * T + t] * C + i] += d;
          ge[e.wpe + t * C + i] += d;
        }
      }
    }
  }

  static double Gelu(double x) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + std::tanh(u));
  }
  static double GeluGrad(double x) {
    const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    const double th = std::tanh(u), sech2 = 1.0 - th * th;
    return 0.5 * (1.0 + th) + 0.5 * x * sech2 * std::sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
  }

 private:
  struct Acts {
    Vec ln1, ln1_mean, ln1_rstd, qkv, att, atty, res_mid, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };

  static void LayerNorm(Vec& out, Vec& mean, Vec& rstd, const Vec& inp, const double* w, const double* b, int64_t rows,
                        int64_t C) {
    out.assign(rows * C, 0.0);
    mean.assign(rows, 0.0);
    rstd.assign(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0, v = 0;
      for (int64_t i = 0; i < C; ++i) m += inp[r * C + i];
      m /= C;
      for (int64_t i = 0; i < C; ++i) v += (inp[r * C + i] - m) * (inp[r * C + i] - m);
      v /= C;
      const double s = 1.0 / std::sqrt(v + 1e-5);
      for (int64_t i = 0; i < C; ++i) out[r * C + i] = (inp[r * C + i] - m) * s * w[i] + b[i];
      mean[r] = m;
      rstd[r] = s;
    }
  }

  static void LayerNormBackward(Vec& dinp, double* dw, double* db, const Vec& dout, const Vec& inp, const double* w,
                                const Vec& mean, const Vec& rstd, int64_t rows, int64_t C) {
    for (int64_t r = 0; r < rows; ++r) {
      double dnorm_mean = 0, dnorm_norm_mean = 0;
      for (int64_t i = 0; i < C; ++i) {
        const double norm = (inp[r * C + i] - mean[r]) * rstd[r];
        const double dnorm = w[i] * dout[r * C + i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      for (int64_t i = 0; i < C; ++i) {
        const double norm = (inp[r * C + i] - mean[r]) * rstd[r];
        const double dnorm = w[i] * dout[r * C + i];
        db[i] += dout[r * C + i];
        dw[i] += norm * dout[r * C + i];
        dinp[r * C + i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[r];
      }
    }
  }

  // out[rows, oc] = inp[rows, ic] · w[ic, oc] + bias.
  static void Matmul(Vec& out, const Vec& inp, const double* w, const double* bias, int64_t rows, int64_t ic,
                     int64_t oc) {
    out.assign(rows * oc, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < oc; ++o) {
        double s = bias[o];
        for (int64_t i = 0; i < ic; ++i) s += inp[r * ic + i] * w[i * oc + o];
        out[r * oc + o] = s;
      }
    }
  }

  // dinp += dout · wᵀ; dw += inpᵀ · dout; dbias += Σ dout.
  static void MatmulBackward(Vec& dinp, double* dw, double* dbias, const Vec& dout, const Vec& inp, const double* w,
                             int64_t rows, int64_t ic, int64_t oc) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < oc; ++o) {
        const double d = dout[r * oc + o];
        dbias[o] += d;
        for (int64_t i = 0; i < ic; ++i) {
          dinp[r * ic + i] += d * w[i * oc + o];
          dw[i * oc + o] += d * inp[r * ic + i];
        }
      }
    }
  }

  void Attention(Vec& out, Vec& att, const Vec& qkv) const {
    const int64_t B = B_, T = T_, C = c_.embed_dim, H = c_.num_heads, D = C / H;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    out.assign(B * T * C, 0.0);
    att.assign(B * H * T * T, 0.0);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          const double* q = &qkv[(b * T + t) * 3 * C + h * D];
          double* a = &att[((b * H + h) * T + t) * T];
          double mx = -1e300;
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            const double* k = &qkv[(b * T + t2) * 3 * C + C + h * D];
            double s = 0;
            for (int64_t i = 0; i < D; ++i) s += q[i] * k[i];
            a[t2] = s * scale;
            mx = std::max(mx, a[t2]);
          }
          double sum = 0;
          for (int64_t t2 = 0; t2 <= t; ++t2) sum += (a[t2] = std::exp(a[t2] - mx));
          for (int64_t t2 = 0; t2 <= t; ++t2) a[t2] /= sum;
          double* o = &out[(b * T + t) * C + h * D];
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            const double* v = &qkv[(b * T + t2) * 3 * C + 2 * C + h * D];
            for (int64_t i = 0; i < D; ++i) o[i] += a[t2] * v[i];
          }
        }
      }
    }
  }

  void AttentionBackward(Vec& dqkv, const Vec& dout, const Vec& qkv, const Vec& att) const {
    const int64_t B = B_, T = T_, C = c_.embed_dim, H = c_.num_heads, D = C / H;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Vec datt(T), dpre(T);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          const double* a = &att[((b * H + h) * T + t) * T];
          const double* dy = &dout[(b * T + t) * C + h * D];
          const double* q = &qkv[(b * T + t) * 3 * C + h * D];
          double* dq = &dqkv[(b * T + t) * 3 * C + h * D];
          std::fill(datt.begin(), datt.end(), 0.0);
          std::fill(dpre.begin(), dpre.end(), 0.0);
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            const double* v = &qkv[(b * T + t2) * 3 * C + 2 * C + h * D];
            double* dv = &dqkv[(b * T + t2) * 3 * C + 2 * C + h * D];
            for (int64_t i = 0; i < D; ++i) {
              datt[t2] += v[i] * dy[i];
              dv[i] += a[t2] * dy[i];
            }
          }
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            for (int64_t t3 = 0; t3 <= t; ++t3) {
              dpre[t3] += datt[t2] * a[t2] * ((t2 == t3 ? 1.0 : 0.0) - a[t3]);
            }
          }
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            const double* k = &qkv[(b * T + t2) * 3 * C + C + h * D];
            double* dk = &dqkv[(b * T + t2) * 3 * C + C + h * D];
            for (int64_t i = 0; i < D; ++i) {
              dq[i] += k[i] * dpre[t2] * scale;
              dk[i] += q[i] * dpre[t2] * scale;
            }
          }
        }
      }
    }
  }

  GptConfig c_;
  int64_t B_, T_;
  std::vector<int32_t> tokens_, targets_;
  std::vector<Vec> params_;
  std::vector<Vec> residual_;
  std::vector<Acts> acts_;
  Vec lnf_, lnf_mean_, lnf_rstd_, probs_;
  int64_t num_targets_ = 0;
};

}  // namespace zinf::model::test
