// A C++17 program built against an installed zinf (find_package or
// pkg-config), using the C ABI through RAII handles. It trains the dense
// layers of dense_model.h with the host computing between calls (fetch, then
// zinf_stream_synchronize, then compute on this thread: the other way the C
// ABI allows besides host functions in stream order), once per ZeRO setup,
// and checks that stage 0, stage 2 and stage 2 with the optimizer offloaded
// to the CPU end with bit-identical parameters and optimizer state. Then the
// aio handle with several threads at once, the CPU Adam's bf16/fp16
// variants, and the thread-locality of zinf_last_error.
//   cxx_consumer <scratch directory>
#include <zinf/zinf.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dense_model.h"

namespace {

[[noreturn]] void Fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: %s\n", file, line, what.c_str());
  std::exit(1);
}
#define CHECK(cond) \
  if (!(cond)) Fail(__FILE__, __LINE__, "check failed: " #cond)
#define CHECK_OK(call)                  \
  if (int rc_ = (call); rc_ != ZINF_OK) \
  Fail(__FILE__, __LINE__, std::string(#call) + " -> " + zinf_status_name(rc_) + ": " + zinf_last_error())

struct EngineDeleter {
  void operator()(zinf_engine* e) const { zinf_engine_destroy(e); }
};
struct StreamDeleter {
  void operator()(zinf_stream* s) const { zinf_stream_destroy(s); }
};
struct AioDeleter {
  void operator()(zinf_aio* a) const { zinf_aio_destroy(a); }
};
struct FileDeleter {
  void operator()(zinf_file* f) const { zinf_file_close(f); }
};
struct AdamDeleter {
  void operator()(zinf_adam* a) const { zinf_adam_destroy(a); }
};
using Engine = std::unique_ptr<zinf_engine, EngineDeleter>;
using Stream = std::unique_ptr<zinf_stream, StreamDeleter>;
using Aio = std::unique_ptr<zinf_aio, AioDeleter>;
using File = std::unique_ptr<zinf_file, FileDeleter>;
using Adam = std::unique_ptr<zinf_adam, AdamDeleter>;

struct RunResult {
  double first_loss = 0, last_loss = 0;
  std::vector<std::vector<float>> state[3];  // master, m, v per unit
};

RunResult Train(const std::string& zero_block) {
  const std::string config = R"({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 3,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
      "gradient_clipping": 1.0, "zero_optimization": )" +
                             zero_block + R"(,
      "zinf": {"device": "cpu", "device_memory": "64M"}})";
  zinf_engine* raw = nullptr;
  CHECK_OK(zinf_engine_create(config.c_str(), nullptr, &raw));
  Engine engine(raw);
  std::vector<float> w(DM_WIDEST * DM_WIDEST), b(DM_WIDEST);
  for (int u = 0; u < DM_LAYERS; ++u) {
    dm_init_params(u, 5, w.data(), b.data());
    const int64_t wshape[2] = {dm_in[u], dm_out[u]}, bshape[1] = {dm_out[u]};
    const zinf_param_spec specs[2] = {{"w", wshape, 2, ZINF_DTYPE_FP32, w.data()},
                                      {"b", bshape, 1, ZINF_DTYPE_FP32, b.data()}};
    CHECK_OK(zinf_engine_add_unit(engine.get(), ("dense" + std::to_string(u)).c_str(), specs, 2, nullptr));
  }
  zinf_stream* sraw = nullptr;
  CHECK_OK(zinf_stream_create(engine.get(), &sraw));
  Stream stream(sraw);
  zinf_engine_info info{};
  CHECK_OK(zinf_engine_get_info(engine.get(), &info));
  const int accumulation = static_cast<int>(info.gradient_accumulation_steps);

  auto st = std::make_unique<dm_state>();
  RunResult r;
  for (int step = 0; step < 30; ++step) {
    double loss = 0;
    for (int m = 0; m < accumulation; ++m) {
      dm_make_batch(step * accumulation + m, st.get());
      for (int u = 0; u < DM_LAYERS; ++u) {
        zinf_unit_pointers p{};
        CHECK_OK(zinf_engine_fetch(engine.get(), u, stream.get(), &p));
        CHECK_OK(zinf_stream_synchronize(stream.get()));  // the stream passed the fetch: compute here
        dm_forward(u, static_cast<const float*>(p.tensors[0]), static_cast<const float*>(p.tensors[1]), st.get());
        CHECK_OK(zinf_engine_release(engine.get(), u, stream.get()));
      }
      float scale = 0;
      CHECK_OK(zinf_engine_loss_scale(engine.get(), &scale));
      for (int u = DM_LAYERS - 1; u >= 0; --u) {
        zinf_unit_pointers p{}, g{};
        CHECK_OK(zinf_engine_fetch(engine.get(), u, stream.get(), &p));
        CHECK_OK(zinf_engine_grad_buffers(engine.get(), u, &g));
        CHECK_OK(zinf_stream_synchronize(stream.get()));
        dm_backward(u, static_cast<const float*>(p.tensors[0]), static_cast<float*>(g.tensors[0]),
                    static_cast<float*>(g.tensors[1]), scale, st.get());
        CHECK_OK(zinf_engine_grads_ready(engine.get(), u, stream.get()));
        CHECK_OK(zinf_engine_release(engine.get(), u, stream.get()));
      }
      int boundary = 0;
      CHECK_OK(zinf_engine_step(engine.get(), &boundary));
      CHECK(boundary == (m == accumulation - 1));
      loss += st->loss / accumulation;
    }
    if (step == 0) r.first_loss = loss;
    r.last_loss = loss;
  }
  CHECK_OK(zinf_stream_synchronize(stream.get()));
  for (int k = 0; k < 3; ++k) {
    for (int u = 0; u < DM_LAYERS; ++u) {
      std::vector<float> v(static_cast<size_t>(dm_weights(u) + dm_out[u]));
      CHECK_OK(zinf_engine_read_state(engine.get(), u, static_cast<zinf_state_kind>(k), v.data(), v.size()));
      r.state[k].push_back(std::move(v));
    }
  }
  char* stats = nullptr;
  CHECK_OK(zinf_engine_stats_json(engine.get(), &stats));
  std::unique_ptr<char, decltype(&zinf_string_free)> stats_owner(stats, zinf_string_free);
  CHECK(std::strstr(stats, "\"step\":30") != nullptr);
  return r;
}

