"""The per-unit work of zinf.torch, done for every unit in every micro-step:
fetch and bind a unit's parameters, release and unbind them, copy each
gradient into the unit's fp32 buffer and report the unit, and at stage 3
keep the tensors autograd saves as places in the unit's buffer.

Two implementations of one interface (a "core", one per engine, that holds
each unit's state between hooks):
  - _zinf_torch.Core (src/torch/torch_hooks.cc), a C++ extension module:
    each hook is one call into it, and its backward fetches are autograd
    hooks in C++ that never enter Python. zinf.torch loads it from $ZINF_TORCH_EXTENSION (a path;
    "off" turns it off), else from beside the loaded libzinf.so (or
    ../torch/ from there, a build tree) or this package's folder;
  - PyCore below, the same in Python, where the extension is not built or
    does not load (then zinf.torch warns once, naming the reason).

The interface, units by the engine's index, unit modules by add_module's id:
  add_unit(index, name, params, shapes, frozen)
  watch_grads(u)                   take u's gradients (a pre-hook on each parameter's accumulator)
  add_module(units) -> id          a module whose forward needs these units
  module_hooks(m, engine) -> (pre, post)  its forward pre-hook and forward hook
  set_persistent(u, flag), set_module_persistent(m, flag)  buffers stay put (stages 0-2)
  fetch(u), release(u)             with binding and unbinding the parameters
  fetched(u), reported(u), unbind(u)
  fetch_module(m), release_module(m), after_module_backward(m)
  add_backward_fetch(output, m)    fetch m's units before the backward of output's node
  flush(), end_backward() -> [u]   the units none of whose parameters got a gradient
  counts(), close()
"""
import ctypes
import functools
import importlib.machinery
import importlib.util
import os
import warnings

import torch

from . import _capi
from ._capi import check

TORCH_DTYPE = {_capi.DTYPE_FP32: torch.float32, _capi.DTYPE_BF16: torch.bfloat16, _capi.DTYPE_FP16: torch.float16}
_CTYPE = {_capi.DTYPE_FP32: ctypes.c_float, _capi.DTYPE_BF16: ctypes.c_uint16, _capi.DTYPE_FP16: ctypes.c_uint16}
_VIEW_CACHE = 8  # buffers remembered per unit (stage 3 gathers a unit at many addresses)


class _CudaMemory:
    """`count` elements of zinf's device memory at `address`, as the CUDA
    array interface describes them (16-bit types as int16: the interface has
    no bfloat16; the caller reinterprets). stream None: the memory is used on
    the adopted stream, in its order, so torch need not synchronize."""

    def __init__(self, address, count, typestr):
        self.__cuda_array_interface__ = {"shape": (count,), "typestr": typestr, "data": (address, False),
                                         "version": 3, "strides": None, "stream": None}


def _view(address, count, zinf_dtype, shape, device=None):
    """A tensor over `count` elements of zinf memory at `address` (no copy):
    host memory, or with a CUDA `device` that GPU's memory."""
    dtype = TORCH_DTYPE[zinf_dtype]
    if device is not None and device.type == "cuda":
        if count == 0:
            return torch.empty(shape, dtype=dtype, device=device)
        wide = zinf_dtype == _capi.DTYPE_FP32
        t = torch.as_tensor(_CudaMemory(address, count, "<f4" if wide else "<i2"), device=device)
        return (t if wide else t.view(dtype)).view(shape)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    buf = (_CTYPE[zinf_dtype] * count).from_address(address)
    return torch.frombuffer(buf, dtype=dtype, count=count).view(shape)


class _HostArena:
    """The CPU device's memory, which holds every buffer the engine hands
    out, as one tensor per element type: a buffer is then a strided view at
    its offset, with no new storage for a new address."""

    def __init__(self, base, nbytes):
        self.base, self.nbytes = base, nbytes
        self._tensors = {}

    def tensor(self, zinf_dtype):
        t = self._tensors.get(zinf_dtype)
        if t is None:
            count = self.nbytes // ctypes.sizeof(_CTYPE[zinf_dtype])
            buf = (_CTYPE[zinf_dtype] * count).from_address(self.base)
            t = self._tensors[zinf_dtype] = torch.frombuffer(buf, dtype=TORCH_DTYPE[zinf_dtype], count=count)
        return t


