#include "data/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/float16.h"
#include "common/json_text.h"

namespace zinf::data {
namespace {

using nlohmann::json;

std::string Range(uint64_t b, uint64_t e) { return "[" + std::to_string(b) + ", " + std::to_string(e) + ")"; }

// Deepest nesting of objects and arrays in a JSON text, strings skipped
// (a deep header is rejected before a DOM is built for it).
int NestingDepth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

// One tensor's entry of the header, `key`: {"dtype", "shape",
// "data_offsets"}, checked against the data buffer's `data_bytes` (its
// place there, `data + begin`, becomes the tensor's data).
Result<SafetensorsTensor> ParseTensor(const std::string& name, const std::string& key, const json& v,
                                      const std::byte* data, uint64_t data_bytes, const SafetensorsLimits& limits) {
  auto fail = [&](StatusCode code, const std::string& what) { return Status(code, name + ": " + what); };
  const std::string t = "tensor '" + key + "': ";
  if (key.empty()) return fail(StatusCode::kInvalidArgument, "a tensor has an empty name");
  if (!v.is_object())
    return fail(StatusCode::kInvalidArgument, t + "expected an object with dtype, shape, data_offsets");
  for (auto f = v.begin(); f != v.end(); ++f) {
    if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets") {
      return fail(StatusCode::kInvalidArgument, t + "unknown field '" + f.key() + "'");
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(field)) return fail(StatusCode::kInvalidArgument, t + "missing field '" + field + "'");
  }
  SafetensorsTensor tensor;
  tensor.name = key;
  if (!v["dtype"].is_string()) return fail(StatusCode::kInvalidArgument, t + "dtype is not a string");
  tensor.dtype = v["dtype"].get<std::string>();
  const size_t elem_bytes = SafetensorsDTypeBytes(tensor.dtype);
  if (elem_bytes == 0) {
    return fail(StatusCode::kInvalidArgument,
                t + "unknown dtype '" + tensor.dtype +
                    "'; expected BOOL, U8, I8, F8_E4M3, F8_E5M2, I16, U16, F16, BF16, I32, U32, F32, I64, U64 or F64");
  }
  const json& shape = v["shape"];
  if (!shape.is_array()) return fail(StatusCode::kInvalidArgument, t + "shape is not an array");
  if (static_cast<int64_t>(shape.size()) > limits.max_rank) {
    return fail(StatusCode::kInvalidArgument, t + "shape has " + std::to_string(shape.size()) +
                                                  " dimensions, more than the limit of " +
                                                  std::to_string(limits.max_rank));
  }
  uint64_t num_elems = 1;
  for (const json& d : shape) {
    if (!d.is_number_unsigned()) {
      return fail(StatusCode::kInvalidArgument,
                  t + "shape " + shape.dump() + " has a dimension that is not a non-negative integer");
    }
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX) || MulOverflows(num_elems, dim, &num_elems) ||
        num_elems > static_cast<uint64_t>(INT64_MAX)) {
      return fail(StatusCode::kInvalidArgument, t + "shape " + shape.dump() + " has too many elements");
    }
    tensor.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (MulOverflows(num_elems, elem_bytes, &nbytes)) {
    return fail(StatusCode::kInvalidArgument,
                t + "shape " + shape.dump() + " × " + std::to_string(elem_bytes) + " bytes overflows");
  }
  const json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
    return fail(StatusCode::kInvalidArgument, t + "data_offsets " + off.dump() + " is not two non-negative integers");
  }
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  if (begin > end) {
    return fail(StatusCode::kInvalidArgument, t + "data_offsets " + Range(begin, end) + " ends before it begins");
  }
  if (end > data_bytes) {
    return fail(StatusCode::kDataLoss, t + "data_offsets " + Range(begin, end) + " run past the data buffer (" +
                                           std::to_string(data_bytes) + " bytes)");
  }
  if (end - begin != nbytes) {
    return fail(StatusCode::kInvalidArgument, t + "data_offsets " + Range(begin, end) + " hold " +
                                                  std::to_string(end - begin) + " bytes, but " + tensor.dtype + " " +
                                                  tensor.ShapeString() + " needs " + std::to_string(nbytes));
  }
  tensor.offset_bytes = begin;
  tensor.data = std::span<const std::byte>(data + begin, nbytes);
  return tensor;
}

