// Tests for ReduceInRankOrder and MpiComm. The same binary runs without
// mpirun (label unit: the 1-rank communicator that never calls MPI) and under
// mpirun -np 1, 2 and 4 (label mpi). Every rank derives every rank's input
// from a seeded generator, so each checks its output bit for bit against a
// reference it computes locally. Buffers live on a HostDevice in checking
// mode: a collective that touched an untranslated device pointer would fault.
//
// Every rank runs every test in the same order. A test that fails on one rank
// must not skip collectives the others still make (that would only turn into
// a deadline failure later), so data checks use EXPECT, and ASSERT only
// guards what every rank sees alike.
#include "cpu/mpi_comm.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/communicator.h"
#include "common/float16.h"
#include "cpu/host_device.h"
#include "test_util.h"

namespace zinf::cpu {
namespace {

using Bytes = std::vector<uint8_t>;

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

using test::SplitMix64;
// A finite value with a random sign, mantissa and binary exponent in
// [-exp_range, exp_range]: wide enough that the order of a sum matters.
float RandomFloat(uint64_t bits, int exp_range) {
  const float mantissa = 1.0f + static_cast<float>(bits & 0xffffff) / 16777216.0f;
  const int exponent = static_cast<int>((bits >> 24) % (2 * exp_range + 1)) - exp_range;
  const float v = std::ldexp(mantissa, exponent);
  return (bits >> 40) & 1 ? -v : v;
}

// Element i of `rank`'s input for test `seed`, stored as `dtype`.
void StoreElement(DType dtype, uint8_t* base, size_t i, float v) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(base + 4 * i, &v, 4);
      return;
    case DType::kBFloat16: {
      uint16_t h = FloatToBf16Bits(v);
      std::memcpy(base + 2 * i, &h, 2);
      return;
    }
    case DType::kFloat16: {
      uint16_t h = FloatToHalfBits(v);
      std::memcpy(base + 2 * i, &h, 2);
      return;
    }
  }
}

Bytes MakeInput(DType dtype, uint64_t seed, int rank, size_t count) {
  Bytes out(count * DTypeSizeBytes(dtype));
  // fp16 tops out at 65504: keep sums of a few ranks finite.
  const int exp_range = dtype == DType::kFloat16 ? 8 : 20;
  for (size_t i = 0; i < count; ++i) {
    uint64_t bits = SplitMix64(seed * 0x100000001b3ull ^ SplitMix64(static_cast<uint64_t>(rank) << 40 ^ i));
    StoreElement(dtype, out.data(), i, RandomFloat(bits, exp_range));
  }
  return out;
}

// The specification, written out independently of the implementation:
// fp32 accumulation in rank order, one rounding at the end; max keeps a NaN
// and otherwise takes a later value only when strictly greater; a NaN result
// is the canonical quiet NaN.
Bytes ReferenceReduce(const std::vector<Bytes>& inputs, DType dtype, ReduceOp op, size_t offset, size_t count) {
  Bytes out(count * DTypeSizeBytes(dtype));
  for (size_t i = 0; i < count; ++i) {
    float acc = test::LoadAsFloat(inputs[0].data(), dtype, offset + i);
    for (size_t r = 1; r < inputs.size(); ++r) {
      const float x = test::LoadAsFloat(inputs[r].data(), dtype, offset + i);
      if (op == ReduceOp::kSum) {
        acc = acc + x;
      } else if (!std::isnan(acc) && (std::isnan(x) || x > acc)) {
        acc = x;
      }
    }
    if (std::isnan(acc)) acc = BitsToFloat(0x7fc00000u);  // NaN results are canonical
    StoreElement(dtype, out.data(), i, acc);
  }
  return out;
}

// Bitwise equality, reporting the first differing element.
::testing::AssertionResult BitsEqual(const Bytes& got, const Bytes& want, DType dtype) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size() << " bytes";
  const size_t elem = DTypeSizeBytes(dtype);
  for (size_t i = 0; i < got.size() / elem; ++i) {
    if (std::memcmp(got.data() + i * elem, want.data() + i * elem, elem) != 0) {
      return ::testing::AssertionFailure()
             << DTypeName(dtype) << " element " << i << " of " << got.size() / elem << ": got "
             << test::LoadAsFloat(got.data(), dtype, i) << ", want " << test::LoadAsFloat(want.data(), dtype, i);
    }
  }
  return ::testing::AssertionSuccess();
}

Bytes Slice(const Bytes& b, size_t offset_bytes, size_t bytes) {
  return Bytes(b.begin() + offset_bytes, b.begin() + offset_bytes + bytes);
}

// ---------------------------------------------------------------------------
// ReduceInRankOrder on its own.

