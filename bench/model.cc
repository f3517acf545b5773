// `zinf bench model`: one training step of the GPT reference model on the
// host device (or with --device cuda a GPU) — forward and backward time,
// achieved GFLOP/s, and, measured in the same run and interleaved step by
// step, the model's largest matrix product (the LM head, [B·T, C] · [C, V])
// on its own: OpenBLAS sgemm with OpenBLAS's own threading at the same
// thread count, or on a GPU cuBLAS with the model's operands (fp32 without
// TF32, or bf16 with fp32 sums). The ratio model GFLOP/s / reference
// GFLOP/s is the figure of merit: how close the whole step comes to the best
// single product this machine's BLAS can do. On a GPU whose dense bf16
// tensor-core peak is known (or given with --peak-tflops), the model FLOPs
// utilization (MFU) is the step's FLOP/s over that peak.
//
// FLOPs per step (model/gpt_config.h, TrainingFlops): 6 N per token, N =
// every parameter (wte once), plus 12 L C T per token for attention's QKᵀ
// and PV over the full T² scores; the forward is one third of it. The
// stages run as tasks on a HostDevice stream (as the engine will run them),
// with parameters, gradients and activations in its memory; each stage is
// timed from enqueue to completion.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "common/units.h"
#include "common/float16.h"
#include "model/gemm.h"
#include "exec/gpt_device.h"
#include "exec/op_profile.h"
#include "sched/backends.h"