// The tensors, sorted by offset, must cover the data buffer's `data_bytes`
// exactly: no overlap, no gap, nothing after the last.
Status CheckCoverage(const std::string& name, const std::vector<SafetensorsTensor>& tensors, uint64_t data_bytes) {
  auto fail = [&](StatusCode code, const std::string& what) { return Status(code, name + ": " + what); };
  uint64_t covered = 0;
  const SafetensorsTensor* prev = nullptr;
  for (const SafetensorsTensor& t : tensors) {
    const uint64_t b = t.offset_bytes, e = b + t.data.size();
    if (b < covered) {
      return fail(StatusCode::kInvalidArgument, "tensor '" + t.name + "' " + Range(b, e) + " overlaps tensor '" +
                                                    prev->name + "' " +
                                                    Range(prev->offset_bytes, prev->offset_bytes + prev->data.size()));
    }
    if (b > covered) {
      return fail(StatusCode::kInvalidArgument,
                  "data bytes " + Range(covered, b) + " before tensor '" + t.name + "' belong to no tensor");
    }
    covered = e;
    prev = &t;
  }
  if (covered != data_bytes) {
    return fail(StatusCode::kInvalidArgument,
                "data bytes " + Range(covered, data_bytes) +
                    (prev ? " after the last tensor '" + prev->name + "'" : std::string()) + " belong to no tensor");
  }
  return Status::Ok();
}

}  // namespace

size_t SafetensorsDTypeBytes(std::string_view d) {
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  if (d == "I16" || d == "U16" || d == "F16" || d == "BF16") return 2;
  if (d == "I32" || d == "U32" || d == "F32") return 4;
  if (d == "I64" || d == "U64" || d == "F64") return 8;
  return 0;
}

int64_t SafetensorsTensor::num_elems() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsTensor::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- Reader ------------------------------------------------------------------------

Result<SafetensorsReader> SafetensorsReader::Open(const std::string& path, const SafetensorsLimits& limits) {
  ZINF_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  auto shared = std::make_shared<MappedFile>(std::move(file));
  ZINF_ASSIGN_OR_RETURN(SafetensorsReader r, Parse(shared->bytes(), path, limits));
  r.file_ = std::move(shared);
  return r;
}

Result<SafetensorsReader> SafetensorsReader::Parse(std::span<const std::byte> file, const std::string& name,
                                                   const SafetensorsLimits& limits) {
  auto fail = [&](StatusCode code, const std::string& what) { return Status(code, name + ": " + what); };
  if (file.size() < 8) {
    return fail(StatusCode::kDataLoss,
                "file is " + std::to_string(file.size()) + " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | static_cast<uint8_t>(file[i]);
  if (header_bytes > limits.max_header_bytes) {
    return fail(StatusCode::kInvalidArgument, "header length " + std::to_string(header_bytes) +
                                                  " bytes exceeds the limit of " +
                                                  std::to_string(limits.max_header_bytes));
  }
  if (header_bytes > file.size() - 8) {
    return fail(StatusCode::kDataLoss, "header length " + std::to_string(header_bytes) +
                                           " bytes runs past the end of the file (" + std::to_string(file.size()) +
                                           " bytes)");
  }
  const std::string_view header(reinterpret_cast<const char*>(file.data()) + 8, header_bytes);
  if (header.empty() || header[0] != '{') {
    return fail(StatusCode::kInvalidArgument, "header does not start with '{'");
  }
  if (const int depth = NestingDepth(header); depth > 3) {
    return fail(StatusCode::kInvalidArgument,
                "header nests " + std::to_string(depth) + " levels deep; the format has at most 3");
  }

  // Duplicate keys: nlohmann keeps the last silently; ParseJsonText lists
  // them. (nlohmann's callback parser, used here before, rescans an object's
  // members at the end of each member object: quadratic in the tensors.)
  auto parsed = ParseJsonText(header, "header");
  if (!parsed.ok()) {
    // "header:1:5: malformed JSON: ..." -> "... at 1:5: malformed JSON: ..."
    return fail(StatusCode::kInvalidArgument,
                "header is not valid JSON (or not UTF-8) at " + parsed.status().message().substr(7));
  }
  if (!parsed->duplicate_keys.empty()) {
    const DuplicateKey& dup = parsed->duplicate_keys.front();
    return fail(StatusCode::kInvalidArgument,
                "header repeats the key '" + dup.key + "'" + (dup.path != dup.key ? " (at " + dup.path + ")" : ""));
  }
  const json j = std::move(parsed->value);
  if (!j.is_object()) return fail(StatusCode::kInvalidArgument, "header is not a JSON object");

  const uint64_t data_bytes = file.size() - 8 - header_bytes;
  const std::byte* data = file.data() + 8 + header_bytes;
  SafetensorsReader r;
  r.name_ = name;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) return fail(StatusCode::kInvalidArgument, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return fail(StatusCode::kInvalidArgument, "__metadata__ '" + m.key() + "' is not a string");
        }
        r.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    ZINF_ASSIGN_OR_RETURN(SafetensorsTensor tensor, ParseTensor(name, key, v, data, data_bytes, limits));
    r.tensors_.push_back(std::move(tensor));
  }

  std::sort(r.tensors_.begin(), r.tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    if (a.offset_bytes != b.offset_bytes) return a.offset_bytes < b.offset_bytes;
    return a.data.size() < b.data.size();
  });
  ZINF_RETURN_IF_ERROR(CheckCoverage(name, r.tensors_, data_bytes));
  for (size_t i = 0; i < r.tensors_.size(); ++i) r.by_name_.emplace(r.tensors_[i].name, i);
  return r;
}