std::vector<const void*> Pointers(const std::vector<Bytes>& inputs) {
  std::vector<const void*> p;
  for (const Bytes& b : inputs) p.push_back(b.data());
  return p;
}

TEST(ReduceInRankOrderTest, MatchesTheSpecificationOnRandomDataWithTails) {
  for (DType dtype : kDTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (int n : {1, 2, 3, 5}) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{2048}, size_t{5000}}) {
          std::vector<Bytes> inputs;
          for (int r = 0; r < n; ++r) inputs.push_back(MakeInput(dtype, 11, r, count));
          Bytes out(count * DTypeSizeBytes(dtype));
          ReduceInRankOrder(Pointers(inputs).data(), n, out.data(), count, dtype, op);
          EXPECT_TRUE(BitsEqual(out, ReferenceReduce(inputs, dtype, op, 0, count), dtype))
              << DTypeName(dtype) << " " << ReduceOpName(op) << " n=" << n << " count=" << count;
        }
      }
    }
  }
}

TEST(ReduceInRankOrderTest, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float denorm = std::numeric_limits<float>::denorm_min();
  const std::vector<float> specials = {0.0f,   -0.0f,    inf,   -inf,   nan,  denorm, -denorm,
                                       1e-40f, 65504.0f, 3e38f, -3e38f, 1.0f, -1.0f,  5.96e-8f};
  // Every ordered triple of specials, for every dtype and op.
  const size_t m = specials.size(), count = m * m * m;
  for (DType dtype : kDTypes) {
    std::vector<Bytes> inputs(3, Bytes(count * DTypeSizeBytes(dtype)));
    for (size_t i = 0; i < count; ++i) {
      StoreElement(dtype, inputs[0].data(), i, specials[i % m]);
      StoreElement(dtype, inputs[1].data(), i, specials[(i / m) % m]);
      StoreElement(dtype, inputs[2].data(), i, specials[i / (m * m)]);
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      Bytes out(count * DTypeSizeBytes(dtype));
      ReduceInRankOrder(Pointers(inputs).data(), 3, out.data(), count, dtype, op);
      EXPECT_TRUE(BitsEqual(out, ReferenceReduce(inputs, dtype, op, 0, count), dtype))
          << DTypeName(dtype) << " " << ReduceOpName(op);
    }
  }
}

