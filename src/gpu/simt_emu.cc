// The SIMT emulation (simt_emu.h): threads as ucontext fibers, scheduled
// cooperatively on the calling thread; a warp instruction or a barrier is
// where a fiber yields until its warp or block has arrived.
#include "gpu/simt_emu.h"

#include <ucontext.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define ZINF_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZINF_EMU_ASAN 1
#endif
#endif
#if defined(ZINF_EMU_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

namespace zinf::gpu::emu {
namespace {

constexpr int kWarpSize = 32;
// Each fiber's stack: the kernels keep their tiles' fragments in locals,
// and sanitizer builds grow frames several times over.
constexpr size_t kStackBytes = size_t{256} << 10;

enum class Wait { kNone, kWarp, kBlock };
enum class WarpOp { kShfl, kShflIdx, kMma, kLdm, kLdmTrans };

const char* OpName(WarpOp op) {
  switch (op) {
    case WarpOp::kShfl:
      return "shfl.xor";
    case WarpOp::kShflIdx:
      return "shfl.idx";
    case WarpOp::kMma:
      return "mma.sync m16n8k16";
    case WarpOp::kLdm:
      return "ldmatrix.x4";
    case WarpOp::kLdmTrans:
      return "ldmatrix.x4.trans";
  }
  return "?";
}

struct PendingCopy {
  unsigned char* dst;
  int bytes, src_bytes;
  unsigned char data[16];
};

struct Thread {
  ucontext_t ctx;
  std::unique_ptr<char[]> stack;
  Dim3 idx;
  int warp = 0, lane = 0;
  bool done = false;
  Wait wait = Wait::kNone;
  uint64_t wait_gen = 0;
  size_t wait_group = 0;  // with Wait::kWarp: the index of the group in its warp
  std::vector<PendingCopy> copies;
  void* fake_stack = nullptr;  // AddressSanitizer's, across switches
};

// A lane's operands of a warp instruction, and its results.
struct LaneIn {
  uint32_t a[4];
  uint32_t b[2];
  float c[4];
  const unsigned char* p;
  int arg;  // shfl: the lane mask (xor) or source lane (idx)
};
struct LaneOut {
  uint32_t r[4];
  float d[4];
};

// The lanes of a warp that take part in one instruction (its member
// mask: all 32 but for a shfl with a narrower mask, e.g. a half-warp's).
struct Group {
  uint32_t members = 0;
  WarpOp op = WarpOp::kShfl;
  int arg = 0, width = kWarpSize;  // shfl's, the same for every member
  int arrived = 0;
  uint64_t gen = 0;
  LaneIn in[kWarpSize];
  LaneOut out[kWarpSize];
};
struct WarpState {
  std::vector<Group> groups;  // one per member mask in use (a warp's halves may be at different shuffles)
  bool Waiting(int lane) const {
    for (const Group& g : groups) {
      if (g.arrived > 0 && (g.members >> lane & 1u)) return true;
    }
    return false;
  }
};

// Thrown inside a fiber for a broken rule; caught at the fiber's base.
struct Broken {
  std::string what;
};

struct Machine {
  LaunchConfig cfg;
  const std::function<void()>* kernel = nullptr;
  std::vector<Thread> threads;
  std::vector<WarpState> warps;
  unsigned char* smem = nullptr;                              // this block's, cfg.smem_bytes
  unsigned char* static_smem = nullptr;                       // kStaticSmemBytes
  std::vector<std::pair<const void*, size_t>> static_arrays;  // key, offset: this block's
  size_t static_used = 0;
  Dim3 block_idx;
  int live = 0;
  int barrier_arrived = 0;
  uint64_t barrier_gen = 0;
  ucontext_t sched;
  Thread* current = nullptr;
  std::string error;
  // AddressSanitizer's view of the scheduler's stack.
  void* sched_fake_stack = nullptr;
  const void* sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
};

thread_local Machine* g_machine = nullptr;

Machine& M() { return *g_machine; }
Thread& Current() { return *M().current; }

std::string Where(const Thread& t) {
  const Dim3& b = M().block_idx;
  return "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ") thread (" +
         std::to_string(t.idx.x) + "," + std::to_string(t.idx.y) + "," + std::to_string(t.idx.z) + ")";
}

[[noreturn]] void Fail(const std::string& what) { throw Broken{Where(Current()) + ": " + what}; }

// From a fiber to the scheduler; returns when the scheduler resumes it.
// `final`: the fiber has finished and is never resumed.
void ToScheduler(Thread& t, bool final) {
#if defined(ZINF_EMU_ASAN)
  __sanitizer_start_switch_fiber(final ? nullptr : &t.fake_stack, M().sched_stack_bottom, M().sched_stack_size);
#else
  (void) final;
#endif
  swapcontext(&t.ctx, &M().sched);
#if defined(ZINF_EMU_ASAN)
  __sanitizer_finish_switch_fiber(t.fake_stack, &M().sched_stack_bottom, &M().sched_stack_size);
#endif
}

// Blocks the current fiber until `gen` moves past `seen`.
void WaitFor(Wait kind, uint64_t seen) {
  Thread& t = Current();
  t.wait = kind;
  t.wait_gen = seen;
  ToScheduler(t, false);
  t.wait = Wait::kNone;
}

void LandCopy(const PendingCopy& c) {
  std::memcpy(c.dst, c.data, static_cast<size_t>(c.src_bytes));
  std::memset(c.dst + c.src_bytes, 0, static_cast<size_t>(c.bytes - c.src_bytes));
}

void ApplyCopies(Thread& t) {
  for (const PendingCopy& c : t.copies) LandCopy(c);
  t.copies.clear();
}

void Finish(Thread& t) {
  Machine& m = M();
  ApplyCopies(t);  // copies complete whether or not the thread waited
  t.done = true;
  --m.live;
  for (const Group& g : m.warps[static_cast<size_t>(t.warp)].groups) {
    if (g.arrived > 0 && (g.members >> t.lane & 1u) && m.error.empty()) {
      m.error = Where(t) + ": returned while its warp waits at " + OpName(g.op);
    }
  }
  if (m.barrier_arrived > 0 && m.barrier_arrived == m.live) {  // the exited thread counts as arrived
    m.barrier_arrived = 0;
    ++m.barrier_gen;
  }
}

void Entry() {
  Machine& m = M();
  Thread& t = Current();
#if defined(ZINF_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &m.sched_stack_bottom, &m.sched_stack_size);
#endif
  try {
    (*m.kernel)();
  } catch (const Broken& b) {
    if (m.error.empty()) m.error = b.what;
  }
  Finish(t);
  ToScheduler(t, true);
}

// The warp instruction `op` over the lanes of `members` (this lane among
// them), with this lane's operands: waits for the other members, the last
// of which computes every member's result.
template <class Compute>
LaneOut WarpCollective(WarpOp op, uint32_t members, int width, const LaneIn& in, Compute compute) {
  Machine& m = M();
  Thread& t = Current();
  if (!(members >> t.lane & 1u)) Fail(std::string(OpName(op)) + " with a member mask that leaves out the lane itself");
  WarpState& w = m.warps[static_cast<size_t>(t.warp)];
  const size_t first = static_cast<size_t>(t.warp) * kWarpSize;
  for (int l = 0; l < kWarpSize; ++l) {
    if ((members >> l & 1u) && m.threads[first + static_cast<size_t>(l)].done) {
      Fail(std::string(OpName(op)) + " while lane " + std::to_string(l) + " of its mask has returned");
    }
  }
  size_t gi = w.groups.size();
  for (size_t i = 0; i < w.groups.size(); ++i) {
    const Group& g = w.groups[i];
    if (g.members == members) {
      gi = i;
    } else if (g.arrived > 0 && (g.members & members) != 0) {
      Fail(std::string("divergent warp: ") + OpName(op) + " over lanes " + std::to_string(members) +
           " while lanes of it wait at " + OpName(g.op) + " over " + std::to_string(g.members));
    }
  }
  if (gi == w.groups.size()) {
    w.groups.emplace_back();
    w.groups.back().members = members;
  }
  Group& g = w.groups[gi];
  if (g.arrived == 0) {
    g.op = op;
    g.arg = in.arg;
    g.width = width;
  } else if (g.op != op || g.arg != in.arg || g.width != width) {
    Fail(std::string("divergent warp: this lane at ") + OpName(op) + ", others at " + OpName(g.op) +
         (g.op == op ? " with another lane argument" : ""));
  }
  g.in[t.lane] = in;
  if (++g.arrived == std::popcount(members)) {
    compute(g);
    g.arrived = 0;
    ++g.gen;
  } else {
    t.wait_group = gi;
    WaitFor(Wait::kWarp, g.gen);
  }
  return m.warps[static_cast<size_t>(t.warp)].groups[gi].out[t.lane];
}

constexpr uint32_t kAllLanes = 0xffffffffu;

bool InSmem(const unsigned char* p, size_t bytes) {
  const Machine& m = M();
  return (p >= m.smem && p + bytes <= m.smem + m.cfg.smem_bytes) ||
         (p >= m.static_smem && p + bytes <= m.static_smem + m.static_used);
}

void CheckShared(const void* p, size_t bytes, const char* what) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (!InSmem(c, bytes)) {
    Fail(std::string(what) + ": " + std::to_string(bytes) + " bytes at " + std::to_string(c - M().smem) +
         " outside the block's " + std::to_string(M().cfg.smem_bytes) + " bytes of shared memory");
  }
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    Fail(std::string(what) + ": shared address at byte " + std::to_string(c - M().smem) + " not " +
         std::to_string(bytes) + "-byte aligned");
  }
}

