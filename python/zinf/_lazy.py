"""Parameters kept on disk while a model is built (zinf.deepspeed.zero.Init).

When a module's constructor returns, the values of its parameters go to an
unlinked file (the spill) and the module holds a meta-device parameter in
each one's place, so building a model takes host memory for one module's
parameters, not the model's. While the Init block runs, what the code that
builds the model does afterwards to such a parameter is carried out on its
value from the spill: a parent's init, transformers' post_init, writes
through views such as weight[0] or .data, reads such as .item(). The steps
run in the same order and draw the same random numbers as on a model built
whole, so the values are the same bit for bit. initialize() then reads each
parameter as it registers the parameter's unit (Reader).

Outside the block a spilled parameter is a placeholder, as DeepSpeed's
partitioned parameters are: GatheredParameters gives its value. One
process, one thread: the spill and its cache are not shared.
"""
import collections
import ctypes
import functools
import os
import tempfile
import types
import weakref

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

_TAG = "_zinf_lazy"  # on a meta tensor: (Record, chain of (func, args after self, kwargs))
_INPLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
                    "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"}
# In-place by name, but on the tensor object, not its values.
_METADATA_INPLACE = {"requires_grad_", "retain_grad", "share_memory_", "_fix_weakref", "__setstate__"}
_CACHE_BYTES = 64 << 20


class Record:
    """Where one value lies in a spill."""
    __slots__ = ("spill", "offset", "nbytes", "dtype", "shape")

    def __init__(self, spill, offset, nbytes, dtype, shape):
        self.spill, self.offset, self.nbytes, self.dtype, self.shape = spill, offset, nbytes, dtype, shape


def _bytes_of(t):
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""


class Spill:
    """An unlinked file in `directory` (gone when the process is), written
    at its end and read with pread, with a small write-back cache of the
    values being worked on."""

    def __init__(self, directory):
        os.makedirs(directory, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="zinf-init-", suffix=".spill", dir=directory)
        os.unlink(path)
        self.fd, self.path, self.end = fd, path, 0
        self.cache = collections.OrderedDict()  # id(record) -> [record, tensor, dirty]
        self.cached_bytes = 0
        self.release_memory = _libc_trim()

    def __del__(self):
        fd = self.__dict__.get("fd")
        if fd is not None:
            os.close(fd)
            self.fd = None

    def _pwrite(self, data, offset):
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            got = os.pwrite(self.fd, view[done:], offset + done)
            if got <= 0:
                raise OSError("zinf: pwrite %s offset=%d len=%d: nothing written" % (self.path, offset + done,
                                                                                     len(view) - done))
            done += got

    def append(self, tensor):
        """Writes `tensor`'s values at the end; returns their Record."""
        data = _bytes_of(tensor)
        offset = (self.end + 63) // 64 * 64
        try:
            self._pwrite(data, offset)
        except OSError as e:
            raise OSError("zinf: zero.Init spill %s offset=%d len=%d: %s" % (self.path, offset, len(data), e)) from e
        self.end = offset + len(data)
        return Record(self, offset, len(data), tensor.dtype, tuple(tensor.shape))

    def _read(self, record):
        buf = bytearray(record.nbytes)
        view = memoryview(buf)
        done = 0
        while done < record.nbytes:
            got = os.preadv(self.fd, [view[done:]], record.offset + done)
            if got <= 0:
                raise OSError("zinf: pread %s offset=%d len=%d: end of file" % (self.path, record.offset + done,
                                                                                record.nbytes - done))
            done += got
        if not record.nbytes:
            return torch.empty(record.shape, dtype=record.dtype)
        return torch.frombuffer(buf, dtype=record.dtype).reshape(record.shape)

    def value(self, record):
        """The record's values as a CPU tensor that stays current until
        evicted: writes into it reach the spill (after mark_dirty)."""
        entry = self.cache.get(id(record))
        if entry is not None:
            self.cache.move_to_end(id(record))
            return entry[1]
        t = self._read(record)
        self.cache[id(record)] = [record, t, False]
        self.cached_bytes += record.nbytes
        return t

    def trim(self):
        """Writes back and drops the values least recently used beyond the
        cache's budget (between calls: never a value a call is using)."""
        evicted = 0
        while len(self.cache) > 2 and self.cached_bytes > _CACHE_BYTES:
            evicted += self._evict(next(iter(self.cache)))
        if evicted >= (1 << 20):
            self.release_memory()

    def mark_dirty(self, record):
        self.cache[id(record)][2] = True

    def _evict(self, key):
        record, t, dirty = self.cache.pop(key)
        self.cached_bytes -= record.nbytes
        if dirty:
            self._pwrite(_bytes_of(t), record.offset)
        return record.nbytes

    def flush(self):
        for key in list(self.cache):
            self._evict(key)


