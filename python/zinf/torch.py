"""zinf as the offload backend of a PyTorch model.

    import zinf.torch
    engine = zinf.torch.initialize(model, config="ds_config.json")
    loss = engine(batch)          # the model's forward
    engine.backward(loss)
    engine.step()

The engine is an nn.Module with DeepSpeed's engine API (zinf.deepspeed
returns it from deepspeed.initialize): train/eval, module, parameters,
backward, step, get_lr, global_steps, is_gradient_accumulation_boundary,
save_checkpoint/load_checkpoint with tags, save_16bit_model, and the model's
own state_dict/load_state_dict with whole tensors.

Units. zinf moves parameters unit by unit. By default each child of the
model's largest nn.ModuleList (the transformer blocks) is a unit. The other
parameters (embeddings, final norm, head) form one unit held through the
step when they add up to no more than a block's; otherwise every module that
owns some is a unit of its own, fetched only while that module runs, so that
no unit stays resident with more than a block's worth of parameters (a
128 K-token embedding is bigger than a Llama layer). Parameters the model's
own forward uses directly (nn.Parameters of the root module) stay in one
unit held through the step. `unit_modules=[...]` chooses the units instead;
`held_modules=[...]` (Engine) puts modules whose weights are read where they
are not called (a fused head) in that held unit. At stages 0-2 every
parameter is whole from initialize() on; at stage 3 one read outside its
module's forward is an empty placeholder, and the backward that finds its
gradient of that empty shape raises, naming it.
Frozen parameters (requires_grad=False, as PEFT leaves a base model) go to
frozen units beside their module's trainable ones: on the same tier and
partition, with no gradients or optimizer state.

The engine holds the parameters (fp32 masters, the compute copy in the
config's precision, Adam's m and v, each on the tier the config puts it); the
module's own parameter tensors are emptied and, while a unit is in use,
bound to the engine's buffers without a copy.

The protocol, per micro-step (include/zinf/engine.h):
  - a unit module's forward pre-hook fetches and binds its units; its
    forward hook releases them and attaches an autograd function to its
    outputs whose backward fetches them again before the module's own
    backward, and one on its inputs whose backward releases them after it;
  - each parameter's gradient hook copies the gradient into the unit's fp32
    gradient buffer; when every parameter of the unit has its gradient the
    unit is reported ready and released;
  - backward() reports the units whose parameters got no gradient (zeros),
    step() ends the micro-step (the optimizer runs at accumulation
    boundaries: AdamW with each parameter group's lr and weight decay, the
    config's schedule, clipping and loss scaling).
torch.utils.checkpoint (reentrant or not) recomputes a unit module's forward
in backward with its units fetched; HF's gradient_checkpointing_enable()
works through it. The hooks' per-unit work is done by a core
(zinf/_units.py): zinf's C++ extension module where it is built and loads
(each hook one call into it; its backward fetches never enter Python), else
the same in Python.

Devices. The engine runs where the model's parameters are when initialize()
is called: a model on the CPU trains on zinf's host device, a model on a CUDA
GPU on that GPU (the config's "zinf": {"device": ...} may say so too, and
must then agree). On a GPU the engine adopts torch's current CUDA stream at
initialize(): fetches make that stream wait for a unit's gather and update,
the unit's buffers are bound to the parameters as CUDA tensors (no copy),
gradients are copied into zinf's buffers by kernels on the same stream, and
no call waits on the host in a micro-step. The engine's device memory is a
budget it takes at initialize(): the config's zinf.device_memory, or by
default what its tiers need for this model plus staging.

Ranks: each rank runs its own copy of the script on its own batches and the
engine reduces the gradients across ranks. The world is the launcher's
(mpirun, torchrun, the deepspeed launcher, accelerate launch, srun; see
zinf/_world.py); on GPUs, mpirun's only.
"""
import ctypes
import functools
import json
import math
import os
import pickle
import struct
import warnings
import weakref

import torch
import torch.utils._pytree as pytree

from . import _capi, _config, _lazy, _optim, _units, _world
from ._capi import ZinfError, check  # noqa: F401  (ZinfError is part of the API)

_TORCH_DTYPE = _units.TORCH_DTYPE


def _model_device(model, zinf_keys):
    """The device the engine runs on: where the model's parameters are; the
    config's zinf.device, when given, must agree."""
    devices = {p.device for p in model.parameters()}
    if any(d.type == "meta" for d in devices):
        raise ValueError("zinf.torch: the model has parameters on the meta device; build it with "
                         "zinf.torch.from_pretrained(path, config) (which streams the weights into zinf's tiers) "
                         "or materialize it before initialize()")
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


class _Unit:
    """A unit: its parameters and what the model made them (their dynamic
    state, fetched and bound, is the core's: zinf/_units.py)."""

    def __init__(self, index, name, params, frozen):
        self.index = index
        self.name = name
        self.params = params  # [(qualified name, nn.Parameter)]
        self.frozen = frozen
        self.shapes = [tuple(p.shape) for _, p in params]
        self.numels = [p.numel() for _, p in params]
        self.dtypes = [p.dtype for _, p in params]  # what the model made them (state_dict returns these)


class _UnitModule:
    """A module whose forward needs some units (a block, or a module owning
    parameters outside the blocks); `id` is the core's."""

    def __init__(self, module, name, units, id):
        self.module = module
        self.name = name
        self.units = units
        self.id = id
        self.frozen = any(u.frozen for u in units)  # a frozen unit is released after the module's backward


class _PreBackward(torch.autograd.Function):
    """Identity on a unit module's outputs; its backward fetches the module's
    units again, before the module's own backward."""

    @staticmethod
    def forward(ctx, engine, um, *tensors):
        ctx.engine, ctx.um = engine, um
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.engine._core.fetch_module(ctx.um.id)
        return (None, None) + grads


class _PostBackward(torch.autograd.Function):
    """Identity on a unit module's inputs; its backward runs after the
    module's own backward and releases the units whose work is done there
    (frozen units, and those whose gradients are all in)."""

    @staticmethod
    def forward(ctx, engine, um, *tensors):
        ctx.engine, ctx.um = engine, um
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        ctx.engine._core.after_module_backward(ctx.um.id)
        return (None, None) + grads


def _largest_module_list(model):
    best, best_count = None, 0
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList):
            count = sum(p.numel() for p in m.parameters())
            if count > best_count:
                best, best_count = m, count
    return list(best) if best is not None else []


def _enabled(block):
    return isinstance(block, dict) and block.get("enabled") is True


def _device_of(cfg, key):
    zero = cfg.get("zero_optimization") if isinstance(cfg.get("zero_optimization"), dict) else {}
    block = zero.get(key) if isinstance(zero.get(key), dict) else {}
    return block.get("device", "none")


