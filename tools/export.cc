// `zinf export CKPT_DIR OUT.safetensors [--dtype bf16|fp16|fp32] [--names zinf|hf]`
// `zinf export CKPT_DIR --hf-dir DIR [--dtype bf16|fp16|fp32]`
//
// Reads a checkpoint's fp32 master weights unit by unit, from the slices of
// whatever world size saved it (every slice's XXH3 verified), and streams them
// into OUT tensor by tensor: memory is one unit's master plus the writer's
// conversion buffer. A checkpoint of `zinf train` carries its GPT shape in
// the client state: its tensors get GPT-2 names (zinf's, or Hugging Face's
// with --names hf). Any other engine client's tensors are written as
// "<unit>.<tensor>" with the shapes it registered. A Llama-family model
// trained by `zinf train` carries its config.json in the client state and is
// written with --hf-dir as a Hugging Face folder (config.json, safetensors
// shards of at most 5 GB with their index, and the tokenizer files of the
// training run when they are still where they were).
#include "tools/export.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/units.h"
#include "cpu/cast.h"
#include "data/gpt_weights.h"
#include "data/hf_checkpoint.h"
#include "data/safetensors.h"
#include "model/gpt_config.h"
#include "nvme/io_engine.h"
#include "sched/checkpoint_io.h"
#include "tools/tool_status.h"

namespace zinf::tools {
namespace {

struct ExportOptions {
  std::string checkpoint, out, dtype = "bf16", names = "zinf";
  std::string hf_dir;
};

const char* SafetensorsDType(DType d) { return d == DType::kFloat32 ? "F32" : d == DType::kBFloat16 ? "BF16" : "F16"; }

// The checkpoint being exported: its reader, its units, and the unit read
// last (the fp32 master, whole).
struct ExportRun {
  DType dtype = DType::kBFloat16;
  data::WeightNaming naming = data::WeightNaming::kZinf;
  std::unique_ptr<nvme::IoEngine> io;
  std::unique_ptr<sched::ckpt::CheckpointReader> reader;
  struct UnitInfo {
    std::string name;
    int64_t elements;
  };
  std::vector<UnitInfo> units;
  std::vector<float> master;
  std::chrono::steady_clock::time_point t0;