float Bf16Lo(uint32_t r) {
  const uint32_t u = r << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float Bf16Hi(uint32_t r) {
  const uint32_t u = r & 0xffff0000u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void Resume(Machine& m, Thread& t) {
  m.current = &t;
#if defined(ZINF_EMU_ASAN)
  __sanitizer_start_switch_fiber(&m.sched_fake_stack, t.stack.get(), kStackBytes);
#endif
  swapcontext(&m.sched, &t.ctx);
#if defined(ZINF_EMU_ASAN)
  __sanitizer_finish_switch_fiber(m.sched_fake_stack, nullptr, nullptr);
#endif
  m.current = nullptr;
}

bool Runnable(const Machine& m, const Thread& t) {
  if (t.done) return false;
  switch (t.wait) {
    case Wait::kNone:
      return true;
    case Wait::kWarp:
      return m.warps[static_cast<size_t>(t.warp)].groups[t.wait_group].gen != t.wait_gen;
    case Wait::kBlock:
      return m.barrier_gen != t.wait_gen;
  }
  return false;
}

std::string Stuck(const Machine& m) {
  int at_barrier = 0, at_warp = 0;
  const Thread* example = nullptr;
  for (const Thread& t : m.threads) {
    if (t.done) continue;
    if (t.wait == Wait::kBlock) ++at_barrier;
    if (t.wait == Wait::kWarp) {
      ++at_warp;
      if (!example) example = &t;
    }
  }
  std::string s = "deadlock in block (" + std::to_string(m.block_idx.x) + "," + std::to_string(m.block_idx.y) + "," +
                  std::to_string(m.block_idx.z) + "): " + std::to_string(at_barrier) + " threads at __syncthreads, " +
                  std::to_string(at_warp) + " at warp instructions";
  if (example) {
    const Group& g = m.warps[static_cast<size_t>(example->warp)].groups[example->wait_group];
    s += " (warp " + std::to_string(example->warp) + " at " + OpName(g.op) + ", " + std::to_string(g.arrived) + " of " +
         std::to_string(std::popcount(g.members)) + " lanes arrived)";
  }
  return s;
}

// A fresh context for t that starts in Entry. Kept out of line: getcontext
// returns twice, which would leave the caller's locals in doubt.
[[gnu::noinline]] bool MakeFiber(Thread& t) {
  if (getcontext(&t.ctx) != 0) return false;
  t.ctx.uc_stack.ss_sp = t.stack.get();
  t.ctx.uc_stack.ss_size = kStackBytes;
  t.ctx.uc_link = nullptr;
  makecontext(&t.ctx, &Entry, 0);
  return true;
}

Status RunBlock(Machine& m, uint64_t& rng) {
  const size_t n = m.threads.size();
  std::memset(m.smem, 0xff, m.cfg.smem_bytes);
  std::memset(m.static_smem, 0xff, kStaticSmemBytes);
  m.static_arrays.clear();
  m.static_used = 0;
  m.live = static_cast<int>(n);
  m.barrier_arrived = 0;
  for (WarpState& w : m.warps) w.groups.clear();
  const Dim3 bd = m.cfg.block;
  for (size_t i = 0; i < n; ++i) {
    Thread& t = m.threads[i];
    t.idx = Dim3{static_cast<unsigned>(i % bd.x), static_cast<unsigned>(i / bd.x % bd.y),
                 static_cast<unsigned>(i / (bd.x * bd.y))};
    t.warp = static_cast<int>(i / kWarpSize);
    t.lane = static_cast<int>(i % kWarpSize);
    t.done = false;
    t.wait = Wait::kNone;
    t.copies.clear();
    t.fake_stack = nullptr;
    if (!MakeFiber(t)) return Internal("simt emulation: getcontext failed");
  }
  const size_t warps = m.warps.size();
  std::vector<size_t> order(warps);
  for (size_t w = 0; w < warps; ++w) order[w] = w;
  while (m.live > 0) {
    bool progressed = false;
    if (m.cfg.schedule_seed == 0) {  // lockstep: every runnable thread once a pass, in index order
      for (size_t i = 0; i < n; ++i) {
        Thread& t = m.threads[i];
        if (!Runnable(m, t)) continue;
        Resume(m, t);
        progressed = true;
        if (!m.error.empty()) return Internal("simt emulation: " + m.error);
      }
    } else {  // warps in a shuffled order, each as far as it goes before the next
      for (size_t i = warps; i > 1; --i) std::swap(order[i - 1], order[SplitMix(rng) % i]);
      for (size_t w : order) {
        for (bool ran = true; ran;) {
          ran = false;
          for (size_t i = w * kWarpSize; i < (w + 1) * kWarpSize; ++i) {
            Thread& t = m.threads[i];
            if (!Runnable(m, t)) continue;
            Resume(m, t);
            ran = progressed = true;
            if (!m.error.empty()) return Internal("simt emulation: " + m.error);
          }
        }
      }
    }
    if (m.live > 0 && !progressed) return Internal("simt emulation: " + Stuck(m));
  }
  return Status::Ok();
}

}  // namespace

Status Launch(const LaunchConfig& config, const std::function<void()>& kernel) {
  const uint64_t threads = uint64_t{config.block.x} * config.block.y * config.block.z;
  if (threads == 0 || threads > 1024 || threads % kWarpSize != 0) {
    return InvalidArgument("simt emulation: a block of " + std::to_string(threads) +
                           " threads (need a multiple of 32, at most 1024)");
  }
  if (g_machine) return FailedPrecondition("simt emulation: Launch from inside a kernel");
  Machine m;
  m.cfg = config;
  m.kernel = &kernel;
  m.threads.resize(threads);
  for (Thread& t : m.threads) t.stack.reset(new char[kStackBytes]);
  m.warps.resize(threads / kWarpSize);
  // 128-byte aligned, as CUDA's dynamic shared memory is at least.
  std::unique_ptr<unsigned char[], void (*)(unsigned char*)> smem(
      static_cast<unsigned char*>(::operator new[](std::max<size_t>(config.smem_bytes, 1), std::align_val_t{128})),
      [](unsigned char* p) { ::operator delete[](p, std::align_val_t{128}); });
  m.smem = smem.get();
  std::unique_ptr<unsigned char[], void (*)(unsigned char*)> static_smem(
      static_cast<unsigned char*>(::operator new[](kStaticSmemBytes, std::align_val_t{128})),
      [](unsigned char* p) { ::operator delete[](p, std::align_val_t{128}); });
  m.static_smem = static_smem.get();
  uint64_t rng = config.schedule_seed;
  g_machine = &m;
  Status st = Status::Ok();
  for (unsigned z = 0; z < config.grid.z && st.ok(); ++z) {
    for (unsigned y = 0; y < config.grid.y && st.ok(); ++y) {
      for (unsigned x = 0; x < config.grid.x && st.ok(); ++x) {
        m.block_idx = Dim3{x, y, z};
        st = RunBlock(m, rng);
      }
    }
  }
  g_machine = nullptr;
  return st;
}

const Dim3& ThreadIdx() { return Current().idx; }
const Dim3& BlockIdx() { return M().block_idx; }
const Dim3& BlockDim() { return M().cfg.block; }
const Dim3& GridDim() { return M().cfg.grid; }
unsigned char* DynamicSmem() { return M().smem; }

void* StaticSmem(const void* key, size_t bytes, size_t align) {
  Machine& m = M();
  for (const auto& [k, offset] : m.static_arrays) {
    if (k == key) return m.static_smem + offset;
  }
  const size_t offset = (m.static_used + align - 1) / align * align;
  if (offset + bytes > kStaticSmemBytes) {
    Fail("static shared memory past " + std::to_string(kStaticSmemBytes) + " bytes");
  }
  m.static_arrays.emplace_back(key, offset);
  m.static_used = offset + bytes;
  return m.static_smem + offset;
}

void SyncThreads() {
  Machine& m = M();
  if (++m.barrier_arrived == m.live) {
    m.barrier_arrived = 0;
    ++m.barrier_gen;
    return;
  }
  WaitFor(Wait::kBlock, m.barrier_gen);
}

uint32_t ShflXor(uint32_t value, int lane_mask) {
  if (lane_mask < 0 || lane_mask >= kWarpSize) Fail("shfl.xor lane mask " + std::to_string(lane_mask));
  LaneIn in{};
  in.a[0] = value;
  in.arg = lane_mask;
  return WarpCollective(WarpOp::kShfl, kAllLanes, kWarpSize, in,
                        [](Group& g) {
                          for (int l = 0; l < kWarpSize; ++l) g.out[l].r[0] = g.in[l ^ g.arg].a[0];
                        })
      .r[0];
}

void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  LaneIn in{};
  std::copy(a, a + 4, in.a);
  in.b[0] = b0;
  in.b[1] = b1;
  std::copy(d, d + 4, in.c);
  const LaneOut out = WarpCollective(WarpOp::kMma, kAllLanes, kWarpSize, in, [](Group& w) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < kWarpSize; ++l) {  // the PTX fragment layouts of m16n8k16
      const int g = l / 4, c = l % 4;
      const LaneIn& x = w.in[l];
      for (int h = 0; h < 2; ++h) {  // h: rows g and g + 8 (A, C) or k 2c.. and 2c + 8.. (B)
        A[g + 8 * h][2 * c] = Bf16Lo(x.a[h]);
        A[g + 8 * h][2 * c + 1] = Bf16Hi(x.a[h]);
        A[g + 8 * h][2 * c + 8] = Bf16Lo(x.a[2 + h]);
        A[g + 8 * h][2 * c + 9] = Bf16Hi(x.a[2 + h]);
        B[2 * c + 8 * h][g] = Bf16Lo(x.b[h]);
        B[2 * c + 8 * h + 1][g] = Bf16Hi(x.b[h]);
        C[g + 8 * h][2 * c] = x.c[2 * h];
        C[g + 8 * h][2 * c + 1] = x.c[2 * h + 1];
      }
    }
    for (int l = 0; l < kWarpSize; ++l) {
      const int g = l / 4, c = l % 4;
      for (int e = 0; e < 4; ++e) {
        const int i = g + 8 * (e / 2), j = 2 * c + e % 2;
        float s = 0.0f;
        for (int k = 0; k < 16; ++k) s += A[i][k] * B[k][j];  // exact products (8-bit significands)
        w.out[l].d[e] = C[i][j] + s;
      }
    }
  });
  std::copy(out.d, out.d + 4, d);
}

