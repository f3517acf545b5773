// _zinf_torch: zinf.torch's per-unit work in C++ (a torch extension module).
//
// What zinf.torch does for every unit in every micro-step (fetch and bind
// its parameters, release and unbind them, copy each gradient into the
// unit's fp32 buffer, report the unit, and at stage 3 keep the tensors
// autograd saves as places in the unit's buffer) costs tens of
// microseconds a unit in Python. Here it is plain C++: the fetch before a
// module's backward and the gradient hooks (pre-hooks on the parameters'
// gradient accumulators) are C++ autograd hooks that never enter Python;
// a unit module's forward is wrapped in a callable of this module's own,
// and the saved-tensor hooks torch calls through Python are plain CPython
// functions here. A unit's parameters are views of one storage per unit,
// pointed at wherever the engine fetched the unit: a fetch makes no tensor.
//
// The state of each unit (fetched, bound where, its gradient buffer this
// backward) lives in a Core, one per engine; python/zinf/torch.py keeps the
// rest (units' names and shapes, the state dict, checkpoints) and asks the
// Core for this state. The library's functions come as addresses from the
// ctypes handle that zinf.torch loaded, so both call the same libzinf.
//
// Threads: torch calls the hooks of one backward one at a time (on the
// calling thread for the CPU, on the device's autograd thread for a GPU),
// and the engine takes calls from one thread at a time, so the Core needs
// no lock. The C++ hooks run without the GIL and touch no Python object.
#include "torch_comm.h"
#include "torch_core.h"

// After Python.h, which the torch headers include.
#include <structmember.h>

namespace zinf::torch {

// A unit module's forward wrapped in zinf's work before and after it (what
// Core::forward_pre and Core::forward_post do as hooks), as one CPython
// callable: torch's call of the module reaches it with the arguments as
// they came (vectorcall), and it hands them on to the module's own forward
// the same way. No Python frame, argument tuple or hook dispatch of
// zinf's runs per call; the arguments are gathered into a tuple and a dict
// only for the Python engine's rare cases (_pre_slow).
struct ForwardWrapper {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* dict;     // the attributes functools.update_wrapper sets (__wrapped__: the signature)
  PyObject* forward;  // the module's own
  PyObject* engine;   // a weak reference to the Python engine
  std::weak_ptr<Core>* core;
  int m;

  inline static PyTypeObject* type = nullptr;

  static py::object Make(const std::shared_ptr<Core>& core, int m, py::object engine, py::object forward) {
    core->module(m);
    if (!PyCallable_Check(forward.ptr()))
      throw std::invalid_argument("zinf.torch: the module's forward is not callable");
    auto* w = reinterpret_cast<ForwardWrapper*>(type->tp_alloc(type, 0));
    if (w == nullptr) throw py::error_already_set();
    w->vectorcall = &Call;
    w->forward = forward.release().ptr();
    w->engine = engine.release().ptr();
    w->core = new std::weak_ptr<Core>(core);
    w->m = m;
    return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(w));
  }

