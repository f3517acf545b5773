// The streaming-bound variants for sse2 (4 floats a vector); this file is
// compiled with that instruction set's flags (bench/CMakeLists.txt).
#include "bench/stream_bound_impl.h"

namespace zinf::bench {

std::vector<StreamVariant> StreamVariantsSse2() { return VariantsOfWidth<4>("sse2"); }

}  // namespace zinf::bench
