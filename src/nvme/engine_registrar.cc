// EngineRegistrar::Unregister: a failure cannot be acted on (the memory is
// freed next), so it is logged.
#include "nvme/engine_registrar.h"

#include "common/logging.h"

namespace zinf::nvme {

void EngineRegistrar::Unregister(void* ptr, size_t bytes) {
  Status st = engine_.UnregisterBuffer(ptr);
  if (!st.ok()) ZINF_LOG_WARN("io_uring: unregistering a {}-byte pinned buffer: {}", bytes, st.ToString());
}

}  // namespace zinf::nvme
