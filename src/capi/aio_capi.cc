// The C ABI of the asynchronous I/O handle (DeepSpeed's aio handle): an
// IoEngine, the files opened through it, and request handles. The handle
// also remembers every request submitted since the last zinf_aio_wait_all.
// Thread-safety: every function may be called from any thread (the list of
// pending requests is guarded by a mutex; IoEngine and IoRequest are
// thread-safe themselves).
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "capi/capi_internal.h"
#include "nvme/file.h"
#include "nvme/io_engine.h"
#include "zinf/config.h"
#include "zinf/zinf.h"

struct zinf_aio {
  std::unique_ptr<zinf::nvme::IoEngine> engine;
  std::string backend;  // backend_name(), kept for zinf_aio_backend's pointer
  std::mutex mu;
  std::vector<zinf::nvme::IoRequest> pending;  // since the last wait_all, in submission order
};

struct zinf_file {
  std::shared_ptr<zinf::nvme::File> file;
};

struct zinf_aio_request {
  zinf::nvme::IoRequest request;
};

namespace zinf::capi {
namespace {

Status WrapEngine(const nvme::IoEngineOptions& options, zinf_aio** out) {
  ZINF_ASSIGN_OR_RETURN(auto engine, nvme::IoEngine::Create(options));
  auto aio = std::make_unique<zinf_aio>();
  aio->backend = engine->backend_name();
  aio->engine = std::move(engine);
  *out = aio.release();
  return Status::Ok();
}

Status Submit(zinf_aio* aio, zinf_file* file, nvme::IoKind kind, void* buffer, uint64_t length, uint64_t offset,
              zinf_aio_request** out_request) {
  ZINF_RETURN_IF_ERROR(NotNull(aio, "aio"));
  ZINF_RETURN_IF_ERROR(NotNull(file, "file"));
  ZINF_RETURN_IF_ERROR(NotNull(buffer, "buffer"));
  // Allocated before submitting, so that a failure here leaves nothing in flight.
  std::unique_ptr<zinf_aio_request> handle;
  if (out_request) handle = std::make_unique<zinf_aio_request>();
  std::lock_guard<std::mutex> lock(aio->mu);
  aio->pending.reserve(aio->pending.size() + 1);
  nvme::IoOp op{kind, file->file, offset, buffer, length};
  nvme::IoRequest request = aio->engine->Submit({std::move(op)});
  // A request the engine refused (null buffer, O_DIRECT misalignment) is
  // complete already with kInvalidArgument: report it here, not later.
  if (request.Done()) {
    Status s = request.Wait();
    if (s.code() == StatusCode::kInvalidArgument) return s;
  }
  aio->pending.push_back(request);
  if (out_request) {
    handle->request = std::move(request);
    *out_request = handle.release();
  }
  return Status::Ok();
}

}  // namespace
}  // namespace zinf::capi

using zinf::Status;
using zinf::capi::Guard;
using zinf::capi::GuardVoid;
using zinf::capi::NotNull;

extern "C" {

ZINF_API int zinf_aio_create(uint64_t block_size, unsigned queue_depth, unsigned num_threads, unsigned flags,
                             zinf_aio** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    constexpr unsigned kKnown = ZINF_AIO_SINGLE_SUBMIT | ZINF_AIO_POSIX | ZINF_AIO_NO_FIXED_BUFFERS;
    if (flags & ~kKnown) {
      return zinf::InvalidArgument("unknown flags 0x" + std::to_string(flags & ~kKnown) +
                                   " (known: ZINF_AIO_SINGLE_SUBMIT, ZINF_AIO_POSIX, ZINF_AIO_NO_FIXED_BUFFERS)");
    }
    zinf::nvme::IoEngineOptions options;
    if (block_size) options.block_size = block_size;
    if (queue_depth) options.queue_depth = queue_depth;
    if (num_threads) options.rings = num_threads;
    options.single_submit = flags & ZINF_AIO_SINGLE_SUBMIT;
    if (flags & ZINF_AIO_POSIX) options.backend = zinf::nvme::IoBackend::kPosix;
    if (flags & ZINF_AIO_NO_FIXED_BUFFERS) options.fixed_buffers = false;
    return zinf::capi::WrapEngine(options, out);
  });
}

ZINF_API int zinf_aio_create_from_config(const char* config_json, zinf_aio** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(config_json, "config_json"));
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    ZINF_ASSIGN_OR_RETURN(zinf::Config config, zinf::ParseConfig(config_json, "<config_json>"));
    return zinf::capi::WrapEngine(zinf::nvme::IoEngineOptionsFromConfig(config), out);
  });
}

ZINF_API void zinf_aio_destroy(zinf_aio* aio) {
  GuardVoid([&] { delete aio; });  // ~IoEngine waits for the requests in flight
}

