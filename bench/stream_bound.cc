// Picks the streaming-bound variants by SIMD level (stream_bound.h).
#include "bench/stream_bound.h"

namespace zinf::bench {

std::vector<StreamVariant> StreamVariantsSse2();
std::vector<StreamVariant> StreamVariantsAvx2();
std::vector<StreamVariant> StreamVariantsAvx512();

std::vector<StreamVariant> StreamVariants(cpu::SimdLevel level) {
  std::vector<StreamVariant> all;
  auto add = [&](std::vector<StreamVariant> v) { all.insert(all.end(), v.begin(), v.end()); };
  add(StreamVariantsSse2());  // 16-byte vectors: plain C++, any target
#if defined(__x86_64__)
  if (level >= cpu::SimdLevel::kAvx2) add(StreamVariantsAvx2());
  if (level >= cpu::SimdLevel::kAvx512) add(StreamVariantsAvx512());
#else
  (void)level;
#endif
  return all;
}

double StreamBytes(const cpu::AdamBuffers& a) {
  const double per_elem = 24.0 + static_cast<double>(DTypeSizeBytes(a.grad_dtype)) + (a.param_copy ? 2.0 : 0.0);
  return per_elem * static_cast<double>(a.num_elems);
}

}  // namespace zinf::bench