def _contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class _SavedInUnit:
    """Marks a saved tensor kept as a place in its unit's buffer."""


def read_outside_message(what):
    """The error for a parameter read while its unit was not fetched (at
    stage 3 it is then an empty placeholder); the C++ core says the same."""
    return ("zinf.torch: %s was read outside the forward of the module that holds it, while ZeRO-3 kept it "
            "elsewhere: the computation saw an empty tensor. Read it inside "
            "zinf.deepspeed.zero.GatheredParameters([...]), or name the module reading it in held_modules=[...] "
            "(held through the model's forward) or unit_modules=[...]" % what)


class _Unit:
    """A unit's shapes and its state between hooks."""

    def __init__(self, index, name, params, shapes, frozen):
        self.index = index
        self.name = name
        self.params = params
        self.frozen = frozen
        self.shapes = [tuple(s) for s in shapes]
        self.strides = [_contiguous_strides(s) for s in self.shapes]
        self.numels = [int(torch.Size(s).numel()) for s in self.shapes]
        self.persistent = False
        self.fetched = False
        self.bound = None  # the buffer address the parameters are bound to (None: unbound)
        self.base = self.dtype = None
        self.bytes = self.num_elems = 0
        # Tensors over the unit's buffers, by (address, dtype): a fetch or a
        # gradient buffer at an address seen before reuses them (making a
        # CUDA tensor over foreign memory costs tens of microseconds).
        self.views = {}
        self.grad_views = None  # the fp32 gradient buffer's tensors, this backward
        self.received = None  # which of them got their gradient, this backward
        self.pending = 0  # parameters whose gradient has not arrived yet
        self.reported = False  # grads_ready called this backward
        # Each parameter's gradient accumulator (torch's AccumulateGrad
        # node), with zinf's pre-hook on it, once the unit is bound with its
        # gradients watched; held so that the node outlives each backward.
        self.watched = False
        self.accumulators = []
        # What zinf_engine_fetch and zinf_engine_grad_buffers fill, made once.
        self.fetch_ptrs = _capi.UnitPointers()
        self.fetch_ref = ctypes.byref(self.fetch_ptrs)
        self.grad_ptrs = _capi.UnitPointers()
        self.grad_ref = ctypes.byref(self.grad_ptrs)


class _Module:
    """A unit module's units and its state between hooks."""

    def __init__(self, units):
        self.units = units
        self.frozen = any(u.frozen for u in units)  # a frozen unit is released after the module's backward
        # Its units' buffers stay put between fetches (stages 0-2): tensors
        # saved in forward stay valid, and backward needs no second fetch.
        self.persistent = False
        self.hooks = None  # (pack, unpack) of its saved-tensor hooks, made on first use
        self.pushed = False  # they are on, this forward
        self.fetch_hook = None  # the pre-hook on the output's node that fetches the units again in backward


def _in_backward():
    return torch._C._current_graph_task_id() != -1


# What torch.autograd.graph.saved_tensors_hooks' __enter__ and __exit__ call.
_top_saved_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_push_saved_hooks = torch._C._autograd._push_saved_tensors_default_hooks
_pop_saved_hooks = torch._C._autograd._pop_saved_tensors_default_hooks


