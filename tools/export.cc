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
#include <span>
#include <string>
#include <vector>

#include "common/units.h"
#include "cpu/cast.h"
#include "data/gpt_weights.h"
#include "data/hf_checkpoint.h"
#include "data/safetensors.h"
#include "model/gpt_config.h"
#include "nvme/io_engine.h"
#include "sched/checkpoint_io.h"

namespace zinf::tools {
namespace {

struct ExportOptions {
  std::string checkpoint, out, dtype = "bf16", names = "zinf";
  std::string hf_dir;
};

struct Usage {
  std::string message;
};
struct Failure {
  std::string message;
};

template <class T>
T Must(Result<T> r, const char* what) {
  if (!r.ok()) throw Failure{std::string(what) + ": " + r.status().ToString()};
  return std::move(*r);
}
void Must(const Status& s, const char* what) {
  if (!s.ok()) throw Failure{std::string(what) + ": " + s.ToString()};
}

const char* SafetensorsDType(DType d) {
  return d == DType::kFloat32 ? "F32" : d == DType::kBFloat16 ? "BF16" : "F16";
}

int Run(const ExportOptions& opt) {
  DType dtype;
  if (opt.dtype == "fp32") {
    dtype = DType::kFloat32;
  } else if (opt.dtype == "bf16") {
    dtype = DType::kBFloat16;
  } else if (opt.dtype == "fp16") {
    dtype = DType::kFloat16;
  } else {
    throw Usage{"--dtype: expected bf16, fp16 or fp32, got '" + opt.dtype + "'"};
  }
  auto naming = data::ParseWeightNaming(opt.names);
  if (!naming.ok()) throw Usage{"--names: expected zinf or hf, got '" + opt.names + "'"};
  if (opt.out.empty() == opt.hf_dir.empty()) throw Usage{"give OUT.safetensors or --hf-dir DIR (one of them)"};
  if (!opt.out.empty() && std::filesystem::is_directory(opt.out)) {
    throw Usage{opt.out + " is a directory; give the output file's path (or --hf-dir for a Hugging Face folder)"};
  }
  auto io = Must(nvme::IoEngine::Create(nvme::IoEngineOptions{}), "I/O engine");
  auto opened = ckpt::CheckpointReader::Open(*io, opt.checkpoint);
  if (!opened.ok() && opened.status().code() == StatusCode::kNotFound) throw Usage{opened.status().message()};
  std::unique_ptr<ckpt::CheckpointReader> reader = Must(std::move(opened), "checkpoint");
  const nlohmann::json& manifest = reader->manifest();
  const auto t0 = std::chrono::steady_clock::now();
  struct UnitInfo {
    std::string name;
    int64_t elements;
  };
  std::vector<UnitInfo> units;
  for (const auto& u : reader->units()) units.push_back({u.name, u.elements});
  std::vector<float> master;
  auto read_unit = [&](int u) -> Result<std::span<const float>> {
    master.assign(units[u].elements, 0.0f);
    ZINF_RETURN_IF_ERROR(reader->ReadRange(units[u].name, 0, units[u].elements, 0, units[u].elements, master.data()));
    return std::span<const float>(master);
  };
  const nlohmann::json client = manifest.value("client_state", nlohmann::json::object());
  uint64_t tensors = 0;
  const bool llama_family = client.is_object() && client.contains("hf_config");
  if (!opt.hf_dir.empty() && !llama_family) {
    throw Usage{"--hf-dir needs a Llama-family model saved by `zinf train`; this checkpoint has none (for GPT-2 "
                "give OUT.safetensors --names hf)"};
  }
  if (!opt.out.empty() && llama_family) {
    throw Usage{"this checkpoint holds a Llama-family model: write it with --hf-dir DIR"};
  }
  if (llama_family) {
    const std::string where = opt.checkpoint + ": client state hf_config";
    auto hf = data::ParseHfConfig(client.at("hf_config").get<std::string>(), where);
    if (!hf.ok()) throw Failure{hf.status().message()};
    if (static_cast<int>(units.size()) != model::NumUnits(hf->config)) {
      throw Failure{"the checkpoint has " + std::to_string(units.size()) + " units; its model " +
                    hf->config.ToString() + " has " + std::to_string(model::NumUnits(hf->config))};
    }
    data::HfExportOptions eo;
    eo.dtype = dtype;
    eo.config_json = hf->config_json;
    const std::string tok = client.value("tokenizer_dir", std::string());
    if (!tok.empty() && std::filesystem::exists(tok + "/tokenizer.json")) eo.tokenizer_dir = tok;
    Must(data::ExportHfCheckpoint(read_unit, hf->config, opt.hf_dir, eo), "export");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("exported %s (%s read, verified) to the Hugging Face folder %s as %s%s in %.2f s\n",
                reader->dir().c_str(), FormatBytes(reader->bytes_read()).c_str(), opt.hf_dir.c_str(),
                opt.dtype.c_str(), eo.tokenizer_dir.empty() ? " (no tokenizer files)" : ", tokenizer files copied",
                secs);
    return 0;
  }
  if (client.is_object() && client.contains("model")) {
    // A GPT trained by `zinf train`: GPT-2 names.
    const auto& m = client.at("model");
    model::GptConfig mc;
    mc.name = m.value("name", std::string("gpt"));
    auto dimension = [&](const char* key) {
      const nlohmann::json& v = m.at(key);
      if (!v.is_number_integer()) {
        throw Failure{"the checkpoint's manifest is damaged: model." + std::string(key) + " is " + v.dump()};
      }
      return v.get<int64_t>();
    };
    mc.vocab_size = dimension("vocab_size");
    mc.max_seq_len = dimension("max_seq_len");
    mc.embed_dim = dimension("embed_dim");
    mc.num_layers = dimension("num_layers");
    mc.num_heads = dimension("num_heads");
    Must(mc.Validate(), "the checkpoint's model");
    if (static_cast<int>(units.size()) != model::NumUnits(mc)) {
      throw Failure{"the checkpoint has " + std::to_string(units.size()) + " units; its model " + mc.ToString() +
                    " has " + std::to_string(model::NumUnits(mc))};
    }
    Must(data::ExportGptWeights(read_unit, mc, *naming, dtype, opt.out), "export");
    tensors = data::GptWeightNames(mc, *naming).size();
  } else {
    if (*naming != data::WeightNaming::kZinf) {
      throw Usage{"--names hf needs a GPT checkpoint saved by `zinf train`; this one has the engine client's own "
                  "tensors (use --names zinf)"};
    }
    // "<unit>.<tensor>" with the registered shapes.
    std::vector<data::SafetensorsTensorSpec> specs;
    struct Where {
      int unit;
      int64_t offset, count;
    };
    std::vector<Where> where;
    for (size_t u = 0; u < units.size(); ++u) {
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
        if (n < 0 || offset < 0 || offset > units[u].elements - n) {
          throw Failure{"the checkpoint's manifest is damaged: tensor '" + p.at("name").get<std::string>() +
                        "' of unit '" + units[u].name + "' (offset " + std::to_string(offset) + ", shape " +
                        p.at("shape").dump() + ") does not fit the unit's " + std::to_string(units[u].elements) +
                        " elements"};
        }
        specs.push_back({units[u].name + "." + p.at("name").get<std::string>(), SafetensorsDType(dtype), shape});
        where.push_back({static_cast<int>(u), offset, n});
      }
    }
    data::SafetensorsWriter w = Must(data::SafetensorsWriter::Begin(opt.out, specs), "export");
    std::vector<std::byte> converted;
    tbb::task_arena arena;
    int loaded = -1;
    for (size_t t = 0; t < specs.size(); ++t) {
      if (where[t].unit != loaded) {
        (void)Must(read_unit(where[t].unit), "checkpoint");
        loaded = where[t].unit;
      }
      const float* src = master.data() + where[t].offset;
      converted.resize(static_cast<size_t>(where[t].count) * DTypeSizeBytes(dtype));
      Must(Cast(arena, src, DType::kFloat32, converted.data(), dtype, where[t].count), "cast");
      Must(w.Write(specs[t].name, converted), "export");
    }
    Must(w.Finish(), "export");
    tensors = specs.size();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("exported %llu tensors of %s (%s read, verified) to %s as %s in %.2f s\n",
              static_cast<unsigned long long>(tensors), reader->dir().c_str(), FormatBytes(reader->bytes_read()).c_str(),
              opt.out.c_str(), opt.dtype.c_str(), secs);
  return 0;
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
  cmd->callback([opt, exit_code] {
    try {
      *exit_code = Run(*opt);
    } catch (const Usage& u) {
      std::fprintf(stderr, "zinf export: %s\n", u.message.c_str());
      *exit_code = 2;
    } catch (const Failure& f) {
      std::fprintf(stderr, "zinf export: %s\n", f.message.c_str());
      *exit_code = 1;
    } catch (const nlohmann::json::exception& e) {
      std::fprintf(stderr, "zinf export: the checkpoint's manifest is malformed: %s\n", e.what());
      *exit_code = 1;
    }
  });
}

}  // namespace zinf::tools
