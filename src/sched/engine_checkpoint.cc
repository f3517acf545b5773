// Engine checkpoints and ReadState.
//
// Save writes this rank's slices of every unit's master, m and v into one
// file per rank, streamed from wherever they live (device, pinned host,
// NVMe), plus a manifest; Load reads the slices of any world size that
// overlap what this rank keeps. Both run on the calling thread after the
// engine's streams are synchronized; ranks agree on the outcome
// (AgreeOk) so that all of them succeed or fail together. Their I/O is left
// out of the steps' NVMe bytes (ExcludeIo).
#include "sched/engine_impl.h"

namespace zinf::sched {

Status EngineImpl::ReadState(int unit, StateKind kind, float* host_dst) {
  ExcludeIo exclude(this);
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "ReadState"));
  ZINF_RETURN_IF_ERROR(Finalize());
  ZINF_RETURN_IF_ERROR(Synchronize());
  Unit& u = units_[unit];
  const int64_t n = u.part.num_elems;
  if (u.frozen && kind != StateKind::kMaster && kind != StateKind::kComputeParams) {
    return InvalidArgument("ReadState: unit '" + u.name + "' is frozen: it has no optimizer state");
  }
  if (kind == StateKind::kComputeParams || u.frozen) {  // a frozen unit's value is its compute copy
    std::vector<uint8_t> raw(n * DTypeSizeBytes(compute_dtype_));
    const bool gather = u.partitioned && !u.gathered;
    if (gather) ZINF_RETURN_IF_ERROR(Gather(u, /*prefetch=*/false));
    if (u.partitioned) ZINF_RETURN_IF_ERROR(stream_->Wait(*u.gathered_ready));
    ZINF_RETURN_IF_ERROR(device_.CopyToHost(raw.data(), u.partitioned ? u.gathered : u.params, raw.size(), *stream_));
    if (gather) ZINF_RETURN_IF_ERROR(u.released->Record(*stream_));  // DropGathered frees after this copy
    if (gather) ZINF_RETURN_IF_ERROR(DropGathered(u));
    ZINF_RETURN_IF_ERROR(stream_->Synchronize());
    return cpu::Cast(arena_, raw.data(), compute_dtype_, host_dst, DType::kFloat32, n);
  }
  const cpu::PinnedBuffer& host_buf = kind == StateKind::kMaster   ? u.h_master
                                      : kind == StateKind::kExpAvg ? u.h_exp_avg
                                                                   : u.h_exp_avg_sq;
  const void* host_state = host_buf.data();
  std::unique_ptr<float, decltype(&std::free)> swapped(nullptr, &std::free);
  if (nvme_) {  // read the unit's sub-group back from the store
    const size_t g = swapper_->group_of(swap_id(unit));
    ZINF_ASSIGN_OR_RETURN(uint64_t padded, swapper_->store().PaddedBytes(g));
    swapped.reset(static_cast<float*>(std::aligned_alloc(4096, padded)));
    if (!swapped) return OutOfMemory("ReadState: " + FormatBytes(padded) + " for a sub-group");
    ZINF_RETURN_IF_ERROR(swapper_->store().Read(g, swapped.get()).Wait());
    const int k = kind == StateKind::kMaster ? 0 : kind == StateKind::kExpAvg ? 1 : 2;
    host_state = swapped.get() + swapper_->offset_in_group(swap_id(unit)) + k * owned_elems(u);
  }
  float* state = kind == StateKind::kMaster ? u.master : kind == StateKind::kExpAvg ? u.exp_avg : u.exp_avg_sq;
  if (!sharded()) {
    if (offload_) {
      std::memcpy(host_dst, host_state, n * 4);
      return Status::Ok();
    }
    ZINF_RETURN_IF_ERROR(device_.CopyToHost(host_dst, state, n * 4, *stream_));
    return stream_->Synchronize();
  }
  // Sharded: gather every rank's shard on the device (collective).
  const int64_t S = u.part.shard_elems;
  ZINF_ASSIGN_OR_RETURN(void* tmp, Alloc(u.part.padded_elems * 4, "ReadState gather buffer"));
  float* mine = static_cast<float*>(tmp) + u.part.shard_begin(rank_);
  Status s = offload_ ? device_.CopyToDevice(mine, host_state, S * 4, *stream_)
                      : device_.CopyOnDevice(mine, state, S * 4, *stream_);
  if (s.ok()) s = comm_->AllGather(mine, tmp, S, DType::kFloat32, *stream_);
  if (s.ok()) s = device_.CopyToHost(host_dst, tmp, n * 4, *stream_);
  Status sync = stream_->Synchronize();
  Status f = device_.Free(tmp, *stream_);
  if (!s.ok()) return s;
  if (!sync.ok()) return sync;
  return f;
}

