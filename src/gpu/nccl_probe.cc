// NCCL probe: the library version (needs no GPU).
#include <nccl.h>

#include <string>

#include "gpu/cuda_probe.h"

namespace zinf::gpu {

BackendInfo ProbeNccl() {
  int version = 0;
  ncclResult_t rc = ncclGetVersion(&version);
  if (rc != ncclSuccess) return {"nccl", true, false, std::string("ncclGetVersion: ") + ncclGetErrorString(rc)};
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  std::string v = std::to_string(version / 10000) + "." + std::to_string((version / 100) % 100) + "." +
                  std::to_string(version % 100);
  return {"nccl", true, CudaDeviceCount() > 0, v + (CudaDeviceCount() > 0 ? "" : " (no GPU: not used)")};
}

}  // namespace zinf::gpu