  Result<std::span<const float>> ReadUnit(int u) {
    master.assign(units[u].elements, 0.0f);
    ZINF_RETURN_IF_ERROR(reader->ReadRange(units[u].name, 0, units[u].elements, 0, units[u].elements, master.data()));
    return std::span<const float>(master);
  }
  double Seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

// --dtype, --names, and one output that is not a directory.
Status ParseFlags(const ExportOptions& opt, ExportRun& run) {
  if (opt.dtype == "fp32") {
    run.dtype = DType::kFloat32;
  } else if (opt.dtype == "bf16") {
    run.dtype = DType::kBFloat16;
  } else if (opt.dtype == "fp16") {
    run.dtype = DType::kFloat16;
  } else {
    return BadInput("--dtype: expected bf16, fp16 or fp32, got '" + opt.dtype + "'");
  }
  auto naming = data::ParseWeightNaming(opt.names);
  if (!naming.ok()) return BadInput("--names: expected zinf or hf, got '" + opt.names + "'");
  run.naming = *naming;
  if (opt.out.empty() == opt.hf_dir.empty()) return BadInput("give OUT.safetensors or --hf-dir DIR (one of them)");
  if (!opt.out.empty() && std::filesystem::is_directory(opt.out)) {
    return BadInput(opt.out + " is a directory; give the output file's path (or --hf-dir for a Hugging Face folder)");
  }
  return Status::Ok();
}

// The checkpoint (a missing one is bad input) and its units.
Status OpenCheckpoint(const ExportOptions& opt, ExportRun& run) {
  auto io = nvme::IoEngine::Create(nvme::IoEngineOptions{});
  if (!io.ok()) return RunFailed(io.status(), "I/O engine");
  run.io = std::move(*io);
  auto opened = sched::ckpt::CheckpointReader::Open(*run.io, opt.checkpoint);
  if (!opened.ok() && opened.status().code() == StatusCode::kNotFound) return BadInput(opened.status().message());
  if (!opened.ok()) return RunFailed(opened.status(), "checkpoint");
  run.reader = std::move(*opened);
  run.t0 = std::chrono::steady_clock::now();
  for (const auto& u : run.reader->units()) run.units.push_back({u.name, u.elements});
  return Status::Ok();
}

// A Llama-family model trained by `zinf train`: a Hugging Face folder.
Status ExportHfFolder(const ExportOptions& opt, ExportRun& run, const nlohmann::json& client) {
  const std::string where = opt.checkpoint + ": client state hf_config";
  auto hf = data::ParseHfConfig(client.at("hf_config").get<std::string>(), where);
  if (!hf.ok()) return DataLoss(hf.status().message());
  if (static_cast<int>(run.units.size()) != model::NumUnits(hf->config)) {
    return DataLoss("the checkpoint has " + std::to_string(run.units.size()) + " units; its model " +
                    hf->config.ToString() + " has " + std::to_string(model::NumUnits(hf->config)));
  }
  data::HfExportOptions eo;
  eo.dtype = run.dtype;
  eo.config_json = hf->config_json;
  const std::string tok = client.value("tokenizer_dir", std::string());
  if (!tok.empty() && std::filesystem::exists(tok + "/tokenizer.json")) eo.tokenizer_dir = tok;
  Status s = data::ExportHfCheckpoint([&](int u) { return run.ReadUnit(u); }, hf->config, opt.hf_dir, eo);
  if (!s.ok()) return RunFailed(s, "export");
  std::printf("exported %s (%s read, verified) to the Hugging Face folder %s as %s%s in %.2f s\n",
              run.reader->dir().c_str(), FormatBytes(run.reader->bytes_read()).c_str(), opt.hf_dir.c_str(),
              opt.dtype.c_str(), eo.tokenizer_dir.empty() ? " (no tokenizer files)" : ", tokenizer files copied",
              run.Seconds());
  return Status::Ok();
}

// A GPT trained by `zinf train`: GPT-2 names (zinf's or Hugging Face's).
// Returns the tensors written.
Result<uint64_t> ExportGpt(const ExportOptions& opt, ExportRun& run, const nlohmann::json& m) {
  model::GptConfig mc;
  mc.name = m.value("name", std::string("gpt"));
  for (auto [key, dim] : {std::pair{"vocab_size", &mc.vocab_size}, std::pair{"max_seq_len", &mc.max_seq_len},
                          std::pair{"embed_dim", &mc.embed_dim}, std::pair{"num_layers", &mc.num_layers},
                          std::pair{"num_heads", &mc.num_heads}}) {
    const nlohmann::json& v = m.at(key);
    if (!v.is_number_integer()) {
      return DataLoss("the checkpoint's manifest is damaged: model." + std::string(key) + " is " + v.dump());
    }
    *dim = v.get<int64_t>();
  }
  if (Status s = mc.Validate(); !s.ok()) return RunFailed(s, "the checkpoint's model");
  if (static_cast<int>(run.units.size()) != model::NumUnits(mc)) {
    return DataLoss("the checkpoint has " + std::to_string(run.units.size()) + " units; its model " + mc.ToString() +
                    " has " + std::to_string(model::NumUnits(mc)));
  }
  Status s = data::ExportGptWeights([&](int u) { return run.ReadUnit(u); }, mc, run.naming, run.dtype, opt.out);
  if (!s.ok()) return RunFailed(s, "export");
  return static_cast<uint64_t>(data::GptWeightNames(mc, run.naming).size());
}

// Where one registered tensor lies in its unit.
struct TensorPlace {
  int unit;
  int64_t offset, count;
};

// Each registered tensor as "<unit>.<tensor>" with its shape, checked
// against its unit's elements.
Status RegisteredTensors(ExportRun& run, const nlohmann::json& manifest,
                         std::vector<data::SafetensorsTensorSpec>& specs, std::vector<TensorPlace>& where) {
  for (size_t u = 0; u < run.units.size(); ++u) {
    for (const auto& p : manifest.at("units")[u].at("params")) {
      const nlohmann::json& dims = p.at("shape");
      const bool integers = dims.is_array() && p.at("offset").is_number_integer() &&
                            std::all_of(dims.begin(), dims.end(), [](const auto& d) { return d.is_number_integer(); });
      std::vector<int64_t> shape;
      const int64_t offset = integers ? p.at("offset").get<int64_t>() : -1;
      int64_t n = integers ? 1 : -1;
      for (size_t k = 0; integers && k < dims.size() && n >= 0; ++k) {
        const int64_t d = dims[k].get<int64_t>();
        if (d <= 0 || n > (int64_t{1} << 40) / d) n = -1;
        if (n >= 0) n *= d;
        shape.push_back(d);
      }
      if (n < 0 || offset < 0 || offset > run.units[u].elements - n) {
        return DataLoss("the checkpoint's manifest is damaged: tensor '" + p.at("name").get<std::string>() +
                        "' of unit '" + run.units[u].name + "' (offset " + std::to_string(offset) + ", shape " +
                        p.at("shape").dump() + ") does not fit the unit's " + std::to_string(run.units[u].elements) +
                        " elements");
      }
      specs.push_back({run.units[u].name + "." + p.at("name").get<std::string>(), SafetensorsDType(run.dtype), shape});
      where.push_back({static_cast<int>(u), offset, n});
    }
  }
  return Status::Ok();
}

// Any other engine client's tensors, with the shapes it registered.
// Returns the tensors written.
Result<uint64_t> ExportRegistered(const ExportOptions& opt, ExportRun& run, const nlohmann::json& manifest) {
  if (run.naming != data::WeightNaming::kZinf) {
    return BadInput(
        "--names hf needs a GPT checkpoint saved by `zinf train`; this one has the engine client's own "
        "tensors (use --names zinf)");
  }
  std::vector<data::SafetensorsTensorSpec> specs;
  std::vector<TensorPlace> where;
  ZINF_RETURN_IF_ERROR(RegisteredTensors(run, manifest, specs, where));
  auto begun = data::SafetensorsWriter::Begin(opt.out, specs);
  if (!begun.ok()) return RunFailed(begun.status(), "export");
  data::SafetensorsWriter& w = *begun;
  std::vector<std::byte> converted;
  tbb::task_arena arena;
  int loaded = -1;
  for (size_t t = 0; t < specs.size(); ++t) {
    if (where[t].unit != loaded) {
      if (auto r = run.ReadUnit(where[t].unit); !r.ok()) return RunFailed(r.status(), "checkpoint");
      loaded = where[t].unit;
    }
    const float* src = run.master.data() + where[t].offset;
    converted.resize(static_cast<size_t>(where[t].count) * DTypeSizeBytes(run.dtype));
    if (Status s = cpu::Cast(arena, src, DType::kFloat32, converted.data(), run.dtype, where[t].count); !s.ok()) {
      return RunFailed(s, "cast");
    }
    if (Status s = w.Write(specs[t].name, converted); !s.ok()) return RunFailed(s, "export");
  }
  if (Status s = w.Finish(); !s.ok()) return RunFailed(s, "export");
  return static_cast<uint64_t>(specs.size());
}

Status Run(const ExportOptions& opt) {
  ExportRun run;
  ZINF_RETURN_IF_ERROR(ParseFlags(opt, run));
  ZINF_RETURN_IF_ERROR(OpenCheckpoint(opt, run));
  const nlohmann::json& manifest = run.reader->manifest();
  const nlohmann::json client = manifest.value("client_state", nlohmann::json::object());
  const bool llama_family = client.is_object() && client.contains("hf_config");
  if (!opt.hf_dir.empty() && !llama_family) {
    return BadInput(
        "--hf-dir needs a Llama-family model saved by `zinf train`; this checkpoint has none (for GPT-2 "
        "give OUT.safetensors --names hf)");
  }
  if (!opt.out.empty() && llama_family) {
    return BadInput("this checkpoint holds a Llama-family model: write it with --hf-dir DIR");
  }
  if (llama_family) return ExportHfFolder(opt, run, client);
  const bool gpt = client.is_object() && client.contains("model");
  ZINF_ASSIGN_OR_RETURN(const uint64_t tensors,
                        gpt ? ExportGpt(opt, run, client.at("model")) : ExportRegistered(opt, run, manifest));
  std::printf("exported %llu tensors of %s (%s read, verified) to %s as %s in %.2f s\n",
              static_cast<unsigned long long>(tensors), run.reader->dir().c_str(),
              FormatBytes(run.reader->bytes_read()).c_str(), opt.out.c_str(), opt.dtype.c_str(), run.Seconds());
  return Status::Ok();
}

// nlohmann's accessors throw on a manifest of another shape than the one
// zinf writes: that is a failure naming what was malformed, told here, at
// the library's boundary.
Status RunCatchingMalformedManifest(const ExportOptions& opt) {
  try {
    return Run(opt);
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(std::string("the checkpoint's manifest is malformed: ") + e.what());
  }
}

}  // namespace

void RegisterExport(CLI::App& app, int* exit_code) {
  auto opt = std::make_shared<ExportOptions>();
  CLI::App* cmd = app.add_subcommand("export", "Write a checkpoint's weights as .safetensors, tensor by tensor");
  cmd->add_option("checkpoint", opt->checkpoint, "A step-N checkpoint directory, or the directory holding `latest`")
      ->required();
  cmd->add_option("out", opt->out, "The .safetensors file to write (atomically)");
  cmd->add_option("--hf-dir", opt->hf_dir,
                  "Write a Llama-family checkpoint as a Hugging Face folder (config.json, shards, tokenizer)");
  cmd->add_option("--dtype", opt->dtype, "bf16, fp16 or fp32")->capture_default_str();
  cmd->add_option("--names", opt->names, "zinf or hf (Hugging Face GPT-2 names; zinf train checkpoints)")
      ->capture_default_str();
  cmd->callback([opt, exit_code] { *exit_code = ReportToolStatus("export", RunCatchingMalformedManifest(*opt)); });
}

}  // namespace zinf::tools