def _is_checkpoint_hook(pack):
    qual = getattr(pack, "__qualname__", "")
    return "_checkpoint_hook" in qual or "_recomputation_hook" in qual


def _micro_batch_size(cfg, accumulation, world_size):
    """The micro-batch as the engine resolved the config's batch sizes
    (DeepSpeed's rules): given, or train_batch_size / (accumulation x world
    size), or 1 when the config gives neither."""
    micro, total = cfg.get("train_micro_batch_size_per_gpu"), cfg.get("train_batch_size")
    if isinstance(micro, int) and not isinstance(micro, bool):
        return micro
    if isinstance(total, int) and not isinstance(total, bool):
        return total // (accumulation * world_size)  # the engine checked that it divides
    return 1


def _hidden_size(model):
    cfg = getattr(model, "config", None)
    for key in ("hidden_size", "n_embd", "d_model"):
        v = getattr(cfg, key, None)
        if isinstance(v, int):
            return v
    return None


# The engines alive in this process, newest last (zinf.deepspeed.comm's
# barrier runs through one).
_LIVE_ENGINES = []


def live_engine():
    """The newest engine of this process not yet closed, or None."""
    for ref in reversed(_LIVE_ENGINES):
        e = ref()
        if e is not None and e.__dict__.get("_engine"):
            return e
    return None


