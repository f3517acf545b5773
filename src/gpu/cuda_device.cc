// CudaDevice. A stream task never runs in a CUDA host function: CUDA may
// serialize host functions across streams, and each one leaves a gap on the
// GPU. Each stream has its own worker thread instead. Enqueue records an
// event where the task belongs, hands the task to the worker, and makes the
// stream wait (cuStreamWaitValue32) until the worker has written the task's
// sequence number into a mapped host word. The worker waits for the event,
// runs the task and writes the number. A failing task sets the stream's
// sticky status, which Synchronize returns (later tasks are skipped, their
// numbers still written so the stream never waits forever). A driver
// without stream memory operations falls back to cudaLaunchHostFunc.
#include "gpu/cuda_device.h"

#include <cuda.h>  // driver types only: the one driver call is found at run time
#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/device_allocator.h"
#include "common/units.h"
#include "gpu/cuda_check.h"

namespace zinf::gpu {
namespace {

std::atomic<uint64_t> next_stream_id{1u << 30};

// Set on stream workers: their waits are the device's, not the host's.
thread_local bool t_device_thread = false;

struct WaitCounters {
  std::atomic<uint64_t> blocking{0}, draining{0};
};

using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// cuStreamWaitValue32 from the driver (nullptr when it has none).
WaitValue32Fn FindWaitValue32() {
  static const WaitValue32Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return WaitValue32Fn{nullptr};
    }
    return reinterpret_cast<WaitValue32Fn>(p);
  }();
  return fn;
}

class CudaContext : public StreamContext {
 public:
  void* Host(const void*) const override { return nullptr; }  // device memory is not host-addressable
};

class CudaStream : public Stream {
 public:
  // `owned`: destroyed with this object (else adopted from a framework).
  CudaStream(int ordinal, cudaStream_t s, WaitCounters* waits, bool owned = true)
      : ordinal_(ordinal), stream_(s), owned_(owned), id_(next_stream_id.fetch_add(1)), waits_(waits) {}
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      worker_.join();
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (flag_) cudaFreeHost(flag_);
    if (owned_) cudaStreamDestroy(stream_);
  }

  // Starts the worker; without stream memory operations tasks go through
  // cudaLaunchHostFunc.
  Status Init() {
    wait_value_ = FindWaitValue32();
    if (!wait_value_) return Status::Ok();
    ZINF_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(uint32_t), cudaHostAllocMapped));
    *flag_ = 0;
    void* dev = nullptr;
    ZINF_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&dev, flag_, 0));
    flag_dev_ = reinterpret_cast<CUdeviceptr>(dev);
    worker_ = std::thread([this] { Work(); });
    return Status::Ok();
  }

  Status Enqueue(StreamTask task) override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    if (!wait_value_) return EnqueueHostFunc(std::move(task));
    // Event, hand-over and wait in one order per stream, whatever the thread.
    std::lock_guard<std::mutex> order(order_mu_);
    ZINF_ASSIGN_OR_RETURN(cudaEvent_t gate, TakeEvent());
    if (cudaError_t err = cudaEventRecord(gate, stream_); err != cudaSuccess) {
      GiveEvent(gate);
      return CudaError(err, "cudaEventRecord", __FILE__, __LINE__);
    }
    const uint32_t seq = ++enqueued_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(Pending{gate, std::move(task), seq});
    }
    cv_.notify_all();
    CUresult r = wait_value_(reinterpret_cast<CUstream>(stream_), flag_dev_, seq, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
      // Later work would not wait for the task: the stream's order is lost.
      Status st =
          Internal("cuStreamWaitValue32 on a stream of cuda:" + std::to_string(ordinal_) + " failed (CUresult " +
                   std::to_string(static_cast<int>(r)) + "): the stream's later work would not wait for its task");
      SetSticky(st);
      return st;
    }
    return Status::Ok();
  }
  Status Wait(Event& event) override;
  Status Synchronize() override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    if (!t_device_thread && cudaStreamQuery(stream_) == cudaErrorNotReady) {
      waits_->blocking.fetch_add(1);
      waits_->draining.fetch_add(1);
    }
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the tasks too: the stream waited for each
    std::lock_guard<std::mutex> lock(mu_);
    return sticky_;
  }
  Status sticky_error() override {
    // Kernel failures are sticky in the context: seen here without waiting.
    if (cudaError_t err = cudaStreamQuery(stream_); err != cudaSuccess && err != cudaErrorNotReady) {
      return CudaError(err, "cudaStreamQuery", __FILE__, __LINE__);
    }
    return Sticky();
  }
  void* native_handle() const override { return stream_; }
  uint64_t id() const override { return id_; }
  cudaStream_t get() const { return stream_; }
  int ordinal() const { return ordinal_; }

 private:
  struct Pending {
    cudaEvent_t gate;
    StreamTask task;
    uint32_t seq;
  };
  struct Call {
    CudaStream* stream;
    StreamTask task;
  };

  void Work() {
    t_device_thread = true;
    cudaSetDevice(ordinal_);
    static const CudaContext ctx;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Pending p = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      Status st;
      if (cudaError_t err = cudaEventSynchronize(p.gate); err != cudaSuccess) {
        st = CudaError(err, "cudaEventSynchronize (a stream task's gate)", __FILE__, __LINE__);
      } else if (Sticky().ok()) {
        st = p.task(ctx);
      }
      p.task = nullptr;  // what the task holds goes before the stream moves on
      if (!st.ok()) SetSticky(std::move(st));
      std::atomic_ref<uint32_t>(*flag_).store(p.seq, std::memory_order_release);
      GiveEvent(p.gate);
      lock.lock();
    }
  }

  Result<cudaEvent_t> TakeEvent() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e;
    // Blocking sync: the worker sleeps while it waits rather than spinning.
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
    return e;
  }
  void GiveEvent(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_events_.push_back(e);
  }
  Status Sticky() {
    std::lock_guard<std::mutex> lock(mu_);
    return sticky_;
  }
  void SetSticky(Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    if (sticky_.ok()) sticky_ = std::move(st);
  }

  Status EnqueueHostFunc(StreamTask task) {
    auto* call = new Call{this, std::move(task)};
    cudaError_t err = cudaLaunchHostFunc(stream_, &CudaStream::RunHostFunc, call);
    if (err != cudaSuccess) {
      delete call;
      return CudaError(err, "cudaLaunchHostFunc", __FILE__, __LINE__);
    }
    return Status::Ok();
  }
  static void CUDART_CB RunHostFunc(void* data) {
    std::unique_ptr<Call> call(static_cast<Call*>(data));
    if (!call->stream->Sticky().ok()) return;
    static const CudaContext ctx;
    Status st = call->task(ctx);
    if (!st.ok()) call->stream->SetSticky(std::move(st));
  }

  int ordinal_;
  cudaStream_t stream_;
  bool owned_;
  uint64_t id_;
  WaitCounters* waits_;
  WaitValue32Fn wait_value_ = nullptr;
  uint32_t* flag_ = nullptr;  // mapped host word: the last task done
  CUdeviceptr flag_dev_ = 0;
  std::mutex order_mu_;
  uint32_t enqueued_ = 0;  // under order_mu_
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  std::vector<cudaEvent_t> free_events_;
  bool stop_ = false;
  Status sticky_;
  std::thread worker_;
};

