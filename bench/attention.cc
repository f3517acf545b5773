// `zinf bench attention`: the CUDA flash attention's forward and backward on
// one shape (a model preset's heads, or --heads/--kv-heads/--head-dim), in
// both ways its kernels take their bf16 operands, measured in one run:
//   reference: the fp32 q, k, v and dO rounded as each tile loads (one
//     buffer a tile: load, then multiply);
//   bf16 copies: qkv and dO rounded once by the cast kernel (its time
//     counted), tiles copied by cp.async into two buffers, the next block's
//     in flight while the warps multiply this one's (what the model runs
//     with bf16 products).
// At head_dim 64 the copies' path also runs with the forward's blocks of 64
// queries instead of the default 128 (two row tiles a warp), for the
// comparison. All must give the same bits (checked: a mismatch exits 1). TFLOP/s
// count the causal products done: 4·D FLOPs per visible (query, key) pair
// forward (q·k and p·v), 10·D backward (five products).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "bench/bench.h"
#include "math/attention_math.h"
#include "model/gpt_config.h"
#include "sched/backends.h"

namespace zinf::bench {
namespace {

struct Options {
  std::string preset = "llama-3.2-1b";
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // override the preset's (0: keep)
  int64_t seq_len = 2048;
  int64_t micro_batch = 2;
  int reps = 5;
  bool json = false;
};

int Fail(const Status& st) {
  std::fprintf(stderr, "zinf bench attention: %s\n", st.ToString().c_str());
  return st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound ? 2 : 1;
}

Result<math::AttentionShape> ShapeOf(const Options& opt) {
  ZINF_ASSIGN_OR_RETURN(const model::GptConfig c, model::GptPreset(opt.preset));
  math::AttentionShape s;
  s.batch = opt.micro_batch;
  s.seq_len = opt.seq_len;
  s.heads = opt.heads > 0 ? opt.heads : c.num_heads;
  s.kv_heads = opt.kv_heads > 0 ? opt.kv_heads : opt.heads > 0 ? s.heads : c.kv_heads();
  s.head_dim = opt.head_dim > 0 ? opt.head_dim : c.head_dim();
  if (s.batch < 1 || s.seq_len < 1) return InvalidArgument("--micro-batch and --seq-len must be positive");
  if (s.head_dim != 64 && s.head_dim != 128) {
    return InvalidArgument("head_dim " + std::to_string(s.head_dim) + ": the CUDA kernels take 64 or 128");
  }
  if (s.heads % s.kv_heads != 0) {
    return InvalidArgument("--kv-heads " + std::to_string(s.kv_heads) + " does not divide --heads " +
                           std::to_string(s.heads));
  }
  if (opt.reps < 1) return InvalidArgument("--reps must be >= 1");
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  return s;
}

int Run(const Options& opt) {
  const Result<math::AttentionShape> shape = ShapeOf(opt);
  if (!shape.ok()) return Fail(shape.status());
  const math::AttentionShape& s = *shape;
  const Result<const sched::CudaTimings*> cuda = sched::GetCudaTimings();
  if (!cuda.ok()) return Fail(cuda.status());
  if ((*cuda)->device_count() == 0) return Fail(Unavailable("needs a CUDA device; none found"));
  const double pairs =
      static_cast<double>(s.batch * s.heads) * static_cast<double>(s.seq_len) * static_cast<double>(s.seq_len + 1) / 2;
  const double fwd_flops = 4.0 * s.head_dim * pairs, bwd_flops = 10.0 * s.head_dim * pairs;
  auto timed = [&](bool bf16_copies, gpu::FlashVariant variant = {}) {
    return (*cuda)->time_flash_attention(s, bf16_copies, opt.reps, /*seed=*/1, /*range=*/2.0f, variant);
  };
  const Result<gpu::FlashTiming> ref = timed(false);
  if (!ref.ok()) return Fail(ref.status());
  const Result<gpu::FlashTiming> cp = timed(true);
  if (!cp.ok()) return Fail(cp.status());
  // head_dim 64: the forward with one 64-row tile a warp (the default takes
  // two), and the dK/dV kernel without its register cap (two blocks a SM;
  // the default is capped for three).
  std::optional<gpu::FlashTiming> one_tile, kv_uncapped;
  if (s.head_dim == 64) {
    const Result<gpu::FlashTiming> r = timed(true, {.query_tiles = 1});
    if (!r.ok()) return Fail(r.status());
    one_tile = *r;
    const Result<gpu::FlashTiming> u = timed(true, {.kv_min_blocks = 1});
    if (!u.ok()) return Fail(u.status());
    kv_uncapped = *u;
  }
  const Result<bool> two_buffers = (*cuda)->flash_copies_fit(s.head_dim);
  if (!two_buffers.ok()) return Fail(two_buffers.status());
  const bool same_bits = ref->result_hash == cp->result_hash &&
                         (!one_tile || one_tile->result_hash == cp->result_hash) &&
                         (!kv_uncapped || kv_uncapped->result_hash == cp->result_hash);
  const double ratio = (ref->forward + ref->backward) / (cp->forward + cp->backward);
  if (opt.json) {
    auto way = [&](const gpu::FlashTiming& t) {
      return nlohmann::json{{"forward_ms", t.forward * 1e3},
                            {"backward_ms", t.backward * 1e3},
                            {"forward_tflops", fwd_flops / t.forward / 1e12},
                            {"backward_tflops", bwd_flops / t.backward / 1e12}};
    };
    nlohmann::json j = {{"command", "bench attention"},
                        {"batch", s.batch},
                        {"seq_len", s.seq_len},
                        {"heads", s.heads},
                        {"kv_heads", s.kv_heads},
                        {"head_dim", s.head_dim},
                        {"reps", opt.reps},
                        {"reference", way(*ref)},
                        {"bf16_copies", way(*cp)},
                        {"casts_ms", cp->casts * 1e3},
                        {"bf16_copies_64_query_blocks", one_tile ? way(*one_tile) : nlohmann::json(nullptr)},
                        {"bf16_copies_dkdv_uncapped", kv_uncapped ? way(*kv_uncapped) : nlohmann::json(nullptr)},
                        {"speedup", ratio},
                        {"same_bits", same_bits},
                        {"two_buffer_kernels", *two_buffers}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("# zinf bench attention: B=%lld T=%lld heads=%lld kv_heads=%lld head_dim=%lld, causal, median of %d\n",
                static_cast<long long>(s.batch), static_cast<long long>(s.seq_len), static_cast<long long>(s.heads),
                static_cast<long long>(s.kv_heads), static_cast<long long>(s.head_dim), opt.reps);
    std::printf("# FLOPs: forward %.4g, backward %.4g (4·D and 10·D per visible pair)\n", fwd_flops, bwd_flops);
    std::printf("%-26s %12s %10s %12s %10s\n", "operands", "forward ms", "TFLOP/s", "backward ms", "TFLOP/s");
    auto row = [&](const char* name, const gpu::FlashTiming& t) {
      std::printf("%-26s %12.3f %10.1f %12.3f %10.1f\n", name, t.forward * 1e3, fwd_flops / t.forward / 1e12,
                  t.backward * 1e3, bwd_flops / t.backward / 1e12);
    };
    row("rounded at load (ref)", *ref);
    row(s.head_dim == 64 ? "bf16 copies, 128 queries" : "bf16 copies, cp.async", *cp);
    if (one_tile) {
      row("bf16 copies, 64 queries", *one_tile);
      std::printf("# forward, blocks of 128 queries (two row tiles a warp) against 64: %.2fx\n",
                  one_tile->forward / cp->forward);
    }
    if (kv_uncapped) {
      row("bf16 copies, dK/dV 2 a SM", *kv_uncapped);
      std::printf("# backward, dK/dV capped at 168 registers (3 blocks a SM) against uncapped (186, 2 a SM): %.2fx\n",
                  kv_uncapped->backward / cp->backward);
    }
    std::printf("# the copies' casts: %.3f ms of the above; forward + backward: %.2fx the reference\n", cp->casts * 1e3,
                ratio);
    std::printf("# same bits: %s\n", same_bits ? "yes" : "NO");
    if (!*two_buffers) {
      std::printf(
          "# this GPU's shared memory per block is too small for the two-buffer kernels at head_dim %lld:\n"
          "# the copies' path ran the one-buffer kernels (only the casts differ)\n",
          static_cast<long long>(s.head_dim));
    }
  }
  if (!same_bits) {
    std::fprintf(stderr, "zinf bench attention: the ways gave different bits (a bug)\n");
    return 1;
  }
  return 0;
}

}  // namespace

void RegisterAttention(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand(
      "attention", "CUDA flash attention: bf16 copies with cp.async vs rounding at load, forward and backward");
  cmd->add_option("--preset", opt->preset, "Model preset whose heads to take")->capture_default_str();
  cmd->add_option("--heads", opt->heads, "Query heads (default: the preset's)");
  cmd->add_option("--kv-heads", opt->kv_heads, "Key/value heads (default: the preset's, or --heads when given)");
  cmd->add_option("--head-dim", opt->head_dim, "64 or 128 (default: the preset's)");
  cmd->add_option("--seq-len", opt->seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--micro-batch", opt->micro_batch, "Sequences")->capture_default_str();
  cmd->add_option("--reps", opt->reps, "Timed repetitions (median reported)")->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of the table");
  cmd->callback([opt, exit_code] { *exit_code = Run(*opt); });
}

}  // namespace zinf::bench