TEST(ReduceInRankOrderTest, SumsInRankOrder) {
  // fp32: (1e8 + 1) rounds back to 1e8, so rank order gives 0, not 1.
  std::vector<Bytes> inputs(3, Bytes(4));
  StoreElement(DType::kFloat32, inputs[0].data(), 0, 1e8f);
  StoreElement(DType::kFloat32, inputs[1].data(), 0, 1.0f);
  StoreElement(DType::kFloat32, inputs[2].data(), 0, -1e8f);
  float out = -1;
  ReduceInRankOrder(Pointers(inputs).data(), 3, &out, 1, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(out, 0.0f);
  std::swap(inputs[1], inputs[2]);
  ReduceInRankOrder(Pointers(inputs).data(), 3, &out, 1, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(out, 1.0f);
}

TEST(ReduceInRankOrderTest, SixteenBitTypesRoundOnceAtTheEnd) {
  // bf16 has 8 significant bits: 1 + 2^-8 alone rounds to 1 (tie to even),
  // so rounding after each step would give 1; fp32 accumulation gives the
  // exactly representable 1 + 2^-7.
  std::vector<Bytes> inputs(3, Bytes(2));
  StoreElement(DType::kBFloat16, inputs[0].data(), 0, 1.0f);
  StoreElement(DType::kBFloat16, inputs[1].data(), 0, 0.00390625f);
  StoreElement(DType::kBFloat16, inputs[2].data(), 0, 0.00390625f);
  uint16_t out = 0;
  ReduceInRankOrder(Pointers(inputs).data(), 3, &out, 1, DType::kBFloat16, ReduceOp::kSum);
  EXPECT_EQ(Bf16BitsToFloat(out), 1.0078125f);
}

TEST(ReduceInRankOrderTest, NaNIsCanonicalAndMaxBreaksTiesByRank) {
  // NaN payloads and signs differ between CPUs, compilers and GPUs (x86's
  // inf - inf is negative, CUDA's NaN positive): every NaN result is made the
  // canonical quiet NaN, so outputs stay bit-identical everywhere.
  const float nan_a = BitsToFloat(0xffc00001u), nan_b = BitsToFloat(0x7fc00002u);
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<Bytes> inputs(3, Bytes(4 * 4));
  const float values[3][4] = {{1.0f, -0.0f, 2.0f, inf}, {nan_a, 0.0f, nan_b, -inf}, {nan_b, 0.0f, 3.0f, 1.0f}};
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 4; ++i) StoreElement(DType::kFloat32, inputs[r].data(), i, values[r][i]);
  float out[4];
  ReduceInRankOrder(Pointers(inputs).data(), 3, out, 4, DType::kFloat32, ReduceOp::kMax);
  EXPECT_EQ(FloatToBits(out[0]), 0x7fc00000u);
  EXPECT_EQ(FloatToBits(out[1]), FloatToBits(-0.0f));  // +0 > -0 is false: rank 0's zero stays
  EXPECT_EQ(FloatToBits(out[2]), 0x7fc00000u);
  EXPECT_EQ(out[3], inf);
  ReduceInRankOrder(Pointers(inputs).data(), 3, out, 4, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(FloatToBits(out[0]), 0x7fc00000u);
  EXPECT_EQ(FloatToBits(out[3]), 0x7fc00000u);  // inf + -inf
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<Bytes> halves(2, Bytes(2));
    StoreElement(dtype, halves[0].data(), 0, inf);
    StoreElement(dtype, halves[1].data(), 0, -inf);
    uint16_t h = 0;
    ReduceInRankOrder(Pointers(halves).data(), 2, &h, 1, dtype, ReduceOp::kSum);
    EXPECT_EQ(h, dtype == DType::kBFloat16 ? 0x7fc0 : 0x7e00) << DTypeName(dtype);
  }
}

TEST(ReduceInRankOrderTest, OutputMayBeAnInput) {
  for (DType dtype : kDTypes) {
    const size_t count = 4099;
    std::vector<Bytes> inputs;
    for (int r = 0; r < 3; ++r) inputs.push_back(MakeInput(dtype, 5, r, count));
    const Bytes want = ReferenceReduce(inputs, dtype, ReduceOp::kSum, 0, count);
    ReduceInRankOrder(Pointers(inputs).data(), 3, inputs[1].data(), count, dtype, ReduceOp::kSum);
    EXPECT_TRUE(BitsEqual(inputs[1], want, dtype)) << DTypeName(dtype);
  }
}

// ---------------------------------------------------------------------------
// The communicator, on a HostDevice in checking mode.

class MpiCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 64 << 20, .checking = true});
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(*device);
    auto stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    stream_ = std::move(*stream);
    auto comm = CreateMpiCommunicator(CommOptions{.timeout_seconds = 20, .checking = checking_});
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    comm_ = std::move(*comm);
    n_ = comm_->size();
    rank_ = comm_->rank();
  }

  void TearDown() override {
    if (stream_) {
      for (void* p : allocations_) EXPECT_TRUE(device_->Free(p, *stream_).ok());
      EXPECT_TRUE(stream_->Synchronize().ok());
    }
  }

  void* Upload(const Bytes& host) {
    auto p = device_->Allocate(std::max<size_t>(host.size(), 1), *stream_);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    allocations_.push_back(*p);
    if (!host.empty()) {
      // The copy runs later, in stream order: keep the source alive until then.
      const Bytes& source = staged_.emplace_back(host);
      EXPECT_TRUE(device_->CopyToDevice(*p, source.data(), source.size(), *stream_).ok());
    }
    return *p;
  }
  // Filled with 0xEE, so an element a collective forgot to write shows.
  void* Scratch(size_t bytes) { return Upload(Bytes(bytes, 0xEE)); }

  // Waits for the stream and returns the buffer's bytes.
  Bytes Download(const void* device_ptr, size_t bytes) {
    Bytes host(bytes);
    EXPECT_TRUE(device_->CopyToHost(host.data(), device_ptr, bytes, *stream_).ok());
    Status st = stream_->Synchronize();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return host;
  }

  std::vector<Bytes> AllInputs(DType dtype, uint64_t seed, size_t count) const {
    std::vector<Bytes> inputs;
    for (int r = 0; r < n_; ++r) inputs.push_back(MakeInput(dtype, seed, r, count));
    return inputs;
  }

  bool checking_ = false;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Communicator> comm_;
  std::vector<void*> allocations_;
  std::deque<Bytes> staged_;
  int n_ = 0, rank_ = 0;
};

// mpirun -np N here starts every rank on this machine; without a launcher
// the one rank is alone.
TEST_F(MpiCommTest, LocalSizeCountsTheRanksOnThisMachine) { EXPECT_EQ(comm_->local_size(), n_); }

TEST_F(MpiCommTest, WithoutALauncherOneRankNeedsNoMpi) {
  if (StartedByMpiLauncher()) GTEST_SKIP() << "started by mpirun";
  EXPECT_EQ(n_, 1);
  EXPECT_EQ(rank_, 0);
  void* buf = Scratch(16);
  ASSERT_TRUE(comm_->AllReduce(buf, buf, 4, DType::kFloat32, ReduceOp::kSum, *stream_).ok());
  ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  EXPECT_TRUE(stream_->Synchronize().ok());
  int initialized = 1;
  ASSERT_EQ(MPI_Initialized(&initialized), MPI_SUCCESS);  // callable before MPI_Init
  EXPECT_FALSE(initialized) << "the 1-rank communicator initialized MPI";
}