Status EngineImpl::WriteState(int unit, StateKind kind, const float* host_src) {
  ExcludeIo exclude(this);
  ZINF_RETURN_IF_ERROR(CheckUnit(unit, "WriteState"));
  if (kind != StateKind::kMaster) return InvalidArgument("WriteState: only the parameters (kMaster) can be written");
  ZINF_RETURN_IF_ERROR(Finalize());
  if (micro_in_window_ != 0) {
    return FailedPrecondition("WriteState between optimizer steps only: " + std::to_string(micro_in_window_) + " of " +
                              std::to_string(accumulation_) + " micro-steps of this step are done");
  }
  {
    MutexLock lock(mu_);
    ZINF_RETURN_IF_ERROR(broken_);
  }
  ZINF_RETURN_IF_ERROR(Synchronize());
  Unit& u = units_[unit];
  // A copy gathered ahead (stage 3) would be stale: the next Fetch gathers anew.
  if (u.gathered && !u.client_holds) ZINF_RETURN_IF_ERROR(DropGathered(u));
  const int64_t ob = owned_begin(u), ov = owned_valid(u);
  if (!u.frozen && ov > 0) {
    if (nvme_) {  // the unit's sub-group: read, changed, written back
      const size_t g = swapper_->group_of(swap_id(unit));
      ZINF_ASSIGN_OR_RETURN(uint64_t padded, swapper_->store().PaddedBytes(g));
      std::unique_ptr<float, decltype(&std::free)> buf(static_cast<float*>(std::aligned_alloc(4096, padded)),
                                                       &std::free);
      if (!buf) return OutOfMemory("WriteState: " + FormatBytes(padded) + " for a sub-group");
      ZINF_RETURN_IF_ERROR(swapper_->store().Read(g, buf.get()).Wait());
      std::memcpy(buf.get() + swapper_->offset_in_group(swap_id(unit)), host_src + ob, ov * 4);
      ZINF_RETURN_IF_ERROR(SwapFailure(swapper_->store().Write(g, buf.get()).Wait()));
    } else if (offload_) {
      std::memcpy(u.h_master.data(), host_src + ob, ov * 4);
    } else {
      ZINF_RETURN_IF_ERROR(device_.CopyToDevice(u.master, host_src + ob, ov * 4, *stream_));
      ZINF_RETURN_IF_ERROR(stream_->Synchronize());
    }
  }
  return WriteComputeCopy(u, host_src, 0);
}

