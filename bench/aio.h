// `zinf aio`: storage throughput through the exact engine zinf trains with,
// and a tuner that writes the best `aio` settings as a config file.
//
//   zinf aio read|write --path P [--path P2 ...] --size 4G --block-size 1M
//                       --queue-depth 32 --threads 2 [--buffered] [--fixed-buffers]
//                       [--sqpoll] [--loops 3] [--verify] [--json]
//   zinf aio sweep --path P [--size 1G] [--output F] [--svg F] [--json]
//
// The run functions are a library so tests can call them in-process; the
// CLI wiring is RegisterAio. Not thread-safe (one run at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nvme/file.h"
#include "zinf/status.h"

namespace CLI {
class App;
}

namespace zinf::bench {

struct AioOptions {
  nvme::IoKind kind = nvme::IoKind::kRead;
  std::vector<std::string> paths;  // files; the blocks are striped across them
  uint64_t size = 4ull << 30;      // total bytes, across all paths
  uint64_t block_size = 1 << 20;
  unsigned queue_depth = 32;  // per thread (ring), like fio's iodepth per job
  unsigned threads = 2;       // rings, like fio's numjobs, each on its own region
  bool buffered = false;
  bool fixed_buffers = false;
  bool sqpoll = false;
  bool single_submit = false;  // one io_uring_submit per block (no plugging, no merging)
  bool verify = false;
  int loops = 3;
};

struct AioLoop {
  double seconds = 0;
  double gb_per_s = 0;  // 10^9 bytes of payload per second
  double iops = 0;      // blocks per second
  double p50_us = 0;    // per-block latency, submit to completion
  double p99_us = 0;
  double cpu_seconds = 0;  // user + system of this process
};

struct AioResult {
  std::vector<AioLoop> loops;
  AioLoop median;  // field-wise medians
  std::string backend;
  bool laid_out = false;  // the file(s) had to be written first
};

// Checks arguments without touching the disk. kInvalidArgument says what is wrong.
Status ValidateAio(const AioOptions& options);
// Lays the files out if needed (a known pattern), then runs the loops.
// Progress (0..1) is reported through `progress` when given.
Result<AioResult> RunAio(const AioOptions& options, const std::function<void(double)>& progress = nullptr);

// Adds `aio` (read, write, sweep) to the CLI.
void RegisterAio(CLI::App& app, int* exit_code);

}  // namespace zinf::bench
