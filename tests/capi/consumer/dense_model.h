/* dense_model.h: the model the C and C++ consumers train through zinf's C
 * ABI: three dense layers y = tanh(x W + b) (the last one linear) regressing
 * the output of a fixed "teacher" network of the same shape, with a mean
 * squared error. Plain C99 that also compiles as C++; host memory only.
 * Unit u holds W [in, out] then b [out]. Not thread-safe: one dm_state per
 * stream. */
#ifndef ZINF_TESTS_CAPI_DENSE_MODEL_H_
#define ZINF_TESTS_CAPI_DENSE_MODEL_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#define DM_LAYERS 3
#define DM_BATCH 16
#define DM_WIDEST 32
#define DM_BATCHES 4 /* the data set: micro-batch i is batch i % DM_BATCHES */

static const int dm_in[DM_LAYERS] = {8, 32, 32};
static const int dm_out[DM_LAYERS] = {32, 32, 4};

typedef struct dm_state {
  float acts[DM_LAYERS + 1][DM_BATCH * DM_WIDEST]; /* acts[0] = x, acts[L] = y */
  float dy[DM_BATCH * DM_WIDEST];                  /* d loss / d acts[u + 1] on the way back */
  float target[DM_BATCH * DM_WIDEST];
  double loss; /* of the last backward */
} dm_state;

/* Uniform in [-1, 1), from a 64-bit state (splitmix64). */
static inline float dm_uniform(uint64_t* s) {
  uint64_t x = (*s += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (float)(x >> 40) / (float)(1 << 23) - 1.0f;
}

static inline int64_t dm_weights(int u) { return (int64_t)dm_in[u] * dm_out[u]; }

/* Initial parameters of layer u: W scaled by 1/sqrt(in), small b. */
static inline void dm_init_params(int u, uint64_t seed, float* w, float* b) {
  uint64_t s = seed * 1000003u + (uint64_t)u;
  const float scale = 1.0f / sqrtf((float)dm_in[u]);
  for (int64_t i = 0; i < dm_weights(u); ++i) w[i] = scale * dm_uniform(&s);
  for (int i = 0; i < dm_out[u]; ++i) b[i] = 0.1f * dm_uniform(&s);
}

static inline void dm_forward_layer(int u, const float* w, const float* b, const float* x, float* y) {
  const int in = dm_in[u], out = dm_out[u];
  for (int n = 0; n < DM_BATCH; ++n) {
    for (int o = 0; o < out; ++o) {
      float z = b[o];
      for (int i = 0; i < in; ++i) z += x[n * in + i] * w[(int64_t)i * out + o];
      y[n * out + o] = u == DM_LAYERS - 1 ? z : tanhf(z);
    }
  }
}

/* Fills acts[0] and target for micro-batch `index`: inputs from the index,
 * targets from the teacher network (seed 99). */
static inline void dm_make_batch(int index, dm_state* st) {
  uint64_t s = 7777u + (uint64_t)(index % DM_BATCHES);
  for (int i = 0; i < DM_BATCH * dm_in[0]; ++i) st->acts[0][i] = dm_uniform(&s);
  float a[DM_LAYERS + 1][DM_BATCH * DM_WIDEST];
  float w[DM_WIDEST * DM_WIDEST], b[DM_WIDEST];
  memcpy(a[0], st->acts[0], sizeof(float) * DM_BATCH * dm_in[0]);
  for (int u = 0; u < DM_LAYERS; ++u) {
    dm_init_params(u, 99, w, b);
    for (int64_t i = 0; i < dm_weights(u); ++i) w[i] *= 2.0f; /* a teacher the student must move to reach */
    dm_forward_layer(u, w, b, a[u], a[u + 1]);
  }
  memcpy(st->target, a[DM_LAYERS], sizeof(float) * DM_BATCH * dm_out[DM_LAYERS - 1]);
}

static inline void dm_forward(int u, const float* w, const float* b, dm_state* st) {
  dm_forward_layer(u, w, b, st->acts[u], st->acts[u + 1]);
}

/* Backward of layer u (called from the last layer down): writes the fp32
 * gradients of W and b (of the loss times loss_scale) and leaves d loss /
 * d input in st->dy. The last layer also sets st->loss = mean over the batch
 * of 0.5 * |y - target|^2. */
static inline void dm_backward(int u, const float* w, float* gw, float* gb, float loss_scale, dm_state* st) {
  const int in = dm_in[u], out = dm_out[u];
  const int last = u == DM_LAYERS - 1;
  const float* x = st->acts[u];
  const float* y = st->acts[u + 1];
  float dz[DM_BATCH * DM_WIDEST];
  if (last) st->loss = 0;
  for (int i = 0; i < DM_BATCH * out; ++i) {
    if (last) {
      const float e = y[i] - st->target[i];
      st->loss += 0.5 * (double)e * e / DM_BATCH;
      dz[i] = loss_scale * e / DM_BATCH;
    } else {
      dz[i] = st->dy[i] * (1.0f - y[i] * y[i]);
    }
  }
  for (int i = 0; i < in; ++i) {
    for (int o = 0; o < out; ++o) {
      float s = 0;
      for (int n = 0; n < DM_BATCH; ++n) s += x[n * in + i] * dz[n * out + o];
      gw[(int64_t)i * out + o] = s;
    }
  }
  for (int o = 0; o < out; ++o) {
    float s = 0;
    for (int n = 0; n < DM_BATCH; ++n) s += dz[n * out + o];
    gb[o] = s;
  }
  for (int n = 0; n < DM_BATCH; ++n) {
    for (int i = 0; i < in; ++i) {
      float s = 0;
      for (int o = 0; o < out; ++o) s += dz[n * out + o] * w[(int64_t)i * out + o];
      st->dy[n * in + i] = s;
    }
  }
}

/* float -> bfloat16 bits, round to nearest even (NaN kept quiet). */
static inline uint16_t dm_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif /* ZINF_TESTS_CAPI_DENSE_MODEL_H_ */