Status EngineImpl::Broadcast(void* host, size_t bytes, int root) {
  if (root < 0 || root >= world_) {
    return InvalidArgument("Broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(world_));
  }
  if (bytes > 0 && host == nullptr) return InvalidArgument("Broadcast: host is null");
  if (micro_in_window_ != 0) {
    return FailedPrecondition("Broadcast between optimizer steps only: " + std::to_string(micro_in_window_) + " of " +
                              std::to_string(accumulation_) + " micro-steps of this step are done");
  }
  {
    MutexLock lock(mu_);
    ZINF_RETURN_IF_ERROR(broken_);
  }
  ZINF_RETURN_IF_ERROR(Synchronize());
  if (!distributed()) return Status::Ok();
  // Staged through device memory in pieces (the communicator moves device
  // buffers), as whole 4-byte words: the tail's padding is never copied out.
  constexpr size_t kPieceBytes = size_t{16} << 20;
  Status s = Status::Ok();
  if (bytes > 0) {
    const size_t staging = std::min(kPieceBytes, (bytes + 3) / 4 * 4);
    Result<void*> buf = Alloc(staging, "broadcast staging");
    // Every rank enters each piece's collective, or none does.
    if (Status agreed = AgreeOk(buf.status()); !agreed.ok()) {
      if (buf.ok()) (void)device_.Free(*buf, *stream_);
      return agreed.WithContext("Broadcast staging");
    }
    char* p = static_cast<char*>(host);
    for (size_t done = 0; done < bytes;) {
      const size_t n = std::min(kPieceBytes, bytes - done);
      Status c = rank_ == root ? device_.CopyToDevice(*buf, p + done, n, *stream_) : Status::Ok();
      Status b = comm_->Broadcast(*buf, (n + 3) / 4, DType::kFloat32, root, *stream_);
      if (b.ok() && rank_ != root) c = device_.CopyToHost(p + done, *buf, n, *stream_);
      Status sync = stream_->Synchronize();
      if (s.ok()) s = !b.ok() ? b : !c.ok() ? c : sync;
      if (!b.ok() || !sync.ok()) break;  // the communicator or the stream is broken: no further piece
      done += n;
    }
    if (buf.ok()) {
      if (Status f = device_.Free(*buf, *stream_); s.ok()) s = f;
    }
  }
  // Every rank learns every other's outcome, and none returns before all joined.
  return AgreeOk(s).WithContext("Broadcast of " + std::to_string(bytes) + " bytes from rank " + std::to_string(root));
}

Status EngineImpl::ReadFrozenSlice(Unit& u, std::vector<float>* out) {
  const size_t esize = DTypeSizeBytes(compute_dtype_);
  const int64_t begin = u.part.shard_begin(rank_), count = u.part.valid_in_shard(rank_);
  out->assign(std::max<int64_t>(count, 0), 0.0f);
  if (count <= 0) return Status::Ok();
  const void* src = nullptr;
  std::vector<uint8_t> staged;
  if (u.shard_on_nvme) {
    void* buf = param_bufs_[kUpdateBuffer].data();
    ZINF_RETURN_IF_ERROR(
        param_store_->Read(u.index, buf).Wait().WithContext("parameter shard of unit '" + u.name + "'"));
    src = buf;
  } else if (host_home(u)) {
    src = u.h_shard.data();
  } else {
    staged.resize(count * esize);
    const char* dev =
        u.partitioned ? static_cast<const char*>(u.shard_params) : static_cast<const char*>(u.params) + begin * esize;
    ZINF_RETURN_IF_ERROR(device_.CopyToHost(staged.data(), dev, staged.size(), *stream_));
    ZINF_RETURN_IF_ERROR(stream_->Synchronize());
    src = staged.data();
  }
  return cpu::Cast(arena_, src, compute_dtype_, out->data(), DType::kFloat32, count);
}

namespace {
constexpr int kCheckpointFormat = ckpt::CheckpointReader::kFormat;  // 2: slices 4 KiB-aligned, tensor shapes
constexpr const char* const* kKindNames = ckpt::CheckpointReader::kKindNames;
}  // namespace

// Waits for every request still in flight when it goes out of scope.
struct DrainRequests {
  std::vector<nvme::IoRequest>& requests;
  ~DrainRequests() {
    for (auto& r : requests) {
      if (r.valid()) (void)r.Wait();
    }
  }
};

Result<nvme::IoEngine*> EngineImpl::CheckpointIo() {
  if (io_) return io_.get();
  if (!ckpt_io_) {
    ZINF_ASSIGN_OR_RETURN(ckpt_io_, nvme::IoEngine::Create(nvme::IoEngineOptionsFromConfig(config_)));
  }
  return ckpt_io_.get();
}

Status EngineImpl::AgreeOk(const Status& mine, bool* reached) {
  if (reached) *reached = !distributed();
  if (!distributed()) return mine;
  // Each rank contributes 1 + its rank when it failed; the max names one.
  // A rank that cannot take part in a collective here (out of memory for
  // the flag, a failed copy) must not leave its peers waiting for it until
  // the deadline: it stops the communicator, whose notice ends their wait
  // naming this rank and the cause.
  auto cannot_agree = [&](const Status& why) -> Status {
    comm_->Abort(why);
    return !mine.ok() ? mine : why;
  };
  float flag = mine.ok() ? 0.0f : static_cast<float>(rank_ + 1);
  Result<void*> buf = Alloc(2 * sizeof(float), "checkpoint agreement");
  if (!buf.ok()) return cannot_agree(buf.status());
  float* d = static_cast<float*>(*buf);
  Status s = device_.CopyToDevice(d, &flag, sizeof flag, *stream_);
  if (s.ok()) s = comm_->AllReduce(d, d + 1, 1, DType::kFloat32, ReduceOp::kMax, *stream_);
  float worst = 0;
  if (s.ok()) s = device_.CopyToHost(&worst, d + 1, sizeof worst, *stream_);
  Status sync = stream_->Synchronize();
  Status f = device_.Free(*buf, *stream_);
  if (!s.ok() || !sync.ok()) return cannot_agree(!s.ok() ? s : sync);
  if (reached) *reached = true;
  if (worst > 0) {
    // Every rank learns why: the failed rank broadcasts its error's text
    // (every rank knows which one, so all of them take part).
    const int failed = static_cast<int>(worst) - 1;
    constexpr size_t kWords = 256;  // 1 KiB of text
    std::string why;
    std::string text = rank_ == failed ? mine.ToString() : std::string();
    text.resize(kWords * 4 - 1, '\0');
    text.push_back('\0');
    Result<void*> tb = Alloc(kWords * 4, "checkpoint failure text");
    Status t = tb.status();
    if (t.ok()) t = device_.CopyToDevice(*tb, text.data(), kWords * 4, *stream_);
    if (t.ok()) t = comm_->Broadcast(*tb, kWords, DType::kFloat32, failed, *stream_);
    if (t.ok()) t = device_.CopyToHost(text.data(), *tb, kWords * 4, *stream_);
    if (Status ts = stream_->Synchronize(); t.ok()) t = ts;
    if (tb.ok()) (void)device_.Free(*tb, *stream_);
    if (!t.ok()) comm_->Abort(t);  // a peer may still wait in the broadcast
    why = t.ok() ? std::string(text.c_str()) : "its error did not arrive (" + t.ToString() + ")";
    if (!mine.ok()) return mine;
    return Unavailable("rank " + std::to_string(failed) + " stopped: " + why);
  }
  if (!mine.ok()) return mine;
  return f;
}

Status EngineImpl::WriteShards(const std::string& path, nlohmann::json* table) {
  ZINF_ASSIGN_OR_RETURN(nvme::IoEngine * io, CheckpointIo());
  ZINF_ASSIGN_OR_RETURN(std::shared_ptr<nvme::File> file, ckpt::OpenDataFile(*io, path, /*write=*/true));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::SliceWriter> w, ckpt::SliceWriter::Create(*io, file));
  // NVMe: each sub-group is read once, the next one read ahead in the
  // engine's swap buffers (idle between steps).
  const size_t nb = nvme_ ? swapper_->num_buffers() : 0;
  std::vector<nvme::IoRequest> reads(nvme_ ? swapper_->num_groups() : 0);
  auto read_group = [&](size_t g) {
    if (g < reads.size() && !reads[g].valid()) reads[g] = swapper_->store().Read(g, swapper_->buffer(g));
  };
  DrainRequests drain{reads};  // never leave a read in flight into the engine's buffers
  std::vector<float> staged;   // offload none: one slice copied off the device
  int64_t current_group = -1;
  uint64_t bytes_out = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    const int64_t begin = u.part.shard_begin(rank_), count = u.part.valid_in_shard(rank_);
    if (u.frozen) {  // its compute copy, widened, as its "master"
      std::vector<float> slice;
      ZINF_RETURN_IF_ERROR(ReadFrozenSlice(u, &slice));
      if (count <= 0) continue;
      const uint64_t offset = w->BeginSlice();
      ZINF_RETURN_IF_ERROR(w->Append(slice.data(), static_cast<uint64_t>(count) * 4));
      ZINF_ASSIGN_OR_RETURN(uint64_t xxh3, w->EndSlice());
      table->push_back({{"unit", u.name},
                        {"kind", kKindNames[0]},
                        {"begin", begin},
                        {"count", count},
                        {"offset", offset},
                        {"xxh3", xxh3}});
      bytes_out += static_cast<uint64_t>(count) * 4;
      continue;
    }
    const int64_t at = begin - owned_begin(u);  // the slice's place in the owned range
    const float* src[3] = {nullptr, nullptr, nullptr};
    if (nvme_) {
      const size_t g = swapper_->group_of(swap_id(i));
      if (static_cast<int64_t>(g) != current_group) {
        read_group(g);
        Status r = reads[g].Wait();
        reads[g] = {};
        if (!r.ok()) return r;
        current_group = static_cast<int64_t>(g);
        if (nb > 1) read_group(g + 1);
      }
      const float* base = swapper_->state(swap_id(i));
      for (int k = 0; k < 3; ++k) src[k] = base + k * owned_elems(u) + at;
    } else if (offload_) {
      const cpu::PinnedBuffer* h[3] = {&u.h_master, &u.h_exp_avg, &u.h_exp_avg_sq};
      for (int k = 0; k < 3; ++k) src[k] = static_cast<const float*>(h[k]->data()) + at;
    } else {
      const float* d[3] = {u.master, u.exp_avg, u.exp_avg_sq};
      for (int k = 0; k < 3; ++k) src[k] = d[k] + at;
    }
    if (count <= 0) continue;
    const uint64_t bytes = static_cast<uint64_t>(count) * 4;
    for (int k = 0; k < 3; ++k) {
      const float* p = src[k];
      if (!offload_) {  // device memory: through a host copy
        staged.resize(count);
        ZINF_RETURN_IF_ERROR(device_.CopyToHost(staged.data(), p, bytes, *stream_));
        ZINF_RETURN_IF_ERROR(stream_->Synchronize());
        p = staged.data();
      }
      const uint64_t offset = w->BeginSlice();
      ZINF_RETURN_IF_ERROR(w->Append(p, bytes));
      ZINF_ASSIGN_OR_RETURN(uint64_t xxh3, w->EndSlice());
      table->push_back({{"unit", u.name},
                        {"kind", kKindNames[k]},
                        {"begin", begin},
                        {"count", count},
                        {"offset", offset},
                        {"xxh3", xxh3}});
      bytes_out += bytes;
    }
  }
  ZINF_RETURN_IF_ERROR(w->Finish());
  ZINF_LOG_DEBUG("checkpoint: rank {} wrote {} to {}", rank_, FormatBytes(bytes_out), path);
  return Status::Ok();
}

