// `zinf bench attention`: the CUDA flash attention (gpu/kernels.h) timed on
// random inputs of one shape, with CUDA events on a stream of its own, in
// either of the ways its kernels take their operands (rounding the fp32
// inputs as each tile loads, or copying tiles of bf16 copies made first).
#pragma once

#include <cstdint>

#include "math/attention_math.h"
#include "zinf/status.h"

namespace zinf::gpu {

struct FlashTiming {
  // Medians over the timed repetitions, seconds. With bf16 copies, forward
  // and backward include the casts that make them (qkv; qkv and dout), as
  // the model's step does; `casts` is those casts' time alone.
  double forward = 0, backward = 0, casts = 0;
  // FNV-1a of the last repetition's out, lse and dqkv bytes: equal hashes
  // across the two ways say they gave the same bits.
  uint64_t result_hash = 0;
};

// The kernels' build variants to time (gpu/kernels.h; 0: the defaults):
// FlashAttentionForward's query_tiles, FlashAttentionBackward's
// kv_min_blocks.
struct FlashVariant {
  int query_tiles = 0;
  int kv_min_blocks = 0;
};

// On the current device; the inputs are uniform in [-range, range] from
// `seed` (the same for both ways). reps >= 1, after one warm-up.
Result<FlashTiming> TimeFlashAttention(const math::AttentionShape& shape, bool bf16_copies, int reps, uint64_t seed = 1,
                                       float range = 2.0f, FlashVariant variant = {});

}  // namespace zinf::gpu
