// The device contract, as tests any Device must pass. Instantiated for
// HostDevice in checking mode (tests/cpu) and for CudaDevice (tests/gpu, skipped
// without a GPU). They touch device memory only through copies, so they hold
// on a GPU too; host tasks use host memory only.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "zinf/device.h"

namespace zinf::test {

class DeviceContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    DeviceOptions o;
    o.spec = GetParam();
    o.memory_budget = 64 << 20;
    o.checking = true;
    o.seed = 42;
    auto d = CreateDevice(o);
    if (!d.ok() && d.status().code() == StatusCode::kUnavailable) GTEST_SKIP() << d.status().message();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    device_ = std::move(d).value();
  }
  std::unique_ptr<Stream> NewStream() {
    auto s = device_->CreateStream();
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  }
  std::unique_ptr<Event> NewEvent() {
    auto e = device_->CreateEvent();
    EXPECT_TRUE(e.ok());
    return std::move(e).value();
  }
  std::unique_ptr<Device> device_;
};

TEST_P(DeviceContractTest, StreamRunsWorkInOrder) {
  auto s = NewStream();
  std::vector<int> seen;
  for (int i = 0; i < 300; ++i)
    ASSERT_TRUE(s->Enqueue([&seen, i](const StreamContext&) {
                   seen.push_back(i);
                   return Status::Ok();
                 }).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  ASSERT_EQ(seen.size(), 300u);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(seen[i], i);
}

// Short tasks (EnqueueShort) take their place in stream order among the
// rest, and after a failure they are skipped like any task.
TEST_P(DeviceContractTest, ShortTasksKeepStreamOrder) {
  auto s = NewStream();
  std::vector<int> seen;
  for (int i = 0; i < 200; ++i) {
    auto task = [&seen, i](const StreamContext&) {
      seen.push_back(i);
      return Status::Ok();
    };
    ASSERT_TRUE((i % 3 == 0 ? s->Enqueue(task) : s->EnqueueShort(task)).ok());
    if (i % 7 == 0) {
      ASSERT_TRUE(s->Synchronize().ok());  // so that some short tasks find the stream idle
    }
  }
  ASSERT_TRUE(s->Synchronize().ok());
  ASSERT_EQ(seen.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(seen[i], i);
  ASSERT_TRUE(s->EnqueueShort([](const StreamContext&) { return IoError("short and failed"); }).ok());
  ASSERT_TRUE(s->EnqueueShort([&seen](const StreamContext&) {
                 seen.push_back(-1);
                 return Status::Ok();
               }).ok());
  EXPECT_EQ(s->Synchronize().code(), StatusCode::kIoError);
  EXPECT_EQ(seen.size(), 200u);
}

TEST_P(DeviceContractTest, EventOrdersWorkAcrossStreams) {
  auto a = NewStream(), b = NewStream();
  auto e = NewEvent();
  for (int round = 0; round < 10; ++round) {
    std::atomic<bool> written{false};
    bool saw_write = false;
    ASSERT_TRUE(a->Enqueue([&](const StreamContext&) {
                   std::this_thread::sleep_for(std::chrono::milliseconds(5));
                   written = true;
                   return Status::Ok();
                 }).ok());
    ASSERT_TRUE(e->Record(*a).ok());
    ASSERT_TRUE(b->Wait(*e).ok());
    ASSERT_TRUE(b->Enqueue([&](const StreamContext&) {
                   saw_write = written.load();
                   return Status::Ok();
                 }).ok());
    ASSERT_TRUE(b->Synchronize().ok());
    ASSERT_TRUE(a->Synchronize().ok());
    EXPECT_TRUE(saw_write) << "round " << round;
  }
}

TEST_P(DeviceContractTest, EventQueryAndSynchronize) {
  auto s = NewStream();
  auto e = NewEvent();
  EXPECT_TRUE(*e->Query());  // never recorded: nothing to wait for
  std::atomic<bool> release{false};
  ASSERT_TRUE(s->Enqueue([&](const StreamContext&) {
                 while (!release) std::this_thread::sleep_for(std::chrono::microseconds(100));
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(e->Record(*s).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(*e->Query());
  release = true;
  ASSERT_TRUE(e->Synchronize().ok());
  EXPECT_TRUE(*e->Query());
}

TEST_P(DeviceContractTest, CopiesAndMemsetRoundTrip) {
  auto s = NewStream();
  const size_t n = 1 << 16;
  std::vector<uint32_t> src(n), back(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
  auto a = device_->Allocate(n * 4, *s), b = device_->Allocate(n * 4, *s);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(device_->CopyToDevice(*a, src.data(), n * 4, *s).ok());
  ASSERT_TRUE(device_->CopyOnDevice(*b, *a, n * 4, *s).ok());
  ASSERT_TRUE(device_->Memset(static_cast<char*>(*b) + 4 * 100, 0xff, 4 * 10, *s).ok());
  ASSERT_TRUE(device_->CopyToHost(back.data(), *b, n * 4, *s).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], (i >= 100 && i < 110) ? 0xffffffffu : src[i]) << i;
  ASSERT_TRUE(device_->Free(*a, *s).ok());
  ASSERT_TRUE(device_->Free(*b, *s).ok());
  EXPECT_EQ(device_->Free(*b, *s).code(), StatusCode::kInvalidArgument);  // double free
}

TEST_P(DeviceContractTest, AFailedTaskIsStickyAndLaterTasksAreSkipped) {
  auto s = NewStream();
  auto e = NewEvent();
  int ran = 0;
  ASSERT_TRUE(s->Enqueue([](const StreamContext&) { return IoError("disk on fire"); }).ok());
  ASSERT_TRUE(s->Enqueue([&](const StreamContext&) {
                 ++ran;
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(e->Record(*s).ok());
  Status st = s->Synchronize();
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_EQ(st.message(), "disk on fire");
  EXPECT_EQ(ran, 0);
  EXPECT_TRUE(e->Synchronize().ok());  // events still complete: nobody waiting on them hangs
  EXPECT_EQ(s->Synchronize().code(), StatusCode::kIoError);
}

TEST_P(DeviceContractTest, StickyErrorIsSeenWithoutSynchronizing) {
  auto s = NewStream();
  auto e = NewEvent();
  EXPECT_TRUE(s->sticky_error().ok());
  ASSERT_TRUE(s->Enqueue([](const StreamContext&) { return IoError("disk on fire"); }).ok());
  ASSERT_TRUE(e->Record(*s).ok());
  ASSERT_TRUE(e->Synchronize().ok());
  EXPECT_EQ(s->sticky_error().code(), StatusCode::kIoError);
  EXPECT_EQ(s->Synchronize().code(), StatusCode::kIoError);
}

// A task of one stream waits for a task of another: were the two streams'
// tasks run one at a time (as CUDA may run host functions), this would
// never finish. It waits 10 s at most and then fails.
TEST_P(DeviceContractTest, TasksOfDifferentStreamsRunAtOnce) {
  auto a = NewStream(), b = NewStream();
  std::atomic<bool> b_ran{false}, a_saw_b{false};
  ASSERT_TRUE(a->Enqueue([&](const StreamContext&) {
                 const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                 while (!b_ran.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
                 a_saw_b = b_ran.load();
                 return Status::Ok();
               }).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a's task is (very likely) running
  ASSERT_TRUE(b->Enqueue([&](const StreamContext&) {
                 b_ran = true;
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(a->Synchronize().ok());
  ASSERT_TRUE(b->Synchronize().ok());
  EXPECT_TRUE(a_saw_b.load());
}

// Timing events measure device work between them with no host code on the
// stream: after a task that sleeps 20 ms, the span covers it; before both
// have completed, the answer is kFailedPrecondition, never a wait.
TEST_P(DeviceContractTest, TimingEventsMeasureTheWorkBetweenThem) {
  auto s = NewStream();
  auto start = std::move(device_->CreateTimingEvent()).value(), end = std::move(device_->CreateTimingEvent()).value();
  std::atomic<bool> open{false};
  ASSERT_TRUE(s->Enqueue([&open](const StreamContext&) {
                 const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                 while (!open.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(start->Record(*s).ok());
  ASSERT_TRUE(s->Enqueue([](const StreamContext&) {
                 std::this_thread::sleep_for(std::chrono::milliseconds(20));
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(end->Record(*s).ok());
  EXPECT_EQ(end->SecondsSince(*start).status().code(), StatusCode::kFailedPrecondition);  // gated: not yet
  open = true;
  ASSERT_TRUE(s->Synchronize().ok());
  const Result<double> seconds = end->SecondsSince(*start);
  ASSERT_TRUE(seconds.ok()) << seconds.status().ToString();
  EXPECT_GE(*seconds, 0.019);
  EXPECT_LT(*seconds, 10.0);
}

// Device::wait_stats: a host wait counts when it blocks; it drains when the
// stream has nothing queued behind what it waited for.
TEST_P(DeviceContractTest, HostWaitsAreCountedWhenTheyBlock) {
  auto s = NewStream();
  auto e = NewEvent();
  ASSERT_TRUE(s->Synchronize().ok());
  const DeviceWaitStats before = device_->wait_stats();
  ASSERT_TRUE(s->Synchronize().ok());  // nothing queued: no wait
  EXPECT_EQ(device_->wait_stats().blocking, before.blocking);
  // Two gated tasks with the event between them: waiting for the event
  // blocks but leaves the second task queued.
  std::atomic<int> open{0};
  auto gate = [&open](int n) {
    return [&open, n](const StreamContext&) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (open.load() < n && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      return Status::Ok();
    };
  };
  ASSERT_TRUE(s->Enqueue(gate(1)).ok());
  ASSERT_TRUE(e->Record(*s).ok());
  ASSERT_TRUE(s->Enqueue(gate(2)).ok());
  std::thread opener([&open] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    open = 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    open = 2;
  });
  ASSERT_TRUE(e->Synchronize().ok());
  const DeviceWaitStats mid = device_->wait_stats();
  EXPECT_EQ(mid.blocking, before.blocking + 1);
  EXPECT_EQ(mid.draining, before.draining);  // the second task was still queued
  ASSERT_TRUE(s->Synchronize().ok());        // waits for the second: drains the stream
  opener.join();
  const DeviceWaitStats after = device_->wait_stats();
  EXPECT_EQ(after.blocking, before.blocking + 2);
  EXPECT_EQ(after.draining, before.draining + 1);
}

TEST_P(DeviceContractTest, BudgetIsRealAndFragmentationCounts) {
  auto s = NewStream();
  const uint64_t mib = 1 << 20, budget = device_->memory_stats().budget_bytes;
  ASSERT_EQ(budget, 64 * mib);
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(*device_->Allocate(8 * mib, *s));
  auto over = device_->Allocate(1, *s);
  ASSERT_EQ(over.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(over.status().message().find("budget 64.00 MiB, in use 64.00 MiB in 8 allocations"), std::string::npos)
      << over.status().message();
  // Free every other block: 32 MiB free, but no 16 MiB range.
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(device_->Free(blocks[i], *s).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  auto frag = device_->Allocate(16 * mib, *s);
  ASSERT_EQ(frag.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(frag.status().message().find("32.00 MiB is free but fragmented, the largest free range is 8.00 MiB"),
            std::string::npos)
      << frag.status().message();
  // Freeing a neighbour merges the ranges.
  ASSERT_TRUE(device_->Free(blocks[1], *s).ok());
  ASSERT_TRUE(s->Synchronize().ok());
  auto merged = device_->Allocate(24 * mib, *s);
  EXPECT_TRUE(merged.ok()) << merged.status().ToString();
  EXPECT_EQ(device_->memory_stats().peak_in_use_bytes, 64 * mib);
}

TEST_P(DeviceContractTest, FreedMemoryIsReusedInStreamOrder) {
  auto a = NewStream(), b = NewStream();
  const uint64_t bytes = 1 << 20;
  std::vector<uint8_t> pattern(bytes, 0xab), back(bytes, 0);
  auto buf = device_->Allocate(bytes, *a);
  ASSERT_TRUE(buf.ok());
  // Same stream: the block comes back at once.
  ASSERT_TRUE(device_->Free(*buf, *a).ok());
  auto again = device_->Allocate(bytes, *a);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *buf);
  // Another stream: it gets the block only after a's pending write is done.
  ASSERT_TRUE(a->Enqueue([](const StreamContext&) {
                 std::this_thread::sleep_for(std::chrono::milliseconds(30));
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(device_->CopyToDevice(*again, pattern.data(), bytes, *a).ok());
  ASSERT_TRUE(device_->Free(*again, *a).ok());
  // Fill the rest of the budget so b must take the block a freed.
  auto rest = device_->Allocate(device_->memory_stats().budget_bytes - bytes, *b);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  auto reused = device_->Allocate(bytes, *b);
  ASSERT_TRUE(reused.ok()) << reused.status().ToString();
  EXPECT_EQ(*reused, *buf);
  ASSERT_TRUE(device_->CopyToHost(back.data(), *reused, bytes, *b).ok());
  ASSERT_TRUE(b->Synchronize().ok());
  EXPECT_EQ(back, pattern) << "stream b read the block before stream a's write to it finished";
}

// Stream a reuses the head of a block it freed; the tail is still a's until
// a's earlier work is done: stream b, left only that tail, must wait for it.
TEST_P(DeviceContractTest, TheTailOfAReusedBlockWaitsForItsStream) {
  auto a = NewStream(), b = NewStream();
  const uint64_t mib = 1 << 20;
  std::vector<uint8_t> pattern(mib, 0xcd), back(mib, 0);
  auto block = device_->Allocate(2 * mib, *a);
  ASSERT_TRUE(block.ok());
  ASSERT_TRUE(a->Enqueue([](const StreamContext&) {
                 std::this_thread::sleep_for(std::chrono::milliseconds(30));
                 return Status::Ok();
               }).ok());
  char* tail = static_cast<char*>(*block) + mib;
  ASSERT_TRUE(device_->CopyToDevice(tail, pattern.data(), mib, *a).ok());
  ASSERT_TRUE(device_->Free(*block, *a).ok());
  auto head = device_->Allocate(mib, *a);  // a's own freed block, at once
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(*head, *block);
  auto rest = device_->Allocate(device_->memory_stats().budget_bytes - 2 * mib, *b);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  auto reused = device_->Allocate(mib, *b);
  ASSERT_TRUE(reused.ok()) << reused.status().ToString();
  EXPECT_EQ(*reused, static_cast<void*>(tail));
  ASSERT_TRUE(device_->CopyToHost(back.data(), *reused, mib, *b).ok());
  ASSERT_TRUE(b->Synchronize().ok());
  EXPECT_EQ(back, pattern) << "stream b took the tail before stream a's write to it finished";
  ASSERT_TRUE(a->Synchronize().ok());
}

// Neighbours freed on two streams, still pending, merge for a request that
// neither holds alone; the allocating stream waits for both.
TEST_P(DeviceContractTest, PendingNeighboursMergeForALargerRequest) {
  auto a = NewStream(), b = NewStream(), c = NewStream();
  const uint64_t mib = 1 << 20, budget = device_->memory_stats().budget_bytes;
  std::vector<uint8_t> pa(mib, 0x11), pb(mib, 0x22), back(2 * mib, 0);
  auto x = device_->Allocate(mib, *a);
  auto y = device_->Allocate(mib, *b);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ(static_cast<char*>(*y), static_cast<char*>(*x) + mib);
  auto rest = device_->Allocate(budget - 2 * mib, *c);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  for (auto* s : {a.get(), b.get()}) {
    ASSERT_TRUE(s->Enqueue([](const StreamContext&) {
                   std::this_thread::sleep_for(std::chrono::milliseconds(20));
                   return Status::Ok();
                 }).ok());
  }
  ASSERT_TRUE(device_->CopyToDevice(*x, pa.data(), mib, *a).ok());
  ASSERT_TRUE(device_->CopyToDevice(*y, pb.data(), mib, *b).ok());
  ASSERT_TRUE(device_->Free(*x, *a).ok());
  ASSERT_TRUE(device_->Free(*y, *b).ok());
  EXPECT_EQ(device_->memory_stats().largest_free_bytes, 2 * mib);
  auto both = device_->Allocate(2 * mib, *c);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(*both, *x);
  ASSERT_TRUE(device_->CopyToHost(back.data(), *both, 2 * mib, *c).ok());
  ASSERT_TRUE(c->Synchronize().ok());
  EXPECT_TRUE(std::equal(pa.begin(), pa.end(), back.begin()) && std::equal(pb.begin(), pb.end(), back.begin() + mib))
      << "stream c read the merged range before a's and b's writes finished";
}

TEST_P(DeviceContractTest, ThousandsOfSmallOpsChainedAcrossStreams) {
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(NewStream());
  std::vector<std::unique_ptr<Event>> events;
  const int n = 1200;
  int counter = 0, mismatches = 0;
  for (int i = 0; i < n; ++i) {
    Stream& s = *streams[i % 3];
    if (i > 0) {
      ASSERT_TRUE(s.Wait(*events.back()).ok());
    }
    ASSERT_TRUE(s.Enqueue([&counter, &mismatches, i](const StreamContext&) {
                   if (counter != i) ++mismatches;
                   counter = i + 1;
                   return Status::Ok();
                 }).ok());
    events.push_back(NewEvent());
    ASSERT_TRUE(events.back()->Record(s).ok());
  }
  for (auto& s : streams) ASSERT_TRUE(s->Synchronize().ok());
  EXPECT_EQ(counter, n);
  EXPECT_EQ(mismatches, 0);
}

}  // namespace zinf::test