Result<std::string> EngineImpl::Save(const std::string& dir, const std::string& client_state) {
  ExcludeIo exclude(this);
  // Every check that can fail on one rank alone is agreed on before any
  // rank goes further: no rank is left waiting in a collective.
  auto client = nlohmann::json::parse(client_state, nullptr, false);
  Status prepared = Finalize();
  if (prepared.ok() && micro_in_window_ != 0) {
    prepared = FailedPrecondition("Save between optimizer steps only: " + std::to_string(micro_in_window_) + " of " +
                                  std::to_string(accumulation_) + " micro-steps of this step are done");
  }
  if (prepared.ok()) {
    MutexLock lock(mu_);
    prepared = broken_;
  }
  if (prepared.ok() && client.is_discarded()) prepared = InvalidArgument("Save: client_state is not valid JSON");
  if (prepared.ok()) prepared = Synchronize();
  namespace fs = std::filesystem;
  const std::string name = "step-" + std::to_string(boundaries_);
  const std::string tmp = (fs::path(dir) / (name + ".tmp")).string();
  const std::string final_dir = (fs::path(dir) / name).string();
  if (rank_ == 0 && prepared.ok()) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    fs::remove_all(tmp, ec);  // left by a save that crashed
    if (!fs::create_directories(tmp, ec) && ec) prepared = IoError("cannot create " + tmp + ": " + ec.message());
  }
  ZINF_RETURN_IF_ERROR(AgreeOk(prepared));
  // A failure from here on removes step-N.tmp: the previous checkpoint and
  // `latest` are untouched. Only once every rank is known to be done with
  // it: when a rank stopped without taking part in the agreement, a slower
  // peer may still be writing there, and removing it would turn that peer's
  // report of the failed rank into an ENOENT of its own. The next save
  // removes what is left.
  auto abandon = [&](const Status& s, bool every_rank_done) -> Status {
    if (rank_ == 0 && every_rank_done) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    return s;
  };
  // This rank's file: its shard range of every unit, whatever the stage.
  const std::string bin = "rank-" + std::to_string(rank_) + ".bin";
  nlohmann::json table = nlohmann::json::array();
  Status written = WriteShards((fs::path(tmp) / bin).string(), &table);
  if (written.ok()) {
    written =
        ckpt::WriteFileAtomic((fs::path(tmp) / ("rank-" + std::to_string(rank_) + ".json")).string(),
                              nlohmann::json{{"file", bin}, {"align", ckpt::kSliceAlign}, {"tensors", table}}.dump(1));
  }
  bool reached = false;
  if (Status all = AgreeOk(written, &reached); !all.ok()) return abandon(all, reached);
  Status committed;
  if (rank_ == 0) {
    nlohmann::json units = nlohmann::json::array();
    for (const Unit& u : units_) {
      nlohmann::json params = nlohmann::json::array();
      for (size_t t = 0; t < u.tensor_names.size(); ++t) {
        params.push_back({{"name", u.tensor_names[t]}, {"shape", u.tensor_shapes[t]}, {"offset", u.tensor_offsets[t]}});
      }
      // steps: the updates this unit has had (fewer than steps_applied when
      // some steps did not fetch it).
      units.push_back({{"name", u.name},
                       {"elements", u.part.num_elems},
                       {"params", params},
                       {"steps", u.steps},
                       {"frozen", u.frozen}});
    }
    LossScaler::State ls;
    int64_t steps_applied;
    {
      MutexLock lock(mu_);
      ls = decider_.scaler().state();
      steps_applied = decider_.steps_applied();
    }
    nlohmann::json manifest = {{"format", kCheckpointFormat},
                               {"world_size", world_},
                               {"stage", stage_},
                               {"compute_dtype", std::string(DTypeName(compute_dtype_))},
                               {"boundaries", boundaries_},
                               {"steps_applied", steps_applied},
                               {"loss_scale",
                                {{"scale", ls.scale},
                                 {"cur_hysteresis", ls.cur_hysteresis},
                                 {"iter", ls.iter},
                                 {"last_overflow_iter", ls.last_overflow_iter},
                                 {"overflows", ls.overflows}}},
                               {"units", units},
                               {"config", nlohmann::json::parse(config_.ToJson(0), nullptr, false)},
                               {"client_state", client}};
    committed = ckpt::WriteFileAtomic((fs::path(tmp) / "manifest.json").string(), manifest.dump(1));
    if (committed.ok()) committed = ckpt::FsyncDir(tmp);
    if (committed.ok()) {
      // Saved at this step before (a save right after a load): the new
      // directory and the old one swap places atomically, so `latest` never
      // names a missing directory; the old one is removed afterwards.
      if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
      } else if (errno != ENOENT || ::rename(tmp.c_str(), final_dir.c_str()) != 0) {
        committed = IoError("rename " + tmp + " -> " + final_dir + ": " + std::strerror(errno));
      }
    }
    if (!committed.ok()) committed = abandon(committed, true);
    // From here step-N is complete; a failure below leaves `latest` at the
    // previous checkpoint, which is intact.
    if (committed.ok()) committed = ckpt::FsyncDir(dir);
    if (committed.ok()) committed = ckpt::WriteFileAtomic((fs::path(dir) / "latest").string(), name + "\n");
  }
  ZINF_RETURN_IF_ERROR(AgreeOk(committed));
  {
    MutexLock lock(mu_);
    last_checkpoint_ = final_dir;
  }
  return final_dir;
}

