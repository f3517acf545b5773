#include "gpu/flash_attention_timing.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu/cuda_check.h"
#include "gpu/kernels.h"

namespace zinf::gpu {
namespace {

// Device buffers, events and a stream released on every path.
struct Resources {
  std::vector<void*> buffers;
  std::vector<cudaEvent_t> events;
  cudaStream_t stream = nullptr;
  ~Resources() {
    for (void* p : buffers) (void)cudaFree(p);
    for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
    if (stream) (void)cudaStreamDestroy(stream);
  }
  Result<void*> Alloc(int64_t bytes) {
    void* p = nullptr;
    ZINF_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 16))));
    buffers.push_back(p);
    return p;
  }
  Result<cudaEvent_t> Event() {
    cudaEvent_t e = nullptr;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    events.push_back(e);
    return e;
  }
};

// Uniform in [-range, range], from a 64-bit mix of (seed, i).
std::vector<float> Uniform(int64_t n, uint64_t seed, float range) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[static_cast<size_t>(i)] = (static_cast<float>(z >> 40) / 16777216.0f * 2.0f - 1.0f) * range;
  }
  return x;
}

uint64_t Fnv1a(uint64_t h, const std::vector<float>& x) {
  const auto* p = reinterpret_cast<const unsigned char*>(x.data());
  for (size_t i = 0; i < x.size() * sizeof(float); ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

Result<std::vector<float>> Download(const void* p, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpy(h.data(), p, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

Result<FlashTiming> TimeFlashAttention(const math::AttentionShape& s, bool bf16_copies, int reps, uint64_t seed,
                                       float range, FlashVariant variant) {
  if (reps < 1) return InvalidArgument("TimeFlashAttention: reps must be positive");
  const int64_t BT = s.batch * s.seq_len, Q = s.heads * s.head_dim, K = s.kv_heads * s.head_dim, S = Q + 2 * K;
  const int64_t stats = s.batch * s.heads * s.seq_len;
  Resources r;
  ZINF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  ZINF_ASSIGN_OR_RETURN(void* qkv, r.Alloc(BT * S * 4));
  ZINF_ASSIGN_OR_RETURN(void* dqkv, r.Alloc(BT * S * 4));
  ZINF_ASSIGN_OR_RETURN(void* out, r.Alloc(BT * Q * 4));
  ZINF_ASSIGN_OR_RETURN(void* dout, r.Alloc(BT * Q * 4));
  ZINF_ASSIGN_OR_RETURN(void* lse, r.Alloc(stats * 4));
  ZINF_ASSIGN_OR_RETURN(void* delta, r.Alloc(stats * 4));
  ZINF_ASSIGN_OR_RETURN(void* qkv16, r.Alloc(BT * S * 2));
  ZINF_ASSIGN_OR_RETURN(void* dout16, r.Alloc(BT * Q * 2));
  {
    const std::vector<float> x = Uniform(BT * S, seed, range), dy = Uniform(BT * Q, seed + 1, 1.0f);
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpy(qkv, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpy(dout, dy.data(), dy.size() * 4, cudaMemcpyHostToDevice));
  }

  math::AttentionTensors t;
  t.q = static_cast<const float*>(qkv);
  t.k = t.q + Q;
  t.v = t.q + Q + K;
  t.q_stride = t.kv_stride = S;
  t.out = static_cast<float*>(out);
  t.out_stride = Q;
  t.lse = static_cast<float*>(lse);
  t.dout = static_cast<const float*>(dout);
  t.delta = static_cast<float*>(delta);
  t.dq = static_cast<float*>(dqkv);
  t.dk = t.dq + Q;
  t.dv = t.dq + Q + K;
  math::AttentionTensors copies = t;
  copies.q16 = static_cast<const uint16_t*>(qkv16);
  copies.k16 = copies.q16 + Q;
  copies.v16 = copies.q16 + Q + K;
  copies.dout16 = static_cast<const uint16_t*>(dout16);

  auto cast_qkv = [&] {
    return Cast(qkv, DType::kFloat32, qkv16, DType::kBFloat16, static_cast<size_t>(BT * S), r.stream);
  };
  auto cast_dout = [&] {
    return Cast(dout, DType::kFloat32, dout16, DType::kBFloat16, static_cast<size_t>(BT * Q), r.stream);
  };
  auto forward = [&]() -> Status {
    if (bf16_copies) ZINF_RETURN_IF_ERROR(cast_qkv());
    return FlashAttentionForward(s, bf16_copies ? copies : t, r.stream, variant.query_tiles);
  };
  auto backward = [&]() -> Status {
    if (bf16_copies) {
      ZINF_RETURN_IF_ERROR(cast_qkv());
      ZINF_RETURN_IF_ERROR(cast_dout());
    }
    return FlashAttentionBackward(s, bf16_copies ? copies : t, r.stream, variant.kv_min_blocks);
  };

  ZINF_RETURN_IF_ERROR(forward());  // warm-up
  ZINF_RETURN_IF_ERROR(backward());
  std::vector<cudaEvent_t> ev;
  for (int i = 0; i < 4 * reps; ++i) {
    ZINF_ASSIGN_OR_RETURN(cudaEvent_t e, r.Event());
    ev.push_back(e);
  }
  for (int i = 0; i < reps; ++i) {
    cudaEvent_t* e = &ev[4 * i];
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(e[0], r.stream));
    ZINF_RETURN_IF_ERROR(forward());
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(e[1], r.stream));
    ZINF_RETURN_IF_ERROR(backward());
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(e[2], r.stream));
    ZINF_RETURN_IF_ERROR(cast_qkv());  // the casts alone, whichever way
    ZINF_RETURN_IF_ERROR(cast_qkv());
    ZINF_RETURN_IF_ERROR(cast_dout());
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(e[3], r.stream));
  }
  ZINF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(r.stream));
  std::vector<double> fwd, bwd, casts;
  for (int i = 0; i < reps; ++i) {
    const cudaEvent_t* e = &ev[4 * i];
    float a = 0, b = 0, c = 0;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&a, e[0], e[1]));
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&b, e[1], e[2]));
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&c, e[2], e[3]));
    fwd.push_back(a / 1e3);
    bwd.push_back(b / 1e3);
    casts.push_back(c / 1e3);
  }
  FlashTiming timing;
  timing.forward = Median(fwd);
  timing.backward = Median(bwd);
  timing.casts = Median(casts);
  uint64_t h = 0xCBF29CE484222325ull;
  for (auto [p, n] : {std::pair<const void*, int64_t>{out, BT * Q}, {lse, stats}, {dqkv, BT * S}}) {
    ZINF_ASSIGN_OR_RETURN(const std::vector<float> x, Download(p, n));
    h = Fnv1a(h, x);
  }
  timing.result_hash = h;
  return timing;
}

}  // namespace zinf::gpu