void TestEngineStages() {
  const RunResult s0 = Train(R"({"stage": 0})");
  std::printf("cxx consumer: engine loss %.6f -> %.6f (stage 0)\n", s0.first_loss, s0.last_loss);
  CHECK(std::isfinite(s0.last_loss) && s0.last_loss < 0.5 * s0.first_loss);
  for (const char* zero :
       {R"({"stage": 2, "reduce_bucket_size": 65536})", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})"}) {
    const RunResult s = Train(zero);
    for (int k = 0; k < 3; ++k) {
      for (int u = 0; u < DM_LAYERS; ++u) {
        CHECK(s.state[k][u].size() == s0.state[k][u].size());
        if (std::memcmp(s.state[k][u].data(), s0.state[k][u].data(), s.state[k][u].size() * 4) != 0) {
          Fail(__FILE__, __LINE__,
               std::string("state kind ") + std::to_string(k) + " of unit " + std::to_string(u) +
                   " differs between stage 0 and " + zero);
        }
      }
    }
  }
  std::printf("cxx consumer: stage 0, stage 2 and stage 2 + offload_optimizer cpu are bit-identical\n");
}

void TestAioThreads(const std::string& scratch) {
  zinf_aio* raw = nullptr;
  CHECK_OK(zinf_aio_create(256 << 10, 16, 2, 0, &raw));
  Aio aio(raw);
  const std::string path = scratch + "/cxx_consumer_aio.bin";
  zinf_file* fraw = nullptr;
  CHECK_OK(zinf_aio_open(aio.get(), path.c_str(), ZINF_FILE_WRITE | ZINF_FILE_CREATE | ZINF_FILE_TRUNCATE, &fraw));
  File file(fraw);
  // Four threads each write and read back their own 1 MiB region through one handle.
  constexpr int kThreads = 4;
  constexpr uint64_t kRegion = 1 << 20;
  std::vector<std::thread> threads;
  std::vector<int> ok(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> out(kRegion), in(kRegion);
      for (uint64_t i = 0; i < kRegion; ++i) out[i] = static_cast<uint8_t>(i * 7 + t * 13);
      zinf_aio_request* req = nullptr;
      if (zinf_aio_pwrite(aio.get(), file.get(), out.data(), kRegion, t * kRegion, &req) != ZINF_OK) return;
      const int wrc = zinf_aio_request_wait(req, nullptr);
      zinf_aio_request_free(req);
      if (wrc != ZINF_OK) return;
      if (zinf_aio_pread(aio.get(), file.get(), in.data(), kRegion, t * kRegion, &req) != ZINF_OK) return;
      const int rrc = zinf_aio_request_wait(req, nullptr);
      zinf_aio_request_free(req);
      ok[t] = rrc == ZINF_OK && in == out;
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(ok[t] == 1);
  uint64_t count = 0;
  CHECK_OK(zinf_aio_wait_all(aio.get(), &count));
  CHECK(count == 2 * kThreads);
  uint64_t bytes = 0;
  CHECK_OK(zinf_file_size(file.get(), &bytes));
  CHECK(bytes == kThreads * kRegion);
  file.reset();
  std::remove(path.c_str());
  std::printf("cxx consumer: aio (%s) from %d threads\n", zinf_aio_backend(aio.get()), kThreads);
}

void TestAdamVariants() {
  zinf_adam* raw = nullptr;
  CHECK_OK(zinf_adam_create(0, &raw));
  Adam adam(raw);
  zinf_adam_options o;
  zinf_adam_options_default(&o);
  o.adamw_mode = 0;  // classic Adam with L2 weight decay
  o.weight_decay = 0.01;
  const size_t n = 1000;
  // The same fp16 gradients given as fp16 and widened to fp32 give the same bits.
  std::vector<float> p1(n), m1(n), v1(n), p2, m2, v2, g32(n);
  std::vector<uint16_t> g16(n), copy1(n), copy2(n);
  uint64_t s = 3;
  for (size_t i = 0; i < n; ++i) {
    p1[i] = dm_uniform(&s);
    g16[i] = static_cast<uint16_t>(0x3000 + (i % 0x0c00));  // fp16 values in [2^-3, 2^0)
    const int e = (g16[i] >> 10) & 0x1f;
    g32[i] = std::ldexp(1.0f + (g16[i] & 0x3ff) / 1024.0f, e - 15);
  }
  p2 = p1, m2 = m1, v2 = v1;
  for (int64_t t = 1; t <= 2; ++t) {
    CHECK_OK(zinf_adam_step(adam.get(), &o, t, 1.0, p1.data(), m1.data(), v1.data(), g16.data(), ZINF_DTYPE_FP16,
                            copy1.data(), ZINF_DTYPE_FP16, n));
    CHECK_OK(zinf_adam_step(adam.get(), &o, t, 1.0, p2.data(), m2.data(), v2.data(), g32.data(), ZINF_DTYPE_FP32,
                            copy2.data(), ZINF_DTYPE_FP16, n));
  }
  CHECK(std::memcmp(p1.data(), p2.data(), n * 4) == 0 && std::memcmp(v1.data(), v2.data(), n * 4) == 0);
  CHECK(copy1 == copy2);
  std::printf("cxx consumer: adam fp16 gradients agree with their fp32 widening\n");
}

void TestLastErrorIsPerThread() {
  CHECK(zinf_engine_step(nullptr, nullptr) == ZINF_ERR_INVALID_ARGUMENT);
  const std::string mine = zinf_last_error();
  CHECK(!mine.empty());
  std::string other = "unset";
  std::thread([&] { other = zinf_last_error(); }).join();
  CHECK(other.empty());
  CHECK(mine == zinf_last_error());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <scratch directory>\n", argv[0]);
    return 2;
  }
  CHECK(zinf_abi_version() == ZINF_ABI_VERSION);
  CHECK_OK(zinf_set_log_level("warn"));
  TestLastErrorIsPerThread();
  TestEngineStages();
  TestAioThreads(argv[1]);
  TestAdamVariants();
  std::printf("cxx consumer: all checks passed (zinf %s)\n", zinf_version());
  return 0;
}
