// `zinf train`: the CLI subcommand that fine-tunes the GPT reference model
// through the engine (tools/train.cc).
#pragma once

namespace CLI {
class App;
}

namespace zinf::tools {

// Adds `train` to `app`; when it runs it stores its exit code in *exit_code
// (0 done, 1 failed while running, 2 bad input).
void RegisterTrain(CLI::App& app, int* exit_code);

}  // namespace zinf::tools
