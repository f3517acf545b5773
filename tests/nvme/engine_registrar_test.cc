// One allocation, several uses: a pinned-pool buffer is an io_uring fixed
// buffer for as long as the pool holds it.
#include "nvme/engine_registrar.h"

#include <gtest/gtest.h>

#include "cpu/pinned_pool.h"
#include "nvme_test_util.h"

namespace zinf::nvme {
namespace {

TEST(EngineRegistrarTest, PoolBuffersAreFixedBuffersOfTheEngine) {
  IoEngineOptions eo;
  eo.backend = IoBackend::kUring;
  eo.block_size = 256 << 10;
  auto engine = std::move(IoEngine::Create(eo)).value();
  EngineRegistrar registrar(*engine);
  cpu::PinnedPoolOptions po;
  po.budget_bytes = 8 << 20;
  po.registrars = {&registrar};
  auto pool = cpu::PinnedPool::Create(po);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();

  FileOptions fo;
  fo.create = true;
  auto file = std::move(engine->Open(testing::FreshDir() + "/f", fo)).value();
  void* seen = nullptr;
  {
    auto a = (*pool)->Acquire(1 << 20), b = (*pool)->Acquire(1 << 20);
    ASSERT_TRUE(a.ok() && b.ok());
    seen = a->data();
    EXPECT_TRUE(engine->IsRegistered(a->data(), a->capacity_bytes()));
    testing::FillRandom(static_cast<char*>(a->data()), 1 << 20, 3);
    ASSERT_TRUE(engine->WriteSync(file, 0, a->data(), 1 << 20).ok());
    ASSERT_TRUE(engine->ReadSync(file, 0, b->data(), 1 << 20).ok());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), 1 << 20), 0);
  }
  // Released to the pool's cache: still registered, ready for reuse.
  EXPECT_TRUE(engine->IsRegistered(seen, 4096));
  (*pool)->Trim();  // freed: unregistered first
  EXPECT_FALSE(engine->IsRegistered(seen, 4096));
}

}  // namespace
}  // namespace zinf::nvme