// Uneven splits (count not a multiple of 2 or 4), fewer elements than ranks,
// and the empty collective.
constexpr size_t kCounts[] = {0, 1, 3, 1000, 4099};

TEST_F(MpiCommTest, AllGatherMatchesReference) {
  for (DType dtype : kDTypes) {
    for (size_t count : kCounts) {
      const size_t bytes = count * DTypeSizeBytes(dtype);
      const std::vector<Bytes> inputs = AllInputs(dtype, 1, count);
      void* send = Upload(inputs[rank_]);
      void* recv = Scratch(bytes * n_);
      ASSERT_TRUE(comm_->AllGather(send, recv, count, dtype, *stream_).ok());
      const Bytes got = Download(recv, bytes * n_);
      for (int r = 0; r < n_; ++r)
        EXPECT_TRUE(BitsEqual(Slice(got, r * bytes, bytes), inputs[r], dtype))
            << DTypeName(dtype) << " count " << count << " from rank " << r;
    }
  }
}

TEST_F(MpiCommTest, ReduceScatterMatchesReference) {
  for (DType dtype : kDTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (size_t count : kCounts) {
        const size_t bytes = count * DTypeSizeBytes(dtype);
        const std::vector<Bytes> inputs = AllInputs(dtype, 2, count * n_);
        void* send = Upload(inputs[rank_]);
        void* recv = Scratch(bytes);
        ASSERT_TRUE(comm_->ReduceScatter(send, recv, count, dtype, op, *stream_).ok());
        EXPECT_TRUE(BitsEqual(Download(recv, bytes), ReferenceReduce(inputs, dtype, op, rank_ * count, count), dtype))
            << DTypeName(dtype) << " " << ReduceOpName(op) << " count " << count;
      }
    }
  }
}

TEST_F(MpiCommTest, AllReduceMatchesReference) {
  for (DType dtype : kDTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (size_t count : kCounts) {
        const size_t bytes = count * DTypeSizeBytes(dtype);
        const std::vector<Bytes> inputs = AllInputs(dtype, 3, count);
        void* send = Upload(inputs[rank_]);
        void* recv = Scratch(bytes);
        ASSERT_TRUE(comm_->AllReduce(send, recv, count, dtype, op, *stream_).ok());
        EXPECT_TRUE(BitsEqual(Download(recv, bytes), ReferenceReduce(inputs, dtype, op, 0, count), dtype))
            << DTypeName(dtype) << " " << ReduceOpName(op) << " count " << count;
      }
    }
  }
}

TEST_F(MpiCommTest, ReduceScatterThenAllGatherIsAllReduce) {
  for (DType dtype : kDTypes) {
    const size_t per_rank = 777;
    const size_t count = per_rank * n_, bytes = count * DTypeSizeBytes(dtype);
    const std::vector<Bytes> inputs = AllInputs(dtype, 4, count);
    void* send = Upload(inputs[rank_]);
    void* shard = Scratch(bytes / n_);
    void* gathered = Scratch(bytes);
    void* reduced = Scratch(bytes);
    ASSERT_TRUE(comm_->ReduceScatter(send, shard, per_rank, dtype, ReduceOp::kSum, *stream_).ok());
    ASSERT_TRUE(comm_->AllGather(shard, gathered, per_rank, dtype, *stream_).ok());
    ASSERT_TRUE(comm_->AllReduce(send, reduced, count, dtype, ReduceOp::kSum, *stream_).ok());
    const Bytes want = ReferenceReduce(inputs, dtype, ReduceOp::kSum, 0, count);
    EXPECT_TRUE(BitsEqual(Download(gathered, bytes), Download(reduced, bytes), dtype)) << DTypeName(dtype);
    EXPECT_TRUE(BitsEqual(Download(reduced, bytes), want, dtype)) << DTypeName(dtype);
  }
}

TEST_F(MpiCommTest, RepeatedRunsAreBitIdentical) {
  const size_t count = 10007;
  const std::vector<Bytes> inputs = AllInputs(DType::kFloat32, 6, count);
  void* send = Upload(inputs[rank_]);
  Bytes first;
  for (int run = 0; run < 5; ++run) {
    void* recv = Scratch(count * 4);
    ASSERT_TRUE(comm_->AllReduce(send, recv, count, DType::kFloat32, ReduceOp::kSum, *stream_).ok());
    Bytes got = Download(recv, count * 4);
    if (run == 0)
      first = got;
    else
      EXPECT_TRUE(BitsEqual(got, first, DType::kFloat32)) << "run " << run;
  }
  EXPECT_TRUE(BitsEqual(first, ReferenceReduce(inputs, DType::kFloat32, ReduceOp::kSum, 0, count), DType::kFloat32));
}

