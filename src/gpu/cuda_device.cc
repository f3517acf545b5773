// CudaDevice. Host tasks run through cudaLaunchHostFunc; since CUDA cannot
// take an error back from one, a failing task sets the stream's sticky status,
// which Synchronize returns (and later tasks on the stream are skipped).
#include "gpu/cuda_device.h"

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <string>

#include "common/device_allocator.h"
#include "common/units.h"
#include "gpu/cuda_check.h"

namespace zinf::gpu {
namespace {

std::atomic<uint64_t> next_stream_id{1u << 30};

class CudaContext : public StreamContext {
 public:
  void* Host(const void*) const override { return nullptr; }  // device memory is not host-addressable
};

class CudaStream : public Stream {
 public:
  CudaStream(int ordinal, cudaStream_t s) : ordinal_(ordinal), stream_(s), id_(next_stream_id.fetch_add(1)) {}
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  Status Enqueue(StreamTask task) override {
    auto* call = new Call{this, std::move(task)};
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaError_t err = cudaLaunchHostFunc(stream_, &CudaStream::Run, call);
    if (err != cudaSuccess) {
      delete call;
      return CudaError(err, "cudaLaunchHostFunc", __FILE__, __LINE__);
    }
    return Status::Ok();
  }
  Status Wait(Event& event) override;
  Status Synchronize() override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    std::lock_guard<std::mutex> lock(mu_);
    return sticky_;
  }
  void* native_handle() const override { return stream_; }
  uint64_t id() const override { return id_; }
  cudaStream_t get() const { return stream_; }
  int ordinal() const { return ordinal_; }

 private:
  struct Call {
    CudaStream* stream;
    StreamTask task;
  };
  static void CUDART_CB Run(void* data) {
    std::unique_ptr<Call> call(static_cast<Call*>(data));
    {
      std::lock_guard<std::mutex> lock(call->stream->mu_);
      if (!call->stream->sticky_.ok()) return;
    }
    static const CudaContext ctx;
    Status st = call->task(ctx);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(call->stream->mu_);
      if (call->stream->sticky_.ok()) call->stream->sticky_ = std::move(st);
    }
  }

  int ordinal_;
  cudaStream_t stream_;
  uint64_t id_;
  std::mutex mu_;
  Status sticky_;
};

class CudaEvent : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t e) : ordinal_(ordinal), event_(e) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  Status Record(Stream& stream) override {
    auto* cs = dynamic_cast<CudaStream*>(&stream);
    if (!cs) return InvalidArgument("Event::Record: the stream belongs to another kind of device");
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(event_, cs->get()));
    return Status::Ok();
  }
  Result<bool> Query() override {
    cudaError_t err = cudaEventQuery(event_);
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaError(err, "cudaEventQuery", __FILE__, __LINE__);
  }
  Status Synchronize() override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return Status::Ok();
  }
  cudaEvent_t get() const { return event_; }

 private:
  int ordinal_;
  cudaEvent_t event_;
};

Status CudaStream::Wait(Event& event) {
  auto* ce = dynamic_cast<CudaEvent*>(&event);
  if (!ce) return InvalidArgument("Stream::Wait: the event belongs to another kind of device");
  ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  ZINF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, ce->get(), 0));
  return Status::Ok();
}

class CudaDevice : public Device {
 public:
  CudaDevice(int ordinal, std::string name, char* base, uint64_t budget)
      : ordinal_(ordinal), name_(std::move(name)), base_(base), budget_(budget), allocator_(*this, budget) {}
  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    cudaFree(base_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  int ordinal() const { return ordinal_; }
  std::string name() const override { return name_; }

  Result<void*> Allocate(uint64_t bytes, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(uint64_t offset, allocator_.Allocate(bytes, stream));
    return static_cast<void*>(base_ + offset);
  }
  Status Free(void* device_ptr, Stream& stream) override {
    auto* p = static_cast<char*>(device_ptr);
    if (p < base_ || p >= base_ + budget_) return InvalidArgument("Free: pointer is not this device's memory");
    return allocator_.Free(static_cast<uint64_t>(p - base_), stream);
  }
  DeviceMemoryStats memory_stats() const override { return allocator_.stats(); }

  Result<std::unique_ptr<Stream>> CreateStream() override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaStream_t s;
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::unique_ptr<Stream>(new CudaStream(ordinal_, s));
  }
  Result<std::unique_ptr<Event>> CreateEvent() override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaEvent_t e;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, e));
  }

  Status CopyToDevice(void* dst, const void* src, uint64_t bytes, Stream& stream) override {
    return Copy(dst, src, bytes, cudaMemcpyHostToDevice, stream);
  }
  Status CopyToHost(void* dst, const void* src, uint64_t bytes, Stream& stream) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
  }
  Status CopyOnDevice(void* dst, const void* src, uint64_t bytes, Stream& stream) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
  }
  Status Memset(void* dst, int byte, uint64_t bytes, Stream& stream) override {
    ZINF_ASSIGN_OR_RETURN(cudaStream_t s, Native(stream));
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, byte, bytes, s));
    return Status::Ok();
  }

 private:
  Result<cudaStream_t> Native(Stream& stream) {
    auto* cs = dynamic_cast<CudaStream*>(&stream);
    if (!cs || cs->ordinal() != ordinal_) return InvalidArgument("the stream belongs to another device");
    return cs->get();
  }
  Status Copy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind, Stream& stream) {
    ZINF_ASSIGN_OR_RETURN(cudaStream_t s, Native(stream));
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, s));
    return Status::Ok();
  }

  int ordinal_;
  std::string name_;
  char* base_;
  uint64_t budget_;
  DeviceAllocator allocator_;
};

}  // namespace

int CudaOrdinal(const Device& device) {
  const auto* cuda = dynamic_cast<const CudaDevice*>(&device);
  return cuda ? cuda->ordinal() : -1;
}

Result<std::unique_ptr<Device>> CreateCudaDevice(int ordinal, const DeviceOptions& options) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Unavailable("no CUDA device (" + std::string(err == cudaSuccess ? "0 devices" : cudaGetErrorName(err)) + ")");
  }
  if (ordinal < 0 || ordinal >= count)
    return InvalidArgument("cuda:" + std::to_string(ordinal) + " does not exist; " + std::to_string(count) +
                           " device(s) present");
  ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  ZINF_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  size_t free_bytes = 0, total_bytes = 0;
  ZINF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  uint64_t budget = options.memory_budget ? options.memory_budget : free_bytes / 10 * 9;
  if (budget > free_bytes)
    return OutOfMemory("cuda:" + std::to_string(ordinal) + ": a budget of " + FormatBytes(budget) + " exceeds the " +
                       FormatBytes(free_bytes) + " free");
  void* base = nullptr;
  ZINF_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, budget));
  std::string name = "cuda:" + std::to_string(ordinal) + " (" + prop.name + ", " + FormatBytes(budget) + " budget)";
  return std::unique_ptr<Device>(new CudaDevice(ordinal, name, static_cast<char*>(base), budget));
}

}  // namespace zinf::gpu