class CudaEvent : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t e, WaitCounters* waits) : ordinal_(ordinal), event_(e), waits_(waits) {}
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
    if (!t_device_thread && cudaEventQuery(event_) == cudaErrorNotReady) waits_->blocking.fetch_add(1);
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
    return Status::Ok();
  }
  Result<double> SecondsSince(Event& start) override {
    auto* other = dynamic_cast<CudaEvent*>(&start);
    if (!other) return InvalidArgument("Event::SecondsSince: the start event belongs to another kind of device");
    for (cudaEvent_t e : {other->event_, event_}) {
      const cudaError_t err = cudaEventQuery(e);
      if (err == cudaErrorNotReady) return FailedPrecondition("Event::SecondsSince: an event has not completed");
      if (err != cudaSuccess) return CudaError(err, "cudaEventQuery", __FILE__, __LINE__);
    }
    float ms = 0;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, other->event_, event_));
    return static_cast<double>(ms) / 1e3;
  }
  cudaEvent_t get() const { return event_; }

 private:
  int ordinal_;
  cudaEvent_t event_;
  WaitCounters* waits_;
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
  DeviceWaitStats wait_stats() const override {
    return DeviceWaitStats{waits_.blocking.load(), waits_.draining.load()};
  }

  Result<std::unique_ptr<Stream>> CreateStream() override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaStream_t s;
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto stream = std::make_unique<CudaStream>(ordinal_, s, &waits_);
    ZINF_RETURN_IF_ERROR(stream->Init());
    return std::unique_ptr<Stream>(std::move(stream));
  }
  Result<std::unique_ptr<Stream>> AdoptStream(void* native_handle) override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    auto s = static_cast<cudaStream_t>(native_handle);
    int device = -1;
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(s, &device));
    if (device != ordinal_) {
      return InvalidArgument("AdoptStream: the stream belongs to cuda:" + std::to_string(device) +
                             ", not cuda:" + std::to_string(ordinal_));
    }
    auto stream = std::make_unique<CudaStream>(ordinal_, s, &waits_, /*owned=*/false);
    ZINF_RETURN_IF_ERROR(stream->Init());
    return std::unique_ptr<Stream>(std::move(stream));
  }
  Result<std::unique_ptr<Event>> CreateEvent() override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaEvent_t e;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, e, &waits_));
  }
  Result<std::unique_ptr<Event>> CreateTimingEvent() override {
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
    cudaEvent_t e;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDefault));
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, e, &waits_));
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
  WaitCounters waits_;
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
    return Unavailable("no CUDA device (" + std::string(err == cudaSuccess ? "0 devices" : cudaGetErrorName(err)) +
                       ")");
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
