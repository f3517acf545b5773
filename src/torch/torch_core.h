// The Core of zinf.torch's C++ extension module (torch_hooks.cc): each
// unit's state between the hooks, and the per-unit work they do (fetch and
// bind, release, gradients, saved places), one Core per engine. Included
// by torch_hooks.cc alone.
#pragma once

#include <ATen/SavedTensorHooks.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "zinf/zinf.h"

namespace py = pybind11;

namespace zinf::torch {

using FetchFn = int (*)(zinf_engine*, int, zinf_stream*, zinf_unit_pointers*);
using GradBuffersFn = int (*)(zinf_engine*, int, zinf_unit_pointers*);
using UnitCallFn = int (*)(zinf_engine*, int, zinf_stream*);
using SyncFn = int (*)(zinf_stream*);
using TextFn = const char* (*)();
using StatusNameFn = const char* (*)(int);

// A failed library call: zinf.torch raises it as zinf.ZinfError.
struct CallError : std::runtime_error {
  CallError(std::string code_, std::string what_, std::string message_)
      : std::runtime_error(what_ + ": " + code_ + ": " + message_),
        code(std::move(code_)),
        what(std::move(what_)),
        message(std::move(message_)) {}
  std::string code, what, message;
};

// zinf._capi.ZinfError, set by Core's constructor (a reference held for the
// process: a static py::object would outlive the interpreter).
inline PyObject* g_zinf_error = nullptr;

// Throws `e` as zinf's ZinfError through torch's autograd engine (which
// passes a Python error on to the caller of backward(); any other C++
// exception becomes a RuntimeError there).
[[noreturn]] inline void RaiseZinfError(const CallError& e) {
  {
    py::gil_scoped_acquire gil;
    if (g_zinf_error == nullptr) throw e;
    py::object value = py::handle(g_zinf_error)(e.code, e.what, e.message);
    PyErr_SetObject(g_zinf_error, value.ptr());
  }
  python_error err;
  err.persist();
  throw err;
}

// Sets the Python error a pybind11 function would raise for the C++
// exception being handled (one already set stays), for the CPython
// functions and callables this module makes itself.
inline void TranslateException() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (...) {
    py::detail::try_translate_exceptions();
  }
}

inline at::ScalarType scalar_type(int zinf_dtype) {
  switch (zinf_dtype) {
    case ZINF_DTYPE_FP32:
      return at::kFloat;
    case ZINF_DTYPE_BF16:
      return at::kBFloat16;
    case ZINF_DTYPE_FP16:
      return at::kHalf;
  }
  throw std::invalid_argument("zinf.torch: the engine handed out a buffer of unknown type " +
                              std::to_string(zinf_dtype));
}

// Tensors over one buffer of a unit: all of it, and each parameter's view.
// The buffer moves (stage 3 gathers a unit wherever there is room, and its
// gradient buffer too): the tensors stay, and their storage is pointed at
// the buffer's new address, so that a fetch makes no tensor.
struct Views {
  uintptr_t data = 0;  // where the storage points now
  at::ScalarType dtype = at::kFloat;
  int64_t num_elems = 0;
  std::vector<int64_t> offsets;  // each parameter's, in elements
  at::Tensor whole;
  std::vector<at::Tensor> params;
};

