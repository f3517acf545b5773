// The benchmarks behind `zinf bench ...`. Each registers one CLI11
// subcommand under `bench`; each prints its configuration first, then one
// row per case, measures its own reference in the same run and prints the
// ratio, and offers --json. Not thread-safe (run from the CLI's thread).
#pragma once

namespace CLI {
class App;
}

namespace zinf::bench {

// Adds every benchmark as a subcommand of `bench`. Each subcommand, when it
// runs, stores its exit code in *exit_code.
void RegisterAll(CLI::App& bench, int* exit_code);

}  // namespace zinf::bench