def tag(t):
    return t.__dict__.get(_TAG) if isinstance(t, torch.Tensor) else None


def is_lazy(p):
    return tag(p) is not None


def value(t):
    """A lazily held tensor's current value: a CPU tensor (a view into the
    spill's cache when the chain is one of views)."""
    record, chain = tag(t)
    v = record.spill.value(record)
    for func, rest, kwargs in chain:
        v = func(v, *rest, **kwargs)
    return v


def _real(tree):
    return pytree.tree_map(lambda x: value(x) if tag(x) is not None else x, tree)


def _is_data_descriptor(func, name):
    owner = getattr(func, "__self__", None)
    return getattr(owner, "__name__", None) == name and getattr(owner, "__objclass__", None) is torch._C.TensorBase


class LazyMode(TorchFunctionMode):
    """Runs what the model's code does to spilled parameters on their
    values; every other torch call passes through untouched."""

    def __init__(self, spill, keep_writes=True):
        super().__init__()
        self.spill = spill
        self.keep_writes = keep_writes  # False: writes to spilled values are dropped
        self.busy = False

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.busy:
            return func(*args, **kwargs)
        leaves = pytree.tree_leaves((args, kwargs))
        lazy = [x for x in leaves if tag(x) is not None]
        if not lazy:
            return func(*args, **kwargs)
        self.busy = True
        try:
            self.spill.trim()
            if isinstance(func, types.FunctionType):
                return self._composite(func, args, kwargs, lazy)
            return self._handle(func, args, kwargs, lazy)
        finally:
            self.busy = False

    def _composite(self, func, args, kwargs, lazy):
        """A Python function of torch's (torch.nn.init.normal_, a Tensor
        method written in Python): its torch calls do not come back here,
        so it runs on the values; one named in place (ending in _) has
        written the spilled arguments, and returns the one it was given."""
        real = {}

        def to_real(x):
            if tag(x) is None:
                return x
            v = value(x)
            real[id(v)] = x
            return v
        real_args, real_kwargs = pytree.tree_map(to_real, (args, kwargs))
        inplace = func.__name__.endswith("_") and not func.__name__.startswith("_")
        if inplace and not self.keep_writes:
            return args[0] if args else next(iter(lazy))
        result = func(*real_args, **real_kwargs)
        if inplace:
            for x in lazy:
                self.spill.mark_dirty(tag(x)[0])
        if isinstance(result, torch.Tensor) and id(result) in real:
            return real[id(result)]
        return result

    def _handle(self, func, args, kwargs, lazy):
        name = getattr(func, "__name__", "")
        target = args[0] if args else None
        if name == "__set__" and _is_data_descriptor(func, "data"):  # p.data = v
            p, v = args
            if tag(v) is not None:
                func(p, v)
                p.__dict__[_TAG] = tag(v)
            else:
                func(p, torch.empty(v.shape, dtype=v.dtype, device="meta"))
                p.__dict__[_TAG] = (self.spill.append(v), ())
            return None
        out = kwargs.get("out")
        inplace = (name.endswith("_") and not name.startswith("_")) or name in _INPLACE_DUNDERS
        if out is not None and tag(out) is not None:
            raise NotImplementedError("zinf: zero.Init: %s(out=...) into a spilled parameter; write it with "
                                      "copy_ instead" % name)
        if inplace and name not in _METADATA_INPLACE and tag(target) is not None:
            try:
                result = func(*args, **kwargs)  # the meta tensor's own state
            except (RuntimeError, NotImplementedError, TypeError):
                result = target  # a mix of devices the meta kernel refuses: the values decide
            if self.keep_writes:
                real_args, real_kwargs = _real((args, kwargs))
                func(*real_args, **real_kwargs)
                self.spill.mark_dirty(tag(target)[0])
            return result
        if inplace and name not in _METADATA_INPLACE:  # a real tensor written from spilled values
            real_args, real_kwargs = _real((args, kwargs))
            return func(*real_args, **real_kwargs)
        try:
            result = func(*args, **kwargs)
        except (RuntimeError, NotImplementedError, TypeError):  # data a meta tensor does not have (item, cpu)
            real_args, real_kwargs = _real((args, kwargs))
            return func(*real_args, **real_kwargs)
        if not isinstance(result, torch.Tensor):
            return result  # shapes, dtypes, flags: the meta tensor's are the value's
        alias = (name in ("detach", "__get__") and (name == "detach" or _is_data_descriptor(func, "data")))
        if (result.is_meta and tag(target) is not None and len(lazy) == 1
                and (alias or result._is_view())):
            record, chain = tag(target)
            result.__dict__[_TAG] = (record, chain + ((func, tuple(args[1:]), dict(kwargs)),))
            return result
        # A new tensor computed from spilled values: computed from them.
        real_args, real_kwargs = _real((args, kwargs))
        return func(*real_args, **real_kwargs)