// A tensor autograd saved that lies in a unit's buffer, kept as its place.
struct SavedInUnit {
  int unit;
  int64_t offset;  // bytes from the buffer's start
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

// A place in a unit's buffer that autograd saved, remembered so that the
// same place (each forward saves the same few: a weight, its transpose)
// packs into the same Python int and unpacks into the same view while the
// unit is fetched at the same address.
struct SavedPlace {
  SavedInUnit where;
  py::object key;   // what pack hands autograd: unit * kPlaces + slot
  at::Tensor view;  // over the unit's Views (it follows the buffer)
};
constexpr int64_t kPlaces = 64;  // remembered per unit; more are packed as SavedInUnit objects

struct Unit {
  std::string name;
  int index = 0;  // the engine's
  bool frozen = false;
  bool persistent = false;  // the buffer stays put between fetches (stages 0-2)
  std::vector<at::Tensor> params;
  std::vector<std::vector<int64_t>> shapes, strides;
  std::vector<int64_t> numels;
  bool fetched = false;
  uintptr_t bound = 0;  // the address the parameters are bound to (0: unbound)
  uintptr_t base = 0;   // the last fetch's buffer
  at::ScalarType dtype = at::kFloat;
  int64_t num_elems = 0;
  Views bound_views, grad_buffer_views;
  std::vector<SavedPlace> places;
  // Each parameter's gradient accumulator (torch's AccumulateGrad node),
  // held so that the node and the hook on it last across backwards; empty
  // until the unit is first bound with its gradients watched.
  bool watched = false;
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators;
  // This backward's gradient buffer, which parameters got theirs, how many
  // have not, and whether the unit was reported.
  std::vector<at::Tensor> grad_views;
  std::vector<bool> received;
  size_t pending = 0;
  bool reported = false;
};

// A module whose forward needs some units.
struct UnitModule {
  std::vector<int> units;
  bool frozen = false;      // it has a frozen unit (released after the module's backward)
  bool persistent = false;  // its units' buffers stay put: no saved-tensor hooks, no second fetch
  bool pushed = false;      // its saved-tensor hooks are on, this forward
  py::object pack, unpack;  // those hooks, made on first use
};

using SecondsFn = double (*)();

// The thread CPU time of a hook's calls, and the library's own inside them
// (zinf_thread_call_cpu_seconds), for the benchmark's account of each hook.
struct HookTime {
  int64_t ns = 0;
  double lib_seconds = 0;
};

// Adds the calling thread's CPU time in its scope, and the library's, to *t
// (nothing when t is null).
class CpuTimer {
 public:
  CpuTimer(HookTime* t, SecondsFn lib) : t_(t), lib_(lib) {
    if (t_ == nullptr) return;
    start_ = now();
    lib_start_ = lib_ != nullptr ? lib_() : 0;
  }
  ~CpuTimer() {
    if (t_ == nullptr) return;
    t_->ns += now() - start_;
    if (lib_ != nullptr) t_->lib_seconds += lib_() - lib_start_;
  }
  CpuTimer(const CpuTimer&) = delete;
  CpuTimer& operator=(const CpuTimer&) = delete;

 private:
  static int64_t now() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  }
  HookTime* t_;
  SecondsFn lib_;
  int64_t start_ = 0;
  double lib_start_ = 0;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(const py::dict& fns, uintptr_t engine, uintptr_t stream, bool cuda, const std::string& device,
       py::object zinf_error)
      : engine_(reinterpret_cast<zinf_engine*>(engine)),
        stream_(reinterpret_cast<zinf_stream*>(stream)),
        cuda_(cuda),
        device_(device) {
    auto fn = [&](const char* name) {
      uintptr_t p = fns[name].cast<uintptr_t>();
      if (p == 0) throw std::invalid_argument(std::string("zinf.torch: no address for ") + name);
      return reinterpret_cast<void*>(p);
    };
    fetch_ = reinterpret_cast<FetchFn>(fn("zinf_engine_fetch"));
    grad_buffers_ = reinterpret_cast<GradBuffersFn>(fn("zinf_engine_grad_buffers"));
    grads_ready_ = reinterpret_cast<UnitCallFn>(fn("zinf_engine_grads_ready"));
    release_ = reinterpret_cast<UnitCallFn>(fn("zinf_engine_release"));
    sync_ = reinterpret_cast<SyncFn>(fn("zinf_stream_synchronize"));
    last_error_ = reinterpret_cast<TextFn>(fn("zinf_last_error"));
    status_name_ = reinterpret_cast<StatusNameFn>(fn("zinf_status_name"));
    if (g_zinf_error == nullptr) g_zinf_error = zinf_error.release().ptr();
  }

  // A unit, in the engine's index order: its parameters and their shapes
  // (the parameters themselves are empty between fetches). Returns its index.
  int add_unit(int index, const std::string& name, const std::vector<at::Tensor>& params,
               const std::vector<std::vector<int64_t>>& shapes, bool frozen) {
    if (index != static_cast<int>(units_.size()))
      throw std::invalid_argument("zinf.torch: units must be added in the engine's order");
    if (shapes.size() != params.size()) throw std::invalid_argument("zinf.torch: a shape per parameter");
    Unit u;
    u.name = name;
    u.index = index;
    u.frozen = frozen;
    u.params = params;
    for (const std::vector<int64_t>& shape : shapes) {
      u.shapes.push_back(shape);
      std::vector<int64_t> stride(shape.size());
      int64_t step = 1, numel = 1;
      for (size_t d = shape.size(); d-- > 0;) {
        stride[d] = step;
        step *= std::max<int64_t>(shape[d], 1);
        numel *= shape[d];
      }
      u.numels.push_back(numel);
      u.strides.push_back(std::move(stride));
    }
    units_.push_back(std::move(u));
    return index;
  }

