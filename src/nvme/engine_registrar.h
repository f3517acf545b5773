// Plugs the I/O engine into the pinned pool: every buffer the pool creates is
// registered as an io_uring fixed buffer (with every ring of the engine), so
// the bytes the CPU Adam updates are the bytes the engine reads and writes
// without per-I/O page pinning. Thread-safe (the engine's registration is).
#pragma once

#include "common/memory_registrar.h"
#include "nvme/io_engine.h"

namespace zinf::nvme {

class EngineRegistrar : public MemoryRegistrar {
 public:
  explicit EngineRegistrar(IoEngine& engine) : engine_(engine) {}  // the engine must outlive the pool
  std::string_view name() const override { return "io_uring fixed buffers"; }
  Status Register(void* ptr, size_t bytes) override { return engine_.RegisterBuffer(ptr, bytes); }
  void Unregister(void* ptr, size_t bytes) override;

 private:
  IoEngine& engine_;
};

}  // namespace zinf::nvme
