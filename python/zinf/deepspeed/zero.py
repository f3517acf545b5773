"""deepspeed.zero's context managers over zinf.

GatheredParameters(params, modifier_rank=None): inside the block the given
parameters hold their whole values (read from zinf's tiers); with a
modifier_rank, what that rank's block wrote into them goes to every rank
(through zinf's communicator) and back to the tiers on exit. Parameters
built under Init and not yet initialized are read and written in Init's
file inside the block (each rank its own; without a modifier_rank writes
are dropped, as DeepSpeed drops them).

Init(...): as DeepSpeed partitions a model's parameters while its modules
are constructed, zinf moves each module's parameter values, as its
constructor returns, to a file (under the config's NVMe path, else
ZINF_TMPDIR, else /var/tmp) and leaves meta-device parameters: building a
model takes host memory for one module, not the model. Everything the
building code does to the parameters inside the block (a parent's init,
transformers' post_init, views, reads) acts on the values in the file, with
the random numbers an ordinary build draws, so the model is the same bit for
bit; initialize() reads them unit by unit into zinf's tiers. Inside the
block, transformers' from_pretrained of a local folder builds on the meta
device and leaves the weights in the folder, which initialize() streams the
same way.
"""
import logging
import os
import weakref

import torch

from .. import _lazy

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
        self._builder = None
        self._directory = _spill_directory(config_dict_or_path if config_dict_or_path is not None else config)
        if module is not None and enabled:  # a model built already: it is partitioned at initialize()
            for p in module.parameters():
                _mark(p)

    def __enter__(self):
        if not self.enabled:
            return self
        self._builder = _lazy.Builder(self._directory)
        self._builder.__enter__()
        self._patch_from_pretrained()
        return self

    def __exit__(self, *exc):
        if self._restore is not None:
            self._restore()
            self._restore = None
        if self._builder is not None:
            self._builder.__exit__(*exc)
            self._builder = None
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


def _spill_directory(config):
    """Where Init keeps the values: the config's NVMe path (parameters'
    first, then the optimizer's), else ZINF_TMPDIR, else /var/tmp."""
    from .. import _config
    cfg = _config.load(config) if config is not None else {}
    zero = cfg.get("zero_optimization") if isinstance(cfg.get("zero_optimization"), dict) else {}
    for key in ("offload_param", "offload_optimizer"):
        section = zero.get(key) if isinstance(zero.get(key), dict) else {}
        path = section.get("nvme_path")
        if section.get("device") == "nvme" and isinstance(path, str) and path:
            return path
    return os.environ.get("ZINF_TMPDIR") or "/var/tmp"


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
        # Built under Init, not yet initialized: their values wait in Init's spill.
        self.spilled = [p for p in params if _lazy.is_lazy(p)] if enabled else []
        self.modifier_rank = modifier_rank
        self._engines = {}
        self._mode = None

    def __enter__(self):
        if self.spilled:
            spill = _lazy.tag(self.spilled[0])[0].spill
            self._mode = _lazy.LazyMode(spill, keep_writes=self.modifier_rank is not None)
            self._mode.__enter__()
        for p in self.params:
            engine = p._zinf_engine()
            if engine is not None:
                self._engines.setdefault(id(engine), (engine, []))[1].append(p)
        for engine, params in self._engines.values():
            engine._gather_params(params)
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._mode is not None:
            self._mode.__exit__(exc_type, exc, tb)
            self._mode.spill.flush()
            self._mode = None
        for engine, params in self._engines.values():
            engine._release_gathered(params, self.modifier_rank if exc_type is None else None)
        return False
