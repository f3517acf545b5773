"""deepspeed.zero's context managers over zinf.

GatheredParameters(params, modifier_rank=None): inside the block the given
parameters hold their whole values (read from zinf's tiers); with a
modifier_rank, what the block writes into them goes back to the tiers on
exit (every rank must then write the same values: zinf checks it with a
checksum across the ranks when torch.distributed is initialized, and with one
rank there is nothing to check).

Init(...): DeepSpeed partitions a model's parameters as its modules are
constructed. zinf builds the model whole in host memory and partitions it at
initialize() (the engine then holds it on the configured tiers); for a model
larger than host memory load it with zinf.torch.from_pretrained, which
streams the weights into the tiers unit by unit. initialize() says so when a
model was built under Init.
"""
import logging

import torch

_log = logging.getLogger("zinf")


class Init:
    """See the module comment: the model is built whole and partitioned at
    initialize(), which logs that it was."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 **kwargs):
        self.enabled = enabled
        self.dtype = dtype
        self._handle = None
        if module is not None and enabled:
            for p in module.parameters():
                p._zinf_built_under_init = True

    def __enter__(self):
        if not self.enabled:
            return self

        def mark(module, name, param):
            if param is not None:
                param._zinf_built_under_init = True
            return None
        self._handle = torch.nn.modules.module.register_module_parameter_registration_hook(mark)
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return False


def _built_under_init(model):
    if any(getattr(p, "_zinf_built_under_init", False) for p in model.parameters()):
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
            engine._release_gathered(params, write=self.modifier_rank is not None and exc_type is None)
        return False
