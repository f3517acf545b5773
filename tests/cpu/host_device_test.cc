// HostDevice: the shared contract in checking mode, plus what only the host
// can show: tagged pointers fault outside stream work, tasks translate them,
// and tasks serialized across streams as CUDA may run host functions.
#include "cpu/host_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "device_contract_tests.h"

namespace zinf::test {
INSTANTIATE_TEST_SUITE_P(Host, DeviceContractTest, ::testing::Values("cpu"));
}  // namespace zinf::test

namespace zinf::cpu {

namespace {

std::unique_ptr<Device> Host(uint64_t budget, bool checking) {
  DeviceOptions o;
  o.spec = "cpu";
  o.memory_budget = budget;
  o.checking = checking;
  return std::move(CreateHostDevice(o)).value();
}

std::unique_ptr<Device> Checking(uint64_t budget = 16 << 20) { return Host(budget, true); }

TEST(HostDeviceTest, DeviceMemoryIsNotHostAddressableOutsideStreamWork) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the device has threads running
  auto device = Checking();
  auto s = std::move(device->CreateStream()).value();
  void* p = *device->Allocate(4096, *s);
  EXPECT_TRUE(IsTaggedDevicePointer(p));
  EXPECT_DEATH({ *static_cast<volatile float*>(p) = 1.0f; }, "");
  ASSERT_TRUE(s->Synchronize().ok());
}

TEST(HostDeviceTest, TasksReachDeviceMemoryThroughTheContext) {
  auto device = Checking();
  auto s = std::move(device->CreateStream()).value();
  float* p = static_cast<float*>(*device->Allocate(1024 * sizeof(float), *s));
  ASSERT_TRUE(s->Enqueue([p](const StreamContext& ctx) {
                 auto* h = static_cast<float*>(ctx.Host(p));
                 for (int i = 0; i < 1024; ++i) h[i] = static_cast<float>(i) * 0.5f;
                 return Status::Ok();
               }).ok());
  std::vector<float> back(1024);
  ASSERT_TRUE(device->CopyToHost(back.data(), p, back.size() * sizeof(float), *s).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(back[i], i * 0.5f);
}

TEST(HostDeviceTest, HostPointersAreRejectedWhereDeviceMemoryIsExpected) {
  auto device = Checking();
  auto s = std::move(device->CreateStream()).value();
  std::vector<char> host(4096);
  Status st = device->CopyToDevice(host.data(), host.data(), 4096, *s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("is a host address, not this device's memory"), std::string::npos) << st.message();
  void* p = *device->Allocate(4096, *s);
  // Past the allocation but inside the reservation goes unnoticed (as on a
  // GPU); past the reservation is refused.
  std::vector<char> big((16 << 20) + 1);
  st = device->CopyToHost(big.data(), p, big.size(), *s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->Synchronize().ok());
}

TEST(HostDeviceTest, WithoutCheckingDevicePointersAreHostPointers) {
  auto device = Host(1 << 20, false);
  auto s = std::move(device->CreateStream()).value();
  auto* p = static_cast<int*>(*device->Allocate(64, *s));
  EXPECT_FALSE(IsTaggedDevicePointer(p));
  *p = 7;  // legal here; checking mode is what tests run in
  EXPECT_EQ(*p, 7);
}

// A host thread in Synchronize runs queued operations itself while the
// stream's thread is between operations, and copies run on their caller's
// thread while the copy engine is idle: whoever runs them, operations keep
// their order and copies see the tasks before them. Rounds of a task that
// writes device memory, a copy back, and a task that checks the copy,
// synchronized at varying depths (so that the host and the stream's thread
// race for the queue), also under checking mode's random delays.
TEST(HostDeviceTest, WaitingHostThreadsRunQueuedWorkInOrder) {
  for (bool checking : {false, true}) {
    auto device = Host(1 << 20, checking);
    auto s = std::move(device->CreateStream()).value();
    const int rounds = checking ? 60 : 2000;
    int* d = static_cast<int*>(*device->Allocate(sizeof(int), *s));
    std::vector<int> back(rounds, -1), order;
    std::vector<std::string> wrong;
    for (int r = 0; r < rounds; ++r) {
      ASSERT_TRUE(s->Enqueue([d, r](const StreamContext& ctx) {
                     *static_cast<int*>(ctx.Host(d)) = r;
                     return Status::Ok();
                   }).ok());
      ASSERT_TRUE(device->CopyToHost(&back[r], d, sizeof(int), *s).ok());
      ASSERT_TRUE(s->Enqueue([&, r](const StreamContext&) {
                     order.push_back(r);
                     if (back[r] != r) wrong.push_back(std::to_string(r) + ": " + std::to_string(back[r]));
                     return Status::Ok();
                   }).ok());
      if (r % (1 + r % 5) == 0) {
        ASSERT_TRUE(s->Synchronize().ok());
      }
    }
    ASSERT_TRUE(s->Synchronize().ok());
    EXPECT_TRUE(wrong.empty()) << "checking " << checking << ", first wrong copy " << wrong.front();
    ASSERT_EQ(order.size(), static_cast<size_t>(rounds));
    for (int r = 0; r < rounds; ++r) ASSERT_EQ(order[r], r) << "checking " << checking;
    ASSERT_TRUE(device->Free(d, *s).ok());
    ASSERT_TRUE(s->Synchronize().ok());
  }
}

// Outside checking mode, a short task on an idle stream runs on the
// enqueuing thread before EnqueueShort returns, and an event recorded on an
// idle stream is complete at once: neither wakes the stream's thread. Behind
// work still running, both wait their turn. In checking mode a short task
// is queued like any other.
TEST(HostDeviceTest, ShortTasksAndEventsOnAnIdleStreamCompleteAtOnce) {
  auto device = Host(1 << 20, false);
  auto s = std::move(device->CreateStream()).value();
  auto e = std::move(device->CreateEvent()).value();
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  ASSERT_TRUE(s->EnqueueShort([&](const StreamContext&) {
                 ran_on = std::this_thread::get_id();
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(ran_on, caller);
  ASSERT_TRUE(e->Record(*s).ok());
  EXPECT_TRUE(*e->Query());
  auto other = std::move(device->CreateStream()).value();
  ASSERT_TRUE(other->Wait(*e).ok());  // a complete event: nothing to wait for
  ASSERT_TRUE(other->Synchronize().ok());

  std::atomic<bool> open{false};
  std::vector<int> order;
  ASSERT_TRUE(s->Enqueue([&](const StreamContext&) {
                 const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                 while (!open.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
                 order.push_back(0);
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(s->EnqueueShort([&](const StreamContext&) {
                 order.push_back(1);
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(e->Record(*s).ok());
  EXPECT_TRUE(order.empty());  // queued behind the gated task
  EXPECT_FALSE(*e->Query());
  open = true;
  ASSERT_TRUE(e->Synchronize().ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  ASSERT_TRUE(s->Synchronize().ok());

  auto checking = Host(1 << 20, true);
  auto cs = std::move(checking->CreateStream()).value();
  std::atomic<bool> done{false};
  ASSERT_TRUE(cs->EnqueueShort([&](const StreamContext&) {
                  ran_on = std::this_thread::get_id();
                  done.store(true);
                  return Status::Ok();
                }).ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  ASSERT_TRUE(done.load());
  EXPECT_NE(ran_on, caller);  // the stream's own thread ran it
  ASSERT_TRUE(cs->Synchronize().ok());
}

// serialize_tasks: tasks of different streams never run at once, while a
// copy on another stream still overlaps a running task (copies are not host
// functions on a GPU either).
TEST(HostDeviceTest, SerializedTasksRunOneAtATimeAndCopiesStillOverlap) {
  DeviceOptions o;
  o.spec = "cpu";
  o.memory_budget = 1 << 20;
  o.checking = true;
  o.serialize_tasks = true;
  auto device = std::move(CreateHostDevice(o)).value();
  EXPECT_NE(device->name().find("tasks serialized"), std::string::npos) << device->name();
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(std::move(device->CreateStream()).value());
  std::atomic<int> running{0}, most{0};
  for (int round = 0; round < 10; ++round) {
    for (auto& s : streams) {
      ASSERT_TRUE(s->Enqueue([&](const StreamContext&) {
                     const int now = running.fetch_add(1) + 1;
                     int seen = most.load();
                     while (now > seen && !most.compare_exchange_weak(seen, now)) {
                     }
                     std::this_thread::sleep_for(std::chrono::microseconds(300));
                     running.fetch_sub(1);
                     return Status::Ok();
                   }).ok());
    }
  }
  for (auto& s : streams) ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_EQ(most.load(), 1);

  // A task that waits for a copy of another stream: the copy is not queued
  // behind it. It waits 10 s at most and then fails.
  auto a = std::move(device->CreateStream()).value(), b = std::move(device->CreateStream()).value();
  auto done = std::move(device->CreateEvent()).value();
  char* d = static_cast<char*>(*device->Allocate(4096, *b));
  std::vector<char> host(4096, 7), back(4096, 0);
  std::atomic<bool> copy_seen{false};
  ASSERT_TRUE(a->Enqueue([&](const StreamContext&) {
                 const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                 while (!*done->Query() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
                 copy_seen = *done->Query();
                 return Status::Ok();
               }).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a's task is (very likely) running
  ASSERT_TRUE(device->CopyToDevice(d, host.data(), host.size(), *b).ok());
  ASSERT_TRUE(device->CopyToHost(back.data(), d, back.size(), *b).ok());
  ASSERT_TRUE(done->Record(*b).ok());
  ASSERT_TRUE(a->Synchronize().ok());
  ASSERT_TRUE(b->Synchronize().ok());
  EXPECT_TRUE(copy_seen.load());
  EXPECT_EQ(back, host);
}

// The host device has no native streams: adopting one is refused, naming why.
TEST(HostDeviceTest, AdoptingANativeStreamIsRefused) {
  auto device = Checking();
  auto adopted = device->AdoptStream(nullptr);
  ASSERT_FALSE(adopted.ok());
  EXPECT_EQ(adopted.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(adopted.status().message().find("no native streams"), std::string::npos) << adopted.status().message();
}

// The same option from the environment, for whole programs (zinf train).
TEST(HostDeviceTest, SerializedTasksFromTheEnvironment) {
  ::setenv("ZINF_SERIALIZE_TASKS", "1", 1);
  DeviceOptions o;
  o.spec = "cpu";
  o.memory_budget = 1 << 20;
  auto device = std::move(CreateHostDevice(o)).value();
  ::unsetenv("ZINF_SERIALIZE_TASKS");
  EXPECT_NE(device->name().find("tasks serialized"), std::string::npos) << device->name();
  auto plain = std::move(CreateHostDevice(o)).value();
  EXPECT_EQ(plain->name().find("tasks serialized"), std::string::npos) << plain->name();
}

TEST(DeviceRegistryTest, SpecsAreCheckedAndAutoFallsBackToHost) {
  DeviceOptions o;
  o.memory_budget = 1 << 20;
  o.spec = "tpu";
  auto bad = CreateDevice(o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("expected auto, cpu, cuda or cuda:N"), std::string::npos);
  o.spec = "cuda:x";
  EXPECT_EQ(CreateDevice(o).status().code(), StatusCode::kInvalidArgument);
  o.spec = "auto";
  auto dev = CreateDevice(o);
  ASSERT_TRUE(dev.ok());
  if ((*dev)->kind() == DeviceKind::kHost) {
    o.spec = "cuda";
    EXPECT_EQ(CreateDevice(o).status().code(), StatusCode::kUnavailable);  // no GPU, or no CUDA in this build
  }
}

}  // namespace
}  // namespace zinf::cpu
