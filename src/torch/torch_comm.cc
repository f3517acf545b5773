// The transport of zinf's communicator under torchrun, the deepspeed
// launcher, accelerate launch and srun: a torch.distributed process group of
// zinf's own (gloo, made by zinf.torch with new_group, so that no collective
// of the script's or the trainer's ever interleaves with zinf's) and the
// job's Store for failure notices. zinf orders the starts and does the
// reduction (transport_comm.h); this file only maps each operation to the
// group's: allgather, alltoall_base, broadcast, barrier, on uint8 tensors
// that view zinf's host buffers. Polled with Work::isCompleted, never waited
// on, so zinf's deadline and a peer's notice end a wait.
#include "torch_comm.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <tuple>
#include <vector>

#include "zinf/zinf.h"

namespace py = pybind11;

namespace zinf::torch {
namespace {

using CreateTransportFn = int (*)(const zinf_transport*, double, zinf_comm**);
using TextFn = const char* (*)();
using StatusNameFn = const char* (*)(int);

struct Group {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  c10::intrusive_ptr<c10d::Store> store;
  int size = 1;
  bool leaked = false;  // the group is kept for the process (see Release)
};

struct Op {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> keep;  // the views, alive while the operation is
};

void SetError(char* error, size_t n, const std::string& text) {
  if (n == 0) return;
  std::snprintf(error, n, "%s", text.c_str());
}

// The message of the exception being handled.
std::string CurrentError() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

at::Tensor View(const void* p, size_t bytes) {
  return at::from_blob(const_cast<void*>(p), {static_cast<int64_t>(bytes)},
                       at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

int Start(void* ctx, int op, const void* send, void* recv, size_t bytes, int root, void** out, char* error,
          size_t error_bytes) {
  auto* g = static_cast<Group*>(ctx);
  try {
    auto o = std::make_unique<Op>();
    switch (op) {
      case ZINF_TRANSPORT_ALL_GATHER: {
        auto* base = static_cast<std::byte*>(recv);
        at::Tensor in = View(send, bytes);
        if (send >= recv && send < base + bytes * g->size) in = in.clone();  // in place: gloo copies it in itself
        std::vector<std::vector<at::Tensor>> outs(1);
        for (int r = 0; r < g->size; ++r) outs[0].push_back(View(base + r * bytes, bytes));
        std::vector<at::Tensor> ins{in};
        o->work = g->pg->allgather(outs, ins);
        o->keep = outs[0];
        o->keep.push_back(in);
        break;
      }
      case ZINF_TRANSPORT_ALL_TO_ALL: {
        at::Tensor in = View(send, bytes * g->size), outt = View(recv, bytes * g->size);
        std::vector<int64_t> splits;  // equal
        o->work = g->pg->alltoall_base(outt, in, splits, splits);
        o->keep = {in, outt};
        break;
      }
      case ZINF_TRANSPORT_BROADCAST: {
        std::vector<at::Tensor> t{View(recv, bytes)};
        c10d::BroadcastOptions opts;
        opts.rootRank = root;
        o->work = g->pg->broadcast(t, opts);
        o->keep = t;
        break;
      }
      case ZINF_TRANSPORT_BARRIER:
        o->work = g->pg->barrier();
        break;
      default:
        SetError(error, error_bytes, "unknown transport operation " + std::to_string(op));
        return -1;
    }
    *out = o.release();
    return 0;
  } catch (...) {
    SetError(error, error_bytes, "torch.distributed: " + CurrentError());
    return -1;
  }
}

int Test(void* ctx, void* handle, char* error, size_t error_bytes) {
  auto* o = static_cast<Op*>(handle);
  try {
    if (!o->work->isCompleted()) return 0;
    if (std::exception_ptr e = o->work->exception()) std::rethrow_exception(e);
    return 1;
  } catch (...) {
    SetError(error, error_bytes, "torch.distributed: " + CurrentError());
    return -1;
  }
}

// A handle not done: the group's threads still run it, and its views stay
// in this Op, which is kept (the buffers are zinf's, kept too). So is the
// group: destroying a gloo group joins its threads, and the one stuck in the
// abandoned operation would hold the process at exit until gloo's own
// timeout. A leaked reference keeps it for the life of the process.
void Release(void* ctx, void* handle) {
  auto* o = static_cast<Op*>(handle);
  bool done = false;
  try {
    done = o->work->isCompleted();
  } catch (...) {
  }
  if (done) {
    delete o;
    return;
  }
  auto* g = static_cast<Group*>(ctx);
  if (!g->leaked) {
    g->leaked = true;
    (void)c10::intrusive_ptr<c10d::ProcessGroup>(g->pg).release();
  }
}

int Post(void* ctx, const char* key, const char* value, size_t value_bytes, char* error, size_t error_bytes) {
  auto* g = static_cast<Group*>(ctx);
  try {
    g->store->set(key, std::vector<uint8_t>(value, value + value_bytes));
    return 0;
  } catch (...) {
    SetError(error, error_bytes, "store: " + CurrentError());
    return -1;
  }
}

int Read(void* ctx, const char* key, char* value, size_t value_bytes, size_t* out_bytes, char* error,
         size_t error_bytes) {
  auto* g = static_cast<Group*>(ctx);
  try {
    if (!g->store->check({key})) return 0;  // get would wait for it
    std::vector<uint8_t> v = g->store->get(key);
    std::memcpy(value, v.data(), std::min(v.size(), value_bytes));
    *out_bytes = v.size();
    return 1;
  } catch (...) {
    SetError(error, error_bytes, "store: " + CurrentError());
    return -1;
  }
}

void Destroy(void* ctx) { delete static_cast<Group*>(ctx); }

std::tuple<uintptr_t, std::string, std::string> CreateComm(const py::dict& fns, py::object group, py::object store,
                                                           int rank, int size, int local_size, double timeout) {
  auto fn = [&](const char* name) {
    uintptr_t p = fns[name].cast<uintptr_t>();
    if (p == 0) throw std::invalid_argument(std::string("zinf.torch: no address for ") + name);
    return reinterpret_cast<void*>(p);
  };
  auto create = reinterpret_cast<CreateTransportFn>(fn("zinf_comm_create_transport"));
  auto last_error = reinterpret_cast<TextFn>(fn("zinf_last_error"));
  auto status_name = reinterpret_cast<StatusNameFn>(fn("zinf_status_name"));
  auto g = std::make_unique<Group>();
  g->pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  g->store = store.cast<c10::intrusive_ptr<c10d::Store>>();
  g->size = size;
  if (g->pg->getSize() != size || g->pg->getRank() != rank)
    throw std::invalid_argument("zinf.torch: the process group is rank " + std::to_string(g->pg->getRank()) + " of " +
                                std::to_string(g->pg->getSize()) + ", not " + std::to_string(rank) + " of " +
                                std::to_string(size));
  zinf_transport t{};
  t.ctx = g.get();
  t.rank = rank;
  t.size = size;
  t.local_size = local_size;
  t.start = Start;
  t.test = Test;
  t.release = Release;
  t.post = Post;
  t.read = Read;
  t.destroy = Destroy;
  zinf_comm* comm = nullptr;
  int rc;
  {
    py::gil_scoped_release nogil;
    rc = create(&t, timeout, &comm);
  }
  if (rc != 0) return {0, status_name(rc), last_error()};
  (void)g.release();  // the communicator owns it now
  return {reinterpret_cast<uintptr_t>(comm), "", ""};
}

}  // namespace

void RegisterComm(py::module_& m) {
  m.def("create_comm", &CreateComm, "zinf's communicator over a torch.distributed gloo process group");
}

}  // namespace zinf::torch