TEST_F(MpiCommTest, InPlace) {
  const DType dtype = DType::kBFloat16;
  const size_t count = 1001, elem = 2;
  // AllReduce with send == recv.
  std::vector<Bytes> inputs = AllInputs(dtype, 7, count);
  void* buf = Upload(inputs[rank_]);
  ASSERT_TRUE(comm_->AllReduce(buf, buf, count, dtype, ReduceOp::kSum, *stream_).ok());
  EXPECT_TRUE(BitsEqual(Download(buf, count * elem), ReferenceReduce(inputs, dtype, ReduceOp::kSum, 0, count), dtype));
  // ReduceScatter into this rank's own block of the input.
  inputs = AllInputs(dtype, 8, count * n_);
  buf = Upload(inputs[rank_]);
  void* own = static_cast<char*>(buf) + rank_ * count * elem;
  ASSERT_TRUE(comm_->ReduceScatter(buf, own, count, dtype, ReduceOp::kSum, *stream_).ok());
  EXPECT_TRUE(BitsEqual(Slice(Download(buf, count * n_ * elem), rank_ * count * elem, count * elem),
                        ReferenceReduce(inputs, dtype, ReduceOp::kSum, rank_ * count, count), dtype));
  // AllGather from this rank's own block of the output.
  inputs = AllInputs(dtype, 9, count);
  Bytes initial(count * n_ * elem, 0);
  std::copy(inputs[rank_].begin(), inputs[rank_].end(), initial.begin() + rank_ * count * elem);
  buf = Upload(initial);
  own = static_cast<char*>(buf) + rank_ * count * elem;
  ASSERT_TRUE(comm_->AllGather(own, buf, count, dtype, *stream_).ok());
  const Bytes got = Download(buf, count * n_ * elem);
  for (int r = 0; r < n_; ++r) EXPECT_TRUE(BitsEqual(Slice(got, r * count * elem, count * elem), inputs[r], dtype));
}

TEST_F(MpiCommTest, BroadcastFromEveryRoot) {
  for (DType dtype : kDTypes) {
    for (int root = 0; root < n_; ++root) {
      const size_t count = 513, bytes = count * DTypeSizeBytes(dtype);
      const Bytes mine = MakeInput(dtype, 10, rank_, count);
      void* buf = Upload(mine);
      ASSERT_TRUE(comm_->Broadcast(buf, count, dtype, root, *stream_).ok());
      EXPECT_TRUE(BitsEqual(Download(buf, bytes), MakeInput(dtype, 10, root, count), dtype))
          << DTypeName(dtype) << " root " << root;
    }
  }
}

TEST_F(MpiCommTest, MaxAllReduceCarriesOverflowFlags) {
  // The loss-scaling use: any rank's inf or NaN must reach every rank.
  const float inf = std::numeric_limits<float>::infinity();
  float flags[2] = {0.0f, 0.0f};
  if (rank_ == n_ - 1) flags[0] = inf;
  if (rank_ == 0) flags[1] = std::numeric_limits<float>::quiet_NaN();
  void* buf = Upload(Bytes(reinterpret_cast<uint8_t*>(flags), reinterpret_cast<uint8_t*>(flags) + 8));
  ASSERT_TRUE(comm_->AllReduce(buf, buf, 2, DType::kFloat32, ReduceOp::kMax, *stream_).ok());
  const Bytes got = Download(buf, 8);
  EXPECT_EQ(test::LoadAsFloat(got.data(), DType::kFloat32, 0), inf);
  EXPECT_TRUE(std::isnan(test::LoadAsFloat(got.data(), DType::kFloat32, 1)));
}

TEST_F(MpiCommTest, BarrierWaitsForEveryRank) {
  // steady_clock is CLOCK_MONOTONIC: one clock for every process on the node.
  auto now_ns = [] { return static_cast<int64_t>(std::chrono::steady_clock::now().time_since_epoch().count()); };
  void* all_entered = Scratch(8 * n_);
  ASSERT_TRUE(stream_->Synchronize().ok());
  // Later ranks arrive later; nobody may leave before the last has arrived.
  std::this_thread::sleep_for(std::chrono::milliseconds(30 * rank_));
  int64_t entered = now_ns();
  ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  const int64_t left = now_ns();
  // The times travel as raw bytes: two "fp32" elements per int64.
  void* mine = Upload(Bytes(reinterpret_cast<uint8_t*>(&entered), reinterpret_cast<uint8_t*>(&entered) + 8));
  ASSERT_TRUE(comm_->AllGather(mine, all_entered, 2, DType::kFloat32, *stream_).ok());
  const Bytes all = Download(all_entered, 8 * n_);
  for (int r = 0; r < n_; ++r) {
    int64_t t;
    std::memcpy(&t, all.data() + 8 * r, 8);
    EXPECT_LE(t, left) << "rank " << r << " entered the barrier " << (t - left) / 1000 << " us after rank " << rank_
                       << " left it";
  }
}

