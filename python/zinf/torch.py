"""zinf as the offload backend of a PyTorch model.

    import zinf.torch
    engine = zinf.torch.initialize(model, config="ds_config.json")
    loss = engine(batch)          # the model's forward
    engine.backward(loss)
    engine.step()

Units. Each chosen submodule is one engine unit: by default each child of the
model's largest nn.ModuleList (the transformer blocks), plus one unit for
every other parameter (embeddings, final norm, head; tied parameters once);
`unit_modules=[...]` chooses the submodules instead. The engine holds the
parameters (fp32 masters, the compute copy in the config's precision, Adam's
m and v, each on the tier the config puts it: device, host memory or NVMe);
the module's own parameter tensors are emptied and, while a unit is in use,
bound to the engine's buffers without a copy.

The protocol, per micro-step, as zinf's engine wants it (include/zinf/engine.h):
  - the model's forward pre-hook fetches the "rest" unit and keeps it until
    its gradients are ready (it serves the embedding at the start and the
    head at the end);
  - a block's forward pre-hook fetches and binds it, its forward hook
    releases it and attaches an autograd function to its outputs whose
    backward fetches and binds it again before the block's own backward;
  - each parameter's gradient hook copies the gradient into the unit's fp32
    gradient buffer; when every parameter of the unit has its gradient the
    unit is reported ready and released;
  - `backward` reports the units whose parameters got no gradient (zeros),
    `step` ends the micro-step (the optimizer runs at accumulation
    boundaries: the config's AdamW, schedule, clipping and loss scaling).

Devices. The engine runs where the model's parameters are when initialize()
is called: a model on the CPU trains on zinf's host device, a model on a CUDA
GPU on that GPU (the config's "zinf": {"device": ...} may say so too, and
must then agree). On a GPU the engine adopts torch's current CUDA stream at
initialize(): fetches make that stream wait for a unit's gather and update,
the unit's buffers are bound to the parameters as CUDA tensors (no copy),
gradients are copied into zinf's buffers by kernels on the same stream, and
no call waits on the host in a micro-step. The forward and backward must run
on that stream (torch's default unless the caller switches streams). The
engine's device memory is a budget it takes at initialize(): the config's
zinf.device_memory, or by default what its tiers need for this model (the
compute copy, the fp32 gradients, the optimizer state if it stays on the
GPU) plus staging, leaving the rest of the GPU to torch's activations.

Under mpirun each rank runs its own copy of the script on its own batches;
the engine reduces the gradients across ranks (zinf_comm_create_mpi).
"""
import ctypes
import json
import os
import struct

import torch

from . import _capi
from ._capi import check

_TORCH_DTYPE = {_capi.DTYPE_FP32: torch.float32, _capi.DTYPE_BF16: torch.bfloat16, _capi.DTYPE_FP16: torch.float16}
_CTYPE = {_capi.DTYPE_FP32: ctypes.c_float, _capi.DTYPE_BF16: ctypes.c_uint16, _capi.DTYPE_FP16: ctypes.c_uint16}


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
    dtype = _TORCH_DTYPE[zinf_dtype]
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


_VIEW_CACHE = 8  # buffers remembered per unit (stage 3 gathers into a few slots)


def _unit_views(unit, data, tensors, num_elems, zinf_dtype, device):
    """(whole, per-parameter tensors) over a unit's buffer at `data`: one
    tensor over all num_elems, sliced at each parameter's address in
    `tensors`; cached by the buffer's address."""
    key = (data, zinf_dtype, num_elems)
    got = unit.views.get(key)
    if got is None and tensors is None:  # the whole buffer alone (not cached: no parameter offsets)
        return _view(data, num_elems, zinf_dtype, (num_elems,), device), None
    if got is None:
        whole = _view(data, num_elems, zinf_dtype, (num_elems,), device)
        size = whole.element_size()
        views = []
        for i in range(len(unit.params)):
            offset = (tensors[i] - data) // size if unit.numels[i] else 0
            views.append(whole.narrow(0, offset, unit.numels[i]).view(unit.shapes[i]))
        if len(unit.views) >= _VIEW_CACHE:
            unit.views.pop(next(iter(unit.views)))
        got = unit.views[key] = (whole, views)
    return got