class Engine(torch.nn.Module):
    """The model under zinf; see the module comment. Created by initialize()
    (or zinf.deepspeed.initialize)."""

    def __init__(self, model, config, unit_modules=None, optimizer=None, model_parameters=None, lr_scheduler=None,
                 comm_timeout_seconds=None, auto_context=None, held_modules=None, _weights=None):
        super().__init__()
        L = self._lib = _capi.lib()
        cfg = _config.load(config)
        zinf_keys = cfg.get("zinf") if isinstance(cfg.get("zinf"), dict) else {}
        self.module = model
        if _weights is None and getattr(model, "_zinf_weights", None) is not None:
            _weights = model._zinf_weights  # built by from_pretrained inside zinf.deepspeed.zero.Init
        elif _weights is None and _lazy.has_lazy(model):
            _weights = _lazy.Reader(model)  # built inside zinf.deepspeed.zero.Init: the values wait in its spill
        self.device = _model_device(model, zinf_keys) if _weights is None else torch.device("cpu")
        self._cuda = self.device.type == "cuda"
        _world.check_before_engine(self.device.type)  # before anything is built: a world zinf can join

        # The optimizer: the config's, or a client's Adam/AdamW.
        client = None
        if optimizer is not None:
            if "optimizer" in cfg:
                raise ValueError("zinf: the config has an \"optimizer\" block and initialize() was given an "
                                 "optimizer; give one of them")
            if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
                params = model_parameters if model_parameters is not None else model.parameters()
                optimizer = optimizer(params)
            client = _optim._ClientOptimizer(optimizer)
            cfg["optimizer"] = _optim.optimizer_config(client)
        groups = _optim.split_groups(model, model_parameters, client)

        # "auto" values, from the model and the trainer.
        ctx = {"hidden_size": _hidden_size(model), "world_size": _config.launcher_world()[1]}
        if client is not None:
            ctx["lr"] = cfg["optimizer"]["params"]["lr"]
            ctx["weight_decay"] = cfg["optimizer"]["params"]["weight_decay"]
        ctx.update(auto_context or {})
        cfg, self.auto_notes = _config.resolve_auto(cfg, ctx)
        opt_cfg = cfg.get("optimizer") if isinstance(cfg.get("optimizer"), dict) else {}
        opt_params = opt_cfg.get("params") if isinstance(opt_cfg.get("params"), dict) else {}

        defaults = {"lr": float(opt_params.get("lr", 1e-3)),
                    "betas": tuple(opt_params.get("betas", (0.9, 0.999))),
                    "eps": float(opt_params.get("eps", 1e-8)),
                    "weight_decay": float(opt_params.get("weight_decay", 0.0))}
        _optim.check_uniform(groups, defaults, "the optimizer" if client else "model_parameters")
        self._config_scheduler = cfg.get("scheduler", {}).get("type") if isinstance(cfg.get("scheduler"), dict) else None
        if self._config_scheduler and lr_scheduler is not None:
            raise ValueError("zinf: the config has a \"scheduler\" block and initialize() was given an "
                             "lr_scheduler; give one of them")

        # The engine's device and budget.
        block = cfg.setdefault("zinf", {})
        if not isinstance(block, dict):
            raise ValueError("zinf: the config's \"zinf\" block must be an object")
        block["device"] = "cuda:%d" % self.device.index if self._cuda else "cpu"
        if self._cuda and not block.get("device_memory"):
            block["device_memory"] = _default_device_budget(model, cfg, self.device)
        if comm_timeout_seconds is None:
            comm_timeout_seconds = zinf_keys.get("comm_timeout_s", 300.0)
        # The loss goes to the engine only when it checks it: on a GPU, reading
        # it back waits for the forward.
        self._report_loss = zinf_keys.get("stop_on_nonfinite_loss") is True
        self._config = cfg

        self._engine = ctypes.c_void_p()
        self._stream = ctypes.c_void_p()
        self._comm = _world.create_comm(comm_timeout_seconds)
        check(L.zinf_engine_create(json.dumps(cfg).encode(), self._comm, ctypes.byref(self._engine)), "engine config")
        if self._cuda:
            native = torch.cuda.current_stream(self.device).cuda_stream
            check(L.zinf_stream_adopt(self._engine, ctypes.c_void_p(native), ctypes.byref(self._stream)),
                  "adopt torch's CUDA stream")
        else:
            check(L.zinf_stream_create(self._engine, ctypes.byref(self._stream)), "zinf_stream_create")
        info = _capi.EngineInfo()
        check(L.zinf_engine_get_info(self._engine, ctypes.byref(info)), "zinf_engine_get_info")
        self.rank, self.world_size, self.zero_stage = info.rank, info.world_size, info.zero_stage
        self._accumulation = info.gradient_accumulation_steps
        self._compute_dtype = info.compute_dtype
        base, nbytes = ctypes.c_void_p(), ctypes.c_uint64()
        check(L.zinf_engine_host_memory(self._engine, ctypes.byref(base), ctypes.byref(nbytes)),
              "zinf_engine_host_memory")
        # The per-unit work between hooks (zinf/_units.py): C++ where its
        # module loads, else Python.
        self._core = _units.make_core(self._engine, self._stream, self.device,
                                      _units._HostArena(base.value, nbytes.value) if base.value else None)
        _config.check_world(self.world_size)
        _LIVE_ENGINES[:] = [r for r in _LIVE_ENGINES if r() is not None] + [weakref.ref(self)]

        # Parameter groups: each of the trainer's groups is one of the engine's.
        self._group_of = {}
        self._engine_groups = []
        for i, g in enumerate(groups):
            wd = float(g.get("weight_decay", defaults["weight_decay"]))
            gid = ctypes.c_int()
            check(L.zinf_engine_add_param_group(self._engine, wd, -1.0, ctypes.byref(gid)), "parameter group %d" % i)
            self._engine_groups.append((gid.value, wd))
            for p in g["params"]:
                if id(p) in self._group_of:
                    raise ValueError("zinf: a parameter is in two parameter groups (%d and %d)" % (self._group_of[id(p)], i))
                self._group_of[id(p)] = i
        self._pushed_lr = [None] * len(groups)

        self._weights = _weights  # from_pretrained: name -> the fp32 tensor, read when its unit registers
        self._owners = None
        self._units = []
        self._unit_of = {}  # id(parameter) -> its unit
        self._unit_modules = []
        self._rest = []
        self._build_units(model, unit_modules, held_modules or [])
        if self._weights is not None and hasattr(self._weights, "unused"):
            left = self._weights.unused()
            if left:
                raise ValueError("zinf: %s has tensors the model has no parameter for: %s"
                                 % (self._weights.path, ", ".join(left[:8])))
        if getattr(model, "_zinf_weights", None) is not None:
            model._zinf_weights = None  # streamed: the model no longer needs them
        self._weights = None
        self._version = 0  # bumped at every optimizer step and write: the read cache's key
        self._read_cache = None
        # unit index -> {param index: (tensor, parameter, its version then)} from load_state_dict
        self._pending_writes = {}
        self._frozen_flags = {id(p): p.requires_grad for _, p in model.named_parameters()}
        self._note_versions()
        self.micro_steps = 0
        self.global_steps = 0
        self.global_samples = 0
        self._micro_batch = _micro_batch_size(cfg, self._accumulation, self.world_size)

        self.optimizer = _optim.ZinfOptimizer(groups, defaults, self)
        if self._config_scheduler:
            self.lr_scheduler = _optim.ConfigScheduler(self, self._config_scheduler)
        elif lr_scheduler is not None and callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
            self.lr_scheduler = lr_scheduler(self.optimizer)
        else:
            self.lr_scheduler = lr_scheduler
        self._install_state_dict_hooks(model)

    # ---- units -------------------------------------------------------------------

    def _build_units(self, model, unit_modules, held_modules):
        names = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), name)
        blocks = list(unit_modules) if unit_modules is not None else _largest_module_list(model)
        qualified = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
        taken = set()
        planned = []  # (module, name, [params])
        inside = set()
        for block in blocks:
            params = []
            for p in block.parameters():
                if id(p) not in taken:
                    taken.add(id(p))
                    params.append(p)
            for m in block.modules():
                inside.add(id(m))
            if params:
                planned.append((block, qualified.get(id(block), "block"), params))
        # Modules whose parameters are read where they are not called (held_modules):
        # in the unit held through the model's forward and backward.
        held = {id(p) for m in held_modules for p in m.parameters() if id(p) not in taken}
        others = [p for _, p in model.named_parameters() if id(p) not in taken]
        largest_block = max((sum(p.numel() for p in params) for _, _, params in planned), default=0)
        split = sum(p.numel() for p in others) > largest_block and unit_modules is None
        # Outside the blocks: every module owning parameters is a unit of its
        # own (split), or all of them one unit held through the step.
        edges = []
        leaves = set()
        if split:
            for name, m in model.named_modules():
                if m is model or id(m) in inside:
                    continue
                # A ZeRO-3 leaf (deepspeed.utils.set_z3_leaf_modules) is one
                # unit with its whole subtree, fetched by the leaf alone; so is
                # a module that owns parameters and calls submodules that own
                # some too (BERT's prediction head: its bias, its transform),
                # so that no unit module runs inside another.
                leaf = getattr(m, "_z3_leaf", False) or (
                    any(id(p) not in taken and id(p) not in held for p in m.parameters(recurse=False)) and
                    any(id(p) not in taken and id(p) not in held
                        for sub in m.modules() if sub is not m for p in sub.parameters(recurse=False)))
                if leaf:
                    leaves.add(id(m))
                    inside.update(id(sub) for sub in m.modules() if sub is not m)
                params = [p for p in m.parameters(recurse=leaf) if id(p) not in taken and id(p) not in held]
                for p in params:
                    taken.add(id(p))
                if params:
                    edges.append((m, name, params))
        rest = [p for _, p in model.named_parameters() if id(p) not in taken]

        def register(name, params):
            trainable = [p for p in params if p.requires_grad]
            frozen = [p for p in params if not p.requires_grad]
            units = []
            if trainable:
                units.append(self._register(name, [(names[id(p)], p) for p in trainable], frozen=False))
            if frozen:
                units.append(self._register(name + " (frozen)", [(names[id(p)], p) for p in frozen], frozen=True))
            return units

        if rest:
            self._rest = register("rest", rest)
        for module, name, params in planned:
            self._hook(module, name, register(name, params))
        for module, name, params in edges:
            register(name, params)
        if split:
            # Each module outside the blocks that uses such parameters
            # fetches their units (a tied head fetches the embedding's).
            for name, m in model.named_modules():
                if m is model or id(m) in inside:
                    continue
                units = []
                for p in m.parameters(recurse=id(m) in leaves):
                    u = self._unit_of.get(id(p))
                    if u is not None and u not in units and u not in self._rest:
                        units.append(u)
                if units:
                    self._hook(m, name, units)
        model.register_forward_pre_hook(self._model_pre_hook)
        model.register_forward_hook(self._model_post_hook)
        if self.zero_stage < 3:
            for u in self._units:
                self._core.set_persistent(u.index, True)
            for um in self._unit_modules:  # tensors saved in forward stay valid: no second fetch
                self._core.set_module_persistent(um.id, True)
            # Every parameter is whole at stages 0-2 (as DeepSpeed's): code that
            # reads a weight without calling its module (a fused head) reads it.
            for u in self._units:
                self._core.fetch(u.index)

    def _register(self, name, params, frozen):
        L = _capi.lib()
        keep = []
        specs = (_capi.ParamSpec * len(params))()
        groups = (ctypes.c_int * len(params))()
        for i, (pname, p) in enumerate(params):
            if self._weights is not None:
                init = self._weights(pname).contiguous()
                if tuple(init.shape) != tuple(p.shape):
                    raise ValueError("zinf: the weights of '%s' have shape %s, the model's parameter %s"
                                     % (pname, tuple(init.shape), tuple(p.shape)))
            else:
                init = p.detach().to(device="cpu", dtype=torch.float32).contiguous()  # host memory
            shape = (ctypes.c_int64 * max(1, p.dim()))(*(p.shape if p.dim() else (1,)))
            keep += [init, shape, pname.encode()]
            specs[i].name = keep[-1]
            specs[i].shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
            specs[i].ndim = max(1, p.dim())
            specs[i].dtype = _capi.DTYPE_FP32
            specs[i].init = init.data_ptr()
            if not frozen:
                if id(p) not in self._group_of:
                    raise ValueError("zinf: parameter '%s' requires grad but is in no parameter group: add it to "
                                     "model_parameters (or the optimizer), or set requires_grad=False" % pname)
                groups[i] = self._engine_groups[self._group_of[id(p)]][0]
        index = ctypes.c_int()
        check(L.zinf_engine_add_unit_ex(self._engine, name.encode(), specs, len(params), groups,
                                        _capi.UNIT_FROZEN if frozen else 0, ctypes.byref(index)),
              "register unit '%s'" % name)
        del keep
        unit = _Unit(index.value, name, params, frozen)
        if any(p.is_meta for _, p in params):  # built on the meta device: torch parameters of their own now
            params = [(pname, self._materialize(p)) for pname, p in params]
            unit.params = params
        self._units.append(unit)
        me = weakref.ref(self)
        for (_, p), shape, numel in zip(params, unit.shapes, unit.numels):
            self._unit_of[id(p)] = unit
            p._zinf_engine = me
            p.ds_shape, p.ds_numel = torch.Size(shape), numel  # the whole tensor's, as DeepSpeed's attributes say
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
        self._core.add_unit(unit.index, name, [p for _, p in params], [list(s) for s in unit.shapes], frozen)
        if not frozen:
            self._core.watch_grads(unit.index)
        return unit

    def _materialize(self, p):
        """A parameter of the meta device replaced, in every module that
        holds it, by an empty one on the engine's device (a meta tensor's
        data cannot be rebound); the same replacement for a tied one."""
        if not p.is_meta:
            return p
        if self._owners is None:
            self._owners = {}
            for m in self.module.modules():
                for n, q in m._parameters.items():
                    if q is not None:
                        self._owners.setdefault(id(q), []).append((m, n))
        new = torch.nn.Parameter(torch.empty(0, dtype=p.dtype, device=self.device), requires_grad=p.requires_grad)
        for m, n in self._owners.get(id(p), []):
            m._parameters[n] = new
        return new

    def _hook(self, module, name, units):
        um = _UnitModule(module, name, units, self._core.add_module([u.index for u in units]))
        self._unit_modules.append(um)
        # The hooks hold the engine weakly: a model does not keep a dropped
        # engine alive (its forward then says the engine is closed).
        pre, post = self._core.module_hooks(um.id, weakref.ref(self))
        if "forward" in vars(module):  # its forward is wrapped already: hooks, which keep that wrapper as it is
            module.register_forward_pre_hook(pre, with_kwargs=True)
            # always_call: a forward that raises still takes the saved-tensor
            # hooks off and releases the units.
            module.register_forward_hook(post, always_call=True)
            return
        # The same two hooks around the module's own forward, in an instance
        # attribute: nn.Module calls a module without hooks straight, and its
        # Python that runs hooks costs more than zinf's work for a small
        # unit. The script's own hooks on the module still run, outside these.
        # The C++ core makes the wrapper itself (no Python frame per call).
        forward = module.forward
        wrap = getattr(self._core, "wrap_forward", None)
        if wrap is not None:
            module.forward = functools.update_wrapper(wrap(um.id, weakref.ref(self), forward), forward)
            return

        @functools.wraps(forward)
        def zinf_forward(*args, **kwargs):
            changed = pre(module, args, kwargs)
            if changed is not None:
                args, kwargs = changed
            output = None
            try:
                output = forward(*args, **kwargs)
            finally:  # a forward that raises still takes the saved-tensor hooks off and releases the units
                changed = post(module, args, output)
            return output if changed is None else changed
        module.forward = zinf_forward

    # What the hooks do per unit (fetch, bind, gradients, saved tensors) is
    # the core's (zinf/_units.py): one call per hook.
    def _fetch(self, unit):
        if self._pending_writes:
            self._write_pending()
        self._core.fetch(unit.index)

    def _release(self, unit):
        self._core.release(unit.index)

    # ---- hooks -------------------------------------------------------------------

    def _model_pre_hook(self, module, inputs):
        if self._pending_writes:  # a load_state_dict raised midway
            self._write_pending()
        for unit in self._rest:
            self._fetch(unit)

    def _model_post_hook(self, module, inputs, output):
        if not torch.is_grad_enabled():
            for unit in self._rest:
                self._release(unit)  # no backward will use them

    # The unit modules' forward hooks are the core's (module_hooks); these
    # are their rare cases.
    def _pre_slow(self, m, args, kwargs, hooks_on):
        """After the core fetched the units: saved-tensor hooks already on
        (hooks_on) may only be torch.utils.checkpoint's; a module with a
        frozen unit releases it after its backward (an identity function on
        its inputs, whose backward runs after the module's)."""
        um = self._unit_modules[m]
        if hooks_on and not _is_checkpoint_hook(_units._top_saved_hooks(False)[0]):
            raise RuntimeError("zinf.torch: saved_tensors_hooks other than torch.utils.checkpoint's are "
                               "active around unit '%s'; zinf keeps the tensors a unit saves itself" % um.name)
        if not um.frozen or _units._in_backward():
            return None  # in a checkpoint's recomputation the units stay fetched until their gradients are in
        return self._through(_PostBackward, um, (args, kwargs))

    def _post_slow(self, m, output):
        """An output other than one tensor: an identity function on its
        tensors fetches the units again before the module's backward."""
        return self._through(_PreBackward, self._unit_modules[m], output)

    def _through(self, function, um, tree):
        """`tree` with its tensors that require grad passed through the
        autograd `function` of unit module um (None: it has none)."""
        flat, spec = pytree.tree_flatten(tree)
        idx = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not idx:
            return None
        out = function.apply(self, um, *[flat[i] for i in idx])
        for i, t in zip(idx, out):
            flat[i] = t
        return pytree.tree_unflatten(flat, spec)

    # ---- the training loop ------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __getattr__(self, name):
        """The model's attributes through the engine (as DeepSpeed's engine
        forwards them); one neither has is an error naming the engine."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("module")
            if module is not None and name not in ("_engine", "_stream", "_comm") and hasattr(module, name):
                return getattr(module, name)
            raise AttributeError("zinf.torch.Engine (deepspeed.DeepSpeedEngine under zinf.deepspeed) has no attribute "
                                 "'%s', nor has its model (%s)" % (name, type(module).__name__)) from None

    def loss_scale(self):
        scale = ctypes.c_float()
        check(_capi.lib().zinf_engine_loss_scale(self._engine, ctypes.byref(scale)), "loss scale")
        return scale.value

    def report_loss(self, loss):
        """Hands the micro-step's loss (a float) to the engine's checks: with the
        config's zinf.stop_on_nonfinite_loss, a NaN or infinite loss raises
        ZinfError and the engine takes no further steps (every rank stops)."""
        check(_capi.lib().zinf_engine_report_loss(self._engine, float(loss)), "loss")

    def _note_versions(self):
        """Each parameter's autograd version now: an in-place change by the
        script after initialize() (nn.init on a parameter) bumps it."""
        self._versions = {id(p): p._version for unit in self._units for _, p in unit.params}

    def _check_parameters(self):
        """What a script did to its parameters behind zinf's back is refused,
        not ignored: requires_grad changed after initialize(), or a
        parameter written in place (zinf holds the values: change them with
        module.load_state_dict() or zinf.deepspeed.zero.GatheredParameters)."""
        for name, p in self.module.named_parameters():
            if self._frozen_flags.get(id(p), p.requires_grad) != p.requires_grad:
                raise RuntimeError("zinf.torch: the requires_grad of '%s' changed after initialize(); zinf placed "
                                   "it as %s. Set requires_grad before initialize() (or initialize again)"
                                   % (name, "trainable" if self._frozen_flags[id(p)] else "frozen"))
            if self._versions.get(id(p), p._version) != p._version:
                raise RuntimeError("zinf.torch: '%s' was written in place after initialize(); zinf holds the "
                                   "parameters on its tiers, so the write is lost. Change parameters with "
                                   "module.load_state_dict() or inside zinf.deepspeed.zero.GatheredParameters("
                                   "params, modifier_rank=0)" % name)

    def backward(self, loss, retain_graph=False):
        """Backpropagates loss (times fp16's loss scale) into the engine's
        gradient buffers. The mean over the accumulation steps is the
        engine's (as DeepSpeed's scaling by 1/gradient_accumulation_steps)."""
        if self._report_loss:
            self.report_loss(float(loss.detach()))
        scale = self.loss_scale()
        (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain_graph)
        if self.zero_stage == 3:  # at stages 0-2 every parameter is bound from initialize() on
            self._check_placeholders_unread()
        # Units whose parameters got no gradient (some or all) are reported
        # with zeros there; every unit is released and its .grad dropped.
        without = self._core.end_backward()
        if without and loss.requires_grad:
            self._warn_without_gradient(without)
        return loss

    def _warn_without_gradient(self, units):
        """Once per unit: a trainable unit none of whose parameters got a
        gradient in a micro-step (its module did not run, or its parameters
        were read where autograd could not reach them) trains on zeros there.
        A unit some of whose parameters got one (an MoE expert that received
        no tokens, inside its block) is not named."""
        warned = self.__dict__.setdefault("_warned_without_gradient", set())
        new = [self._units[u].name for u in units if u not in warned]
        warned.update(units)
        if new:
            warnings.warn("zinf.torch: no parameter of unit%s %s got a gradient in micro-step %d (a module that did "
                          "not run, or a weight read where autograd does not reach it); its gradient is zero there. "
                          "A weight read outside its module's forward at ZeRO-3 is an empty placeholder: read it inside "
                          "zinf.deepspeed.zero.GatheredParameters, or pass held_modules=[...]"
                          % ("s" if len(new) > 1 else "", ", ".join("'%s'" % n for n in new[:8]), self.micro_steps),
                          stacklevel=3)

    def _check_placeholders_unread(self):
        """At stage 3 a parameter outside a fetch is an empty placeholder; a
        gradient of that empty shape means some code read it where its
        module was not running (a loss reading lm_head.weight itself, a
        hook, a weight shared with another module): the result was computed
        from nothing. Refused before the step is taken, naming the way out."""
        for unit in self._units:
            if unit.frozen:
                continue
            for (name, p), n in zip(unit.params, unit.numels):
                g = p.grad
                if g is not None and g.numel() == 0 and n > 0:
                    raise RuntimeError(_units.read_outside_message("parameter '%s' (unit '%s')" % (name, unit.name)))

    def is_gradient_accumulation_boundary(self):
        """Whether the next step() ends an accumulation window (the optimizer runs)."""
        return (self.micro_steps + 1) % self._accumulation == 0

    def _push_lrs(self):
        """Each group's lr and weight decay as the optimizer's param_groups
        say now (a torch lr scheduler changes them), for the step about to be
        enqueued. With a config scheduler the engine's schedule decides."""
        if self._config_scheduler:
            return
        L = _capi.lib()
        for i, g in enumerate(self.optimizer.param_groups):
            lr = _optim.check_lr(g["lr"], "parameter group %d" % i)
            if lr != self._pushed_lr[i]:
                check(L.zinf_engine_set_group_lr(self._engine, self._engine_groups[i][0], lr), "lr of group %d" % i)
                self._pushed_lr[i] = lr
            wd = float(g.get("weight_decay", self._engine_groups[i][1]))
            if wd != self._engine_groups[i][1]:
                raise RuntimeError("zinf: parameter group %d's weight_decay changed from %g to %g after initialize(); "
                                   "zinf fixes a group's weight decay at initialize" % (i, self._engine_groups[i][1], wd))

    def step(self, lr_kwargs=None):
        """Ends the micro-step; True when it was an accumulation boundary (the
        optimizer ran, then the client's lr scheduler stepped)."""
        boundary_next = self.is_gradient_accumulation_boundary()
        if boundary_next:
            self._check_parameters()
            self._push_lrs()
        boundary = ctypes.c_int()
        check(_capi.lib().zinf_engine_step(self._engine, ctypes.byref(boundary)), "step")
        self.micro_steps += 1
        if self._micro_batch:
            self.global_samples += self._micro_batch * self.world_size
        if not boundary.value:
            return False
        self._version += 1
        self._read_cache = None
        self.global_steps += 1
        self.optimizer.step()  # a no-op: torch's schedulers count it before their own step
        if self.lr_scheduler is not None and not isinstance(self.lr_scheduler, _optim.ConfigScheduler):
            skipped = False
            if self._config.get("fp16", {}).get("enabled") is True:
                skipped = self.stats().get("skipped", False)  # an overflow: DeepSpeed does not step the scheduler
            if not skipped:
                self.lr_scheduler.step(**(lr_kwargs or {}))
        return True

    def zero_grad(self, set_to_none=True):
        """Nothing to do: zinf overwrites its gradient buffers each micro-step."""

    def get_lr(self):
        """Each parameter group's lr for the next optimizer step (as DeepSpeed's
        get_lr: the optimizer's groups after the scheduler's last step); with
        a config scheduler, the engine's schedule at the steps applied so far."""
        if self._config_scheduler:
            applied = self.global_steps
            if self.global_steps and self._config.get("fp16", {}).get("enabled") is True:
                applied = self.stats().get("step", applied)  # overflow-skipped steps do not advance it
            lr = ctypes.c_double()
            check(_capi.lib().zinf_engine_scheduled_lr(self._engine, applied, ctypes.byref(lr)), "scheduled lr")
            for g in self.optimizer.param_groups:
                g["lr"] = lr.value
            return [lr.value] * len(self.optimizer.param_groups)
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        """The gradient norm of the last optimizer step (None before the first)."""
        if self.global_steps == 0:
            return None
        return self.stats(wait=False).get("grad_norm")

    def gradient_accumulation_steps(self):
        return self._accumulation

    def train_micro_batch_size_per_gpu(self):
        return self._micro_batch

    def train_batch_size(self):
        return self._micro_batch * self._accumulation * self.world_size

    def zero_optimization_stage(self):
        return self.zero_stage

    # What DeepSpeedExamples and accelerate ask a DeepSpeed engine.
    def fp16_enabled(self):
        return _enabled(self._config.get("fp16"))

    def bfloat16_enabled(self):
        return _enabled(self._config.get("bf16")) or _enabled(self._config.get("bfloat16"))

    def amp_enabled(self):
        return False  # apex AMP: zinf runs its own bf16/fp16 (fp16, bf16 blocks)

    def get_data_types(self):
        """(the model's compute dtype, the gradient accumulation dtype), as DeepSpeed returns them."""
        compute = torch.float16 if self.fp16_enabled() else torch.bfloat16 if self.bfloat16_enabled() else torch.float32
        return compute, torch.float32

    def gradient_clipping(self):
        return float(self._config.get("gradient_clipping", 0.0))

    def zero_offload_optimizer(self):
        return _device_of(self._config, "offload_optimizer") in ("cpu", "nvme")

    def zero_offload_param(self):
        return _device_of(self._config, "offload_param") in ("cpu", "nvme")

    def zero_cpu_offload(self):
        return _device_of(self._config, "offload_optimizer") == "cpu"

    def steps_per_print(self):
        return self._config.get("steps_per_print", 10)

    def wall_clock_breakdown(self):
        return False

    def get_global_rank(self):
        return self.rank

    def get_world_size(self):
        return self.world_size

    @property
    def config(self):
        """The config the engine runs, "auto" values resolved (a copy)."""
        return json.loads(json.dumps(self._config))

    @property
    def local_rank(self):
        return int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))

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

    def _read_unit(self, unit):
        """The unit's parameters as one fp32 host tensor (the masters; a frozen
        unit's compute copy), cached until the next step or write."""
        key = (unit.index, self._version)
        if self._read_cache is not None and self._read_cache[0] == key:
            return self._read_cache[1]
        if self._pending_writes:
            self._write_pending()
        total = sum(unit.numels)
        flat = torch.empty(total, dtype=torch.float32)
        check(_capi.lib().zinf_engine_read_state(self._engine, unit.index, _capi.STATE_MASTER, flat.data_ptr(), total),
              "read unit '%s'" % unit.name)
        self._read_cache = (key, flat)
        return flat

    def _param_value(self, unit, i):
        flat = self._read_unit(unit)
        offset = sum(unit.numels[:i])
        return flat[offset:offset + unit.numels[i]].view(unit.shapes[i])

    def _write_unit(self, unit, updates):
        """Sets some of a unit's parameters ({index: tensor}); the others keep their values."""
        flat = self._read_unit(unit).clone()
        offsets = [0]
        for n in unit.numels:
            offsets.append(offsets[-1] + n)
        for i, t in updates.items():
            flat[offsets[i]:offsets[i + 1]] = t.detach().to(device="cpu", dtype=torch.float32).reshape(-1)
        check(_capi.lib().zinf_engine_write_state(self._engine, unit.index, _capi.STATE_MASTER, flat.data_ptr(),
                                                 flat.numel()), "write unit '%s'" % unit.name)
        self._version += 1
        self._read_cache = None

    def _write_pending(self, loading=False):
        """Writes the values load_state_dict took for the tiers. In its own
        post-hooks (loading) the loader has copied each into its parameter.
        Anywhere else they are what a load that raised midway left: as in
        torch, a parameter the loader copied into (its version moved) keeps
        the new value, and one it never reached keeps its old one."""
        pending, self._pending_writes = self._pending_writes, {}
        for unit in self._units:
            entries = pending.get(unit.index)
            if not entries:
                continue
            updates = {i: value for i, (value, p, version) in entries.items() if loading or p._version != version}
            if not loading:
                for _, p, _ in entries.values():
                    self._versions[id(p)] = p._version  # the loader's copy, not the script's in-place write
            if updates:
                self._write_unit(unit, updates)

    def _install_state_dict_hooks(self, model):
        """module.state_dict() returns whole tensors read from zinf's tiers
        (unit by unit), and load_state_dict() writes them there."""
        for m in model.modules():
            direct = [(n, p) for n, p in m.named_parameters(recurse=False) if id(p) in self._unit_of]
            if not direct:
                continue

            def save_hook(module, state_dict, prefix, local_metadata, direct=direct):
                for n, p in direct:
                    key = prefix + n
                    if key in state_dict:
                        unit = self._unit_of[id(p)]
                        i = next(j for j, (_, q) in enumerate(unit.params) if q is p)
                        state_dict[key] = self._param_value(unit, i).to(unit.dtypes[i]).clone()

            def load_pre_hook(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors,
                              direct=direct):
                for n, p in direct:
                    key = prefix + n
                    if key not in state_dict:
                        continue
                    value = state_dict[key]
                    unit = self._unit_of[id(p)]
                    i = next(j for j, (_, q) in enumerate(unit.params) if q is p)
                    if tuple(value.shape) != unit.shapes[i]:
                        errors.append("size mismatch for %s: copying a param with shape %s from checkpoint, the "
                                      "shape in current model is %s." % (key, tuple(value.shape), unit.shapes[i]))
                        continue
                    # The loader copies into the parameter: give it the shape it checks, briefly.
                    if tuple(p.shape) != unit.shapes[i]:
                        p.data = torch.empty(unit.shapes[i], dtype=p.dtype, device=p.device)
                        self._core.unbind(unit.index)
                        unit._rebind_after_load = True
                    self._pending_writes.setdefault(unit.index, {})[i] = (value.detach().clone(), p, p._version)

            def load_post_hook(module, incompatible, direct=direct):
                for _, p in direct:
                    unit = self._unit_of[id(p)]
                    if getattr(unit, "_rebind_after_load", False) and not self._core.fetched(unit.index):
                        for _, q in unit.params:
                            q.data = torch.empty(0, dtype=q.dtype, device=self.device)
                        unit._rebind_after_load = False
                if self._pending_writes:
                    self._write_pending(loading=True)
                self._note_versions()  # the loader's copies into the parameters are not the script's

            m.register_state_dict_post_hook(save_hook)
            m.register_load_state_dict_pre_hook(load_pre_hook)
            m.register_load_state_dict_post_hook(load_post_hook)

    def _gather_params(self, params):
        """GatheredParameters' entry: each parameter holds its whole value (a
        copy, in its own dtype) until _release_gathered."""
        for p in params:
            unit = self._unit_of[id(p)]
            if self._core.fetched(unit.index):
                raise RuntimeError("zinf: GatheredParameters inside a forward or backward that uses unit '%s'"
                                   % unit.name)
            i = next(j for j, (_, q) in enumerate(unit.params) if q is p)
            p.data = self._param_value(unit, i).to(device=self.device, dtype=unit.dtypes[i]).clone()
            self._core.unbind(unit.index)

    def broadcast_(self, tensor, root):
        """Copies rank `root`'s CPU tensor into every rank's, in place, through
        zinf's communicator (collective, between optimizer steps; every rank
        passes a tensor of the same size). Returns the tensor."""
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError("zinf: broadcast_ takes a contiguous CPU tensor")
        nbytes = tensor.numel() * tensor.element_size()
        check(_capi.lib().zinf_engine_broadcast(self._engine, ctypes.c_void_p(tensor.data_ptr() if nbytes else None),
                                                nbytes, int(root)), "broadcast from rank %d" % root)
        return tensor

    def barrier(self):
        """Returns on every rank once every rank has called it, after the
        engine's own work (collective, between optimizer steps)."""
        check(_capi.lib().zinf_engine_broadcast(self._engine, None, 0, 0), "barrier")

    def _release_gathered(self, params, modifier_rank):
        """GatheredParameters' exit: with a modifier_rank, that rank's values
        go back to the tiers on every rank (as DeepSpeed broadcasts them);
        the parameters are emptied again."""
        if modifier_rank is not None and not 0 <= modifier_rank < self.world_size:
            raise ValueError("zinf: GatheredParameters(modifier_rank=%r): not a rank of %d"
                             % (modifier_rank, self.world_size))
        updates = {}
        for p in params:
            unit = self._unit_of[id(p)]
            i = next(j for j, (_, q) in enumerate(unit.params) if q is p)
            if modifier_rank is not None:
                value = p.data.detach().to("cpu", torch.float32).contiguous().clone()
                if self.world_size > 1:
                    self.broadcast_(value, modifier_rank)
                updates.setdefault(unit.index, {})[i] = value
        for p in params:
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
            self._core.unbind(self._unit_of[id(p)].index)
        for unit in self._units:
            if unit.index in updates:
                self._write_unit(unit, updates[unit.index])
        self._note_versions()  # writes inside GatheredParameters are the script's, and now zinf's

    def master_weights(self):
        """{parameter name: fp32 master tensor} (collective at stages 1 and 2)."""
        L = _capi.lib()
        check(L.zinf_engine_synchronize(self._engine), "synchronize")
        out = {}
        for unit in self._units:
            flat = self._read_unit(unit)
            offset = 0
            for i, (name, _) in enumerate(unit.params):
                n = unit.numels[i]
                out[name] = flat[offset:offset + n].view(unit.shapes[i]).clone()
                offset += n
        return out

    def _module_state(self, dtype=None):
        """The model's state_dict with whole tensors (buffers too), the
        parameters in `dtype` (default: each as the model made it)."""
        state = self.module.state_dict()
        if dtype is not None:
            managed = {name for unit in self._units for name, _ in unit.params}
            state = {k: (v.to(dtype) if k in managed and v.is_floating_point() else v) for k, v in state.items()}
        return state

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True):
        """DeepSpeed's layout: the engine's state under save_dir/tag (default
        tag: global_step<N>), the client state and the lr scheduler's beside
        it, and save_dir/latest naming the tag. Collective: every rank calls.
        Returns True."""
        tag = tag if tag is not None else "global_step%d" % self.global_steps
        tag = str(tag)
        if not tag or "/" in tag or tag in (".", ".."):
            raise ValueError("zinf: a checkpoint tag must be a plain name, got %r" % tag)
        path = os.path.join(save_dir, tag)
        out = ctypes.c_void_p()
        check(_capi.lib().zinf_engine_save(self._engine, path.encode(), b"{}", ctypes.byref(out)), "save " + path)
        saved = _capi.take_string(out)
        if self.rank == 0:
            extra = {"client_state": client_state if client_state is not None else {},
                     "optimizer": self.optimizer.state_dict(),
                     "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
                     "global_steps": self.global_steps, "global_samples": self.global_samples,
                     "micro_steps": self.micro_steps, "engine_checkpoint": os.path.basename(saved)}
            _atomic_write(os.path.join(path, "zinf_client_state.pt"), lambda f: torch.save(extra, f))
            if save_latest:
                _atomic_write(os.path.join(save_dir, "latest"), lambda f: f.write(tag.encode()))
        if self.world_size > 1:
            self.barrier()  # no rank goes on (to load it, say) before rank 0's files are in place
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        """Restores what save_checkpoint wrote; returns (path, client_state)
        as DeepSpeed does ((None, None) when load_dir has no checkpoint).
        Collective: every rank calls."""
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                return None, None
            with open(latest) as f:
                tag = f.read().strip()
        path = os.path.join(load_dir, str(tag))
        if not os.path.isdir(path):
            raise FileNotFoundError("zinf: no checkpoint '%s' in %s" % (tag, load_dir))
        if not load_optimizer_states or load_module_only:
            raise ValueError("zinf: load_checkpoint restores the optimizer state with the weights (zinf keeps them "
                             "together); to load the weights alone, load them with module.load_state_dict() from "
                             "a save_16bit_model file or an exported folder")
        out = ctypes.c_void_p()
        check(_capi.lib().zinf_engine_load(self._engine, path.encode(), ctypes.byref(out)), "load " + path)
        _capi.take_string(out)
        self._version += 1
        self._read_cache = None
        extra_path = os.path.join(path, "zinf_client_state.pt")
        client = {}
        if os.path.isfile(extra_path):
            extra = torch.load(extra_path, weights_only=False)
            client = extra.get("client_state", {})
            self.global_steps = extra.get("global_steps", self.global_steps)
            self.global_samples = extra.get("global_samples", self.global_samples)
            self.micro_steps = extra.get("micro_steps", self.micro_steps)
            self.optimizer.load_state_dict(extra.get("optimizer", {}))
            sched = extra.get("lr_scheduler")
            if load_lr_scheduler_states and sched is not None and self.lr_scheduler is not None:
                self.lr_scheduler.load_state_dict(sched)
        self._pushed_lr = [None] * len(self._pushed_lr)
        return path, client

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin"):
        """The model's state_dict in the compute precision (bf16 or fp16; fp32
        when the config enables neither) to save_dir/save_filename with
        torch.save, on rank 0 (collective: every rank calls). Returns True."""
        dtype = {_capi.DTYPE_BF16: torch.bfloat16, _capi.DTYPE_FP16: torch.float16}.get(self._compute_dtype,
                                                                                           torch.float32)
        state = self._module_state(dtype)
        if self.rank == 0:
            os.makedirs(save_dir, exist_ok=True)
            _atomic_write(os.path.join(save_dir, save_filename), lambda f: torch.save(state, f))
        if self.world_size > 1:
            self.barrier()
        return True

    def close(self):
        """Frees the engine (its memory, files and ranks). The model stays: at
        stages 0-2 its parameters keep their last values, copied into torch's
        own memory; at stage 3 they are empty (read the weights first:
        state_dict(), save_16bit_model()). Its forward refuses to run."""
        L = _capi.lib()
        if self.__dict__.get("_engine"):
            core = self.__dict__.get("_core")
            if core is not None:
                core.close()  # drops its tensors over the engine's memory
            L.zinf_stream_destroy(self._stream)
            L.zinf_engine_destroy(self._engine)
            L.zinf_comm_destroy(self._comm)
            self.__dict__["_engine"] = self.__dict__["_stream"] = self.__dict__["_comm"] = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _atomic_write(path, write):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def initialize(model, config, unit_modules=None, optimizer=None, model_parameters=None, lr_scheduler=None):
    """zinf takes over `model`'s parameters and optimizer; see the module comment.

    config: a DeepSpeed-style config as a dict, a JSON text or a file's path.
    unit_modules: the submodules that become units (default: the children of
    the model's largest nn.ModuleList and the modules owning the rest).
    optimizer / model_parameters / lr_scheduler: as deepspeed.initialize
    takes them (a torch Adam or AdamW, parameter groups, a torch scheduler).
    """
    return Engine(model, config, unit_modules, optimizer=optimizer, model_parameters=model_parameters,
                  lr_scheduler=lr_scheduler)