  // Watch the gradients of unit u's parameters: a C++ pre-hook on each
  // parameter's gradient accumulator, attached when the unit is bound (an
  // accumulator made while a parameter is empty would expect an empty
  // gradient). It sees the gradient that torch would accumulate, after the
  // script's own tensor hooks, and never enters Python.
  void watch_grads(int u) {
    Unit& x = unit(u);
    if (x.frozen) throw std::invalid_argument("zinf.torch: unit '" + x.name + "' is frozen");
    x.watched = true;
    x.accumulators.assign(x.params.size(), nullptr);
    if (x.bound != 0) attach_grad_hooks(x);
  }

  // A module whose forward needs some units. Returns its id.
  int add_module(const std::vector<int>& units) {
    UnitModule mod;
    for (int u : units) mod.frozen = unit(u).frozen || mod.frozen;
    mod.units = units;
    modules_.push_back(std::move(mod));
    return static_cast<int>(modules_.size()) - 1;
  }

  void set_persistent(int u, bool persistent) { unit(u).persistent = persistent; }
  void set_module_persistent(int m, bool persistent) { module(m).persistent = persistent; }
  bool fetched(int u) { return unit(u).fetched; }
  bool reported(int u) { return unit(u).reported; }
  // The parameters were given other data (a whole value, GatheredParameters):
  // the next fetch binds them again.
  void unbind(int u) { unit(u).bound = 0; }

  void fetch(int u) {
    Unit& x = unit(u);
    if (x.fetched) return;
    if (!handed_over_.empty()) flush();
    zinf_unit_pointers p{};
    check(without_gil([&] { return fetch_(engine_, x.index, stream_, &p); }), "fetch unit", x);
    if (!cuda_) check(without_gil([&] { return sync_(stream_); }), "fetch unit", x);  // torch computes on this thread
    uintptr_t data = reinterpret_cast<uintptr_t>(p.data);
    if (x.bound != data) {
      const Views& v = views(x, x.bound_views, data, scalar_type(p.dtype), p.num_elems, p.tensors, p.num_tensors);
      for (size_t i = 0; i < x.params.size(); ++i) x.params[i].set_data(v.params[i]);
      x.bound = data;
      if (x.watched) attach_grad_hooks(x);
      x.base = data;
      x.dtype = v.dtype;
      x.num_elems = p.num_elems;
    }
    x.fetched = true;
    ++counts_.fetches;
  }

  void release(int u) {
    Unit& x = unit(u);
    if (!x.fetched) return;
    if (!x.persistent) {
      for (at::Tensor& p : x.params) p.set_data(empty(p.scalar_type()));
      x.bound = 0;
    }
    check(without_gil([&] { return release_(engine_, x.index, stream_); }), "release unit", x);
    x.fetched = false;
  }

  void fetch_module(int m) {
    for (int u : module(m).units) fetch(u);
  }
  void release_module(int m) {
    for (int u : module(m).units) release(u);
  }
  // After a module's backward: release what only it needed.
  void after_module_backward(int m) {
    for (int u : module(m).units) {
      Unit& x = units_[u];
      if (x.frozen || x.reported) release(u);
    }
  }

  // A pre-hook on the node that made a module's output: fetches the module's
  // units when the output's gradient arrives, before the module's backward.
  void add_backward_fetch(const at::Tensor& output, int m) {
    module(m);
    const std::shared_ptr<::torch::autograd::Node>& node = output.grad_fn();
    if (node) node->add_pre_hook(std::make_unique<FetchBeforeBackward>(weak_from_this(), m));
  }

  // Units whose gradients were handed over at an earlier hook: torch has
  // accumulated their last gradient into .grad since, so .grad is dropped
  // and the unit released (the gradients never all coexist in torch).
  void flush() {
    std::vector<int> units;
    units.swap(handed_over_);
    for (int u : units) {
      for (at::Tensor& p : units_[u].params) p.mutable_grad().reset();
      release(u);
    }
  }

  // The end of backward: units whose parameters got no gradient are
  // reported with zeros; every unit is released and its .grad dropped.
  // Returns the units none of whose parameters got a gradient (reported with zeros).
  std::vector<int> end_backward() {
    std::vector<int> without;
    for (Unit& x : units_) {
      if (x.frozen) continue;
      if (!x.grad_views.empty()) {
        grads_ready(x);
      } else if (!x.reported) {
        grad_buffers(x);
        grads_ready(x);
        without.push_back(x.index);
      }
    }
    flush();
    for (Unit& x : units_) {
      release(x.index);
      x.reported = false;
      for (at::Tensor& p : x.params) p.mutable_grad().reset();
    }
    return without;
  }