void LoadMatrices(uint32_t (&m)[4], const void* row, bool trans) {
  CheckShared(row, 16, trans ? "ldmatrix.x4.trans" : "ldmatrix.x4");
  LaneIn in{};
  in.p = static_cast<const unsigned char*>(row);
  const LaneOut out =
      WarpCollective(trans ? WarpOp::kLdmTrans : WarpOp::kLdm, kAllLanes, kWarpSize, in, [trans](Group& w) {
        for (int l = 0; l < kWarpSize; ++l) {
          const int g = l / 4, c = l % 4;
          for (int i = 0; i < 4; ++i) {  // matrix i's rows come from lanes 8i .. 8i + 7
            if (!trans) {                // row g, columns 2c and 2c + 1
              std::memcpy(&w.out[l].r[i], w.in[8 * i + g].p + 4 * c, 4);
            } else {  // column g, rows 2c and 2c + 1
              uint16_t lo, hi;
              std::memcpy(&lo, w.in[8 * i + 2 * c].p + 2 * g, 2);
              std::memcpy(&hi, w.in[8 * i + 2 * c + 1].p + 2 * g, 2);
              w.out[l].r[i] = lo | static_cast<uint32_t>(hi) << 16;
            }
          }
        }
      });
  std::copy(out.r, out.r + 4, m);
}

