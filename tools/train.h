// `zinf train`: the CLI subcommand that fine-tunes the GPT reference model
// through the engine (tools/train.cc).
#pragma once

#include <cstdint>

#include "model/gpt_config.h"

namespace CLI {
class App;
}

namespace zinf::tools {

// Adds `train` to `app`; when it runs it stores its exit code in *exit_code
// (0 done, 1 failed while running, 2 bad input).
void RegisterTrain(CLI::App& app, int* exit_code);

// The model `zinf train` builds without --model: a 2-layer, 64-wide GPT with
// a 64-token context over `vocab_size` tokens (the byte tokenizer's 256 by
// default). `zinf plan` plans the same shape.
model::GptConfig DefaultTrainModel(int64_t vocab_size = 256);

}  // namespace zinf::tools