  // saved_tensors_hooks' pack: a tensor lying in one of the module's units'
  // buffers becomes its place there (its first element there makes it a
  // view of the buffer: nothing else shares that memory).
  py::object pack(int m, const py::object& obj) {
    ++counts_.packs;
    CpuTimer timer(timing_ ? &times_[kPack] : nullptr, lib_seconds_);
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    if (t.is_cuda() != cuda_ || t.numel() == 0) return obj;
    uintptr_t start = reinterpret_cast<uintptr_t>(t.data_ptr());
    for (int u : module(m).units) {
      const Unit& x = units_[u];
      if (!x.fetched || start < x.base) continue;
      if (start < x.base + static_cast<uintptr_t>(x.num_elems) * c10::elementSize(x.dtype)) {
        return place(units_[u], static_cast<int64_t>(start - x.base), t);
      }
    }
    return obj;
  }

  // What pack hands autograd for tensor t at `offset` bytes into unit x's
  // buffer: the key of its remembered place, or a SavedInUnit when the
  // unit has too many.
  py::object place(Unit& x, int64_t offset, const at::Tensor& t) {
    for (const SavedPlace& p : x.places) {
      const SavedInUnit& w = p.where;
      if (w.offset == offset && w.dtype == t.scalar_type() && t.sizes().equals(w.sizes) &&
          t.strides().equals(w.strides))
        return p.key;
    }
    SavedInUnit where{x.index, offset, t.sizes().vec(), t.strides().vec(), t.scalar_type()};
    if (static_cast<int64_t>(x.places.size()) >= kPlaces) return py::cast(std::move(where));
    SavedPlace p;
    p.where = std::move(where);
    p.key = py::int_(static_cast<int64_t>(x.index) * kPlaces + static_cast<int64_t>(x.places.size()));
    x.places.push_back(std::move(p));
    return x.places.back().key;
  }

  // The tensor at a saved place, its unit fetched (maybe elsewhere).
  at::Tensor saved_view(const SavedInUnit& s) {
    fetch(s.unit);
    Unit& x = units_[s.unit];
    if (x.dtype != s.dtype) {
      throw std::runtime_error("zinf.torch: unit '" + x.name + "' saved a " + c10::toString(s.dtype) +
                               " tensor from its " + c10::toString(x.dtype) + " buffer");
    }
    at::Tensor whole = whole_buffer(x);
    int64_t size = static_cast<int64_t>(c10::elementSize(x.dtype));
    return whole.as_strided(s.sizes, s.strides, whole.storage_offset() + s.offset / size);
  }

  // saved_tensors_hooks' unpack: the place fetched again (maybe elsewhere).
  py::object unpack(int m, const py::object& packed) {
    ++counts_.unpacks;
    CpuTimer timer(timing_ ? &times_[kUnpack] : nullptr, lib_seconds_);
    if (PyLong_CheckExact(packed.ptr())) {
      int64_t key = packed.cast<int64_t>();
      int64_t u = key / kPlaces, slot = key % kPlaces;
      if (u < 0 || u >= static_cast<int64_t>(units_.size()) || slot >= static_cast<int64_t>(units_[u].places.size()))
        throw std::runtime_error("zinf.torch: a saved tensor of a closed engine was used");
      SavedPlace& p = units_[u].places[slot];
      fetch(static_cast<int>(u));
      const Unit& x = units_[u];
      if (!p.view.defined() || !x.bound_views.whole.defined() ||
          p.view.storage().unsafeGetStorageImpl() != x.bound_views.whole.storage().unsafeGetStorageImpl())
        p.view = saved_view(p.where);
      return py::cast(p.view);
    }
    if (!py::isinstance<SavedInUnit>(packed)) return packed;
    return py::cast(saved_view(packed.cast<const SavedInUnit&>()));
  }

