// The streaming-bound variants for avx2 (8 floats a vector); this file is
// compiled with that instruction set's flags (bench/CMakeLists.txt).
#include "bench/stream_bound_impl.h"

namespace zinf::bench {

std::vector<StreamVariant> StreamVariantsAvx2() { return VariantsOfWidth<8>("avx2"); }

}  // namespace zinf::bench
