// PinnedPool: size classes, reuse, the budget, mlock and its RLIMIT_MEMLOCK
// error (in a child process without CAP_IPC_LOCK), registrars called once per
// buffer and unwound on failure, and NUMA placement on a synthetic topology.
// Buffers stay small (<= 2 MiB locked at a time) so the tests also pass under
// a default 8 MiB RLIMIT_MEMLOCK.
#include "cpu/pinned_pool.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "two_node_topology.h"

// AddressSanitizer intercepts mlock() as a no-op (it cannot lock its shadow
// memory), so tests that observe locking skip under it.
#if defined(__SANITIZE_ADDRESS__)
#define ZINF_SKIP_IF_MLOCK_INTERCEPTED() GTEST_SKIP() << "AddressSanitizer turns mlock into a no-op"
#else
#define ZINF_SKIP_IF_MLOCK_INTERCEPTED() (void)0
#endif

namespace zinf::cpu {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

uint64_t ProcStatusKiB(const char* key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::strlen(key)));
  }
  return 0;
}

bool HasCapability(int cap) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> cap) & 1;
  }
  return false;
}

std::unique_ptr<PinnedPool> MakePool(uint64_t budget, std::vector<MemoryRegistrar*> registrars = {}) {
  PinnedPoolOptions o;
  o.budget_bytes = budget;
  o.registrars = std::move(registrars);
  auto pool = PinnedPool::Create(std::move(o));
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(pool).value() : nullptr;
}

// Records every call; fails the Nth Register (1-based) when fail_at > 0.
class FakeRegistrar : public MemoryRegistrar {
 public:
  explicit FakeRegistrar(std::string name, int fail_at = 0) : name_(std::move(name)), fail_at_(fail_at) {}
  std::string_view name() const override { return name_; }
  Status Register(void* ptr, size_t bytes) override {
    if (++register_calls == fail_at_) return Unavailable("registration refused");
    registered.emplace_back(ptr, bytes);
    return Status::Ok();
  }
  void Unregister(void* ptr, size_t bytes) override {
    ++unregister_calls;
    for (auto it = registered.begin(); it != registered.end(); ++it) {
      if (it->first == ptr && it->second == bytes) {
        registered.erase(it);
        return;
      }
    }
    ADD_FAILURE() << "Unregister of a buffer that was not registered";
  }
  std::vector<std::pair<void*, size_t>> registered;
  int register_calls = 0, unregister_calls = 0;

 private:
  std::string name_;
  int fail_at_;
};

TEST(PinnedPoolTest, SizeClasses) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(PinnedPool::SizeClassBytes(1), page);
  EXPECT_EQ(PinnedPool::SizeClassBytes(page), page);
  EXPECT_EQ(PinnedPool::SizeClassBytes(page + 1), 2 * page);
  EXPECT_EQ(PinnedPool::SizeClassBytes(5 * page), 5 * page);
  EXPECT_EQ(PinnedPool::SizeClassBytes(9 * page), 10 * page);  // 4 classes in [8, 16) pages
  EXPECT_EQ(PinnedPool::SizeClassBytes(17 * page), 20 * page);
  EXPECT_EQ(PinnedPool::SizeClassBytes(PinnedPool::kMaxBufferBytes), PinnedPool::kMaxBufferBytes);
  EXPECT_EQ(PinnedPool::SizeClassBytes(PinnedPool::kMaxBufferBytes - 1), PinnedPool::kMaxBufferBytes);
  uint64_t previous = 0;
  for (uint64_t bytes = 1; bytes <= 64 * kMiB; bytes = bytes * 9 / 8 + 1) {
    const uint64_t c = PinnedPool::SizeClassBytes(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_EQ(c % page, 0u);
    EXPECT_GE(c, previous);  // monotonic
    if (bytes > 4 * page) {
      EXPECT_LE(c, bytes + bytes / 4 + page) << bytes;  // <= 25% over
    }
    previous = c;
  }
}