uint32_t ShflIdx(uint32_t members, uint32_t value, int src_lane, int width) {
  if (width < 1 || width > kWarpSize || (width & (width - 1)) != 0) {
    Fail("shfl.idx width " + std::to_string(width) + " (a power of two up to 32)");
  }
  LaneIn in{};
  in.a[0] = value;
  in.arg = src_lane;
  return WarpCollective(WarpOp::kShflIdx, members, width, in,
                        [](Group& g) {
                          for (int l = 0; l < kWarpSize; ++l) {
                            if (!(g.members >> l & 1u)) continue;
                            const int src = l / g.width * g.width + g.arg % g.width;
                            if (!(g.members >> src & 1u)) {
                              throw Broken{Where(Current()) + ": shfl.idx from lane " + std::to_string(src) +
                                           ", outside the member mask"};
                            }
                            g.out[l].r[0] = g.in[src].a[0];
                          }
                        })
      .r[0];
}

void CpAsync(void* dst, const void* src, int bytes, int src_bytes) {
  if ((bytes != 4 && bytes != 16) || src_bytes < 0 || src_bytes > bytes) {
    Fail("cp.async of " + std::to_string(bytes) + " bytes, " + std::to_string(src_bytes) + " from the source");
  }
  CheckShared(dst, static_cast<size_t>(bytes), "cp.async destination");
  if (reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(bytes) != 0) {
    Fail("cp.async source not " + std::to_string(bytes) + "-byte aligned");
  }
  PendingCopy c{static_cast<unsigned char*>(dst), bytes, src_bytes, {}};
  std::memcpy(c.data, src, static_cast<size_t>(src_bytes));
  if (M().cfg.copies == CopyTiming::kAtIssue) {
    LandCopy(c);
  } else {
    Current().copies.push_back(c);
  }
}

void CpAsyncWaitAll() { ApplyCopies(Current()); }

void CheckAligned(const void* p, int bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) != 0) {
    Fail(std::string(what) + " at an address not " + std::to_string(bytes) + "-byte aligned");
  }
}

}  // namespace zinf::gpu::emu