  // The forward pre-hook and forward hook of unit module m, as nn.Module
  // calls them ((module, args, kwargs) and (module, inputs, output)). The
  // rare cases go to the Python engine, through the weak reference
  // `engine`: _pre_slow(m, args, kwargs, hooks_on) when saved-tensor hooks
  // are on already (torch.utils.checkpoint's) or the module has a frozen
  // unit; _post_slow(m, output) for an output other than one tensor.
  py::tuple module_hooks(int m, py::object engine) {
    module(m);
    std::weak_ptr<Core> me = weak_from_this();
    py::cpp_function pre([me, m, engine](py::handle, py::object args, py::object kwargs) -> py::object {
      return locked(me)->forward_pre(m, engine, args, kwargs);
    });
    py::cpp_function post([me, m, engine](py::handle, py::handle, py::object output) -> py::object {
      return locked(me)->forward_post(m, engine, output);
    });
    return py::make_tuple(pre, post);
  }

  // Fetches the module's units; with autograd recording, saved-tensor
  // hooks keep what the forward saves from their buffers as places there.
  // Returns whether the Python engine's _pre_slow must see the call too
  // (*hooks_on: saved-tensor hooks were on already).
  bool begin_forward(int m, bool* hooks_on) {
    ++counts_.pres;
    CpuTimer timer(timing_ ? &times_[kPre] : nullptr, lib_seconds_);
    UnitModule& mod = module(m);
    *hooks_on = false;
    fetch_module(m);
    if (mod.persistent || !at::GradMode::is_enabled()) return false;
    *hooks_on = at::SavedTensorDefaultHooks::get_hooks().has_value();
    if (!*hooks_on) {
      if (!mod.pack) {
        mod.pack = SavedHook::Make(weak_from_this(), m, /*pack=*/true);
        mod.unpack = SavedHook::Make(weak_from_this(), m, /*pack=*/false);
      }
      // What torch.autograd.graph.saved_tensors_hooks enters with (the
      // default hooks hold a reference each).
      at::SavedTensorDefaultHooks::lazy_initialize();
      at::SavedTensorDefaultHooks::push_hooks(c10::SafePyObject(mod.pack.inc_ref().ptr(), getPyInterpreter()),
                                              c10::SafePyObject(mod.unpack.inc_ref().ptr(), getPyInterpreter()));
      mod.pushed = true;
    }
    return *hooks_on || (mod.frozen && ::torch::autograd::get_current_graph_task_id() == -1);
  }

  py::object forward_pre(int m, const py::object& engine, const py::object& args, const py::object& kwargs) {
    bool hooks_on = false;
    if (!begin_forward(m, &hooks_on)) return py::none();
    return slow(engine, "_pre_slow", m, args, kwargs, hooks_on);
  }