namespace zinf::bench {
namespace {

using exec::GptDevice;
using model::GptConfig;
using model::GptRunOptions;

struct Options {
  std::string preset = "gpt2";
  int64_t layers = 0, d_model = 0, heads = 0, vocab = 0;  // override the preset's shape (0: keep)
  int64_t seq_len = 256;
  int64_t micro_batch = 4;
  int threads = 0;  // 0: hardware concurrency
  int steps = 5;
  std::string dtype = "fp32";
  std::string grad_dtype = "fp32";
  std::string matmul = "fp32";
  std::string attention = "auto";
  bool checkpointing = false;
  int64_t loss_chunk_rows = 0;  // 0: the model's choice (model::LossChunkRows)
  bool json = false;
  std::string device = "cpu";
  bool breakdown = false;  // each op's time (the stages mark their ops)
  double peak_tflops = 0;  // the device's dense bf16 peak (0: known GPUs' from their data sheets)
};

// Dense (not sparse) bf16 tensor-core peaks in TFLOP/s from NVIDIA's data
// sheets, by the name CUDA reports; 0 for any other device.
double KnownDenseBf16PeakTflops(const std::string& name) {
  struct Known {
    const char* part;
    double tflops;
  };
  static const Known kKnown[] = {
      {"H100 PCIe", 756.0},  // H100 PCIe
      {"H100 NVL", 835.0},   // H100 NVL (per GPU)
      {"H100", 989.4},       // H100 SXM5 ("NVIDIA H100 80GB HBM3")
      {"GH200", 989.4},      // Grace Hopper's H100/H200
      {"H200 NVL", 835.0},   // H200 NVL (per GPU)
      {"H200", 989.4},       // H200 SXM
      {"A100", 312.0},       // A100 SXM and PCIe
  };
  for (const Known& k : kKnown) {
    if (name.find(k.part) != std::string::npos) return k.tflops;
  }
  return 0;
}

struct StageTimes {
  double embed_fwd = 0, blocks_fwd = 0, head_fwd = 0, head_bwd = 0, blocks_bwd = 0, embed_bwd = 0;
  double forward() const { return embed_fwd + blocks_fwd + head_fwd; }
  double backward() const { return head_bwd + blocks_bwd + embed_bwd; }
};

Status Timed(double* acc, const std::function<Status()>& enqueue, Stream& stream) {
  const double t0 = NowSeconds();
  ZINF_RETURN_IF_ERROR(enqueue());
  ZINF_RETURN_IF_ERROR(stream.Synchronize());
  *acc += NowSeconds() - t0;
  return Status::Ok();
}

Result<StageTimes> RunStep(GptDevice& gpt, const std::vector<const void*>& p, const std::vector<void*>& g,
                           const int32_t* tokens, const int32_t* targets, float* loss) {
  const GptConfig& c = gpt.config();
  const int L = static_cast<int>(c.num_layers), fin = model::FinalNormUnit(c);
  Stream& s = gpt.stream();
  StageTimes t;
  ZINF_RETURN_IF_ERROR(Timed(
      &t.embed_fwd, [&] { return gpt.EnqueueEmbedForward(tokens, p[0]); }, s));
  for (int l = 0; l < L; ++l) {
    ZINF_RETURN_IF_ERROR(Timed(
        &t.blocks_fwd, [&] { return gpt.EnqueueBlockForward(l, p[l + 1]); }, s));
  }
  ZINF_RETURN_IF_ERROR(Timed(
      &t.head_fwd, [&] { return gpt.EnqueueHeadForward(targets, p[fin], p[0], loss); }, s));
  ZINF_RETURN_IF_ERROR(Timed(
      &t.head_bwd, [&] { return gpt.EnqueueHeadBackward(1.0f, p[fin], p[0], g[fin], g[0]); }, s));
  for (int l = L - 1; l >= 0; --l) {
    ZINF_RETURN_IF_ERROR(Timed(
        &t.blocks_bwd, [&] { return gpt.EnqueueBlockBackward(l, p[l + 1], g[l + 1]); }, s));
  }
  ZINF_RETURN_IF_ERROR(Timed(
      &t.embed_bwd, [&] { return gpt.EnqueueEmbedBackward(g[0]); }, s));
  return t;
}

int Fail(const Status& st) {
  std::fprintf(stderr, "zinf bench model: %s\n", st.ToString().c_str());
  return st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound ? 2 : 1;
}

int Run(const Options& opt) {
  auto preset = model::GptPreset(opt.preset);
  if (!preset.ok()) return Fail(preset.status());
  GptConfig shaped = *preset;
  if (opt.layers > 0 || opt.d_model > 0 || opt.heads > 0 || opt.vocab > 0) {
    shaped.name = "custom";  // as zinf train shapes it: the context is the sequence length
    shaped.max_seq_len = opt.seq_len;
  }
  if (opt.layers > 0) shaped.num_layers = opt.layers;
  if (opt.d_model > 0) shaped.embed_dim = opt.d_model;
  if (opt.heads > 0) shaped.num_heads = opt.heads;
  if (opt.vocab > 0) shaped.vocab_size = opt.vocab;
  if (Status st = shaped.Validate(); !st.ok()) return Fail(st);
  const GptConfig& c = shaped;
  auto dtype = ParseDType(opt.dtype);
  auto grad_dtype = ParseDType(opt.grad_dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  if (!grad_dtype.ok()) return Fail(grad_dtype.status());
  auto matmul = ParseDType(opt.matmul);
  if (!matmul.ok()) return Fail(matmul.status());
  if (opt.steps < 1) return Fail(InvalidArgument("--steps must be >= 1"));
  if (opt.device != "cpu" && opt.device != "cuda" && opt.device.rfind("cuda:", 0) != 0) {
    return Fail(InvalidArgument("--device must be cpu, cuda or cuda:N (got '" + opt.device + "')"));
  }
  if (opt.peak_tflops < 0) return Fail(InvalidArgument("--peak-tflops must be >= 0"));
  if (opt.loss_chunk_rows < 0) return Fail(InvalidArgument("--loss-chunk-rows must be >= 0 (0: the model's choice)"));
  const int threads =
      opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  GptRunOptions o;
  o.batch_size = opt.micro_batch;
  o.seq_len = opt.seq_len;
  o.num_threads = threads;
  o.activation_checkpointing = opt.checkpointing;
  o.loss_chunk_rows = opt.loss_chunk_rows;
  o.param_dtype = *dtype;
  o.grad_dtype = *grad_dtype;
  o.matmul_dtype = *matmul;
  o.attention = opt.attention == "flash"   ? model::AttentionKernel::kFlash
                : opt.attention == "plain" ? model::AttentionKernel::kPlain
                                           : model::AttentionKernel::kAuto;
  const std::string_view attention = model::AttentionKernelName(model::ResolveAttention(c, o));
  auto probe = model::GptModel::Create(c, o);  // validates the options
  if (!probe.ok()) return Fail(probe.status());
  const uint64_t activation_bytes = (*probe)->activation_bytes();
  const std::string activation_text = (*probe)->activation_layout().ToString();
  probe->reset();

  // Device memory: parameters, gradients, activations, tokens, slack for rounding.
  const int64_t n_params = model::NumParams(c);
  const uint64_t param_bytes = n_params * DTypeSizeBytes(*dtype), grad_bytes = n_params * DTypeSizeBytes(*grad_dtype);
  DeviceOptions dopt;
  dopt.spec = opt.device;
  if (opt.device == "cpu") dopt.memory_budget = param_bytes + grad_bytes + activation_bytes + (64u << 20);
  auto device = CreateDevice(dopt);
  if (!device.ok()) return Fail(device.status());
  auto stream = (*device)->CreateStream();
  if (!stream.ok()) return Fail(stream.status());
  Device& dev = **device;
  Stream& s = **stream;

  // Each unit's parameters, made on the host (`threads` units at a time:
  // a large model's initialization is a minute on one core) and copied in.
  std::vector<const void*> p;
  std::vector<void*> g;
  const int num_units = model::NumUnits(c);
  for (int first = 0; first < num_units; first += threads) {
    const int last = std::min(num_units, first + threads);
    std::vector<std::vector<float>> host(last - first);
    std::vector<std::vector<uint16_t>> narrow(last - first);
    std::vector<std::thread> workers;
    for (int u = first; u < last; ++u) {
      workers.emplace_back([&, u] {
        std::vector<float>& h = host[u - first];
        h.resize(model::UnitNumParams(c, u));
        model::InitUnitParams(c, u, 1234, h.data());
        if (*dtype == DType::kFloat32) return;
        std::vector<uint16_t>& n16 = narrow[u - first];
        n16.resize(h.size());
        for (size_t i = 0; i < h.size(); ++i) {
          n16[i] = *dtype == DType::kBFloat16 ? FloatToBf16Bits(h[i]) : FloatToHalfBits(h[i]);
        }
        std::vector<float>().swap(h);
      });
    }
    for (std::thread& w : workers) w.join();
    for (int u = first; u < last; ++u) {
      const int64_t n = model::UnitNumParams(c, u);
      const void* src = *dtype == DType::kFloat32 ? static_cast<const void*>(host[u - first].data())
                                                  : static_cast<const void*>(narrow[u - first].data());
      auto dp = dev.Allocate(n * DTypeSizeBytes(*dtype), s);
      auto dg = dev.Allocate(n * DTypeSizeBytes(*grad_dtype), s);
      if (!dp.ok()) return Fail(dp.status());
      if (!dg.ok()) return Fail(dg.status());
      Status st = dev.CopyToDevice(*dp, src, n * DTypeSizeBytes(*dtype), s);
      if (st.ok()) st = s.Synchronize();  // `host` goes away at the end of this batch
      if (!st.ok()) return Fail(st);
      p.push_back(*dp);
      g.push_back(*dg);
    }
  }
  const int64_t BT = opt.micro_batch * opt.seq_len;
  std::vector<int32_t> tokens(BT), targets(BT);
  std::mt19937 rng(7);
  for (int64_t i = 0; i < BT; ++i) tokens[i] = static_cast<int32_t>(rng() % c.vocab_size);
  for (int64_t i = 0; i < BT; ++i) targets[i] = tokens[(i + 1) % BT];
  auto dtok = dev.Allocate(BT * sizeof(int32_t), s), dtgt = dev.Allocate(BT * sizeof(int32_t), s),
       dloss = dev.Allocate(sizeof(float), s);
  if (!dtok.ok() || !dtgt.ok() || !dloss.ok()) return Fail(OutOfMemory("tokens"));
  Status st = dev.CopyToDevice(*dtok, tokens.data(), BT * sizeof(int32_t), s);
  if (st.ok()) st = dev.CopyToDevice(*dtgt, targets.data(), BT * sizeof(int32_t), s);
  if (!st.ok()) return Fail(st);
  std::unique_ptr<model::OpProfile> profile;
  if (opt.breakdown) {
    profile = exec::CreateOpProfile(dev, s);
    o.profile = profile.get();
  }
  auto gpt = GptDevice::Create(dev, s, c, o);
  if (!gpt.ok()) return Fail(gpt.status());

  // The reference: the LM head's product (the model's largest), as the model
  // issues it (lnf · wteᵀ), through one cblas_sgemm call with OpenBLAS's own
  // threads, and the model's tiled version of the same call for comparison;
  // on a GPU, through cuBLAS with the model's operand type.
  const bool on_gpu = dev.kind() == DeviceKind::kCuda;
  const bool bf16_products = *matmul == DType::kBFloat16;
  const int64_t M = BT, N = c.vocab_size, K = c.embed_dim;
  std::vector<float> a(on_gpu ? 0 : M * K), b(on_gpu ? 0 : N * K), out(on_gpu ? 0 : M * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 17) * 0.01f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 13) * 0.01f;
  void* gpu_a = nullptr;
  void* gpu_b = nullptr;
  void* gpu_c = nullptr;
  if (on_gpu) {
    // Operands of random values in [-1, 1) (a product of constants runs
    // faster than one of real data), from a 16 Mi-element pattern repeated.
    const uint64_t esize = bf16_products ? 2 : 4;
    std::vector<uint32_t> pattern((uint64_t{16} << 20) * esize / 4);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint32_t& w : pattern) {
      uint32_t bits[2];
      for (uint32_t& out_bits : bits) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const float v = static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;  // 24 bits
        out_bits = bf16_products ? FloatToBf16Bits(v) : std::bit_cast<uint32_t>(v);
      }
      w = bf16_products ? bits[0] | bits[1] << 16 : bits[0];
    }
    const uint64_t pattern_bytes = pattern.size() * 4;
    for (auto [ptr, bytes] :
         {std::pair<void**, uint64_t>{&gpu_a, M * K * esize}, {&gpu_b, N * K * esize}, {&gpu_c, M * N * 4}}) {
      auto buf = dev.Allocate(bytes, s);
      if (!buf.ok()) return Fail(buf.status().WithContext("the reference product's operands"));
      *ptr = *buf;
      if (ptr == &gpu_c) break;  // the output: written by the product
      for (uint64_t at = 0; at < bytes; at += pattern_bytes) {
        Status fill =
            dev.CopyToDevice(static_cast<char*>(*ptr) + at, pattern.data(), std::min(pattern_bytes, bytes - at), s);
        if (!fill.ok()) return Fail(fill);
      }
    }
    if (Status synced = s.Synchronize(); !synced.ok()) return Fail(synced);  // `pattern` goes away
  }
  auto reference = [&]() -> Result<double> {
    ZINF_ASSIGN_OR_RETURN(const sched::CudaTimings* cuda, sched::GetCudaTimings());
    return cuda->time_cublas_product(s.native_handle(), M, N, K, bf16_products, gpu_a, gpu_b,
                                     static_cast<float*>(gpu_c), 3);
  };
  model::ModelThreads tile_threads(threads);
  auto sgemm = [&] {
    model::SetBlasThreads(threads);
    const double t0 = NowSeconds();
    model::Gemm<float>(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, out.data(), N);
    const double t = NowSeconds() - t0;
    model::UseSingleThreadedBlas();
    return t;
  };
  auto tiled = [&] {
    const double t0 = NowSeconds();
    model::ParallelGemm<float>(tile_threads, false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, out.data(), N);
    return NowSeconds() - t0;
  };