TEST(PinnedPoolTest, BuffersArePageAlignedLockedAndReused) {
  ZINF_SKIP_IF_MLOCK_INTERCEPTED();
  auto pool = MakePool(4 * kMiB);
  ASSERT_TRUE(pool);
  const uint64_t locked_before = ProcStatusKiB("VmLck:");
  void* first = nullptr;
  {
    auto buf = pool->Acquire(300 * kKiB);
    ASSERT_TRUE(buf.ok()) << buf.status().ToString();
    first = buf->data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % sysconf(_SC_PAGESIZE), 0u);
    EXPECT_EQ(buf->size_bytes(), 300 * kKiB);
    EXPECT_EQ(buf->capacity_bytes(), PinnedPool::SizeClassBytes(300 * kKiB));
    std::memset(buf->data(), 0x5a, buf->capacity_bytes());                             // all of it is usable
    EXPECT_GE(ProcStatusKiB("VmLck:") - locked_before, buf->capacity_bytes() / kKiB);  // mlock'ed
    EXPECT_EQ(pool->stats().in_use_bytes, buf->capacity_bytes());
  }  // released to the cache, still pinned
  PinnedPoolStats s = pool->stats();
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.cached_bytes, PinnedPool::SizeClassBytes(300 * kKiB));
  EXPECT_EQ(s.pinned_bytes, s.cached_bytes);
  auto again = pool->Acquire(290 * kKiB);  // same size class
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);
  s = pool->stats();
  EXPECT_EQ(s.allocations, 1u);
  EXPECT_EQ(s.reuses, 1u);
  again->Release();
  pool->Trim();
  EXPECT_EQ(pool->stats().pinned_bytes, 0u);
  EXPECT_EQ(ProcStatusKiB("VmLck:"), locked_before);  // unlocked and unmapped
}

TEST(PinnedPoolTest, BudgetIsNeverExceeded) {
  auto pool = MakePool(1 * kMiB);
  ASSERT_TRUE(pool);
  auto a = pool->Acquire(512 * kKiB);
  auto b = pool->Acquire(512 * kKiB);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = pool->Acquire(4 * kKiB);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(c.status().message().find("budget 1.00 MiB exceeded: request 4.00 KiB"), std::string::npos)
      << c.status().message();
  EXPECT_EQ(pool->stats().pinned_bytes, 1 * kMiB);
  EXPECT_EQ(pool->stats().peak_pinned_bytes, 1 * kMiB);

  // A cached buffer of another class is freed to make room.
  b->Release();
  auto d = pool->Acquire(256 * kKiB);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  PinnedPoolStats s = pool->stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.pinned_bytes, 768 * kKiB);
  EXPECT_LE(s.peak_pinned_bytes, s.budget_bytes);
}