  // Releases the module's units (not in a recomputation inside backward:
  // they stay until their gradients are in); with autograd recording, a
  // pre-hook on the node that made the output fetches them again before
  // the module's backward. A leaf output (an input or a parameter handed
  // back) has no node: unpacking the saved tensors fetches the units.
  py::object forward_post(int m, const py::object& engine, const py::object& output) {
    ++counts_.posts;
    CpuTimer timer(timing_ ? &times_[kPost] : nullptr, lib_seconds_);
    UnitModule& mod = module(m);
    if (mod.pushed) {
      at::SavedTensorDefaultHooks::pop_hooks();  // and what it leaves with (the references dropped)
      mod.pushed = false;
    }
    if (::torch::autograd::get_current_graph_task_id() != -1) return py::none();
    release_module(m);
    if (mod.persistent || !at::GradMode::is_enabled()) return py::none();
    if (THPVariable_Check(output.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(output.ptr());
      if (t.requires_grad()) add_backward_fetch(t, m);
      return py::none();
    }
    return slow(engine, "_post_slow", m, output);
  }

  // Calls of each hook so far (the benchmark checks that they fired).
  py::dict counts() const {
    py::dict d;
    d["grad"] = counts_.grads;
    d["backward_fetch"] = counts_.backward_fetches;
    d["pack"] = counts_.packs;
    d["unpack"] = counts_.unpacks;
    d["fetch"] = counts_.fetches;
    d["pre"] = counts_.pres;
    d["post"] = counts_.posts;
    return d;
  }
  // With timing on (lib_seconds: zinf_thread_call_cpu_seconds' address),
  // each hook's thread CPU time and the library's inside it, in seconds:
  // {hook: (cpu, library)}. Two clock reads a call.
  void set_timing(bool on, uintptr_t lib_seconds) {
    timing_ = on;
    lib_seconds_ = reinterpret_cast<SecondsFn>(lib_seconds);
  }
  py::dict times() const {
    static const char* const names[kHooks] = {"pre", "post", "grad", "backward_fetch", "pack", "unpack"};
    py::dict d;
    for (int k = 0; k < kHooks; ++k) d[names[k]] = py::make_tuple(times_[k].ns * 1e-9, times_[k].lib_seconds);
    return d;
  }

  // Before the engine is destroyed: parameters bound to its memory (stages
  // 0-2, or a unit fetched now) keep their values in torch's own memory, the
  // others stay empty; then every tensor over the engine's memory, the
  // gradient accumulators and the saved places are dropped. The hooks left
  // on the accumulators and the modules do nothing, or say the engine is
  // closed, from then on.
  void close() {
    bool bound = false;
    for (const Unit& x : units_) bound = bound || x.bound != 0;
    if (bound && !closed_) {
      without_gil([&] { return sync_(stream_); });  // its last writes in; an error here stays the stream's
      for (Unit& x : units_) {
        if (!x.bound) continue;
        for (at::Tensor& p : x.params) p.set_data(p.detach().clone());
        x.bound = 0;
      }
    }
    handed_over_.clear();
    for (Unit& x : units_) {
      x.bound_views = Views();
      x.grad_buffer_views = Views();
      x.grad_views.clear();
    }
    units_.clear();
    modules_.clear();
    closed_ = true;
  }

  // The Python objects it holds are dropped with the GIL held (the last
  // reference may be a hook's, on an autograd thread).
  ~Core() {
    if (!Py_IsInitialized()) {
      for (UnitModule& mod : modules_) {  // the interpreter is gone: leak them
        mod.pack.release();
        mod.unpack.release();
      }
      for (Unit& x : units_) {
        for (SavedPlace& p : x.places) p.key.release();
      }
      return;
    }
    py::gil_scoped_acquire gil;
    units_.clear();  // the places' keys
    modules_.clear();
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

 private:
  friend struct ForwardWrapper;

  // A module's saved-tensor hook (pack or unpack) as a plain CPython
  // function taking one argument, which torch calls for every tensor the
  // module's forward saves and every one its backward uses.
  struct SavedHook {
    std::weak_ptr<Core> core;
    int m;
    bool pack;

    static py::object Make(std::weak_ptr<Core> core, int m, bool pack) {
      static PyMethodDef def = {"zinf_saved_tensor_hook", reinterpret_cast<PyCFunction>(&Call), METH_O,
                                "zinf.torch: a unit module's saved-tensor hook (pack or unpack)"};
      auto* hook = new SavedHook{std::move(core), m, pack};
      py::capsule self(hook, kCapsule,
                       [](PyObject* c) { delete static_cast<SavedHook*>(PyCapsule_GetPointer(c, kCapsule)); });
      PyObject* fn = PyCFunction_New(&def, self.ptr());
      if (fn == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(fn);
    }

    static PyObject* Call(PyObject* self, PyObject* arg) {
      auto* hook = static_cast<SavedHook*>(PyCapsule_GetPointer(self, kCapsule));
      if (hook == nullptr) return nullptr;
      try {
        std::shared_ptr<Core> core = locked(hook->core);
        py::object x = py::reinterpret_borrow<py::object>(arg);
        return (hook->pack ? core->pack(hook->m, x) : core->unpack(hook->m, x)).release().ptr();
      } catch (...) {
        TranslateException();
      }
      return nullptr;
    }

    static constexpr const char* kCapsule = "zinf.torch.SavedHook";
  };

  struct FetchBeforeBackward : ::torch::autograd::FunctionPreHook {
    FetchBeforeBackward(std::weak_ptr<Core> core_, int m_) : core(std::move(core_)), m(m_) {}
    ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& grads) override {
      if (auto c = core.lock()) {
        ++c->counts_.backward_fetches;
        CpuTimer timer(c->timing_ ? &c->times_[kBackwardFetch] : nullptr, c->lib_seconds_);
        try {
          c->fetch_module(m);
        } catch (const CallError& e) {
          RaiseZinfError(e);
        }
      }
      return grads;
    }
    std::weak_ptr<Core> core;
    int m;
  };

  // Parameter i of unit u got its gradient (its accumulator is about to add
  // it to .grad).
  struct GradArrived : ::torch::autograd::FunctionPreHook {
    GradArrived(std::weak_ptr<Core> core_, int u_, size_t i_) : core(std::move(core_)), u(u_), i(i_) {}
    ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& grads) override {
      if (grads.empty() || !grads[0].defined()) return grads;
      if (auto c = core.lock()) {
        try {
          c->on_grad(u, i, grads[0]);
        } catch (const CallError& e) {
          RaiseZinfError(e);
        }
      }
      return grads;
    }
    std::weak_ptr<Core> core;
    int u;
    size_t i;
  };

  // The hooks on a bound unit's accumulators: torch keeps a parameter's
  // accumulator while it lives, and makes a new one only when the
  // parameter's type or device changes; a new one gets the hook too.
  void attach_grad_hooks(Unit& x) {
    for (size_t i = 0; i < x.params.size(); ++i) {
      std::shared_ptr<::torch::autograd::Node> acc = ::torch::autograd::impl::grad_accumulator(x.params[i]);
      if (acc == nullptr || acc == x.accumulators[i]) continue;
      acc->add_pre_hook(std::make_unique<GradArrived>(weak_from_this(), x.index, i));
      x.accumulators[i] = std::move(acc);
    }
  }

  template <typename... Args>
  static py::object slow(const py::object& engine_ref, const char* method, Args&&... args) {
    py::object engine = engine_ref();
    if (engine.is_none()) return py::none();  // the engine is gone: nothing of it to do
    return engine.attr(method)(std::forward<Args>(args)...);
  }

  static std::shared_ptr<Core> locked(const std::weak_ptr<Core>& me) {
    std::shared_ptr<Core> c = me.lock();
    if (!c) throw std::runtime_error("zinf.torch: the engine is closed (or no longer referenced)");
    return c;
  }

  Unit& unit(int u) {
    if (closed_) throw std::runtime_error("zinf.torch: the engine is closed");
    if (u < 0 || static_cast<size_t>(u) >= units_.size())
      throw std::out_of_range("zinf.torch: no unit " + std::to_string(u));
    return units_[u];
  }
  UnitModule& module(int m) {
    if (closed_) throw std::runtime_error("zinf.torch: the engine is closed");
    if (m < 0 || static_cast<size_t>(m) >= modules_.size())
      throw std::out_of_range("zinf.torch: no unit module " + std::to_string(m));
    return modules_[m];
  }

  // Runs a library call without the GIL where this thread holds it (as
  // ctypes calls it): other Python threads go on while the engine works.
  template <typename Call>
  static int without_gil(Call call) {
    if (!Py_IsInitialized() || !PyGILState_Check()) return call();
    PyThreadState* state = PyEval_SaveThread();
    int rc = call();
    PyEval_RestoreThread(state);
    return rc;
  }

  void check(int rc, const char* what, const Unit& x) {
    if (rc == ZINF_OK) return;
    const char* name = status_name_(rc);
    const char* message = last_error_();
    throw CallError(name ? name : "?", std::string(what) + " '" + x.name + "'", message ? message : "");
  }

  at::Tensor empty(at::ScalarType dtype) {
    for (const at::Tensor& t : empties_)
      if (t.scalar_type() == dtype) return t;
    empties_.push_back(at::empty({0}, at::TensorOptions().dtype(dtype).device(device_)));
    return empties_.back();
  }

  // A tensor over the whole of the unit's fetched buffer.
  at::Tensor whole_buffer(const Unit& x) const {
    const Views& v = x.bound_views;
    if (v.whole.defined() && v.data == x.base && v.dtype == x.dtype && v.num_elems == x.num_elems) return v.whole;
    return at::from_blob(reinterpret_cast<void*>(x.base), {x.num_elems},
                         at::TensorOptions().dtype(x.dtype).device(device_));
  }

  // `v`, one of unit x's Views, over its buffer at `data`, each parameter
  // at its address in `tensors`: the same tensors, their storage pointed at
  // `data`, while the buffer's type, size and layout stay.
  const Views& views(const Unit& x, Views& v, uintptr_t data, at::ScalarType dtype, int64_t num_elems,
                     void* const* tensors, size_t num_tensors) {
    if (num_tensors != x.params.size()) {
      throw std::runtime_error("zinf.torch: the engine handed out " + std::to_string(num_tensors) +
                               " tensors for unit '" + x.name + "' of " + std::to_string(x.params.size()));
    }
    int64_t size = static_cast<int64_t>(c10::elementSize(dtype));
    auto offset = [&](size_t i) {
      return x.numels[i] > 0 ? static_cast<int64_t>(reinterpret_cast<uintptr_t>(tensors[i]) - data) / size : 0;
    };
    bool same = v.whole.defined() && v.dtype == dtype && v.num_elems == num_elems;
    for (size_t i = 0; same && i < x.params.size(); ++i) same = v.offsets[i] == offset(i);
    if (same) {
      if (v.data != data && num_elems > 0) {
        void* ptr = reinterpret_cast<void*>(data);
        v.whole.storage().unsafeGetStorageImpl()->set_data_ptr_noswap(at::DataPtr(ptr, ptr, nullptr, v.whole.device()));
      }
      v.data = data;
      return v;
    }
    Views n;
    n.data = data;
    n.dtype = dtype;
    n.num_elems = num_elems;
    n.whole = num_elems > 0 ? at::from_blob(reinterpret_cast<void*>(data), {num_elems},
                                            at::TensorOptions().dtype(dtype).device(device_))
                            : at::empty({0}, at::TensorOptions().dtype(dtype).device(device_));
    for (size_t i = 0; i < x.params.size(); ++i) {
      n.offsets.push_back(offset(i));
      n.params.push_back(x.numels[i] > 0 ? n.whole.as_strided(x.shapes[i], x.strides[i], n.offsets[i])
                                         : at::empty(x.shapes[i], at::TensorOptions().dtype(dtype).device(device_)));
    }
    v = std::move(n);
    return v;
  }

  void grad_buffers(Unit& x) {
    zinf_unit_pointers p{};
    check(without_gil([&] { return grad_buffers_(engine_, x.index, &p); }), "gradient buffers of unit", x);
    if (!cuda_)
      check(without_gil([&] { return sync_(stream_); }), "gradient buffers of unit",
            x);  // on a GPU the copies are on the stream
    const Views& v = views(x, x.grad_buffer_views, reinterpret_cast<uintptr_t>(p.data), scalar_type(p.dtype),
                           p.num_elems, p.tensors, p.num_tensors);
    x.grad_views = v.params;
    x.received.assign(x.params.size(), false);
    x.pending = x.params.size();
  }

  void grads_ready(Unit& x) {
    for (size_t i = 0; i < x.grad_views.size(); ++i) {
      if (!x.received[i]) x.grad_views[i].zero_();  // the buffer is overwritten each micro-step
    }
    check(without_gil([&] { return grads_ready_(engine_, x.index, stream_); }), "gradients of unit", x);
    x.grad_views.clear();
    x.received.clear();
    x.reported = true;
    handed_over_.push_back(x.index);  // released at the next hook: torch still accumulates into .grad
  }

  void on_grad(int u, size_t i, const at::TensorBase& grad) {
    ++counts_.grads;
    CpuTimer timer(timing_ ? &times_[kGrad] : nullptr, lib_seconds_);
    if (!handed_over_.empty()) flush();
    if (static_cast<size_t>(u) >= units_.size()) return;  // closed
    Unit& x = units_[u];
    if (grad.numel() == 0 && x.numels[i] > 0) {
      // The parameter was read while its unit was not fetched (zinf/_units.py: read_outside_message).
      throw std::runtime_error("zinf.torch: parameter " + std::to_string(i) + " of unit '" + x.name +
                               "' was read outside the forward of the module that holds it, while ZeRO-3 kept "
                               "it elsewhere: the computation saw an empty tensor. Read it inside "
                               "zinf.deepspeed.zero.GatheredParameters([...]), or name the module reading it in "
                               "held_modules=[...] (held through the model's forward) or unit_modules=[...]");
    }
    if (x.grad_views.empty()) grad_buffers(x);
    x.grad_views[i].copy_(at::Tensor(grad));  // widened to fp32 (autograd gave it the parameter's shape)
    if (!x.received[i]) {
      x.received[i] = true;
      --x.pending;
    }
    if (x.pending == 0) grads_ready(x);
  }

  zinf_engine* engine_;
  zinf_stream* stream_;
  bool cuda_;
  at::Device device_;
  FetchFn fetch_;
  GradBuffersFn grad_buffers_;
  UnitCallFn grads_ready_, release_;
  SyncFn sync_;
  TextFn last_error_;
  StatusNameFn status_name_;
  std::vector<Unit> units_;
  std::vector<UnitModule> modules_;
  std::vector<int> handed_over_;
  std::vector<at::Tensor> empties_;
  struct {
    int64_t grads = 0, backward_fetches = 0, packs = 0, unpacks = 0, fetches = 0, pres = 0, posts = 0;
  } counts_;
  enum { kPre, kPost, kGrad, kBackwardFetch, kPack, kUnpack, kHooks };
  bool timing_ = false;
  bool closed_ = false;
  SecondsFn lib_seconds_ = nullptr;
  HookTime times_[kHooks];
};

}  // namespace zinf::torch