TEST_F(MpiCommTest, CollectivesOnConcurrentStreams) {
  // Two streams, two collectives in flight at once, in different orders on
  // different ranks' worker threads: tags keep them apart.
  auto other = device_->CreateStream();
  ASSERT_TRUE(other.ok());
  const size_t count = 3000;
  const std::vector<Bytes> a = AllInputs(DType::kFloat32, 12, count);
  const std::vector<Bytes> b = AllInputs(DType::kFloat16, 13, count);
  void* send_a = Upload(a[rank_]);
  void* recv_a = Scratch(count * 4);
  void* send_b = Upload(b[rank_]);
  void* recv_b = Scratch(count * 2 * n_);
  ASSERT_TRUE(stream_->Synchronize().ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(comm_->AllReduce(send_a, recv_a, count, DType::kFloat32, ReduceOp::kSum, *stream_).ok());
    ASSERT_TRUE(comm_->AllGather(send_b, recv_b, count, DType::kFloat16, **other).ok());
  }
  ASSERT_TRUE((*other)->Synchronize().ok());
  EXPECT_TRUE(BitsEqual(Download(recv_a, count * 4), ReferenceReduce(a, DType::kFloat32, ReduceOp::kSum, 0, count),
                        DType::kFloat32));
  Bytes host(count * 2 * n_);
  ASSERT_TRUE(device_->CopyToHost(host.data(), recv_b, host.size(), **other).ok());
  ASSERT_TRUE((*other)->Synchronize().ok());
  for (int r = 0; r < n_; ++r) EXPECT_TRUE(BitsEqual(Slice(host, r * count * 2, count * 2), b[r], DType::kFloat16));
}

