// The list of benchmarks `zinf bench` knows.
#include "bench/bench.h"

#include <CLI/CLI.hpp>

namespace zinf::bench {

void RegisterMembw(CLI::App& bench, int* exit_code);
void RegisterCpuKernels(CLI::App& bench, int* exit_code);  // adam, cast, norm
void RegisterIo(CLI::App& bench, int* exit_code);
void RegisterComm(CLI::App& bench, int* exit_code);
void RegisterCopy(CLI::App& bench, int* exit_code);
void RegisterModel(CLI::App& bench, int* exit_code);
void RegisterOffload(CLI::App& bench, int* exit_code);
void RegisterCheckpoint(CLI::App& bench, int* exit_code);
void RegisterStage3(CLI::App& bench, int* exit_code);
void RegisterTokenizer(CLI::App& bench, int* exit_code);
void RegisterAttention(CLI::App& bench, int* exit_code);

void RegisterAll(CLI::App& bench, int* exit_code) {
  RegisterMembw(bench, exit_code);
  RegisterCpuKernels(bench, exit_code);
  RegisterIo(bench, exit_code);
  RegisterComm(bench, exit_code);
  RegisterCopy(bench, exit_code);
  RegisterModel(bench, exit_code);
  RegisterAttention(bench, exit_code);
  RegisterOffload(bench, exit_code);
  RegisterCheckpoint(bench, exit_code);
  RegisterStage3(bench, exit_code);
  RegisterTokenizer(bench, exit_code);
  bench.require_subcommand(1);
}

}  // namespace zinf::bench
