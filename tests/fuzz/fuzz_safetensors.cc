// A .safetensors file (safetensors.cc): any bytes are a reader or an error
// naming the file; a reader's tensors tile the data buffer exactly, and every
// float tensor widens to fp32.
#include <cstddef>
#include <span>
#include <vector>

#include "data/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zinf;
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  auto r = data::SafetensorsReader::Parse(file, "fuzz.safetensors");
  if (!r.ok()) {
    fuzz::CheckRejection(r.status(), "fuzz.safetensors");
    return 0;
  }
  uint64_t covered = 0;
  std::vector<float> out;
  for (const data::SafetensorsTensor& t : r->tensors()) {
    ZINF_FUZZ_CHECK(t.offset_bytes == covered, "tensors do not tile the data buffer");
    covered += t.data.size();
    ZINF_FUZZ_CHECK(r->Find(t.name) != nullptr, "Find misses " + t.name);
    ZINF_FUZZ_CHECK(static_cast<uint64_t>(t.num_elems()) * data::SafetensorsDTypeBytes(t.dtype) == t.data.size(),
                    "size of " + t.name);
    out.assign(static_cast<size_t>(t.num_elems()), 0.0f);
    Status s = data::SafetensorsReader::ReadAsFloat32(t, out);
    const bool is_float = t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16" || t.dtype == "F64";
    ZINF_FUZZ_CHECK(s.ok() == is_float, t.dtype + ": " + s.ToString());
    (void)t.ShapeString();
  }
  ZINF_FUZZ_CHECK(8 + covered <= size, "tensors beyond the file");
  return 0;
}
