"""DeepSpeedCPUAdam and FusedAdam as zinf.deepspeed takes them: a script that
builds one and passes it to initialize() gets zinf's Adam/AdamW with the same
hyper-parameters and groups. Stepping one by itself, outside an engine, is
an error (zinf's kernels run inside the engine)."""
import torch


class _AdamDescription(torch.optim.Optimizer):
    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, amsgrad=False, adamw_mode=True, **kwargs):
        if amsgrad:
            raise ValueError("zinf: %s(amsgrad=True) is not supported" % type(self).__name__)
        if not bias_correction:
            raise ValueError("zinf: %s(bias_correction=False): set optimizer.params.bias_correction in the config"
                             % type(self).__name__)
        super().__init__(model_params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.adam_w_mode = adamw_mode

    def step(self, closure=None):
        raise RuntimeError("zinf: %s runs inside zinf's engine: pass it to zinf.deepspeed.initialize(optimizer=...) "
                           "and call engine.step()" % type(self).__name__)


class DeepSpeedCPUAdam(_AdamDescription):
    pass


class FusedAdam(_AdamDescription):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, **kwargs):
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adamw_mode=adam_w_mode)