  const double flops = model::TrainingFlops(c, opt.micro_batch, opt.seq_len);
  const double fwd_flops = model::ForwardFlops(c, opt.micro_batch, opt.seq_len);
  const double gemm_flops = 2.0 * M * N * K;
  if (!opt.json) {
    std::printf("# zinf bench model: %s on %s\n", c.ToString().c_str(), dev.name().c_str());
    std::printf(
        "# micro-batch %lld x seq %lld = %lld tokens; params %s, grads %s, matmul operands %s; %.*s attention; "
        "%d thread(s); checkpointing %s; loss in chunks of %lld rows; median of %d steps after 1 warm-up\n",
        static_cast<long long>(opt.micro_batch), static_cast<long long>(opt.seq_len), static_cast<long long>(BT),
        opt.dtype.c_str(), opt.grad_dtype.c_str(), opt.matmul.c_str(), static_cast<int>(attention.size()),
        attention.data(), threads, opt.checkpointing ? "on" : "off", static_cast<long long>(model::LossChunkRows(c, o)),
        opt.steps);
    std::printf("# FLOPs/step = 6*N*tokens + 12*L*C*T*tokens (attention) = %.4g + %.4g = %.4g (forward 1/3)\n",
                6.0 * n_params * BT, flops - 6.0 * n_params * BT, flops);
    std::printf("# activations: %s\n", activation_text.c_str());
    if (on_gpu) {
      std::printf(
          "# reference: cuBLAS M=%lld N=%lld K=%lld (B*T x C times C x V, the LM head), %s operands with "
          "fp32 sums, median of 3 products per step, CUDA events\n",
          static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
          bf16_products ? "bf16" : "fp32 (no TF32)");
    } else {
      std::printf(
          "# reference: cblas_sgemm M=%lld N=%lld K=%lld (B*T x C times C x V, the LM head), OpenBLAS "
          "threads=%d [%s]\n",
          static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), threads,
          model::BlasConfig().c_str());
    }
  }

  std::map<std::string, std::vector<double>> op_seconds;  // --breakdown: per op, each step's
  int lost_marks = 0;
  std::vector<double> fwd, bwd, step, ref, ref_tiled, blocks_fwd, head_fwd, head_bwd, blocks_bwd, embed;
  float loss = 0;
  for (int i = 0; i < opt.steps + 1; ++i) {
    auto t = RunStep(**gpt, p, g, static_cast<const int32_t*>(*dtok), static_cast<const int32_t*>(*dtgt),
                     static_cast<float*>(*dloss));
    if (!t.ok()) return Fail(t.status());
    double r = 0, rt = 0;
    if (on_gpu) {
      auto ref_seconds = reference();
      if (!ref_seconds.ok()) return Fail(ref_seconds.status());
      r = *ref_seconds;
    } else {
      r = sgemm();
      rt = tiled();
    }
    int lost = 0;
    const std::map<std::string, double> ops = profile ? profile->Take(&lost) : std::map<std::string, double>{};
    if (i == 0) continue;  // warm-up: first touch of the activations, BLAS buffers
    for (const auto& [op, seconds] : ops) op_seconds[op].push_back(seconds);
    lost_marks += lost;
    fwd.push_back(t->forward());
    bwd.push_back(t->backward());
    step.push_back(t->forward() + t->backward());
    blocks_fwd.push_back(t->blocks_fwd);
    head_fwd.push_back(t->head_fwd);
    head_bwd.push_back(t->head_bwd);
    blocks_bwd.push_back(t->blocks_bwd);
    embed.push_back(t->embed_fwd + t->embed_bwd);
    ref.push_back(r);
    ref_tiled.push_back(rt);
  }
  st = dev.CopyToHost(&loss, *dloss, sizeof(float), s);
  if (st.ok()) st = s.Synchronize();
  if (!st.ok()) return Fail(st);

  const double ref_gflops = gemm_flops / Median(ref) / 1e9;
  struct Row {
    const char* name;
    double seconds, flops;
  };
  // Per-stage rows split the step's time; the FLOPs of a stage are given
  // where they are well defined (the LM head: 2·B·T·C·V forward, twice that
  // backward).
  const double head_gemm = 2.0 * BT * c.embed_dim * c.vocab_size;
  const Row rows[] = {
      {"forward", Median(fwd), fwd_flops},
      {"backward", Median(bwd), flops - fwd_flops},
      {"step", Median(step), flops},
      {"  blocks fwd", Median(blocks_fwd), fwd_flops - head_gemm},
      {"  head fwd", Median(head_fwd), head_gemm},
      {"  head bwd", Median(head_bwd), 2 * head_gemm},
      {"  blocks bwd", Median(blocks_bwd), flops - fwd_flops - 2 * head_gemm},
      {"  embeddings", Median(embed), 0},
      {on_gpu ? "cublas ref" : "sgemm ref", Median(ref), gemm_flops},
      {"sgemm tiled", on_gpu ? 0.0 : Median(ref_tiled), on_gpu ? 0.0 : gemm_flops},
  };
  const size_t num_rows = on_gpu ? std::size(rows) - 1 : std::size(rows);
  const double step_gflops = flops / Median(step) / 1e9;
  const double ratio = step_gflops / ref_gflops;
  // MFU: against the given peak, or a known GPU's dense bf16 peak.
  const double peak_tflops = opt.peak_tflops > 0 ? opt.peak_tflops : on_gpu ? KnownDenseBf16PeakTflops(dev.name()) : 0;
  const double mfu = peak_tflops > 0 ? step_gflops / 1e3 / peak_tflops : 0;
  // --breakdown: each op's median seconds per step, longest first.
  std::vector<std::pair<std::string, double>> ops;
  for (const auto& [op, v] : op_seconds) ops.emplace_back(op, Median(v));
  std::sort(ops.begin(), ops.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  double ops_total = 0;
  for (const auto& [op, seconds] : ops) ops_total += seconds;
  if (opt.json) {
    nlohmann::json j = {
        {"bench", "model"},
        {"preset", c.name},
        {"params", n_params},
        {"micro_batch", opt.micro_batch},
        {"seq_len", opt.seq_len},
        {"tokens", BT},
        {"threads", threads},
        {"param_dtype", opt.dtype},
        {"grad_dtype", opt.grad_dtype},
        {"matmul", opt.matmul},
        {"attention", std::string(attention)},
        {"checkpointing", opt.checkpointing},
        {"loss_chunk_rows", model::LossChunkRows(c, o)},
        {"steps", opt.steps},
        {"flops_per_step", flops},
        {"flops_formula", "6*N*tokens + 12*L*C*T*tokens"},
        {"activation_bytes", activation_bytes},
        {"device_peak_bytes", dev.memory_stats().peak_in_use_bytes},
        {"loss", loss},
        {"device", dev.name()},
        {"reference",
         {{"kind", on_gpu ? "cublas" : "cblas_sgemm"}, {"m", M}, {"n", N}, {"k", K}, {"gflop_per_s", ref_gflops}}},
        {"ratio_to_reference", ratio},
        {"tflop_per_s", step_gflops / 1e3},
        {"peak_tflop_per_s", peak_tflops},
        {"mfu", mfu},
        {"phases", nlohmann::json::array()}};
    for (size_t i = 0; i < num_rows; ++i) {
      const Row& r = rows[i];
      std::string name = r.name;
      name.erase(0, name.find_first_not_of(' '));
      j["phases"].push_back({{"phase", name},
                             {"seconds", r.seconds},
                             {"flops", r.flops},
                             {"gflop_per_s", r.flops ? r.flops / r.seconds / 1e9 : 0.0}});
    }
    if (opt.breakdown) {
      j["ops"] = nlohmann::json::array();
      for (const auto& [op, seconds] : ops) {
        j["ops"].push_back({{"op", op}, {"seconds", seconds}, {"share_of_step", seconds / Median(step)}});
      }
      j["ops_lost_marks"] = lost_marks;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%-14s %10s %10s %10s %9s\n", "phase", "seconds", "GFLOP", "GFLOP/s", "vs ref");
    for (size_t i = 0; i < num_rows; ++i) {
      const Row& r = rows[i];
      if (r.flops > 0) {
        const double gf = r.flops / r.seconds / 1e9;
        std::printf("%-14s %10.4f %10.2f %10.2f %9.3f\n", r.name, r.seconds, r.flops / 1e9, gf, gf / ref_gflops);
      } else {
        std::printf("%-14s %10.4f %10s %10s %9s\n", r.name, r.seconds, "-", "-", "-");
      }
    }
    std::printf(
        "# step: %.2f GFLOP/s = %.3f of the reference product (%.2f GFLOP/s); loss %.4f; activations %s, "
        "device peak %s\n",
        step_gflops, ratio, ref_gflops, loss, FormatBytes(activation_bytes).c_str(),
        FormatBytes(dev.memory_stats().peak_in_use_bytes).c_str());
    if (opt.breakdown) {
      std::printf(
          "# per op (--breakdown): median seconds per step, each op from its mark to the next%s\n",
          on_gpu ? " (timing events between the kernels on the stream)" : " (the host's clock in the stage's task)");
      std::printf("%-22s %10s %8s\n", "op", "ms/step", "share");
      for (const auto& [op, seconds] : ops) {
        std::printf("%-22s %10.3f %7.1f%%\n", op.c_str(), seconds * 1e3, 100 * seconds / Median(step));
      }
      std::printf("%-22s %10.3f %7.1f%% of the step (the rest: between the stages)%s\n", "all ops", ops_total * 1e3,
                  100 * ops_total / Median(step),
                  lost_marks ? (", " + std::to_string(lost_marks) + " marks not timed").c_str() : "");
    }
    if (peak_tflops > 0) {
      std::printf("# MFU %.1f%%: %.1f TFLOP/s of %.1f TFLOP/s dense bf16 peak (%s)\n", 100 * mfu, step_gflops / 1e3,
                  peak_tflops, opt.peak_tflops > 0 ? "--peak-tflops" : "the GPU's data sheet");
    } else if (on_gpu) {
      std::printf("# MFU: this GPU's dense bf16 peak is not in zinf's table; give it with --peak-tflops\n");
    }
  }
  return 0;
}

}  // namespace

