// PinnedPool: mmap (2 MiB-aligned, huge pages advised) + hwloc_set_area_membind (before the first touch, so the
// pages are allocated on the chosen node) + mlock (which faults them in) +
// registrars. MADV_DONTFORK keeps a fork()ed child (a data-loader worker)
// from sharing, and copy-on-write-splitting, pages a device may be DMAing.
#include "cpu/pinned_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/logging.h"
#include "common/units.h"
#include "cpu/io_memory.h"

namespace zinf::cpu {
namespace {

uint64_t PageBytes() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::string ErrnoText(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

// VmLck of this process, in bytes (0 when unreadable).
uint64_t LockedBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // "VmLck:   1024 kB"
  }
  return 0;
}

// mlock reports ENOMEM (or EPERM when the limit is 0) when RLIMIT_MEMLOCK is
// what stops it; DeepSpeed surfaces the same condition as a CUDA OOM.
Status MlockError(uint64_t bytes, int err) {
  rlimit limit{};
  const bool have_limit = getrlimit(RLIMIT_MEMLOCK, &limit) == 0;
  std::string msg = "mlock " + FormatBytes(bytes) + ": ";
  if ((err == ENOMEM || err == EPERM) && have_limit && limit.rlim_cur != RLIM_INFINITY) {
    msg += "RLIMIT_MEMLOCK is " + FormatBytes(limit.rlim_cur) + " (" + FormatBytes(LockedBytes()) +
           " already locked); raise it with 'ulimit -l unlimited' or memlock in /etc/security/limits.conf, "
           "or run with CAP_IPC_LOCK";
  } else {
    msg += ErrnoText(err);
    if (have_limit) {
      msg += "; RLIMIT_MEMLOCK is " +
             (limit.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : FormatBytes(limit.rlim_cur)) + ", " +
             FormatBytes(LockedBytes()) + " already locked";
    }
  }
  return OutOfMemory(std::move(msg));
}

}  // namespace

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    capacity_bytes_ = std::exchange(other.capacity_bytes_, 0);
  }
  return *this;
}

void PinnedBuffer::Release() {
  if (data_) pool_->Return(data_, capacity_bytes_);
  pool_ = nullptr;
  data_ = nullptr;
  size_bytes_ = capacity_bytes_ = 0;
}

uint64_t PinnedPool::SizeClassBytes(uint64_t bytes) {
  const uint64_t page = PageBytes();
  const uint64_t pages = std::max<uint64_t>(1, (bytes + page - 1) / page);
  if (pages <= 4) return pages * page;
  const uint64_t step = (uint64_t{1} << (std::bit_width(pages) - 1)) / 4;  // a quarter of the power of two below
  return (pages + step - 1) / step * step * page;
}

Result<std::unique_ptr<PinnedPool>> PinnedPool::Create(PinnedPoolOptions options) {
  ZINF_ASSIGN_OR_RETURN(HwlocTopology topology, HwlocTopology::LoadThisSystem(!options.gpu_pci_bus_id.empty()));
  return Create(std::move(options), std::move(topology));
}

Result<std::unique_ptr<PinnedPool>> PinnedPool::Create(PinnedPoolOptions options, HwlocTopology topology) {
  if (options.budget_bytes == 0) return InvalidArgument("pinned pool: budget_bytes must be > 0");
  for (MemoryRegistrar* r : options.registrars) {
    if (!r) return InvalidArgument("pinned pool: null registrar");
  }
  auto choice = ChooseNumaNode(topology.get(), options.gpu_pci_bus_id, options.numa_node);
  if (!choice.ok()) return choice.status().WithContext("pinned pool");
  ZINF_LOG_DEBUG("pinned pool: budget {}, NUMA node {} ({})", FormatBytes(options.budget_bytes), choice->node,
                 choice->reason);
  return std::unique_ptr<PinnedPool>(new PinnedPool(std::move(options), std::move(topology), std::move(*choice)));
}

PinnedPool::PinnedPool(PinnedPoolOptions options, HwlocTopology topology, NumaChoice choice)
    : options_(std::move(options)), topology_(std::move(topology)), choice_(std::move(choice)) {
  nodeset_ = hwloc_bitmap_alloc();
  hwloc_bitmap_only(nodeset_, static_cast<unsigned>(choice_.node));
  stats_.budget_bytes = options_.budget_bytes;
}

PinnedPool::~PinnedPool() {
  ZINF_CHECK_MSG(stats_.in_use_bytes == 0, "PinnedPool destroyed while buffers are still in use");
  Trim();
  hwloc_bitmap_free(nodeset_);
}