def _model_device(model, zinf_keys):
    """The device the engine runs on: where the model's parameters are; the
    config's zinf.device, when given, must agree."""
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1:
        raise ValueError("zinf.torch: the model's parameters are on several devices (%s); move the model to one "
                         "device before initialize()" % ", ".join(sorted(str(d) for d in devices)))
    device = devices.pop() if devices else torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError("zinf.torch: the model is on %s; zinf runs models on the CPU or a CUDA GPU" % device)
    wanted = zinf_keys.get("device", "auto")
    if wanted not in (None, "auto"):
        ok = (wanted == "cpu" and device.type == "cpu") or (
            device.type == "cuda" and wanted in ("cuda", "cuda:%d" % device.index))
        if not ok:
            raise ValueError("zinf.torch: the config's zinf.device is '%s' but the model is on %s; move the model "
                             "there or change the config" % (wanted, device))
    return device


def _default_device_budget(model, config, device):
    """The engine's device budget on a GPU it shares with torch, when the
    config sets none (the engine alone would take 90% of the free memory):
    per parameter the compute copy, the fp32 gradient and, with the optimizer
    on the device, its fp32 state; a fifth more and 1 GiB for staging; at most
    90% of what is free. zinf.device_memory overrides it."""
    n = sum(p.numel() for p in model.parameters())
    half = any(isinstance(config.get(k), dict) and config[k].get("enabled") is True for k in ("bf16", "fp16"))
    zero = config.get("zero_optimization") if isinstance(config.get("zero_optimization"), dict) else {}
    opt = zero.get("offload_optimizer") if isinstance(zero.get("offload_optimizer"), dict) else {}
    on_device = opt.get("device", "none") in (None, "none")
    per_param = (2 if half else 4) + 4 + (16 if on_device else 0)
    free, _ = torch.cuda.mem_get_info(device)
    return int(min(free * 0.9, n * per_param * 1.2 + (1 << 30)))


class _SavedInUnit:
    """Marks a saved tensor kept as a place in its unit's buffer."""


class _Unit:
    def __init__(self, index, name, params):
        self.index = index
        self.name = name
        self.params = params  # [(qualified name, nn.Parameter)]
        self.fetched = False
        self.shapes = []  # of the parameters
        self.numels = []
        self.grad_views = None  # the fp32 gradient buffer's tensors, this backward
        self.received = None  # which of them got their gradient, this backward
        self.pending = 0  # parameters whose gradient has not arrived yet
        # Tensors over the unit's buffers, by (address, dtype): a fetch or a
        # gradient buffer at an address seen before reuses them (making a
        # CUDA tensor over foreign memory costs tens of microseconds).
        self.views = {}
        self.reported = False  # grads_ready called this backward


class _PreBackward(torch.autograd.Function):
    """Identity on a block's outputs; its backward fetches the block again."""

    @staticmethod
    def forward(ctx, engine, unit, *tensors):
        ctx.engine, ctx.unit = engine, unit
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.engine._fetch(ctx.unit)
        return (None, None) + grads


def _largest_module_list(model):
    best, best_count = None, 0
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList):
            count = sum(p.numel() for p in m.parameters())
            if count > best_count:
                best, best_count = m, count
    return list(best) if best is not None else []


