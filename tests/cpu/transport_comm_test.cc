// TransportComm over an in-process fabric whose ranks are threads: the
// fabric matches operations by the order each rank started them (as gloo
// does), so a collective started out of turn exchanges the wrong buffers
// and the test sees it. Reductions against ReduceInRankOrder, the order of
// starts across streams, a peer's Abort and a silent rank named.
#include "cpu/transport_comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/communicator.h"
#include "common/float16.h"
#include "cpu/host_device.h"
#include "zinf/device.h"

namespace zinf::cpu {
namespace {

using Op = Transport::Op;

class Fabric {
 public:
  explicit Fabric(int n) : n_(n), next_(n, 0) {}

  uint64_t Start(int rank, Op op, const void* send, void* recv, size_t bytes, int root) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t k = next_[rank]++;
    Slot& s = slots_[k];
    if (s.sends.empty()) {
      s.sends.resize(n_);
      s.recvs.resize(n_);
      s.op = op;
      s.bytes = bytes;
      s.root = root;
    }
    if (s.op != op || s.bytes != bytes || s.root != root) s.error = "operation #" + std::to_string(k) + " mismatched";
    s.sends[rank] = send;
    s.recvs[rank] = recv;
    if (++s.started == n_ && s.error.empty()) Run(s);
    return k;
  }

  // 1 done, 0 not, -1 failed.
  int Test(uint64_t k, std::string* error) {
    std::lock_guard<std::mutex> lock(mu_);
    const Slot& s = slots_[k];
    if (!s.error.empty()) {
      *error = s.error;
      return -1;
    }
    return s.started == n_ ? 1 : 0;
  }

  void Post(const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> lock(mu_);
    board_[key] = value;
  }
  std::optional<std::string> Read(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = board_.find(key);
    if (it == board_.end()) return std::nullopt;
    return it->second;
  }

 private:
  struct Slot {
    Op op = Op::kBarrier;
    size_t bytes = 0;
    int root = -1;
    int started = 0;
    std::vector<const void*> sends;
    std::vector<void*> recvs;
    std::string error;
  };

  void Run(Slot& s) {
    const size_t b = s.bytes;
    std::vector<std::vector<std::byte>> in(n_);  // every rank's send, read before any write
    for (int r = 0; r < n_; ++r) {
      const size_t len = s.op == Op::kAllToAll ? b * n_ : s.op == Op::kAllGather ? b : 0;
      if (len) in[r].assign(static_cast<const std::byte*>(s.sends[r]), static_cast<const std::byte*>(s.sends[r]) + len);
    }
    for (int p = 0; p < n_; ++p) {
      auto* out = static_cast<std::byte*>(s.recvs[p]);
      for (int r = 0; r < n_; ++r) {
        if (s.op == Op::kAllGather) std::memcpy(out + r * b, in[r].data(), b);
        if (s.op == Op::kAllToAll) std::memcpy(out + r * b, in[r].data() + p * b, b);
      }
      if (s.op == Op::kBroadcast && p != s.root) std::memcpy(out, s.recvs[s.root], b);
    }
  }

  const int n_;
  std::mutex mu_;
  std::vector<uint64_t> next_;
  std::map<uint64_t, Slot> slots_;
  std::map<std::string, std::string> board_;
};

class FabricTransport final : public Transport {
 public:
  FabricTransport(Fabric* f, int rank, int size) : f_(f), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return size_; }
  Result<Handle> Start(Op op, const void* send, void* recv, size_t bytes, int root) override {
    return reinterpret_cast<Handle>(f_->Start(rank_, op, send, recv, bytes, root) + 1);
  }
  Result<bool> Test(Handle h) override {
    std::string error;
    const int rc = f_->Test(reinterpret_cast<uint64_t>(h) - 1, &error);
    if (rc < 0) return Unavailable(error);
    return rc == 1;
  }
  void Release(Handle) override {}
  Status Post(const std::string& key, const std::string& value) override {
    f_->Post(key, value);
    return Status::Ok();
  }
  Result<std::optional<std::string>> Read(const std::string& key) override { return f_->Read(key); }

 private:
  Fabric* const f_;
  const int rank_, size_;
};

std::unique_ptr<Communicator> Make(Fabric* f, int rank, int n, double timeout = 20) {
  auto comm = CreateTransportCommunicator(std::make_unique<FabricTransport>(f, rank, n),
                                          CommOptions{.timeout_seconds = timeout});
  EXPECT_TRUE(comm.ok()) << comm.status().ToString();
  return comm.ok() ? std::move(*comm) : nullptr;
}

// Rank r's input: element i is a float with bits that differ per rank.
std::vector<float> Input(int r, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * 0.1 + i * 1e-3) * (i % 3 ? 1.f : -1.f);
  return v;
}