Status EngineImpl::ReadShards(ckpt::CheckpointReader& reader) {
  using Range = ckpt::CheckpointReader::Range;
  if (nvme_) {
    // A sub-group's [master | m | v] is read straight into a swap buffer
    // (every slice of the sub-group in one read-ahead stream) and written to
    // the store while the next sub-group is read into the next buffer.
    const size_t nb = swapper_->num_buffers();
    std::vector<nvme::IoRequest> writes(nb);
    DrainRequests drain{writes};  // never leave a write in flight from the engine's buffers
    // The compute copies of a sub-group's units run on a helper thread while
    // the next sub-group is read (the disk stays busy); joined before the
    // engine stream is used again here or its buffer is refilled.
    std::thread copier;
    Status copied;
    auto join_copier = [&]() -> Status {
      if (copier.joinable()) copier.join();
      return copied;
    };
    struct JoinCopier {  // on every return path
      std::thread& t;
      ~JoinCopier() {
        if (t.joinable()) t.join();
      }
    } join_on_exit{copier};
    for (size_t g = 0; g < swapper_->num_groups(); ++g) {
      if (nb == 1) ZINF_RETURN_IF_ERROR(join_copier());  // the copier reads the buffer about to be refilled
      nvme::IoRequest& previous = writes[g % nb];
      if (previous.valid()) {
        Status s = previous.Wait();
        previous = {};
        ZINF_RETURN_IF_ERROR(s);
      }
      float* buf = swapper_->buffer(g);
      const std::vector<int>& group = swapper_->group_units(g);
      std::vector<Range> ranges;
      std::vector<char> whole(group.size(), 0);  // the compute copy is whole here, the master sharded
      for (size_t j = 0; j < group.size(); ++j) {
        const int i = swap_unit_[group[j]];
        const Unit& u = units_[i];
        const int64_t ob = owned_begin(u), ov = std::max<int64_t>(owned_valid(u), 0), oe = owned_elems(u);
        float* base = buf + swapper_->offset_in_group(group[j]);
        for (int k = 0; k < 3; ++k) std::fill(base + k * oe + ov, base + (k + 1) * oe, 0.0f);
        whole[j] = !(u.partitioned || (ob == 0 && ov == u.part.num_elems));
        // A rank whose shard holds only padding reads nothing of the unit.
        if (ov == 0) continue;
        for (int k = whole[j] ? 1 : 0; k < 3; ++k)
          ranges.push_back({u.name, k, u.part.num_elems, ob, ov, base + k * oe});
      }
      ZINF_RETURN_IF_ERROR(reader.ReadRanges(ranges));
      ZINF_RETURN_IF_ERROR(join_copier());
      // Units whose whole master is needed: one at a time (memory: one unit).
      for (size_t j = 0; j < group.size(); ++j) {
        if (!whole[j]) continue;
        Unit& u = units_[swap_unit_[group[j]]];
        std::vector<float> master(u.part.num_elems);
        ZINF_RETURN_IF_ERROR(reader.ReadRange(u.name, 0, u.part.num_elems, 0, u.part.num_elems, master.data()));
        const int64_t ov = owned_valid(u);
        if (ov > 0) std::memcpy(buf + swapper_->offset_in_group(group[j]), master.data() + owned_begin(u), ov * 4);
        ZINF_RETURN_IF_ERROR(WriteComputeCopy(u, master.data(), 0));
      }
      writes[g % nb] = swapper_->store().Write(g, buf);
      copier = std::thread([this, &group, buf, whole = std::move(whole), &copied] {
        for (size_t j = 0; j < group.size() && copied.ok(); ++j) {
          if (whole[j]) continue;
          Unit& u = units_[swap_unit_[group[j]]];
          copied = WriteComputeCopy(u, buf + swapper_->offset_in_group(group[j]), owned_begin(u));
        }
      });
    }
    ZINF_RETURN_IF_ERROR(join_copier());
    for (auto& w : writes) {
      if (!w.valid()) continue;
      Status s = w.Wait();
      w = {};
      ZINF_RETURN_IF_ERROR(s);
    }
    for (Unit& u : units_) {
      if (u.frozen) ZINF_RETURN_IF_ERROR(ReadFrozenUnit(reader, u));
    }
    return Status::Ok();
  }
  std::vector<float> state[3];
  for (size_t i = 0; i < units_.size(); ++i) {
    Unit& u = units_[i];
    if (u.frozen) {
      ZINF_RETURN_IF_ERROR(ReadFrozenUnit(reader, u));
      continue;
    }
    const int64_t ob = owned_begin(u), ov = owned_valid(u);
    // The master covers the whole unit where its compute copy is whole here.
    const int64_t first[3] = {u.partitioned ? ob : 0, ob, ob};
    const int64_t len[3] = {u.partitioned ? ov : u.part.num_elems, ov, ov};
    std::vector<Range> ranges;
    for (int k = 0; k < 3; ++k) {
      state[k].assign(std::max<int64_t>(len[k], 0), 0.0f);
      if (len[k] > 0) ranges.push_back({u.name, k, u.part.num_elems, first[k], len[k], state[k].data()});
    }
    ZINF_RETURN_IF_ERROR(reader.ReadRanges(ranges));
    // Place the owned range where the state lives.
    const float* owned[3] = {state[0].data() + (ob - first[0]), state[1].data(), state[2].data()};
    if (ov > 0) {
      if (offload_) {
        cpu::PinnedBuffer* dst[3] = {&u.h_master, &u.h_exp_avg, &u.h_exp_avg_sq};
        for (int k = 0; k < 3; ++k) std::memcpy(dst[k]->data(), owned[k], ov * 4);
      } else {
        float* dst[3] = {u.master, u.exp_avg, u.exp_avg_sq};
        for (int k = 0; k < 3; ++k) ZINF_RETURN_IF_ERROR(device_.CopyToDevice(dst[k], owned[k], ov * 4, *stream_));
      }
    }
    ZINF_RETURN_IF_ERROR(WriteComputeCopy(u, state[0].data(), first[0]));
  }
  return Status::Ok();
}