Result<PinnedBuffer> PinnedPool::Acquire(uint64_t bytes) {
  if (bytes == 0 || bytes > kMaxBufferBytes) {
    return InvalidArgument("pinned pool: request of " + FormatBytes(bytes) + " is outside 1 B .. " +
                           FormatBytes(kMaxBufferBytes) + "; split it");
  }
  const uint64_t capacity = SizeClassBytes(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(capacity); it != cache_.end() && !it->second.empty()) {
      void* data = it->second.back();
      it->second.pop_back();
      stats_.cached_bytes -= capacity;
      stats_.in_use_bytes += capacity;
      ++stats_.reuses;
      return PinnedBuffer(this, data, bytes, capacity);
    }
    if (stats_.pinned_bytes - stats_.cached_bytes + capacity > options_.budget_bytes) {
      return OutOfMemory("pinned host memory budget " + FormatBytes(options_.budget_bytes) + " exceeded: request " +
                         FormatBytes(bytes) + " (size class " + FormatBytes(capacity) + ") with " +
                         FormatBytes(stats_.pinned_bytes - stats_.cached_bytes) + " in use or being allocated");
    }
    // Freed under the lock, so the bytes really pinned never exceed the budget.
    EvictLocked(capacity);
    stats_.pinned_bytes += capacity;  // reserved while the buffer is created outside the lock
    stats_.peak_pinned_bytes = std::max(stats_.peak_pinned_bytes, stats_.pinned_bytes);
  }
  Result<void*> created = CreateBuffer(capacity);
  std::lock_guard<std::mutex> lock(mu_);
  if (!created.ok()) {
    stats_.pinned_bytes -= capacity;
    return created.status().WithContext("pinned host memory");
  }
  stats_.in_use_bytes += capacity;
  ++stats_.allocations;
  return PinnedBuffer(this, *created, bytes, capacity);
}

void PinnedPool::EvictLocked(uint64_t needed) {
  while (stats_.pinned_bytes + needed > options_.budget_bytes && stats_.cached_bytes > 0) {
    auto it = std::prev(cache_.end());
    while (it->second.empty()) it = std::prev(it);  // cached_bytes > 0: some class is non-empty
    void* data = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= it->first;
    stats_.pinned_bytes -= it->first;
    DestroyBuffer(data, it->first);
  }
}

Result<void*> PinnedPool::CreateBuffer(uint64_t capacity) {
  // In huge pages where the kernel gives them: these buffers are the
  // engine's O_DIRECT and DMA buffers (io_memory.h says why that matters).
  void* data = MapIoMemory(capacity);
  if (data == nullptr) return OutOfMemory("mmap " + FormatBytes(capacity) + ": " + ErrnoText(errno));
  if (topology_.is_this_system() && hwloc_set_area_membind(topology_.get(), data, capacity, nodeset_,
                                                           HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_BYNODESET) != 0) {
    // Binding is a placement hint for speed; a kernel or container without
    // mbind still gives correct memory.
    WarnOnce("pinned host memory: cannot bind to NUMA node " + std::to_string(choice_.node) + ": " + ErrnoText(errno) +
             "; using the default placement");
  }
  madvise(data, capacity, MADV_DONTFORK);  // best effort, see the file comment
  if (options_.lock && mlock(data, capacity) != 0) {
    const int err = errno;
    UnmapIoMemory(data, capacity);
    return MlockError(capacity, err);
  }
  for (size_t i = 0; i < options_.registrars.size(); ++i) {
    Status s = options_.registrars[i]->Register(data, capacity);
    if (!s.ok()) {
      for (size_t j = i; j-- > 0;) options_.registrars[j]->Unregister(data, capacity);
      UnmapIoMemory(data, capacity);  // also unlocks
      return s.WithContext(std::string(options_.registrars[i]->name()) + " " + FormatBytes(capacity));
    }
  }
  return data;
}

void PinnedPool::DestroyBuffer(void* data, uint64_t capacity) {
  for (size_t j = options_.registrars.size(); j-- > 0;) options_.registrars[j]->Unregister(data, capacity);
  if (UnmapIoMemory(data, capacity) != 0) {
    ZINF_LOG_ERROR("pinned host memory: munmap {} bytes at {}: {}", capacity, data, ErrnoText(errno));
  }
}

void PinnedPool::Return(void* data, uint64_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  ZINF_CHECK(stats_.in_use_bytes >= capacity);
  stats_.in_use_bytes -= capacity;
  stats_.cached_bytes += capacity;
  cache_[capacity].push_back(data);
}

void PinnedPool::Trim() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [capacity, buffers] : cache_) {
    for (void* data : buffers) DestroyBuffer(data, capacity);
    stats_.cached_bytes -= capacity * buffers.size();
    stats_.pinned_bytes -= capacity * buffers.size();
    buffers.clear();
  }
}

PinnedPoolStats PinnedPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace zinf::cpu