const SafetensorsTensor* SafetensorsReader::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsReader::ReadAsFloat32(const SafetensorsTensor& t, std::span<float> out) {
  const size_t n = static_cast<size_t>(t.num_elems());
  if (out.size() != n) {
    return InvalidArgument("tensor '" + t.name + "': " + std::to_string(n) + " elements into a buffer of " +
                           std::to_string(out.size()));
  }
  const std::byte* p = t.data.data();
  if (t.dtype == "F32") {
    std::memcpy(out.data(), p, 4 * n);
  } else if (t.dtype == "F16" || t.dtype == "BF16") {
    const bool bf16 = t.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = bf16 ? Bf16BitsToFloat(h) : HalfBitsToFloat(h);
    }
  } else if (t.dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    return InvalidArgument("tensor '" + t.name + "': dtype " + t.dtype + " is not a float type (F32, F16, BF16, F64)");
  }
  return Status::Ok();
}

// ---- Writer ------------------------------------------------------------------------

Result<SafetensorsWriter> SafetensorsWriter::Begin(const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
                                                   const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const SafetensorsTensorSpec& s : tensors) {
    const std::string t = "safetensors " + path + ": tensor '" + s.name + "': ";
    if (s.name.empty() || s.name == "__metadata__") return InvalidArgument(t + "not a valid tensor name");
    if (header.contains(s.name)) return InvalidArgument(t + "given twice");
    const size_t elem_bytes = SafetensorsDTypeBytes(s.dtype);
    if (elem_bytes == 0) return InvalidArgument(t + "unknown dtype '" + s.dtype + "'");
    uint64_t bytes = elem_bytes;
    for (int64_t d : s.shape) {
      if (d < 0 || MulOverflows(bytes, static_cast<uint64_t>(d), &bytes)) return InvalidArgument(t + "bad shape");
    }
    header[s.name] = {{"dtype", s.dtype}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  SafetensorsWriter w;
  ZINF_ASSIGN_OR_RETURN(w.file_, FileWriter::Create(path));
  ZINF_RETURN_IF_ERROR(w.file_.Write(len, 8));
  ZINF_RETURN_IF_ERROR(w.file_.Write(text.data(), text.size()));
  w.specs_ = std::move(tensors);
  w.sizes_ = std::move(sizes);
  // Zero-byte tensors at the front are complete already.
  while (w.current_ < w.sizes_.size() && w.sizes_[w.current_] == 0) ++w.current_;
  return w;
}

Status SafetensorsWriter::Write(std::string_view name, std::span<const std::byte> bytes) {
  const std::string where = "safetensors " + file_.path() + ": ";
  if (finished_) return FailedPrecondition(where + "write of '" + std::string(name) + "' after Finish");
  if (current_ >= specs_.size()) {
    return FailedPrecondition(where + "bytes for '" + std::string(name) + "' after every tensor is complete");
  }
  const SafetensorsTensorSpec& s = specs_[current_];
  if (name != s.name) {
    return FailedPrecondition(where + "bytes for '" + std::string(name) + "' while '" + s.name +
                              "' is being written (" + std::to_string(written_in_current_) + " of " +
                              std::to_string(sizes_[current_]) + " bytes)");
  }
  if (bytes.size() > sizes_[current_] - written_in_current_) {
    return FailedPrecondition(where + "tensor '" + s.name + "' is " + std::to_string(sizes_[current_]) +
                              " bytes; got " + std::to_string(written_in_current_ + bytes.size()));
  }
  ZINF_RETURN_IF_ERROR(file_.Write(bytes));
  written_in_current_ += bytes.size();
  if (written_in_current_ == sizes_[current_]) {
    written_in_current_ = 0;
    ++current_;
    while (current_ < sizes_.size() && sizes_[current_] == 0) ++current_;
  }
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (finished_) return FailedPrecondition("safetensors " + file_.path() + ": Finish called twice");
  if (current_ < specs_.size()) {
    return FailedPrecondition("safetensors " + file_.path() + ": tensor '" + specs_[current_].name + "' has " +
                              std::to_string(written_in_current_) + " of " + std::to_string(sizes_[current_]) +
                              " bytes" + (current_ + 1 < specs_.size() ? " (and later tensors none)" : ""));
  }
  finished_ = true;
  return file_.Commit();
}

}  // namespace zinf::data