def spill_module(module, spill, replaced):
    """Moves the values of `module`'s parameters, and of its descendants'
    not moved yet, into `spill`; each becomes a meta parameter holding a
    tag. `replaced` maps id(old parameter) -> (ref to old, new) so that a
    parameter held by several modules becomes one new parameter (the old
    one weakly: while anything holds it, so does its storage)."""
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is None or tag(p) is not None:
                continue
            if id(p) in replaced and replaced[id(p)][0]() is p:
                m._parameters[name] = replaced[id(p)][1]
                continue
            if p.is_meta:
                continue  # built on the meta device on purpose: not ours
            record = spill.append(p)
            new = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                     requires_grad=p.requires_grad)
            for k, v in p.__dict__.items():
                if k != _TAG:
                    new.__dict__[k] = v
            new.__dict__[_TAG] = (record, ())
            m._parameters[name] = new
            # Weakly: a parameter object kept alive keeps its storage, even
            # with its .data replaced.
            replaced[id(p)] = (weakref.ref(p), new)
            p.data = torch.empty(0, dtype=p.dtype)


def _libc_trim():
    """glibc's malloc_trim, or a no-op: freed parameters are returned to the
    system at once (glibc keeps freed heap memory, and raises its mmap
    threshold after a large free, so a model built and spilled module by
    module would otherwise grow the process as if it were kept)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]
    return lambda: trim(0)


def _subclasses(cls):
    out, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.append(sub)
                todo.append(sub)
    return out


class Builder:
    """What zinf.deepspeed.zero.Init does while its block runs: every
    nn.Module subclass's constructor, when the outermost one for an object
    returns, spills the object's parameters; LazyMode is active."""

    def __init__(self, directory):
        self.spill = Spill(directory)
        self.replaced = {}
        self.depth = {}
        self.patched = []
        self.mode = LazyMode(self.spill)
        self.hook = None
        self.saved_init_subclass = None
        self.trim = self.spill.release_memory

    def _wrap(self, cls):
        original = cls.__dict__.get("__init__")
        if original is None or getattr(original, "_zinf_wrapped", False):
            return
        builder = self

        @functools.wraps(original)
        def __init__(obj, *args, **kwargs):
            key = id(obj)
            builder.depth[key] = builder.depth.get(key, 0) + 1
            try:
                original(obj, *args, **kwargs)
            finally:
                builder.depth[key] -= 1
                outermost = builder.depth[key] == 0
                if outermost:
                    del builder.depth[key]
            if outermost:
                before = builder.spill.end
                spill_module(obj, builder.spill, builder.replaced)
                if builder.spill.end - before >= (1 << 20):
                    builder.trim()
        __init__._zinf_wrapped = True
        cls.__init__ = __init__
        self.patched.append((cls, original))

    def __enter__(self):
        for cls in _subclasses(torch.nn.Module):
            self._wrap(cls)
        builder = self
        self.saved_init_subclass = torch.nn.Module.__dict__.get("__init_subclass__")

        def __init_subclass__(cls, **kwargs):
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            builder._wrap(cls)
        torch.nn.Module.__init_subclass__ = classmethod(__init_subclass__)

        def registration(module, name, param):
            if param is not None and id(param) in self.replaced and self.replaced[id(param)][0]() is param:
                return self.replaced[id(param)][1]  # a parameter taken before its module spilled it
            return None
        self.hook = torch.nn.modules.module.register_module_parameter_registration_hook(registration)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        self.hook.remove()
        if self.saved_init_subclass is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self.saved_init_subclass
        for cls, original in reversed(self.patched):
            cls.__init__ = original
        self.patched.clear()
        self.replaced.clear()  # the old parameters hold nothing; the new ones keep the spill alive
        self.spill.flush()
        return False


class Reader:
    """initialize()'s source of initial values for a model built under
    zero.Init: a spilled parameter's from the spill, any other's its own."""

    def __init__(self, model):
        self.params = dict(model.named_parameters())

    def __call__(self, name, shape=None):
        p = self.params[name]
        if tag(p) is None:
            return p.detach().to(device="cpu", dtype=torch.float32)
        v = value(p).to(torch.float32).clone()
        tag(p)[0].spill.trim()
        if shape is not None and tuple(v.shape) != tuple(shape):
            raise ValueError("zinf: the spilled value of '%s' has shape %s, the parameter %s"
                             % (name, tuple(v.shape), tuple(shape)))
        return v

    def unused(self):
        return []


def has_lazy(model):
    return any(tag(p) is not None for p in model.parameters())