ZINF_API const char* zinf_aio_backend(const zinf_aio* aio) { return aio ? aio->backend.c_str() : ""; }

ZINF_API int zinf_aio_open(zinf_aio* aio, const char* path, unsigned flags, zinf_file** out) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(aio, "aio"));
    ZINF_RETURN_IF_ERROR(NotNull(path, "path"));
    ZINF_RETURN_IF_ERROR(NotNull(out, "out"));
    constexpr unsigned kKnown = ZINF_FILE_WRITE | ZINF_FILE_CREATE | ZINF_FILE_TRUNCATE | ZINF_FILE_DIRECT;
    if (flags & ~kKnown) return zinf::InvalidArgument("unknown file flags " + std::to_string(flags & ~kKnown));
    if ((flags & (ZINF_FILE_CREATE | ZINF_FILE_TRUNCATE)) && !(flags & ZINF_FILE_WRITE)) {
      return zinf::InvalidArgument(std::string(path) +
                                   ": ZINF_FILE_CREATE and ZINF_FILE_TRUNCATE need ZINF_FILE_WRITE");
    }
    zinf::nvme::FileOptions options;
    options.direct = flags & ZINF_FILE_DIRECT;
    options.writable = flags & ZINF_FILE_WRITE;
    options.create = flags & ZINF_FILE_CREATE;
    options.truncate = flags & ZINF_FILE_TRUNCATE;
    auto handle = std::make_unique<zinf_file>();
    ZINF_ASSIGN_OR_RETURN(handle->file, aio->engine->Open(path, options));
    *out = handle.release();
    return Status::Ok();
  });
}

ZINF_API int zinf_file_size(const zinf_file* file, uint64_t* out_bytes) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(file, "file"));
    ZINF_RETURN_IF_ERROR(NotNull(out_bytes, "out_bytes"));
    ZINF_ASSIGN_OR_RETURN(uint64_t bytes, file->file->Size());
    *out_bytes = bytes;
    return Status::Ok();
  });
}

ZINF_API void zinf_file_close(zinf_file* file) {
  GuardVoid([&] { delete file; });  // requests in flight hold their own reference
}

ZINF_API int zinf_aio_pread(zinf_aio* aio, zinf_file* file, void* buffer, uint64_t length, uint64_t offset,
                            zinf_aio_request** out_request) {
  return Guard(__func__, [&]() -> Status {
    return zinf::capi::Submit(aio, file, zinf::nvme::IoKind::kRead, buffer, length, offset, out_request);
  });
}

ZINF_API int zinf_aio_pwrite(zinf_aio* aio, zinf_file* file, const void* buffer, uint64_t length, uint64_t offset,
                             zinf_aio_request** out_request) {
  return Guard(__func__, [&]() -> Status {
    // The engine's ops carry a mutable pointer for both directions; a write never writes to it.
    return zinf::capi::Submit(aio, file, zinf::nvme::IoKind::kWrite, const_cast<void*>(buffer), length, offset,
                              out_request);
  });
}

ZINF_API int zinf_aio_request_wait(zinf_aio_request* request, uint64_t* out_bytes) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(request, "request"));
    Status s = request->request.Wait();
    if (out_bytes) *out_bytes = request->request.bytes_transferred();
    return s;
  });
}

ZINF_API int zinf_aio_request_done(const zinf_aio_request* request, int* out_done) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(request, "request"));
    ZINF_RETURN_IF_ERROR(NotNull(out_done, "out_done"));
    *out_done = request->request.Done() ? 1 : 0;
    return Status::Ok();
  });
}

ZINF_API void zinf_aio_request_free(zinf_aio_request* request) {
  GuardVoid([&] { delete request; });
}

ZINF_API int zinf_aio_wait_all(zinf_aio* aio, uint64_t* out_num_requests) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(aio, "aio"));
    std::vector<zinf::nvme::IoRequest> requests;
    {
      std::lock_guard<std::mutex> lock(aio->mu);
      requests.swap(aio->pending);
    }
    Status first;
    for (const zinf::nvme::IoRequest& r : requests) {
      Status s = r.Wait();
      if (first.ok() && !s.ok()) first = std::move(s);
    }
    if (out_num_requests) *out_num_requests = requests.size();
    return first;
  });
}

ZINF_API int zinf_aio_register_buffer(zinf_aio* aio, void* addr, uint64_t bytes) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(aio, "aio"));
    ZINF_RETURN_IF_ERROR(NotNull(addr, "addr"));
    return aio->engine->RegisterBuffer(addr, bytes);
  });
}

ZINF_API int zinf_aio_unregister_buffer(zinf_aio* aio, void* addr) {
  return Guard(__func__, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(NotNull(aio, "aio"));
    ZINF_RETURN_IF_ERROR(NotNull(addr, "addr"));
    return aio->engine->UnregisterBuffer(addr);
  });
}

}  // extern "C"
