// safetensors (Hugging Face's tensor file format): a validating reader over a
// memory map and a streaming writer.
//
// Format: an 8-byte little-endian header length N, then N bytes of UTF-8
// JSON, then the data buffer. The JSON is one object: "__metadata__"
// (optional, string -> string) and, per tensor, {"dtype": "F32", "shape":
// [d0, d1, ...], "data_offsets": [begin, end]}, offsets in bytes relative to
// the data buffer. The header may end with spaces (writers pad it so the
// data starts 8-byte aligned).
//
// What the reader rejects, each with an error naming the tensor (and the
// bytes or values involved): a file shorter than 8 bytes or than 8 + N; N
// above the limit (100 MiB, the reference implementation's); a header that
// is not a JSON object, is not UTF-8, repeats a key, or nests deeper than
// the format allows; an unknown dtype; a missing, ill-typed or unknown field;
// a negative or non-integer dimension; more dimensions than the limit; an
// element count or byte size that overflows; data_offsets that are not two
// integers with begin <= end <= the data size, or whose length is not
// elements × element size; two tensors that overlap; bytes of the data
// buffer that belong to no tensor (a gap, or bytes after the last tensor) —
// the reference implementation rejects those as well.
//
// Thread-safety: a reader is immutable after Open; a writer serves one caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/file_util.h"
#include "zinf/status.h"

namespace zinf::data {

// Bytes per element of a safetensors dtype name ("F32" -> 4), 0 if unknown.
// Known: BOOL U8 I8 F8_E4M3 F8_E5M2 (1), I16 U16 F16 BF16 (2), I32 U32 F32
// (4), I64 U64 F64 (8).
size_t SafetensorsDTypeBytes(std::string_view dtype);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t offset_bytes = 0;        // in the data buffer
  std::span<const std::byte> data;  // not necessarily aligned
  int64_t num_elems() const;
  std::string ShapeString() const;  // "[768, 2304]"
};

struct SafetensorsLimits {
  uint64_t max_header_bytes = 100ull << 20;
  int max_rank = 8;
};

class SafetensorsReader {
 public:
  // Maps the file and validates its header (see above). Errors start with
  // the path.
  static Result<SafetensorsReader> Open(const std::string& path, const SafetensorsLimits& limits = {});
  // The same over bytes the caller keeps alive (tests, fuzzing).
  static Result<SafetensorsReader> Parse(std::span<const std::byte> file, const std::string& name = "<memory>",
                                         const SafetensorsLimits& limits = {});

  // Sorted by offset.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // By name, in O(log n): a file may hold a hundred thousand tensors.
  const SafetensorsTensor* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& name() const { return name_; }

  // Widens F32, F16, BF16 or F64 data to fp32 (F64 rounds to nearest);
  // `out` holds t.num_elems() floats. kInvalidArgument for other dtypes.
  static Status ReadAsFloat32(const SafetensorsTensor& t, std::span<float> out);

 private:
  std::shared_ptr<MappedFile> file_;
  std::string name_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;  // index into tensors_
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsTensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// Writes a file tensor by tensor: Begin fixes the header (the format puts it
// first, so every name, dtype and shape is known up front) and writes it;
// Write appends bytes of the tensors in the order they were given, in as
// many pieces as the caller likes, so nothing needs the whole model in
// memory; Finish checks every tensor is complete, fsyncs and renames the
// file into place (until then it is "<path>.tmp.<pid>", removed if the
// writer is dropped).
class SafetensorsWriter {
 public:
  static Result<SafetensorsWriter> Begin(const std::string& path, std::vector<SafetensorsTensorSpec> tensors,
                                         const std::map<std::string, std::string>& metadata = {});
  // Bytes of tensor `name`, which must be the one being written (the first
  // not yet complete). kFailedPrecondition naming both otherwise, or when
  // the bytes run past the tensor's size.
  Status Write(std::string_view name, std::span<const std::byte> bytes);
  Status Finish();

 private:
  FileWriter file_;
  std::vector<SafetensorsTensorSpec> specs_;
  std::vector<uint64_t> sizes_;
  size_t current_ = 0;
  uint64_t written_in_current_ = 0;
  bool finished_ = false;
};

}  // namespace zinf::data
