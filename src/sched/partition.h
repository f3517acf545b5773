// How a unit's flat buffer is split across ranks: into shards of whole
// 64 Ki-element norm blocks, one per rank, the last ones padded with zeros.
// Every buffer of a unit (compute copy, gradients) is padded_elems long and
// rank r owns [r * shard_elems, (r + 1) * shard_elems). The split depends on
// the rank count only, never on the ZeRO stage, so every stage forms the same
// norm blocks. Thread-safe (pure).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/kernels.h"

namespace zinf::sched {

// The norm block, in the signed arithmetic of element counts.
inline constexpr int64_t kNormBlock = static_cast<int64_t>(math::kNormBlockElems);

struct UnitPartition {
  int64_t num_elems = 0;     // the unit's real elements
  int64_t shard_elems = 0;   // a multiple of kNormBlockElems, >= 1 block
  int64_t padded_elems = 0;  // shard_elems * world_size
  int world_size = 1;

  int64_t shard_begin(int rank) const { return shard_elems * rank; }
  // Real (unpadded) elements in rank's shard: 0 .. shard_elems.
  int64_t valid_in_shard(int rank) const { return std::clamp<int64_t>(num_elems - shard_begin(rank), 0, shard_elems); }
  int64_t shard_blocks() const { return shard_elems / kNormBlock; }
};

// num_elems >= 1, world_size >= 1.
inline UnitPartition PartitionUnit(int64_t num_elems, int world_size) {
  const int64_t block = kNormBlock;
  const int64_t blocks = (num_elems + block - 1) / block;
  const int64_t shard_blocks = std::max<int64_t>(1, (blocks + world_size - 1) / world_size);
  UnitPartition p;
  p.num_elems = num_elems;
  p.shard_elems = shard_blocks * block;
  p.padded_elems = p.shard_elems * world_size;
  p.world_size = world_size;
  return p;
}

}  // namespace zinf::sched
