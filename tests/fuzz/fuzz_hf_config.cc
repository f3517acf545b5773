// A Hugging Face model folder (hf_checkpoint.cc): the input is config.json,
// optionally followed by NUL and model.safetensors.index.json. Any
// config.json is a model or an InvalidArgument naming the file; for a small
// model a real folder is written (shards of a few KiB, zeros) and, with the
// fuzzed index in place of the written one, opened and read unit by unit:
// the index may name any file, any tensor, any shard.
#include <fstream>
#include <span>
#include <vector>

#include "data/hf_checkpoint.h"
#include "fuzz_util.h"

namespace {

// The folder of the last model written, reused while the config stays the same.
struct Folder {
  std::string config_text;  // HfConfigJson of the model it holds
  std::string index_text;   // the index as written ("" when one shard)
};

void WriteFile(const std::string& path, std::string_view text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zinf::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zinf;
  const auto parts = fuzz::SplitParts(fuzz::AsText(data, size), 2);
  auto hf = data::ParseHfConfig(std::string(parts[0]), "config.json");
  if (!hf.ok()) {
    fuzz::CheckRejection(hf.status(), "config.json");
    return 0;
  }
  const model::GptConfig& c = hf->config;
  // What zinf writes for the model must read back as the same model.
  const std::string written = data::HfConfigJson(c);
  auto again = data::ParseHfConfig(written, "written.json");
  ZINF_FUZZ_CHECK(again.ok(), again.status().message());
  ZINF_FUZZ_CHECK(again->config.ToString().substr(again->config.ToString().find(':')) ==
                      c.ToString().substr(c.ToString().find(':')),
                  again->config.ToString() + " vs " + c.ToString());
  if (model::NumParams(c) > (int64_t{1} << 16)) return 0;  // the folder is for small models

  static Folder folder;
  const std::string dir = fuzz::ScratchDir() + "/model";
  if (folder.config_text != written) {
    std::filesystem::remove_all(dir);
    std::vector<float> zeros;
    data::HfExportOptions o;
    o.dtype = DType::kFloat32;
    o.max_shard_bytes = 4096;
    Status s = data::ExportHfCheckpoint(
        [&](int unit) -> Result<std::span<const float>> {
          zeros.assign(static_cast<size_t>(model::UnitNumParams(c, unit)), 0.0f);
          return std::span<const float>(zeros);
        },
        c, dir, o);
    ZINF_FUZZ_CHECK(s.ok(), s.ToString());
    folder.config_text = written;
    std::ifstream in(dir + "/model.safetensors.index.json", std::ios::binary);
    folder.index_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (parts.size() > 1) {
    WriteFile(index_path, parts[1]);
  } else if (folder.index_text.empty()) {
    std::filesystem::remove(index_path);
  } else {
    WriteFile(index_path, folder.index_text);
  }
  auto ck = data::HfCheckpoint::Open(dir, c);
  if (!ck.ok()) {
    fuzz::CheckRejection(ck.status(), dir);
    return 0;
  }
  std::vector<float> unit;
  for (int u = 0; u < model::NumUnits(c); ++u) {
    unit.assign(static_cast<size_t>(model::UnitNumParams(c, u)), 1.0f);
    Status s = ck->ReadUnit(u, unit);
    ZINF_FUZZ_CHECK(s.ok(), s.ToString());
    for (float v : unit) ZINF_FUZZ_CHECK(v == 0.0f, "unit " + std::to_string(u) + " read a value that is not there");
  }
  return 0;
}
