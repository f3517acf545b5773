"""deepspeed.zero's context managers over zinf.

GatheredParameters(params, modifier_rank=None): inside the block the given
parameters hold their whole values (read from zinf's tiers); with a
modifier_rank, what that rank's block wrote into them goes to every rank
(through zinf's communicator) and back to the tiers on exit.

Init(...): DeepSpeed partitions a model's parameters as its modules are
constructed. zinf builds the model whole in host memory and partitions it at
initialize() (the engine then holds it on the configured tiers); for a model
larger than host memory load it with zinf.torch.from_pretrained, which
streams the weights into the tiers unit by unit. initialize() says so when a
model was built under Init.
"""
import logging
import os
import weakref

import torch

_log = logging.getLogger("zinf")
# Parameters registered inside an Init, by id (no attribute on them: copies
# carry their __dict__; no WeakSet: tensors compare elementwise).
_BUILT_UNDER_INIT = {}


def _mark(p):
    _BUILT_UNDER_INIT[id(p)] = weakref.ref(p)


def _was_marked(p):
    ref = _BUILT_UNDER_INIT.get(id(p))
    return ref is not None and ref() is p


class Init:
    """See the module comment. Inside it, transformers' from_pretrained of a
    local folder builds the model on the meta device and leaves its weights
    to be streamed into zinf's tiers by initialize(), unit by unit; another
    model is built whole and partitioned at initialize(), which logs that
    it was."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 **kwargs):
        self.enabled = enabled
        self.dtype = dtype
        self._handle = None
        if module is not None and enabled:
            for p in module.parameters():
                _mark(p)

    def __enter__(self):
        if not self.enabled:
            return self

        def mark(module, name, param):
            if param is not None:
                _mark(param)
            return None
        self._handle = torch.nn.modules.module.register_module_parameter_registration_hook(mark)
        self._patch_from_pretrained()
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._restore is not None:
            self._restore()
            self._restore = None
        return False

    _restore = None

    def _patch_from_pretrained(self):
        try:
            from transformers import modeling_utils
        except ImportError:
            return
        cls_attr = modeling_utils.PreTrainedModel.__dict__["from_pretrained"]
        original = cls_attr.__func__
        dtype_default = self.dtype

        def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
            path = pretrained_model_name_or_path
            if args or not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
                return original(cls, pretrained_model_name_or_path, *args, **kwargs)
            from accelerate import init_empty_weights
            from transformers import AutoConfig
            from ..torch import HfWeights
            dtype = kwargs.pop("torch_dtype", kwargs.pop("dtype", dtype_default)) or torch.float32
            if isinstance(dtype, str):
                dtype = getattr(torch, dtype) if dtype != "auto" else torch.float32
            hf_config = kwargs.pop("config", None) or AutoConfig.from_pretrained(path)
            with init_empty_weights(include_buffers=False):
                model = cls._from_config(hf_config, dtype=dtype)
            model.tie_weights()  # the meta build leaves a tied head untied
            model._zinf_weights = HfWeights(os.fspath(path), getattr(model, "base_model_prefix", ""))
            return model

        modeling_utils.PreTrainedModel.from_pretrained = classmethod(from_pretrained)

        def restore():
            modeling_utils.PreTrainedModel.from_pretrained = cls_attr
        self._restore = restore


def _built_under_init(model):
    if any(_was_marked(p) for p in model.parameters()):
        _log.warning("zinf: the model was built under zero.Init whole in host memory; zinf partitions it now, at "
                     "initialize() (zinf.torch.from_pretrained streams a checkpoint larger than host memory "
                     "into the tiers instead)")
        return True
    return False


class GatheredParameters:
    """See the module comment."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.Tensor):
            params = [params]
        self.params = [p for p in params if getattr(p, "_zinf_engine", None) is not None] if enabled else []
        self.modifier_rank = modifier_rank
        self._engines = {}

    def __enter__(self):
        for p in self.params:
            engine = p._zinf_engine()
            if engine is not None:
                self._engines.setdefault(id(engine), (engine, []))[1].append(p)
        for engine, params in self._engines.values():
            engine._gather_params(params)
        return self

    def __exit__(self, exc_type, exc, tb):
        for engine, params in self._engines.values():
            engine._release_gathered(params, self.modifier_rank if exc_type is None else None)
        return False