  static PyObject* Call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    auto* w = reinterpret_cast<ForwardWrapper*>(self);
    std::shared_ptr<Core> core = w->core->lock();
    if (w->forward == nullptr) {  // cleared by the garbage collector
      PyErr_SetString(PyExc_RuntimeError, "zinf.torch: this unit module's forward was dropped");
      return nullptr;
    }
    if (!core) {
      PyErr_SetString(PyExc_RuntimeError, "zinf.torch: the engine is closed (or no longer referenced)");
      return nullptr;
    }
    py::object engine = py::reinterpret_borrow<py::object>(w->engine);
    // Before: the units fetched; the rare cases go to the Python engine,
    // which may hand back other arguments.
    PyObject* output = nullptr;
    try {
      bool hooks_on = false;
      if (!core->begin_forward(w->m, &hooks_on)) {
        output = PyObject_Vectorcall(w->forward, args, nargsf, kwnames);
      } else {
        Py_ssize_t n = PyVectorcall_NARGS(nargsf);
        py::tuple a(n);
        for (Py_ssize_t i = 0; i < n; ++i) a[i] = py::reinterpret_borrow<py::object>(args[i]);
        py::dict k;
        Py_ssize_t nk = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
        for (Py_ssize_t i = 0; i < nk; ++i)
          k[py::handle(PyTuple_GET_ITEM(kwnames, i))] = py::reinterpret_borrow<py::object>(args[n + i]);
        py::object changed = Core::slow(engine, "_pre_slow", w->m, a, k, hooks_on);
        if (!changed.is_none()) {
          auto ak = changed.cast<std::pair<py::tuple, py::dict>>();
          a = ak.first;
          k = ak.second;
        }
        output = PyObject_Call(w->forward, a.ptr(), k.ptr());
      }
    } catch (...) {
      TranslateException();
    }
    // After, also when the work before or the forward raised (as a forward
    // hook with always_call runs): the saved-tensor hooks off and the
    // units released.
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    if (output == nullptr) PyErr_Fetch(&type, &value, &tb);
    PyObject* result = nullptr;
    try {
      py::object out = output != nullptr ? py::reinterpret_borrow<py::object>(output) : py::none();
      py::object changed = core->forward_post(w->m, engine, out);
      if (output != nullptr) result = changed.is_none() ? Py_NewRef(output) : changed.release().ptr();
    } catch (...) {
      TranslateException();
    }
    Py_XDECREF(output);
    if (type == nullptr) return result;  // the forward's output, or the hook's error
    if (!PyErr_Occurred()) {
      PyErr_Restore(type, value, tb);  // the forward's error
      return nullptr;
    }
    // Both failed: the hook's error, raised while the forward's was
    // handled (its __context__), as a finally clause's would be.
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != nullptr) PyException_SetTraceback(value, tb);
    PyObject *type2 = nullptr, *value2 = nullptr, *tb2 = nullptr;
    PyErr_Fetch(&type2, &value2, &tb2);
    PyErr_NormalizeException(&type2, &value2, &tb2);
    PyException_SetContext(value2, value);  // takes the reference
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyErr_Restore(type2, value2, tb2);
    return nullptr;
  }

  static int Traverse(PyObject* self, visitproc visit, void* arg) {
    auto* w = reinterpret_cast<ForwardWrapper*>(self);
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(w->dict);
    Py_VISIT(w->forward);
    Py_VISIT(w->engine);
    return 0;
  }

  static int Clear(PyObject* self) {
    auto* w = reinterpret_cast<ForwardWrapper*>(self);
    Py_CLEAR(w->dict);
    Py_CLEAR(w->forward);
    Py_CLEAR(w->engine);
    return 0;
  }

  static void Dealloc(PyObject* self) {
    auto* w = reinterpret_cast<ForwardWrapper*>(self);
    PyTypeObject* tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    Clear(self);
    delete w->core;
    tp->tp_free(self);
    Py_DECREF(tp);
  }

  // The type, made once as the module loads.
  static void MakeType(py::module_& m) {
    static PyMemberDef members[] = {
        {"__vectorcalloffset__", T_PYSSIZET, offsetof(ForwardWrapper, vectorcall), READONLY, nullptr},
        {"__dictoffset__", T_PYSSIZET, offsetof(ForwardWrapper, dict), READONLY, nullptr},
        {nullptr, 0, 0, 0, nullptr}};
    static PyGetSetDef getset[] = {{"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
                                   {nullptr, nullptr, nullptr, nullptr, nullptr}};
    static PyType_Slot slots[] = {{Py_tp_call, reinterpret_cast<void*>(&PyVectorcall_Call)},
                                  {Py_tp_traverse, reinterpret_cast<void*>(&Traverse)},
                                  {Py_tp_clear, reinterpret_cast<void*>(&Clear)},
                                  {Py_tp_dealloc, reinterpret_cast<void*>(&Dealloc)},
                                  {Py_tp_members, members},
                                  {Py_tp_getset, getset},
                                  {Py_tp_doc, const_cast<char*>("A unit module's forward with zinf's work around it")},
                                  {0, nullptr}};
    static PyType_Spec spec = {
        "_zinf_torch.UnitForward", sizeof(ForwardWrapper), 0,
        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_DISALLOW_INSTANTIATION,
        slots};
    PyObject* t = PyType_FromSpec(&spec);
    if (t == nullptr) throw py::error_already_set();
    type = reinterpret_cast<PyTypeObject*>(t);
    m.add_object("UnitForward", py::reinterpret_borrow<py::object>(t));
  }
};

}  // namespace zinf::torch

using zinf::torch::CallError;
using zinf::torch::Core;
using zinf::torch::ForwardWrapper;
using zinf::torch::g_zinf_error;
using zinf::torch::SavedInUnit;

PYBIND11_MODULE(_zinf_torch, m) {
  m.doc() = "zinf.torch's per-unit work (fetch, bind, gradients, saved tensors) in C++";
  py::register_local_exception_translator([](std::exception_ptr e) {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const CallError& err) {
      if (g_zinf_error == nullptr) throw;
      py::object value = py::handle(g_zinf_error)(err.code, err.what, err.message);
      PyErr_SetObject(g_zinf_error, value.ptr());
    }
  });
  ForwardWrapper::MakeType(m);
  zinf::torch::RegisterComm(m);
  py::class_<SavedInUnit>(m, "SavedInUnit");
  py::class_<Core, std::shared_ptr<Core>>(m, "Core")
      .def(py::init<const py::dict&, uintptr_t, uintptr_t, bool, const std::string&, py::object>())
      .def("add_unit", &Core::add_unit)
      .def("watch_grads", &Core::watch_grads)
      .def("add_module", &Core::add_module)
      .def("set_persistent", &Core::set_persistent)
      .def("fetched", &Core::fetched)
      .def("reported", &Core::reported)
      .def("unbind", &Core::unbind)
      .def("fetch", &Core::fetch)
      .def("release", &Core::release)
      .def("fetch_module", &Core::fetch_module)
      .def("release_module", &Core::release_module)
      .def("after_module_backward", &Core::after_module_backward)
      .def("add_backward_fetch", &Core::add_backward_fetch)
      .def("flush", &Core::flush)
      .def("end_backward", &Core::end_backward)
      .def("pack", &Core::pack)
      .def("unpack", &Core::unpack)
      .def("module_hooks", &Core::module_hooks)
      .def("wrap_forward",
           [](const std::shared_ptr<Core>& self, int module, py::object engine, py::object forward) {
             return ForwardWrapper::Make(self, module, std::move(engine), std::move(forward));
           })
      .def("set_module_persistent", &Core::set_module_persistent)
      .def("counts", &Core::counts)
      .def("set_timing", &Core::set_timing)
      .def("times", &Core::times)
      .def("close", &Core::close);
}