def export_hf(engine, path, dtype=torch.bfloat16):
    """Writes the model's parameters (fp32 masters, frozen ones as kept) as
    one safetensors file under the model's parameter names, in `dtype` (bf16,
    fp16 or fp32), atomically. Every rank calls it (reading the masters is
    collective at stages 1 and 2); rank 0 writes."""
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

    def write(f):
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    _atomic_write(path, write)


# ---- Hugging Face folders larger than host memory ------------------------------------------

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


class HfWeights:
    """The tensors of a Hugging Face folder (model.safetensors, or shards
    with model.safetensors.index.json), each read with pread when asked for
    and widened to fp32: no file is mapped, so what the process holds is the
    tensor being read. Names are matched to a model's as from_pretrained
    matches them (with or without the model's base_model_prefix)."""

    def __init__(self, path, prefix=""):
        self.path = path
        self.prefix = prefix
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.isfile(os.path.join(path, "model.safetensors")):
            files = ["model.safetensors"]
        else:
            raise FileNotFoundError("zinf: %s holds no model.safetensors (nor an index of shards)" % path)
        self.tensors = {}
        for name in files:
            fpath = os.path.join(path, name)
            with open(fpath, "rb") as f:
                head = f.read(8)
                if len(head) != 8:
                    raise ValueError("zinf: %s: truncated safetensors header" % fpath)
                n = struct.unpack("<Q", head)[0]
                size = os.fstat(f.fileno()).st_size
                if n > size - 8 or n > (1 << 30):
                    raise ValueError("zinf: %s: safetensors header of %d bytes in a file of %d" % (fpath, n, size))
                header = json.loads(f.read(n))
            for key, t in header.items():
                if key == "__metadata__":
                    continue
                if t.get("dtype") not in _ST_DTYPES:
                    raise ValueError("zinf: %s: tensor %s has dtype %s (zinf reads F32, F16, BF16, F64)"
                                     % (fpath, key, t.get("dtype")))
                begin, end = t["data_offsets"]
                if not 0 <= begin <= end <= size - 8 - n:
                    raise ValueError("zinf: %s: tensor %s lies outside the file" % (fpath, key))
                self.tensors[key] = (fpath, 8 + n + begin, end - begin, t["dtype"], tuple(t["shape"]))
        self.used = set()

    def key_of(self, name):
        for key in (name, name[len(self.prefix) + 1:] if self.prefix and name.startswith(self.prefix + ".") else None,
                    self.prefix + "." + name if self.prefix else None):
            if key is not None and key in self.tensors:
                return key
        return None

    def __call__(self, name, shape=None):
        key = self.key_of(name)
        if key is None:
            raise KeyError("zinf: %s has no tensor for parameter '%s'" % (self.path, name))
        fpath, offset, length, dtype, tshape = self.tensors[key]
        if shape is not None and tuple(shape) != tshape:
            raise ValueError("zinf: %s: tensor %s has shape %s, the model's parameter %s" % (fpath, key, tshape,
                                                                                           tuple(shape)))
        buf = bytearray(length)
        view = memoryview(buf)
        fd = os.open(fpath, os.O_RDONLY)
        try:
            done = 0
            while done < length:
                got = os.preadv(fd, [view[done:]], offset + done)
                if got <= 0:
                    raise IOError("zinf: pread %s offset=%d len=%d: end of file" % (fpath, offset + done,
                                                                                     length - done))
                done += got
        finally:
            os.close(fd)
        self.used.add(key)
        t = torch.frombuffer(buf, dtype=_ST_DTYPES[dtype]) if length else torch.empty(0, dtype=_ST_DTYPES[dtype])
        return t.reshape(tshape).to(torch.float32)

    def unused(self):
        return sorted(k for k in self.tensors if k not in self.used and not k.endswith("rotary_emb.inv_freq"))


def empty_model(path, dtype=torch.float32, **kwargs):
    """The causal LM of a Hugging Face folder built on the meta device
    (parameters without memory; buffers real), its weights left in the
    folder: initialize() streams them into zinf's tiers unit by unit."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    hf_config = AutoConfig.from_pretrained(path)
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, **kwargs)
    model.tie_weights()  # the meta build leaves a tied head untied
    model._zinf_weights = HfWeights(path, getattr(model, "base_model_prefix", ""))
    return model


def from_pretrained(path, config, dtype=torch.float32, unit_modules=None, optimizer=None, model_parameters=None,
                    lr_scheduler=None, **model_kwargs):
    """A Hugging Face causal LM trained by zinf, larger than host memory: the
    model is built on the meta device and its safetensors are streamed into
    zinf's tiers unit by unit (the process holds at most one unit's weights
    at a time besides the engine's own buffers). Returns the engine;
    engine.module is the model. `dtype` is the model's own parameter type
    (the engine's compute copy follows the config's bf16/fp16)."""
    return Engine(empty_model(path, dtype, **model_kwargs), config, unit_modules, optimizer=optimizer,
                  model_parameters=model_parameters, lr_scheduler=lr_scheduler)
