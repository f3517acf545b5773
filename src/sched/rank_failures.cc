// StopRanksTogether: see rank_failures.h.
#include "sched/rank_failures.h"

#include <string>
#include <utility>

#include "common/logging.h"
#include "common/thread_annotations.h"

namespace zinf::sched {
namespace {

class SharedFailureEngine final : public Engine {
 public:
  SharedFailureEngine(std::unique_ptr<Engine> inner, Communicator& comm) : inner_(std::move(inner)), comm_(comm) {}

  Result<int> AddUnit(const std::string& name, const std::vector<ParamSpec>& params) override {
    return inner_->AddUnit(name, params);
  }
  Result<int> AddUnit(const std::string& name, const std::vector<ParamSpec>& params,
                      const UnitOptions& options) override {
    return inner_->AddUnit(name, params, options);
  }
  Result<int> AddParamGroup(const ParamGroupOptions& options) override { return inner_->AddParamGroup(options); }
  Status SetGroupLr(int group, double lr) override { return inner_->SetGroupLr(group, lr); }
  int num_units() const override { return inner_->num_units(); }
  Result<int64_t> unit_elems(int unit) const override { return inner_->unit_elems(unit); }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  int zero_stage() const override { return inner_->zero_stage(); }
  DType compute_dtype() const override { return inner_->compute_dtype(); }
  int64_t gradient_accumulation_steps() const override { return inner_->gradient_accumulation_steps(); }
  int optimizer_threads() const override { return inner_->optimizer_threads(); }

  Result<UnitPointers> Fetch(int unit, Stream& stream) override {
    return Shared([&] { return inner_->Fetch(unit, stream); });
  }
  Result<UnitPointers> GradBuffers(int unit) override {
    return Shared([&] { return inner_->GradBuffers(unit); });
  }
  Status GradsReady(int unit, Stream& stream) override {
    return Shared([&] { return inner_->GradsReady(unit, stream); });
  }
  Status Release(int unit, Stream& stream) override {
    return Shared([&] { return inner_->Release(unit, stream); });
  }
  Result<bool> Step() override {
    return Shared([&] { return inner_->Step(); });
  }
  // Local bookkeeping, no collective: nothing to share.
  Status Trace(Stream& stream, const std::string& lane, const std::string& what,
               const std::function<Status()>& enqueue) override {
    return inner_->Trace(stream, lane, what, enqueue);
  }
  Result<int64_t> TraceBegin(Stream& stream) override { return inner_->TraceBegin(stream); }
  Status TraceEnd(int64_t token, Stream& stream, const std::string& lane, const std::string& what) override {
    return inner_->TraceEnd(token, stream, lane, what);
  }
  Status ReportLoss(double loss) override {
    return Shared([&] { return inner_->ReportLoss(loss); });
  }
  Result<float> loss_scale() override {
    return Shared([&] { return inner_->loss_scale(); });
  }
  Status Synchronize() override {
    return Shared([&] { return inner_->Synchronize(); });
  }
  Result<StepStats> Stats() override {
    return Shared([&] { return inner_->Stats(); });
  }
  Result<StepStats> Stats(int64_t boundary) override {
    return Shared([&] { return inner_->Stats(boundary); });
  }
  Status ReadState(int unit, StateKind kind, float* host_dst) override {
    return Shared([&] { return inner_->ReadState(unit, kind, host_dst); });
  }
  Status WriteState(int unit, StateKind kind, const float* host_src) override {
    return Shared([&] { return inner_->WriteState(unit, kind, host_src); });
  }
  Status Broadcast(void* host, size_t bytes, int root) override {
    return Shared([&] { return inner_->Broadcast(host, bytes, root); });
  }
  // Save agrees on its outcome across the ranks itself (a failed save fails
  // on every rank, and training may go on); a stopped engine saves nothing.
  Result<std::string> Save(const std::string& dir, const std::string& client_state) override {
    if (Status s = Stopped(); !s.ok()) return s;
    return inner_->Save(dir, client_state);
  }
  Result<std::string> Load(const std::string& path) override { return inner_->Load(path); }

 private:
  static const Status& StatusOf(const Status& s) { return s; }
  template <typename T>
  static const Status& StatusOf(const Result<T>& r) {
    return r.status();
  }

  // Runs `call` unless this rank or a peer already stopped; a failure of
  // `call` stops every rank.
  template <typename Call>
  auto Shared(Call&& call) -> decltype(call()) {
    if (Status s = Stopped(); !s.ok()) return s;
    if (Status h = comm_.Health(); !h.ok()) return Stop(h);
    auto result = call();
    if (const Status& s = StatusOf(result); !s.ok()) return Stop(s);
    return result;
  }

  Status Stopped() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return stopped_;
  }

  Status Stop(const Status& cause) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (stopped_.ok()) {
      // A cause that came from a peer is already broken on the communicator:
      // Abort then sends nothing back.
      comm_.Abort(cause);
      ZINF_LOG_ERROR("engine: rank {} of {} stops: {}", inner_->rank(), inner_->world_size(), cause.ToString());
      stopped_ = Status(cause.code(), cause.message() +
                                          " [the ranks stopped together; resume from the last complete "
                                          "checkpoint]");
    }
    return stopped_;
  }

  std::unique_ptr<Engine> inner_;
  Communicator& comm_;
  Mutex mu_;
  Status stopped_ GUARDED_BY(mu_);  // the first failure
};

}  // namespace

std::unique_ptr<Engine> StopRanksTogether(std::unique_ptr<Engine> engine, Communicator& comm) {
  return std::make_unique<SharedFailureEngine>(std::move(engine), comm);
}

}  // namespace zinf::sched