class Engine:
    """The model under zinf; see the module comment. Created by initialize()."""

    def __init__(self, model, config, unit_modules=None, comm_timeout_seconds=None):
        L = _capi.lib()
        if isinstance(config, dict):
            config_text = json.dumps(config)
        elif isinstance(config, str) and os.path.exists(config):
            with open(config) as f:
                config_text = f.read()
        else:
            config_text = config
        try:
            zinf_keys = json.loads(config_text).get("zinf", {})
        except (ValueError, AttributeError):
            zinf_keys = {}  # the engine's parser names what is wrong
        if not isinstance(zinf_keys, dict):
            zinf_keys = {}
        self.device = _model_device(model, zinf_keys)
        self._cuda = self.device.type == "cuda"
        try:  # the engine's device is the model's
            parsed = json.loads(config_text)
            if isinstance(parsed, dict):
                block = parsed.setdefault("zinf", {})
                if isinstance(block, dict):
                    block["device"] = "cuda:%d" % self.device.index if self._cuda else "cpu"
                    if self._cuda and not block.get("device_memory"):
                        block["device_memory"] = _default_device_budget(model, parsed, self.device)
                    config_text = json.dumps(parsed)
        except ValueError:
            pass  # the engine's parser names what is wrong
        if comm_timeout_seconds is None:
            comm_timeout_seconds = zinf_keys.get("comm_timeout_s", 300.0)
        # The loss goes to the engine only when it checks it: on a GPU, reading
        # it back waits for the forward.
        self._report_loss = zinf_keys.get("stop_on_nonfinite_loss") is True
        self.module = model
        self._handed_over = []
        self._comm = ctypes.c_void_p()
        check(L.zinf_comm_create_mpi(comm_timeout_seconds, ctypes.byref(self._comm)), "zinf_comm_create_mpi")
        self._engine = ctypes.c_void_p()
        check(L.zinf_engine_create(config_text.encode(), self._comm, ctypes.byref(self._engine)), "engine config")
        self._stream = ctypes.c_void_p()
        if self._cuda:
            # torch's current stream on the model's GPU: fetches make it wait,
            # and torch's kernels on it need no synchronization.
            native = torch.cuda.current_stream(self.device).cuda_stream
            check(L.zinf_stream_adopt(self._engine, ctypes.c_void_p(native), ctypes.byref(self._stream)),
                  "adopt torch's CUDA stream")
        else:
            check(L.zinf_stream_create(self._engine, ctypes.byref(self._stream)), "zinf_stream_create")

        names = {}
        for name, p in model.named_parameters():
            names.setdefault(id(p), name)
        blocks = list(unit_modules) if unit_modules is not None else _largest_module_list(model)
        taken = set()
        groups = []
        for i, block in enumerate(blocks):
            params = []
            for p in block.parameters():
                if id(p) not in taken and p.requires_grad:
                    taken.add(id(p))
                    params.append((names[id(p)], p))
            if params:
                groups.append((block, params))
        rest = [(names[id(p)], p) for _, p in model.named_parameters() if id(p) not in taken and p.requires_grad]
        self._units = []
        self._rest = None
        if rest:
            self._rest = self._register("rest", rest)
        self._block_units = []
        for block, params in groups:
            qualified = next((n for n, m in model.named_modules() if m is block), "block")
            unit = self._register(qualified, params)
            self._block_units.append(unit)
            block.register_forward_pre_hook(self._make_pre_hook(unit))
            block.register_forward_hook(self._make_post_hook(unit))
        model.register_forward_pre_hook(self._model_pre_hook)
        model.register_forward_hook(self._model_post_hook)
        info = _capi.EngineInfo()
        check(L.zinf_engine_get_info(self._engine, ctypes.byref(info)), "zinf_engine_get_info")
        self.rank, self.world_size, self.zero_stage = info.rank, info.world_size, info.zero_stage
        self.gradient_accumulation_steps = info.gradient_accumulation_steps
        self._compute_dtype = info.compute_dtype

    # ---- registration and binding ------------------------------------------------

    def _register(self, name, params):
        L = _capi.lib()
        keep = []
        specs = (_capi.ParamSpec * len(params))()
        for i, (pname, p) in enumerate(params):
            init = p.detach().to(device="cpu", dtype=torch.float32).contiguous()  # host memory
            shape = (ctypes.c_int64 * max(1, p.dim()))(*(p.shape if p.dim() else (1,)))
            keep += [init, shape, pname.encode()]
            specs[i].name = keep[-1]
            specs[i].shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
            specs[i].ndim = max(1, p.dim())
            specs[i].dtype = _capi.DTYPE_FP32
            specs[i].init = init.data_ptr()
        index = ctypes.c_int()
        check(L.zinf_engine_add_unit(self._engine, name.encode(), specs, len(params), ctypes.byref(index)),
              "register unit '%s'" % name)
        unit = _Unit(index.value, name, params)
        unit.shapes = [tuple(p.shape) for _, p in params]
        unit.numels = [p.numel() for _, p in params]
        self._units.append(unit)
        for i, (_, p) in enumerate(params):
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
            p.register_hook(self._make_grad_hook(unit, i))
        return unit

    def _fetch(self, unit):
        self._flush()  # the units handed over before: released before another is gathered
        if unit.fetched:
            return
        L = _capi.lib()
        ptrs = _capi.UnitPointers()
        check(L.zinf_engine_fetch(self._engine, unit.index, self._stream, ctypes.byref(ptrs)),
              "fetch unit '%s'" % unit.name)
        if not self._cuda:  # torch computes on this thread; on a GPU, on the stream that waits
            check(L.zinf_stream_synchronize(self._stream), "fetch unit '%s'" % unit.name)
        _, views = _unit_views(unit, ptrs.data, ptrs.tensors, ptrs.num_elems, ptrs.dtype, self.device)
        for (_, p), v in zip(unit.params, views):
            p.data = v
        unit.base, unit.dtype = ptrs.data, ptrs.dtype
        unit.bytes = ptrs.num_elems * ctypes.sizeof(_CTYPE[ptrs.dtype])
        unit.num_elems = ptrs.num_elems
        unit.fetched = True

    def _release(self, unit):
        if not unit.fetched:
            return
        for i, (_, p) in enumerate(unit.params):
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
        check(_capi.lib().zinf_engine_release(self._engine, unit.index, self._stream), "release unit '%s'" % unit.name)
        unit.fetched = False

    # ---- hooks -------------------------------------------------------------------

    def _model_pre_hook(self, module, inputs):
        if self._rest is not None:
            self._fetch(self._rest)

    def _model_post_hook(self, module, inputs, output):
        if self._rest is not None and not torch.is_grad_enabled():
            self._release(self._rest)  # no backward will use it

    def _make_pre_hook(self, unit):
        def hook(module, inputs):
            self._fetch(unit)
            if torch.is_grad_enabled():
                unit.saved_hooks = torch.autograd.graph.saved_tensors_hooks(
                    lambda t: self._pack(unit, t), lambda packed: self._unpack(unit, packed))
                unit.saved_hooks.__enter__()
        return hook

    # Tensors autograd saves during a unit's forward that lie in the unit's
    # buffer (its parameters, and views of them such as a Linear's transposed
    # weight) are kept as (offset, shape, strides): the buffer is released
    # after forward and fetched again for backward, maybe elsewhere.
    def _pack(self, unit, t):
        # A tensor whose first element lies in the unit's buffer is a view of
        # it (nothing else shares that memory). data_ptr() rather than the
        # storage: building a storage object costs more than the whole test.
        if unit.fetched:
            start = t.data_ptr()
            if unit.base <= start < unit.base + unit.bytes and t.numel() > 0 and t.device == self.device:
                return (_SavedInUnit, start - unit.base, tuple(t.shape), t.stride(), t.dtype)
        return t

    def _unpack(self, unit, packed):
        if not (isinstance(packed, tuple) and packed and packed[0] is _SavedInUnit):
            return packed
        _, offset, shape, stride, dtype = packed
        self._fetch(unit)
        whole, _ = _unit_views(unit, unit.base, None, unit.num_elems, unit.dtype, self.device)
        if whole.dtype != dtype:
            raise RuntimeError("zinf.torch: unit '%s' saved a %s tensor from its %s buffer" % (unit.name, dtype, whole.dtype))
        return torch.as_strided(whole, shape, stride, offset // whole.element_size())

    def _make_post_hook(self, unit):
        def hook(module, inputs, output):
            if getattr(unit, "saved_hooks", None) is not None:
                unit.saved_hooks.__exit__(None, None, None)
                unit.saved_hooks = None
            self._release(unit)
            if not torch.is_grad_enabled():
                return output
            if isinstance(output, torch.Tensor):
                return _PreBackward.apply(self, unit, output)[0]
            if isinstance(output, tuple) and all(isinstance(t, torch.Tensor) for t in output):
                return tuple(_PreBackward.apply(self, unit, *output))
            raise TypeError("zinf.torch: unit '%s' returns %s; a unit's forward must return a tensor or a tuple of "
                            "tensors (choose other unit_modules)" % (unit.name, type(output).__name__))
        return hook

    def _make_grad_hook(self, unit, index):
        def hook(grad):
            self._on_grad(unit, index, grad)
        return hook

    def _grad_buffers(self, unit):
        L = _capi.lib()
        ptrs = _capi.UnitPointers()
        check(L.zinf_engine_grad_buffers(self._engine, unit.index, ctypes.byref(ptrs)),
              "gradient buffers of unit '%s'" % unit.name)
        if not self._cuda:  # on a GPU the copies into it are kernels on the adopted stream
            check(L.zinf_stream_synchronize(self._stream), "gradient buffers of unit '%s'" % unit.name)
        _, unit.grad_views = _unit_views(unit, ptrs.data, ptrs.tensors, ptrs.num_elems, _capi.DTYPE_FP32,
                                         self.device)
        unit.received = [False] * len(unit.params)
        unit.pending = len(unit.params)

    def _flush(self):
        """Units whose gradients were handed over at an earlier hook: torch has
        accumulated their last gradient since (right after that hook), so
        their parameters can be unbound, released and their .grad dropped:
        the gradients never all coexist in torch."""
        for unit in self._handed_over:
            for _, p in unit.params:
                p.grad = None
            self._release(unit)
        self._handed_over = []

    def _on_grad(self, unit, index, grad):
        self._flush()
        if unit.grad_views is None:
            self._grad_buffers(unit)
        unit.grad_views[index].copy_(grad.view(unit.shapes[index]))  # widened to fp32 by the copy
        if not unit.received[index]:
            unit.received[index] = True
            unit.pending -= 1
        if unit.pending == 0:
            self._grads_ready(unit)

    def _grads_ready(self, unit):
        for view, got in zip(unit.grad_views, unit.received):
            if not got:  # the buffer is overwritten each micro-step: zeros where no gradient came
                view.zero_()
        check(_capi.lib().zinf_engine_grads_ready(self._engine, unit.index, self._stream),
              "gradients of unit '%s'" % unit.name)
        unit.grad_views = None
        unit.received = None
        unit.reported = True
        self._handed_over.append(unit)  # released at the next hook: torch still accumulates into .grad

    # ---- the training loop ------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def loss_scale(self):
        scale = ctypes.c_float()
        check(_capi.lib().zinf_engine_loss_scale(self._engine, ctypes.byref(scale)), "loss scale")
        return scale.value

    def report_loss(self, loss):
        """Hands the micro-step's loss (a float) to the engine's checks: with the
        config's zinf.stop_on_nonfinite_loss, a NaN or infinite loss raises
        ZinfError and the engine takes no further steps (every rank stops)."""
        check(_capi.lib().zinf_engine_report_loss(self._engine, float(loss)), "loss")

    def backward(self, loss):
        """Backpropagates loss (times fp16's loss scale) into the engine's gradient buffers."""
        if self._report_loss:
            self.report_loss(float(loss.detach()))
        scale = self.loss_scale()
        (loss * scale if scale != 1.0 else loss).backward()
        for unit in self._units:
            if unit.grad_views is not None:  # some of its parameters got no gradient: zeros for them
                self._grads_ready(unit)
            elif not unit.reported:  # none did
                self._grad_buffers(unit)
                self._grads_ready(unit)
        self._flush()
        for unit in self._units:
            unit.reported = False
            for _, p in unit.params:
                p.grad = None

    def step(self):
        """Ends the micro-step; True when it was an accumulation boundary (the optimizer ran)."""
        boundary = ctypes.c_int()
        check(_capi.lib().zinf_engine_step(self._engine, ctypes.byref(boundary)), "step")
        return bool(boundary.value)

    def stats(self, wait=True):
        """The metrics of the step just taken (lr, grad_norm, loss_scale, bytes moved, timeline, ...).
        wait=True waits for the device and the engine's host work first; wait=False does not: the metrics
        are then those of the latest step that has finished, and "behind" counts the steps enqueued since
        (a training loop on a GPU can log every step without stalling it)."""
        L = _capi.lib()
        if wait:
            check(L.zinf_engine_synchronize(self._engine), "stats")
        out = ctypes.c_void_p()
        check(_capi.lib().zinf_engine_stats_json(self._engine, ctypes.byref(out)), "stats")
        return json.loads(_capi.take_string(out))

    # ---- state -------------------------------------------------------------------

    def master_weights(self):
        """{parameter name: fp32 master tensor} (collective at stages 1 and 2)."""
        L = _capi.lib()
        check(L.zinf_engine_synchronize(self._engine), "synchronize")
        out = {}
        for unit in self._units:
            total = sum(unit.numels)
            flat = torch.empty(total, dtype=torch.float32)
            check(L.zinf_engine_read_state(self._engine, unit.index, _capi.STATE_MASTER, flat.data_ptr(), total),
                  "read unit '%s'" % unit.name)
            offset = 0
            for i, (name, _) in enumerate(unit.params):
                n = unit.numels[i]
                out[name] = flat[offset:offset + n].view(unit.shapes[i]).clone()
                offset += n
        return out

    def save_checkpoint(self, directory, client_state=None):
        """Saves the engine's state under directory/step-N (atomically); returns that path."""
        out = ctypes.c_void_p()
        client = json.dumps(client_state if client_state is not None else {}).encode()
        check(_capi.lib().zinf_engine_save(self._engine, directory.encode(), client, ctypes.byref(out)),
              "save " + directory)
        return _capi.take_string(out)

    def load_checkpoint(self, path):
        """Restores a checkpoint (a step-N directory or the one holding `latest`); returns its client state."""
        out = ctypes.c_void_p()
        check(_capi.lib().zinf_engine_load(self._engine, path.encode(), ctypes.byref(out)), "load " + path)
        text = _capi.take_string(out)
        return json.loads(text) if text else {}

    def close(self):
        L = _capi.lib()
        if self._engine:
            L.zinf_stream_destroy(self._stream)
            L.zinf_engine_destroy(self._engine)
            L.zinf_comm_destroy(self._comm)
            self._engine = self._stream = self._comm = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def initialize(model, config, unit_modules=None):
    """zinf takes over `model`'s parameters and optimizer; see the module comment.

    config: a DeepSpeed-style config as a dict, a JSON text or a file's path.
    unit_modules: the submodules that become units (default: the children of
    the model's largest nn.ModuleList); every other parameter is one more unit.
    """
    return Engine(model, config, unit_modules)


def export_hf(engine, path, dtype=torch.bfloat16):
    """Writes the fp32 masters as one safetensors file under the model's
    parameter names, in `dtype` (bf16, fp16 or fp32), atomically. Every rank
    calls it (reading the masters is collective at stages 1 and 2); rank 0
    writes."""
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    if dtype not in names:
        raise ValueError("export_hf: dtype must be torch.float32, bfloat16 or float16")
    weights = engine.master_weights()
    if engine.rank != 0:
        return
    header, blobs, offset = {}, [], 0
    for name, t in weights.items():
        data = t.to(dtype).contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
