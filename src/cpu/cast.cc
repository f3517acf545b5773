// Block-parallel casts through the kernel table of the chosen SIMD level.
#include "cpu/cast.h"

#include <cstring>
#include <string>

#include "cpu/kernel_args.h"
#include "cpu/kernels.h"
#include "cpu/parallel_blocks.h"

namespace zinf::cpu {

Status Cast(tbb::task_arena& arena, const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t num_elems,
            SimdLevel level) {
  ZINF_RETURN_IF_ERROR(cpu::CheckSimdLevel(level));
  ZINF_RETURN_IF_ERROR(cpu::CheckDType(src_dtype, "cast source"));
  ZINF_RETURN_IF_ERROR(cpu::CheckDType(dst_dtype, "cast destination"));
  if (num_elems == 0) return Status::Ok();
  if (!src || !dst) return InvalidArgument("cast: null buffer");
  const size_t src_bytes = DTypeSizeBytes(src_dtype), dst_bytes = DTypeSizeBytes(dst_dtype);
  ZINF_RETURN_IF_ERROR(
      cpu::CheckNoOverlap({{src, num_elems * src_bytes, "source"}, {dst, num_elems * dst_bytes, "destination"}})
          .WithContext("cast"));
  const cpu::CastFn kernel = cpu::Kernels(level).cast[static_cast<int>(src_dtype)][static_cast<int>(dst_dtype)];
  cpu::ParallelForBlocks(arena, num_elems, src_bytes + dst_bytes, [&](size_t begin, size_t end) {
    const auto* from = static_cast<const unsigned char*>(src) + begin * src_bytes;
    auto* to = static_cast<unsigned char*>(dst) + begin * dst_bytes;
    if (kernel) {
      kernel(from, to, end - begin);
    } else {
      std::memcpy(to, from, (end - begin) * src_bytes);  // same dtype
    }
  });
  return Status::Ok();
}

}  // namespace zinf::cpu
