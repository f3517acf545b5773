// The streaming-bound variants for avx512 (16 floats a vector); this file is
// compiled with that instruction set's flags (bench/CMakeLists.txt).
#include "bench/stream_bound_impl.h"

namespace zinf::bench {

std::vector<StreamVariant> StreamVariantsAvx512() { return VariantsOfWidth<16>("avx512"); }

}  // namespace zinf::bench