TEST(PinnedPoolTest, BadRequestsAreInvalidArgument) {
  auto pool = MakePool(1 * kMiB);
  ASSERT_TRUE(pool);
  EXPECT_EQ(pool->Acquire(0).status().code(), StatusCode::kInvalidArgument);
  auto huge = pool->Acquire(PinnedPool::kMaxBufferBytes + 1);
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("split it"), std::string::npos);
  PinnedPoolOptions o;  // budget 0
  EXPECT_EQ(PinnedPool::Create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(PinnedPoolTest, RegistrarsSeeEachBufferOnce) {
  FakeRegistrar cuda("cuda"), uring("io_uring");
  {
    auto pool = MakePool(2 * kMiB, {&cuda, &uring});
    ASSERT_TRUE(pool);
    {
      auto a = pool->Acquire(64 * kKiB);
      ASSERT_TRUE(a.ok());
      ASSERT_EQ(cuda.registered.size(), 1u);
      EXPECT_EQ(cuda.registered[0].first, a->data());
      EXPECT_EQ(cuda.registered[0].second, a->capacity_bytes());
      EXPECT_EQ(uring.registered, cuda.registered);  // the same bytes, one allocation
    }
    auto reused = pool->Acquire(64 * kKiB);
    ASSERT_TRUE(reused.ok());
    EXPECT_EQ(cuda.register_calls, 1);  // reuse registers nothing again
    EXPECT_EQ(uring.register_calls, 1);
  }
  EXPECT_TRUE(cuda.registered.empty());  // unregistered when the pool freed it
  EXPECT_TRUE(uring.registered.empty());
  EXPECT_EQ(cuda.unregister_calls, 1);
}

TEST(PinnedPoolTest, FailedRegistrationIsUnwound) {
  FakeRegistrar cuda("cuda"), uring("io_uring fixed buffers", /*fail_at=*/1);
  auto pool = MakePool(2 * kMiB, {&cuda, &uring});
  ASSERT_TRUE(pool);
  auto a = pool->Acquire(64 * kKiB);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(a.status().message().find("io_uring fixed buffers 64.00 KiB: registration refused"), std::string::npos)
      << a.status().message();
  EXPECT_TRUE(cuda.registered.empty());  // the registrar before it was undone
  EXPECT_EQ(pool->stats().pinned_bytes, 0u);
  auto b = pool->Acquire(64 * kKiB);  // the next one succeeds
  EXPECT_TRUE(b.ok());
}

TEST(PinnedPoolTest, BindsNearTheGpuOnATwoNodeTopology) {
  auto topology = HwlocTopology::FromXml(test::kTwoNodeTopologyXml);
  ASSERT_TRUE(topology.ok());
  PinnedPoolOptions o;
  o.budget_bytes = 1 * kMiB;
  o.gpu_pci_bus_id = "0000:b3:00.0";
  o.numa_node = 0;
  auto pool = PinnedPool::Create(std::move(o), std::move(topology).value());
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ((*pool)->numa_node(), 1);
  EXPECT_EQ((*pool)->numa_reason(), "nearest to GPU 0000:b3:00.0");
  auto buf = (*pool)->Acquire(8 * kKiB);  // binding is a no-op on another machine's topology
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % sysconf(_SC_PAGESIZE), 0u);
}

TEST(PinnedPoolTest, BadNumaNodeIsInvalidArgument) {
  PinnedPoolOptions o;
  o.budget_bytes = 1 * kMiB;
  o.numa_node = 4096;
  EXPECT_EQ(PinnedPool::Create(std::move(o)).status().code(), StatusCode::kInvalidArgument);
}

// In a child process: give up the right to lock beyond the limit, lower
// RLIMIT_MEMLOCK to 64 KiB, then ask for 1 MiB. As root, CAP_IPC_LOCK makes
// the limit irrelevant, so the child first becomes nobody (setuid drops every
// capability).
void LockBeyondRlimitInChild() {
  if (geteuid() == 0 && setuid(65534) != 0) std::_Exit(3);
  const rlimit limit{64 * kKiB, 64 * kKiB};
  if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) std::_Exit(4);
  PinnedPoolOptions o;
  o.budget_bytes = 16 * kMiB;
  auto pool = PinnedPool::Create(std::move(o));
  if (!pool.ok()) std::_Exit(5);
  auto buf = (*pool)->Acquire(1 * kMiB);
  if (buf.ok()) std::_Exit(6);
  std::fprintf(stderr, "%s\n", buf.status().ToString().c_str());
  std::_Exit(buf.status().code() == StatusCode::kOutOfMemory ? 0 : 7);
}

TEST(PinnedPoolDeathTest, MemlockLimitErrorNamesLimitRequestAndFix) {
  ZINF_SKIP_IF_MLOCK_INTERCEPTED();
  constexpr int kCapSetuid = 7, kCapIpcLock = 14;
  if (geteuid() == 0 && !HasCapability(kCapSetuid)) GTEST_SKIP() << "root without CAP_SETUID: cannot drop CAP_IPC_LOCK";
  if (geteuid() != 0 && HasCapability(kCapIpcLock)) GTEST_SKIP() << "CAP_IPC_LOCK ignores RLIMIT_MEMLOCK";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(LockBeyondRlimitInChild(), ::testing::ExitedWithCode(0),
              "OutOfMemory: pinned host memory: mlock 1.00 MiB: RLIMIT_MEMLOCK is 64.00 KiB \\(.+ already locked\\); "
              "raise it with 'ulimit -l unlimited' or memlock in /etc/security/limits.conf, or run with CAP_IPC_LOCK");
}

}  // namespace
}  // namespace zinf::cpu
