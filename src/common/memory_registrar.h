// MemoryRegistrar: the seam through which one pinned host allocation serves
// every consumer that must know about it — CUDA (cudaHostRegister, so copies
// to and from the device are DMA) and the io_uring engine (fixed buffers, so
// reads and writes skip the per-I/O page pinning). The PinnedPool calls
// Register once when it creates a buffer and Unregister once before it frees
// it; reusing a buffer from the pool registers nothing again. One allocation,
// three uses (host compute, device copies, disk I/O).
//
// Thread-safety: an implementation must accept calls from any thread, and
// concurrent calls for different buffers. The pool may call Unregister while
// holding its own lock, so an implementation must not call back into the pool.
#pragma once

#include <cstddef>
#include <string_view>

#include "zinf/status.h"

namespace zinf {

class MemoryRegistrar {
 public:
  virtual ~MemoryRegistrar() = default;

  // For error messages: "cudaHostRegister", "io_uring fixed buffers".
  virtual std::string_view name() const = 0;

  // Makes [ptr, ptr + bytes) known to the consumer. ptr and bytes are
  // page-aligned, bytes <= 1 GiB; the memory is already locked.
  virtual Status Register(void* ptr, size_t bytes) = 0;

  // Undoes a successful Register with the same arguments. Cannot fail in a
  // way the caller could act on (the memory is freed next): log instead.
  virtual void Unregister(void* ptr, size_t bytes) = 0;
};

}  // namespace zinf