// Runs body(rank) on n threads.
template <typename Body>
void OnRanks(int n, Body body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

TEST(TransportCommTest, CollectivesEqualTheRankOrderReduction) {
  constexpr int n = 3;
  constexpr size_t count = 7;  // not a multiple of n: the all-reduce pads
  Fabric fabric(n);
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(Input(r, count * n));
  std::vector<const void*> ins;
  for (auto& v : inputs) ins.push_back(v.data());
  std::vector<float> want_all(count * n);
  ReduceInRankOrder(ins.data(), n, want_all.data(), count * n, DType::kFloat32, ReduceOp::kSum);
  std::vector<float> want_first(count);
  ReduceInRankOrder(ins.data(), n, want_first.data(), count, DType::kFloat32, ReduceOp::kMax);
  OnRanks(n, [&](int r) {
    auto comm = Make(&fabric, r, n);
    InlineHostStream stream;
    std::vector<float> rs(count), ar(count), gathered(count * n), bc = Input(r, count);
    ASSERT_TRUE(comm->ReduceScatter(inputs[r].data(), rs.data(), count, DType::kFloat32, ReduceOp::kSum, stream).ok());
    ASSERT_TRUE(comm->AllReduce(inputs[r].data(), ar.data(), count, DType::kFloat32, ReduceOp::kMax, stream).ok());
    ASSERT_TRUE(comm->AllGather(rs.data(), gathered.data(), count, DType::kFloat32, stream).ok());
    ASSERT_TRUE(comm->Broadcast(bc.data(), count, DType::kFloat32, 2, stream).ok());
    ASSERT_TRUE(comm->Barrier(stream).ok());
    ASSERT_TRUE(stream.Synchronize().ok()) << stream.sticky_error().ToString();
    EXPECT_EQ(0, std::memcmp(rs.data(), want_all.data() + r * count, count * 4)) << "rank " << r;
    EXPECT_EQ(0, std::memcmp(ar.data(), want_first.data(), count * 4)) << "rank " << r;
    EXPECT_EQ(0, std::memcmp(gathered.data(), want_all.data(), count * n * 4)) << "rank " << r;
    EXPECT_EQ(Input(2, count), bc) << "rank " << r;
  });
}

// Two streams per rank; on each rank a different stream reaches its
// collective first. Started as the threads reach them, the fabric would pair
// rank 0's second all-gather with rank 1's first.
TEST(TransportCommTest, CollectivesStartInTheOrderTheyWereEnqueued) {
  constexpr int n = 2;
  constexpr size_t count = 4;
  Fabric fabric(n);
  OnRanks(n, [&](int r) {
    auto device = CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 1 << 20});
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    auto a = (*device)->CreateStream();
    auto b = (*device)->CreateStream();
    ASSERT_TRUE(a.ok() && b.ok());
    auto comm = Make(&fabric, r, n);
    Device& dev = **device;
    std::vector<float> x = Input(r, count), y = Input(r + 10, count), gx(count * n), gy(count * n);
    auto dx = dev.Allocate(count * 4, **a), dy = dev.Allocate(count * 4, **b);
    auto dgx = dev.Allocate(count * n * 4, **a), dgy = dev.Allocate(count * n * 4, **b);
    ASSERT_TRUE(dx.ok() && dy.ok() && dgx.ok() && dgy.ok());
    ASSERT_TRUE(dev.CopyToDevice(*dx, x.data(), count * 4, **a).ok());
    ASSERT_TRUE(dev.CopyToDevice(*dy, y.data(), count * 4, **b).ok());
    Stream& late = r == 0 ? **a : **b;
    ASSERT_TRUE(late.Enqueue([](const StreamContext&) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(100));
                      return Status::Ok();
                    })
                    .ok());
    ASSERT_TRUE(comm->AllGather(*dx, *dgx, count, DType::kFloat32, **a).ok());
    ASSERT_TRUE(comm->AllGather(*dy, *dgy, count, DType::kFloat32, **b).ok());
    ASSERT_TRUE(dev.CopyToHost(gx.data(), *dgx, count * n * 4, **a).ok());
    ASSERT_TRUE(dev.CopyToHost(gy.data(), *dgy, count * n * 4, **b).ok());
    Status sa = (*a)->Synchronize(), sb = (*b)->Synchronize();
    ASSERT_TRUE(sa.ok()) << sa.ToString();
    ASSERT_TRUE(sb.ok()) << sb.ToString();
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(0, std::memcmp(gx.data() + p * count, Input(p, count).data(), count * 4)) << r << " from " << p;
      EXPECT_EQ(0, std::memcmp(gy.data() + p * count, Input(p + 10, count).data(), count * 4)) << r << " from " << p;
    }
    for (void* ptr : {*dx, *dgx}) EXPECT_TRUE(dev.Free(ptr, **a).ok());
    for (void* ptr : {*dy, *dgy}) EXPECT_TRUE(dev.Free(ptr, **b).ok());
    EXPECT_TRUE((*a)->Synchronize().ok());
    EXPECT_TRUE((*b)->Synchronize().ok());
  });
}

TEST(TransportCommTest, APeersAbortIsNamedAtOnce) {
  constexpr int n = 2;
  Fabric fabric(n);
  OnRanks(n, [&](int r) {
    auto comm = Make(&fabric, r, n, /*timeout=*/60);
    if (r == 1) {
      comm->Abort(IoError("pwrite /nvme/x offset=0 len=4096: No space left on device"));
      return;
    }
    InlineHostStream stream;
    std::vector<float> v(8, 1.f);
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(comm->AllReduce(v.data(), v.data(), v.size(), DType::kFloat32, ReduceOp::kSum, stream).ok());
    Status st = stream.Synchronize();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("rank 1 stopped: IoError: pwrite /nvme/x"), std::string::npos) << st.ToString();
    EXPECT_FALSE(comm->Health().ok());
  });
}

TEST(TransportCommTest, ASilentRankIsNamedAtTheDeadline) {
  constexpr int n = 3;
  Fabric fabric(n);
  OnRanks(n, [&](int r) {
    auto comm = Make(&fabric, r, n, /*timeout=*/0.5);
    if (r == 2) return;  // never joins
    InlineHostStream stream;
    ASSERT_TRUE(comm->Barrier(stream).ok());
    Status st = stream.Synchronize();
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("barrier #1: no progress after 0.5 s; silent ranks: 2"), std::string::npos)
        << st.ToString();
    EXPECT_NE(st.message().find("waiting too: rank " + std::to_string(1 - r) + " in barrier #1"), std::string::npos)
        << st.ToString();
  });
}

}  // namespace
}  // namespace zinf::cpu
