// io_uring availability probe.
#include "nvme/uring_probe.h"

#include <liburing.h>

#include <cstring>
#include <string>

#include "common/build_config.h"

namespace zinf::nvme {

BackendInfo ProbeIoUring() {
  BackendInfo info{"io_uring", true, false, ""};
  io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  std::string lib = std::string("liburing ") + ZINF_LIBURING_VERSION;
  if (rc < 0) {
    info.detail = lib + "; io_uring_queue_init failed: " + std::strerror(-rc) + " (errno " + std::to_string(-rc) +
                  "); I/O falls back to a pread/pwrite thread pool";
    return info;
  }
  std::string features;
  auto add = [&](unsigned flag, const char* name) {
    if (ring.features & flag) features += std::string(features.empty() ? "" : ",") + name;
  };
  add(IORING_FEAT_NODROP, "nodrop");
  add(IORING_FEAT_FAST_POLL, "fast_poll");
  add(IORING_FEAT_EXT_ARG, "ext_arg");
  add(IORING_FEAT_NATIVE_WORKERS, "native_workers");
  io_uring_queue_exit(&ring);
  info.usable = true;
  info.detail = lib + ", kernel ring ok (features " + (features.empty() ? "none" : features) + ")";
  return info;
}

}  // namespace zinf::nvme