void RegisterModel(CLI::App& bench, int* exit_code) {
  auto opt = std::make_shared<Options>();
  CLI::App* cmd = bench.add_subcommand("model", "GPT reference model: forward/backward time and GFLOP/s vs sgemm");
  cmd->add_option("--preset", opt->preset, "Model preset (tiny, gpt2, gpt2-medium, ...)")->capture_default_str();
  cmd->add_option("--layers", opt->layers, "Transformer blocks (default: the preset's)");
  cmd->add_option("--d-model", opt->d_model, "Embedding width (default: the preset's)");
  cmd->add_option("--heads", opt->heads, "Attention heads (default: the preset's)");
  cmd->add_option("--vocab", opt->vocab, "Vocabulary size (default: the preset's)");
  cmd->add_option("--seq-len", opt->seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--micro-batch", opt->micro_batch, "Sequences per step")->capture_default_str();
  cmd->add_option("--threads", opt->threads, "Kernel threads (0: all cores)")->capture_default_str();
  cmd->add_option("--steps", opt->steps, "Timed steps (median reported)")->capture_default_str();
  cmd->add_option("--dtype", opt->dtype, "Parameter dtype: fp32, bf16, fp16")->capture_default_str();
  cmd->add_option("--grad-dtype", opt->grad_dtype, "Gradient dtype: fp32, bf16, fp16")->capture_default_str();
  cmd->add_option("--matmul", opt->matmul, "Matrix product operands: fp32, or bf16 (fp32 sums)")->capture_default_str();
  cmd->add_option("--attention", opt->attention, "auto, plain or flash (zinf.attention)")
      ->check(CLI::IsMember({"auto", "plain", "flash"}))
      ->capture_default_str();
  cmd->add_flag("--checkpointing", opt->checkpointing, "Recompute each block's forward in its backward");
  cmd->add_option("--loss-chunk-rows", opt->loss_chunk_rows,
                  "Rows of LM-head logits held at once (0: every row when their fp32 logits fit in 256 MiB, else "
                  "as many as fit; fewer than batch x seq computes each chunk's logits again in backward)")
      ->capture_default_str();
  cmd->add_option("--device", opt->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_flag("--breakdown", opt->breakdown, "Each op's time per step (matmul, attention, norm, casts, ...)");
  cmd->add_option("--peak-tflops", opt->peak_tflops,
                  "The device's dense bf16 peak for MFU (default: known GPUs' data-sheet figure)");
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of the table");
  cmd->callback([opt, exit_code] { *exit_code = Run(*opt); });
}

}  // namespace zinf::bench
