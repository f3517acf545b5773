// IoEngineOptionsFromConfig: see io_engine.h.
#include "nvme/io_engine.h"
#include "zinf/config.h"

namespace zinf::nvme {

IoEngineOptions IoEngineOptionsFromConfig(const Config& config) {
  IoEngineOptions o;
  o.block_size = static_cast<uint64_t>(config.aio.block_size);
  o.queue_depth = static_cast<unsigned>(config.aio.queue_depth);
  o.rings = static_cast<unsigned>(config.zinf.aio.rings > 0 ? config.zinf.aio.rings : config.aio.intra_op_parallelism);
  o.single_submit = config.aio.single_submit;
  o.backend = config.aio.io_backend == AioBackend::kPosix ? IoBackend::kPosix : IoBackend::kAuto;
  o.fixed_buffers = config.zinf.aio.fixed_buffers;
  o.sqpoll = config.zinf.aio.sqpoll;
  return o;
}

}  // namespace zinf::nvme