def _unit_views(unit, data, tensors, num_elems, zinf_dtype, device, arena=None):
    """(whole, per-parameter tensors) over a unit's buffer at `data`: one
    tensor over all num_elems and, at each parameter's address in `tensors`,
    a strided view of the same storage; cached by the buffer's address.
    Stage 3 gathers a unit wherever the budget has room, so a miss is
    common: with the device's `arena` it costs one as_strided per tensor,
    else also a tensor over foreign memory. A view's storage offset counts
    from its storage's start: whole.storage_offset() is where `data` is."""
    key = (data, zinf_dtype, num_elems)
    got = unit.views.get(key)
    if got is not None:
        return got
    if arena is not None and num_elems > 0:
        store = arena.tensor(zinf_dtype)
        whole = store.as_strided((num_elems,), (1,), (data - arena.base) // store.element_size())
    else:
        whole = _view(data, num_elems, zinf_dtype, (num_elems,), device)
    if tensors is None:  # the whole buffer alone (not cached: no parameter offsets)
        return whole, None
    size = whole.element_size()
    origin = whole.storage_offset() * size - data  # a pointer's byte offset in the storage, minus the pointer
    as_strided = whole.as_strided
    views = [as_strided(shape, stride, (tensors[i] + origin) // size if numel else 0)
             for i, (shape, stride, numel) in enumerate(zip(unit.shapes, unit.strides, unit.numels))]
    if len(unit.views) >= _VIEW_CACHE:
        unit.views.pop(next(iter(unit.views)))
    got = unit.views[key] = (whole, views)
    return got


class PyCore:
    """The per-unit work in Python (see the module comment). The hooks below
    run per unit per micro-step: the library, the structures the C calls
    fill and their messages are made once, not per call (a failure's
    message is formatted only when it fails)."""

    def __init__(self, engine, stream, device, arena):
        self._lib = _capi.lib()
        self._engine, self._stream = engine, stream
        self._device = device
        self._cuda = device.type == "cuda"
        self._arena = arena
        self._units = []
        self._modules = []
        self._handed_over = []
        self._empties = {}
        self._counts = {"grad": 0, "backward_fetch": 0, "pack": 0, "unpack": 0, "fetch": 0, "pre": 0, "post": 0}

    def add_unit(self, index, name, params, shapes, frozen):
        if index != len(self._units):
            raise ValueError("zinf.torch: units must be added in the engine's order")
        self._units.append(_Unit(index, name, params, shapes, frozen))
        return index

    def watch_grads(self, u):
        unit = self._units[u]
        if unit.frozen:
            raise ValueError("zinf.torch: unit '%s' is frozen" % unit.name)
        unit.watched = True
        unit.accumulators = [None] * len(unit.params)
        if unit.bound is not None:
            self._attach_grad_hooks(unit)

    def _attach_grad_hooks(self, unit):
        """A pre-hook on each bound parameter's gradient accumulator: zinf
        takes the gradient torch would accumulate, after the script's own
        tensor hooks. Attached once bound (an accumulator made while the
        parameter is empty would expect an empty gradient), again when torch
        made a new one (a new type or device)."""
        for i, p in enumerate(unit.params):
            with torch.enable_grad():
                acc = p.view_as(p).grad_fn.next_functions[0][0]
            if acc is not unit.accumulators[i]:
                acc.register_prehook(functools.partial(self._on_accumulate, unit, i))
                unit.accumulators[i] = acc

    def _on_accumulate(self, unit, index, grads):
        if grads[0] is not None:
            self._on_grad(unit, index, grads[0])

    def add_module(self, units):
        self._modules.append(_Module([self._units[u] for u in units]))
        return len(self._modules) - 1

    def set_module_persistent(self, m, flag):
        self._modules[m].persistent = flag

    def module_hooks(self, m, engine):
        """The forward pre-hook and forward hook of unit module m; the rare
        cases go to the engine (a weak reference): _pre_slow(m, args,
        kwargs, hooks_on) when saved-tensor hooks are on already
        (torch.utils.checkpoint's) or the module has a frozen unit,
        _post_slow(m, output) for an output other than one tensor."""
        mod = self._modules[m]
        counts = self._counts

        def pre(module, args, kwargs):
            counts["pre"] += 1
            for unit in mod.units:
                self._fetch(unit)
            if mod.persistent or not torch.is_grad_enabled():
                return None
            hooks_on = _top_saved_hooks(False) is not None
            if not hooks_on:
                if mod.hooks is None:
                    mod.hooks = (functools.partial(self._pack, mod), functools.partial(self._unpack, mod))
                _push_saved_hooks(*mod.hooks)
                mod.pushed = True
            if hooks_on or (mod.frozen and not _in_backward()):
                e = engine()
                return e._pre_slow(m, args, kwargs, hooks_on) if e is not None else None
            return None

        def post(module, inputs, output):
            counts["post"] += 1
            if mod.pushed:
                _pop_saved_hooks()
                mod.pushed = False
            if _in_backward():
                return None  # recomputation inside backward: the units stay until their gradients are in
            for unit in mod.units:
                self._release(unit)
            if mod.persistent or not torch.is_grad_enabled():
                return None  # the buffers stay put: backward needs no second fetch
            if isinstance(output, torch.Tensor):
                # A pre-hook on the node that made it fetches the units when
                # its gradient arrives, before the module's own backward. A
                # leaf output (an input or a parameter handed back) has no
                # node: unpacking the saved tensors fetches the units.
                if output.requires_grad:
                    self.add_backward_fetch(output, m)
                return None
            e = engine()
            return e._post_slow(m, output) if e is not None else None
        return pre, post

    def set_persistent(self, u, flag):
        self._units[u].persistent = flag

    def fetched(self, u):
        return self._units[u].fetched

    def reported(self, u):
        return self._units[u].reported

    def unbind(self, u):
        self._units[u].bound = None

    def fetch(self, u):
        self._fetch(self._units[u])

    def release(self, u):
        self._release(self._units[u])

    def _fetch(self, unit):
        if unit.fetched:
            return
        if self._engine is None:
            raise RuntimeError("zinf.torch: the engine is closed")
        if self._handed_over:
            self.flush()  # the units handed over before: released before another is gathered
        L = self._lib
        ptrs = unit.fetch_ptrs
        rc = L.zinf_engine_fetch(self._engine, unit.index, self._stream, unit.fetch_ref)
        if rc:
            check(rc, "fetch unit '%s'" % unit.name)
        if not self._cuda:  # torch computes on this thread; on a GPU, on the stream that waits
            rc = L.zinf_stream_synchronize(self._stream)
            if rc:
                check(rc, "fetch unit '%s'" % unit.name)
        if unit.bound != ptrs.data:
            _, views = _unit_views(unit, ptrs.data, ptrs.tensors, ptrs.num_elems, ptrs.dtype, self._device,
                                   self._arena)
            for p, v in zip(unit.params, views):
                p.data = v
            unit.bound = ptrs.data
            if unit.watched:
                self._attach_grad_hooks(unit)
            unit.base, unit.dtype = ptrs.data, ptrs.dtype
            unit.bytes = ptrs.num_elems * ctypes.sizeof(_CTYPE[ptrs.dtype])
            unit.num_elems = ptrs.num_elems
        unit.fetched = True
        self._counts["fetch"] += 1

    def _empty(self, dtype):
        """A zero-element tensor of `dtype` on the engine's device, one per
        dtype, that unbound parameters share."""
        t = self._empties.get(dtype)
        if t is None:
            t = self._empties[dtype] = torch.empty(0, dtype=dtype, device=self._device)
        return t

    def _release(self, unit):
        if not unit.fetched:
            return
        if not unit.persistent:
            for p in unit.params:
                p.data = self._empty(p.dtype)
            unit.bound = None
        rc = self._lib.zinf_engine_release(self._engine, unit.index, self._stream)
        if rc:
            check(rc, "release unit '%s'" % unit.name)
        unit.fetched = False

    def fetch_module(self, m):
        for unit in self._modules[m].units:
            self._fetch(unit)

    def release_module(self, m):
        for unit in self._modules[m].units:
            self._release(unit)

    def after_module_backward(self, m):
        for unit in self._modules[m].units:
            if unit.frozen or unit.reported:
                self._release(unit)

    def _backward_fetch(self, mod, grads=None):
        self._counts["backward_fetch"] += 1
        for unit in mod.units:
            self._fetch(unit)

    def add_backward_fetch(self, output, m):
        node = output.grad_fn
        if node is not None:
            mod = self._modules[m]
            if mod.fetch_hook is None:
                mod.fetch_hook = functools.partial(self._backward_fetch, mod)
            node.register_prehook(mod.fetch_hook)

    # Tensors autograd saves during a unit module's forward that lie in one of
    # its units' buffers (its parameters, and views of them such as a
    # Linear's transposed weight) are kept as (unit, offset, shape, strides):
    # the buffer is released after forward and fetched again for backward,
    # maybe elsewhere.
    def _pack(self, mod, t):
        # A tensor whose first element lies in the unit's buffer is a view of
        # it (nothing else shares that memory). data_ptr() rather than the
        # storage: building a storage object costs more than the whole test.
        self._counts["pack"] += 1
        if t.is_cuda == self._cuda and t.numel() > 0:
            start = t.data_ptr()
            for unit in mod.units:
                if unit.fetched and unit.base <= start < unit.base + unit.bytes:
                    return (_SavedInUnit, unit, start - unit.base, tuple(t.shape), t.stride(), t.dtype)
        return t

    def _unpack(self, mod, packed):
        self._counts["unpack"] += 1
        if not (isinstance(packed, tuple) and packed and packed[0] is _SavedInUnit):
            return packed
        _, unit, offset, shape, stride, dtype = packed
        self._fetch(unit)
        got = unit.views.get((unit.base, unit.dtype, unit.num_elems))
        whole = got[0] if got is not None else _unit_views(unit, unit.base, None, unit.num_elems, unit.dtype,
                                                           self._device, self._arena)[0]
        if whole.dtype != dtype:
            raise RuntimeError("zinf.torch: unit '%s' saved a %s tensor from its %s buffer"
                               % (unit.name, dtype, whole.dtype))
        return torch.as_strided(whole, shape, stride, whole.storage_offset() + offset // whole.element_size())

    def _grad_buffers(self, unit):
        L = self._lib
        ptrs = unit.grad_ptrs
        rc = L.zinf_engine_grad_buffers(self._engine, unit.index, unit.grad_ref)
        if rc:
            check(rc, "gradient buffers of unit '%s'" % unit.name)
        if not self._cuda:  # on a GPU the copies into it are kernels on the adopted stream
            rc = L.zinf_stream_synchronize(self._stream)
            if rc:
                check(rc, "gradient buffers of unit '%s'" % unit.name)
        _, unit.grad_views = _unit_views(unit, ptrs.data, ptrs.tensors, ptrs.num_elems, _capi.DTYPE_FP32,
                                         self._device, self._arena)
        unit.received = [False] * len(unit.params)
        unit.pending = len(unit.params)

    def flush(self):
        """Units whose gradients were handed over at an earlier hook: torch has
        accumulated their last gradient since (right after that hook), so
        their parameters can be unbound, released and their .grad dropped:
        the gradients never all coexist in torch."""
        if not self._handed_over:
            return
        units, self._handed_over = self._handed_over, []
        for unit in units:
            for p in unit.params:
                p.grad = None
            self._release(unit)

    def _on_grad(self, unit, index, grad):
        if self._engine is None:
            return  # closed: the hooks stay on the parameters and do nothing
        self._counts["grad"] += 1
        if self._handed_over:
            self.flush()
        if grad.numel() == 0 and unit.numels[index] > 0:
            raise RuntimeError(read_outside_message("parameter %d of unit '%s'" % (index, unit.name)))
        if unit.grad_views is None:
            self._grad_buffers(unit)
        unit.grad_views[index].copy_(grad)  # widened to fp32 by the copy (autograd gave it the parameter's shape)
        if not unit.received[index]:
            unit.received[index] = True
            unit.pending -= 1
        if unit.pending == 0:
            self._grads_ready(unit)

    def _grads_ready(self, unit):
        for view, got in zip(unit.grad_views, unit.received):
            if not got:  # the buffer is overwritten each micro-step: zeros where no gradient came
                view.zero_()
        rc = self._lib.zinf_engine_grads_ready(self._engine, unit.index, self._stream)
        if rc:
            check(rc, "gradients of unit '%s'" % unit.name)
        unit.grad_views = None
        unit.received = None
        unit.reported = True
        self._handed_over.append(unit)  # released at the next hook: torch still accumulates into .grad

    def end_backward(self):
        """Units whose parameters got no gradient are reported with zeros;
        every unit is released and its .grad dropped. Returns the units none
        of whose parameters got one."""
        without = []
        for unit in self._units:
            if unit.frozen:
                continue
            if unit.grad_views is not None:  # some of its parameters got no gradient
                self._grads_ready(unit)
            elif not unit.reported:  # none did
                self._grad_buffers(unit)
                self._grads_ready(unit)
                without.append(unit.index)
        self.flush()
        for unit in self._units:
            self._release(unit)
            unit.reported = False
            for p in unit.params:
                p.grad = None
        return without

    def counts(self):
        return dict(self._counts)

    def close(self):
        """Before the engine goes: parameters bound to its memory (stages
        0-2, or a unit fetched now) keep their values in torch's own memory;
        the others stay empty."""
        if self._engine is not None and any(unit.bound is not None for unit in self._units):
            self._lib.zinf_stream_synchronize(self._stream)  # its last writes in; an error here stays the stream's
            with torch.no_grad():
                for unit in self._units:
                    if unit.bound is not None:
                        for p in unit.params:
                            p.data = p.data.clone()
                        unit.bound = None
        self._engine = None  # the model's hooks refuse to run from now on
        self._handed_over = []
        for unit in self._units:
            unit.views = {}
            unit.grad_views = None


def _loaded_library_path():
    """Where the libzinf.so this process loaded lies (None if unknown)."""
    _capi.lib()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("libzinf.so"):
                    return os.path.realpath(path)
    except OSError:
        pass
    lib = os.environ.get("ZINF_LIBRARY")
    return os.path.realpath(lib) if lib else None


_EXTENSION = None  # (module or None, why it is not used)


def _check_torch_version(path):
    """Refuses a C++ core built against another torch (its C++ ABI changes between releases: loading it
    could crash later rather than now). The version is the one its build recorded beside it."""
    recorded = os.path.join(os.path.dirname(path), "_zinf_torch.torch_version")
    if not os.path.isfile(recorded):
        return
    with open(recorded) as f:
        built = f.read().strip()
    if built and built != torch.__version__:
        raise ImportError("zinf.torch: its C++ core %s was built against torch %s, but this environment has torch "
                          "%s. Rebuild zinf against this torch (`pip install --no-build-isolation --force-reinstall "
                          "<zinf source>`, or scripts/build for a build tree), or set ZINF_TORCH_EXTENSION=off to "
                          "run its slower Python core." % (path, built, torch.__version__))


def extension():
    """The C++ core's module, or None (and why) where it is not used."""
    global _EXTENSION
    if _EXTENSION is not None:
        return _EXTENSION
    wanted = os.environ.get("ZINF_TORCH_EXTENSION", "")
    if wanted.lower() in ("0", "off", "no", "false"):
        _EXTENSION = (None, "ZINF_TORCH_EXTENSION=%s" % wanted)
        return _EXTENSION
    if wanted:
        paths = [wanted]
    else:
        # This package's folder; the loaded libzinf.so's (an install puts the
        # module there) and ../torch/ beside it (a build tree).
        places = [os.path.dirname(os.path.abspath(__file__))]
        lib = _loaded_library_path()
        if lib:
            places += [os.path.dirname(lib), os.path.join(os.path.dirname(os.path.dirname(lib)), "torch")]
        suffixes = importlib.machinery.EXTENSION_SUFFIXES  # this interpreter's (others' modules are skipped)
        paths = [os.path.join(place, "_zinf_torch" + suffix) for place in places for suffix in suffixes]
        paths = [p for p in paths if os.path.isfile(p)]
    if not paths:
        _EXTENSION = (None, "no _zinf_torch module for this Python beside zinf or libzinf.so (build it: src/torch, "
                            "or scripts/build_torch_ext.py)")
        return _EXTENSION
    failures = []
    for path in paths:
        _check_torch_version(path)
        try:
            spec = importlib.util.spec_from_file_location("_zinf_torch", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except ImportError as e:
            if wanted:
                raise ImportError("zinf.torch: ZINF_TORCH_EXTENSION=%s does not load: %s" % (wanted, e)) from e
            failures.append("%s does not load: %s" % (path, e))
            continue
        _EXTENSION = (module, None)
        return _EXTENSION
    _EXTENSION = (None, "; ".join(failures))
    return _EXTENSION


_WARNED = []


def make_core(engine, stream, device, arena):
    """The C++ core where its module loads, else the Python one (warning once why)."""
    module, why = extension()
    if module is None:
        if not _WARNED and not why.startswith("ZINF_TORCH_EXTENSION="):
            _WARNED.append(why)
            warnings.warn("zinf.torch runs its per-unit hooks in Python, which costs the host more: " + why,
                          RuntimeWarning, stacklevel=3)
        return PyCore(engine, stream, device, arena)
    L = _capi.lib()
    fns = {name: ctypes.cast(getattr(L, name), ctypes.c_void_p).value
           for name in ("zinf_engine_fetch", "zinf_engine_grad_buffers", "zinf_engine_grads_ready",
                        "zinf_engine_release", "zinf_stream_synchronize", "zinf_last_error", "zinf_status_name")}
    return module.Core(fns, engine.value, stream.value, device.type == "cuda", str(device), _capi.ZinfError)