// A frozen unit's compute copy from its saved values: this rank's shard
// where it is partitioned, else the whole unit.
Status EngineImpl::ReadFrozenUnit(ckpt::CheckpointReader& reader, Unit& u) {
  const int64_t first = u.partitioned ? u.part.shard_begin(rank_) : 0;
  const int64_t len = u.partitioned ? u.part.valid_in_shard(rank_) : u.part.num_elems;
  if (len <= 0) return Status::Ok();
  std::vector<float> values(len);
  ZINF_RETURN_IF_ERROR(reader.ReadRange(u.name, 0, u.part.num_elems, first, len, values.data()));
  return WriteComputeCopy(u, values.data(), first);
}

Result<std::string> EngineImpl::Load(const std::string& path) {
  ExcludeIo exclude(this);
  // Every check that can fail on one rank alone (a path only some ranks
  // see, a damaged table) is agreed on before any rank reads state.
  std::unique_ptr<ckpt::CheckpointReader> reader;
  auto prepare = [&]() -> Status {
    {
      MutexLock lock(mu_);
      if (!broken_.ok() && !broken_by_load_) {
        return FailedPrecondition("this engine stopped during a step (" + broken_.message() +
                                  "): create a new engine and load the checkpoint there");
      }
    }
    ZINF_RETURN_IF_ERROR(Finalize());
    ZINF_RETURN_IF_ERROR(Synchronize());
    ZINF_ASSIGN_OR_RETURN(nvme::IoEngine * io, CheckpointIo());
    ZINF_ASSIGN_OR_RETURN(reader, ckpt::CheckpointReader::Open(*io, path));
    try {
      // The units must be the same (names and sizes); list every difference.
      std::string diffs;
      const auto& saved = reader->manifest().at("units");
      if (saved.size() != units_.size()) {
        diffs += " the checkpoint has " + std::to_string(saved.size()) + " units, this engine " +
                 std::to_string(units_.size()) + ";";
      }
      for (size_t i = 0; i < std::min<size_t>(saved.size(), units_.size()); ++i) {
        const std::string sname = saved[i].at("name");
        const int64_t selems = saved[i].at("elements");
        if (sname != units_[i].name || selems != units_[i].part.num_elems) {
          diffs += " unit " + std::to_string(i) + " is '" + sname + "' (" + std::to_string(selems) +
                   " elements) there, '" + units_[i].name + "' (" + std::to_string(units_[i].part.num_elems) +
                   ") here;";
        } else if (saved[i].value("frozen", false) != units_[i].frozen) {
          diffs += std::string(" unit '") + sname + "' is " + (units_[i].frozen ? "trainable" : "frozen") +
                   " there and " + (units_[i].frozen ? "frozen" : "trainable") + " here;";
        }
      }
      if (!diffs.empty()) {
        return InvalidArgument("checkpoint " + reader->dir() + " does not match the registered units:" + diffs);
      }
    } catch (const nlohmann::json::exception& e) {
      return DataLoss(reader->dir() + "/manifest.json: malformed (" + std::string(e.what()) + ")");
    }
    return Status::Ok();
  };
  ZINF_RETURN_IF_ERROR(AgreeOk(prepare()));
  const std::string& ckpt_dir = reader->dir();
  const nlohmann::json& manifest = reader->manifest();
  const std::string manifest_path = ckpt_dir + "/manifest.json";
  try {
    // A failure part-way leaves this rank's state mixed: no steps until a
    // Load succeeds.
    if (Status s = AgreeOk(ReadShards(*reader)); !s.ok()) {
      MutexLock lock(mu_);
      broken_ = Status(s.code(), "Load from " + ckpt_dir +
                                     " failed part-way, the engine's state is mixed (load a "
                                     "checkpoint again): " +
                                     s.message());
      broken_by_load_ = true;
      return s;
    }
    const auto& ls = manifest.at("loss_scale");
    MutexLock lock(mu_);
    broken_ = Status::Ok();
    broken_by_load_ = false;
    decider_.scaler().Restore({ls.at("scale").get<double>(), ls.at("cur_hysteresis").get<int64_t>(),
                               ls.at("iter").get<int64_t>(), ls.at("last_overflow_iter").get<int64_t>(),
                               ls.at("overflows").get<int64_t>()});
    decider_.set_steps_applied(manifest.at("steps_applied").get<int64_t>());
    const auto& saved_units = manifest.at("units");
    for (size_t i = 0; i < units_.size(); ++i) {
      units_[i].steps = saved_units[i].value("steps", decider_.steps_applied());
      units_[i].active_updated = units_[i].released_after_grads = false;  // no update of the window before
    }
    boundaries_ = manifest.at("boundaries").get<int64_t>();
    first_boundary_ = boundaries_ + 1;
    closed_.clear();  // their boundaries belong to the run before the Load
    timed_.clear();
    spans_.clear();
    logged_through_ = boundaries_;
    decided_steps_.clear();
    decision_pending_ = false;
    micro_in_window_ = 0;
    last_checkpoint_ = ckpt_dir;
    return manifest.at("client_state").dump();
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(manifest_path + " or a rank table: malformed (" + std::string(e.what()) + ")");
  }
}

}  // namespace zinf::sched