TEST_F(MpiCommTest, InvalidArgumentsAreRefusedAtEnqueue) {
  void* buf = Scratch(16);
  Status st = comm_->Broadcast(buf, 4, DType::kFloat32, n_, *stream_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("root " + std::to_string(n_)), std::string::npos) << st.message();
  st = comm_->AllReduce(nullptr, buf, 4, DType::kFloat32, ReduceOp::kSum, *stream_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  st = comm_->AllGather(buf, buf, 4, static_cast<DType>(7), *stream_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  // Nothing was enqueued and no sequence number was used: a real collective
  // still lines up with the other ranks.
  ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  EXPECT_TRUE(stream_->Synchronize().ok());
}

TEST_F(MpiCommTest, MismatchedCountsWithoutCheckingFailAndBreakTheCommunicator) {
  if (n_ < 2) GTEST_SKIP() << "needs 2 or more ranks";
  // Rank 1 gathers 16 elements, everyone else 8: some ranks get a message
  // longer than their buffer (MPI truncation), rank 1 shorter ones.
  const size_t count = rank_ == 1 ? 16 : 8;
  void* send = Scratch(64);
  void* recv = Scratch(64 * n_);
  ASSERT_TRUE(stream_->Synchronize().ok());
  ASSERT_TRUE(comm_->AllGather(send, recv, count, DType::kFloat32, *stream_).ok());
  Status st = stream_->Synchronize();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("all_gather #1 (fp32, " + std::to_string(count) + " elements)"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("do the ranks pass the same arguments?"), std::string::npos) << st.message();
  // Messages may be half-delivered: the communicator refuses further work.
  Status later = comm_->Barrier(*stream_);
  EXPECT_EQ(later.code(), StatusCode::kUnavailable) << later.ToString();
  auto fresh = device_->CreateStream();
  ASSERT_TRUE(fresh.ok());
  stream_ = std::move(*fresh);
}

// One rank fails on its own (Abort) while the others wait in an all-reduce
// it will never join: they must fail at once, well before the 20 s
// deadline, naming the rank and its cause, and so must every later call.
TEST_F(MpiCommTest, AbortStopsEveryRankWithTheCause) {
  const int victim = n_ - 1;
  ASSERT_TRUE(comm_->Health().ok());
  // Every rank has seen a healthy communicator before the victim aborts.
  ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  if (rank_ == victim) {
    if (n_ > 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are waiting by now
    comm_->Abort(OutOfMemory("test: a rank-local shortage"));
    comm_->Abort(IoError("a second cause is ignored"));
    Status h = comm_->Health();
    EXPECT_EQ(h.code(), StatusCode::kOutOfMemory) << h.ToString();
    EXPECT_NE(h.message().find("test: a rank-local shortage"), std::string::npos) << h.ToString();
    void* buf = Scratch(64);
    Status later = comm_->AllReduce(buf, buf, 16, DType::kFloat32, ReduceOp::kSum, *stream_);
    EXPECT_EQ(later.code(), StatusCode::kUnavailable) << later.ToString();
    EXPECT_NE(later.message().find("test: a rank-local shortage"), std::string::npos) << later.ToString();
    return;
  }
  void* buf = Scratch(64);
  ASSERT_TRUE(stream_->Synchronize().ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(comm_->AllReduce(buf, buf, 16, DType::kFloat32, ReduceOp::kSum, *stream_).ok());
  Status st = stream_->Synchronize();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  const std::string named = "rank " + std::to_string(victim) + " stopped: OutOfMemory: test: a rank-local shortage";
  EXPECT_NE(st.message().find(named), std::string::npos) << st.ToString();
  EXPECT_LT(waited, 5.0) << "the notice should end the wait, not the 20 s deadline";
  Status h = comm_->Health();
  EXPECT_EQ(h.code(), StatusCode::kUnavailable) << h.ToString();
  EXPECT_NE(h.message().find(named), std::string::npos) << h.ToString();
  EXPECT_EQ(comm_->Barrier(*stream_).code(), StatusCode::kUnavailable);
  auto fresh = device_->CreateStream();  // the old one keeps the collective's error
  ASSERT_TRUE(fresh.ok());
  stream_ = std::move(*fresh);
}

// The root finishes a broadcast, then stops (Abort). A rank that learns of
// the stop before its own part of that broadcast runs still finishes it with
// the root's data: every rank did its part, and failing there would leave
// the ranks disagreeing on a collective that completed. Later calls fail,
// naming the root.
TEST_F(MpiCommTest, ACollectiveTheStoppedRankFinishedStillFinishesAtItsPeers) {
  if (n_ < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const int root = n_ - 1;
  const size_t count = 16;  // 64 bytes: the root's sends complete eagerly
  const Bytes data = MakeInput(DType::kFloat32, 12, root, count);
  void* buf = Upload(rank_ == root ? data : Bytes(count * 4, 0xEE));
  ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  // The root stops only once every other rank has enqueued its broadcast
  // (a barrier on a second communicator and stream says so): a rank that
  // saw the notice first would rightly refuse to start the broadcast at all.
  auto gate = CreateMpiCommunicator(CommOptions{.timeout_seconds = 20});
  ASSERT_TRUE(gate.ok()) << gate.status().ToString();
  auto gate_stream = device_->CreateStream();
  ASSERT_TRUE(gate_stream.ok()) << gate_stream.status().ToString();
  const std::string cause = "test: the root stops after its broadcast";
  if (rank_ == root) {
    ASSERT_TRUE((*gate)->Barrier(**gate_stream).ok());
    ASSERT_TRUE((*gate_stream)->Synchronize().ok());
    ASSERT_TRUE(comm_->Broadcast(buf, count, DType::kFloat32, root, *stream_).ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
    comm_->Abort(IoError(cause));
    EXPECT_EQ(comm_->Barrier(*stream_).code(), StatusCode::kUnavailable);
    return;
  }
  // This rank's part waits in stream order until it has seen the notice.
  std::atomic<bool> seen{false};
  ASSERT_TRUE(stream_
                  ->Enqueue([&seen](const StreamContext&) {
                    while (!seen.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                    return Status::Ok();
                  })
                  .ok());
  ASSERT_TRUE(comm_->Broadcast(buf, count, DType::kFloat32, root, *stream_).ok());
  ASSERT_TRUE((*gate)->Barrier(**gate_stream).ok());
  ASSERT_TRUE((*gate_stream)->Synchronize().ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (comm_->Health().ok() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  Status h = comm_->Health();
  seen.store(true);
  EXPECT_EQ(h.code(), StatusCode::kUnavailable) << h.ToString();
  const std::string named = "rank " + std::to_string(root) + " stopped: IoError: " + cause;
  EXPECT_NE(h.message().find(named), std::string::npos) << h.ToString();
  Status st = stream_->Synchronize();
  EXPECT_TRUE(st.ok()) << "the broadcast the root finished: " << st.ToString();
  EXPECT_TRUE(BitsEqual(Download(buf, count * 4), data, DType::kFloat32));
  Status later = comm_->Barrier(*stream_);
  EXPECT_EQ(later.code(), StatusCode::kUnavailable) << later.ToString();
  EXPECT_NE(later.message().find(named), std::string::npos) << later.ToString();
}

// Rank 0 stops (Abort) inside an all-gather of 4 MiB a rank that the others
// join only later, then destroys the device its buffers live on, as a
// process does on its way out. Its sends are waiting for their receivers by
// then, and MPI cannot cancel a send: once the others post their receives,
// the transport reads rank 0's buffer, in whatever MPI call of either side
// makes progress (here the barriers of a fresh communicator, or
// MPI_Finalize at exit). No rank may fault, and every rank's all-gather
// must fail with the cause.
TEST_F(MpiCommTest, AStoppedRanksSendsOutliveItsDevice) {
  if (n_ < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const size_t count = size_t{1} << 20;  // 4 MiB of fp32 a rank: far above any eager limit
  auto device = CreateHostDevice(DeviceOptions{.spec = "cpu", .memory_budget = 64 << 20});
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  auto send = (*device)->Allocate(count * sizeof(float), **stream);
  auto recv = (*device)->Allocate(count * n_ * sizeof(float), **stream);
  ASSERT_TRUE(send.ok() && recv.ok());
  ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
  const std::string cause = "test: rank 0 stops while its sends wait";
  std::thread aborter;
  if (rank_ == 0) {
    aborter = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      comm_->Abort(IoError(cause));
    });
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
  }
  ASSERT_TRUE(comm_->AllGather(*send, *recv, count, DType::kFloat32, **stream).ok());
  Status st = (*stream)->Synchronize();
  if (aborter.joinable()) aborter.join();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find(cause), std::string::npos) << st.ToString();
  if (rank_ != 0) {
    EXPECT_NE(st.message().find("rank 0 stopped"), std::string::npos) << st.ToString();
  }
  stream->reset();
  device->reset();

  auto other = CreateMpiCommunicator(CommOptions{.timeout_seconds = 20});
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE((*other)->Barrier(*stream_).ok());
    ASSERT_TRUE(stream_->Synchronize().ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

class CheckingMpiCommTest : public MpiCommTest {
 protected:
  void SetUp() override {
    checking_ = true;
    MpiCommTest::SetUp();
  }
};

TEST_F(CheckingMpiCommTest, MatchingCallsPass) {
  const size_t count = 100;
  const std::vector<Bytes> inputs = AllInputs(DType::kFloat16, 14, count);
  void* send = Upload(inputs[rank_]);
  void* recv = Scratch(count * 2);
  ASSERT_TRUE(comm_->AllReduce(send, recv, count, DType::kFloat16, ReduceOp::kSum, *stream_).ok());
  ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  EXPECT_TRUE(BitsEqual(Download(recv, count * 2), ReferenceReduce(inputs, DType::kFloat16, ReduceOp::kSum, 0, count),
                        DType::kFloat16));
}

TEST_F(CheckingMpiCommTest, SizeMismatchNamesBothRanks) {
  if (n_ < 2) GTEST_SKIP() << "needs 2 or more ranks";
  // Rank 1 passes 16 elements, everyone else 8.
  const size_t count = rank_ == 1 ? 16 : 8;
  void* send = Scratch(64);
  void* recv = Scratch(64);
  ASSERT_TRUE(stream_->Synchronize().ok());
  ASSERT_TRUE(comm_->AllReduce(send, recv, count, DType::kFloat32, ReduceOp::kSum, *stream_).ok());
  Status st = stream_->Synchronize();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("rank 0 called all_reduce #1 (fp32, 8 elements)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 1 called all_reduce #1 (fp32, 16 elements)"), std::string::npos) << st.message();
  // A mismatch caught before any data moved leaves the communicator usable.
  auto fresh = device_->CreateStream();
  ASSERT_TRUE(fresh.ok());
  stream_ = std::move(*fresh);
  ASSERT_TRUE(comm_->Broadcast(send, 8, DType::kFloat32, 0, *stream_).ok());
  st = stream_->Synchronize();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(CheckingMpiCommTest, KindMismatchNamesBothRanks) {
  if (n_ < 2) GTEST_SKIP() << "needs 2 or more ranks";
  void* buf = Scratch(64);
  ASSERT_TRUE(stream_->Synchronize().ok());
  if (rank_ == 0)
    ASSERT_TRUE(comm_->Broadcast(buf, 4, DType::kBFloat16, 0, *stream_).ok());
  else
    ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  Status st = stream_->Synchronize();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("rank 0 called broadcast #1 (bf16, 4 elements, root 0), rank 1 called barrier #1"),
            std::string::npos)
      << st.message();
  // The stream keeps its sticky error; the communicator stays usable.
  auto fresh = device_->CreateStream();
  ASSERT_TRUE(fresh.ok());
  stream_ = std::move(*fresh);
  ASSERT_TRUE(comm_->Barrier(*stream_).ok());
  st = stream_->Synchronize();
  EXPECT_TRUE(st.ok()) << st.ToString();
}

}  // namespace
}  // namespace zinf::cpu
