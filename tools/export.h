// `zinf export CKPT_DIR OUT.safetensors`: the fp32 master weights of a
// checkpoint as a .safetensors file, tensor by tensor.
#pragma once

namespace CLI {
class App;
}

namespace zinf::tools {

// Adds `export` to `app`; when it runs it stores its exit code in *exit_code
// (0 done, 1 failed, 2 bad input).
void RegisterExport(CLI::App& app, int* exit_code);

}  // namespace zinf::tools
