"""The optimizer side of zinf's PyTorch front-ends: parameter groups and a
client's Adam/AdamW turned into the engine's config and parameter groups,
the optimizer object a training script holds (a torch.optim.Optimizer whose
param_groups a torch lr scheduler may change; zinf applies each group's lr
and weight decay at the next optimizer step), and DeepSpeed's config
schedulers seen through a scheduler object.

zinf runs one Adam/AdamW (its own kernels, on the config's tier); what a
client asks of it that it cannot honour is refused here, at initialize, with
the reason.
"""
import math

import torch

# Keys of a torch param group zinf applies; the others must keep the
# optimizer's defaults.
_APPLIED = {"params", "lr", "weight_decay", "betas", "eps", "initial_lr", "name"}
# Keys torch and DeepSpeed's optimizers add that do not change Adam's math.
_HARMLESS = {"foreach", "maximize", "capturable", "differentiable", "fused", "amsgrad", "bias_correction",
             "adam_w_mode", "decoupled_weight_decay", "lr_scale", "base_lr", "max_lr", "min_lr", "max_momentum",
             "base_momentum"}


class _ClientOptimizer:
    """What a client optimizer says: its kind (Adam or AdamW), defaults and
    groups."""

    def __init__(self, opt):
        cls = type(opt)
        name = cls.__name__
        mode = None
        if isinstance(opt, torch.optim.AdamW) or name == "AdamW":
            mode = "AdamW"
        elif isinstance(opt, torch.optim.Adam):
            mode = "AdamW" if opt.defaults.get("decoupled_weight_decay") else "Adam"
        elif name in ("DeepSpeedCPUAdam", "FusedAdam"):
            mode = "AdamW" if getattr(opt, "adam_w_mode", opt.defaults.get("adam_w_mode", True)) else "Adam"
        if mode is None:
            raise ValueError("zinf: the optimizer %s.%s is not supported: zinf runs Adam and AdamW (its own CPU "
                             "and GPU kernels); pass torch.optim.Adam or torch.optim.AdamW, or leave the optimizer "
                             "to the config (\"optimizer\": {\"type\": \"AdamW\", ...})"
                             % (cls.__module__, name))
        for group in opt.param_groups:
            if group.get("amsgrad"):
                raise ValueError("zinf: %s with amsgrad=True is not supported (zinf's Adam keeps no max of v)" % name)
            if group.get("maximize"):
                raise ValueError("zinf: %s with maximize=True is not supported" % name)
            if group.get("bias_correction") is False:
                raise ValueError("zinf: %s with bias_correction=False in a parameter group is not supported; set "
                                 "it in the config's optimizer.params instead" % name)
        self.mode = mode
        self.opt = opt
        self.name = name


def split_groups(model, model_parameters, client):
    """The parameter groups: a list of dicts with 'params' (a list of
    Parameters) and the group's options, from `model_parameters` (params or
    torch-style groups), the client optimizer's groups, or every parameter of
    the model in one group."""
    if client is not None:
        # DeepSpeed trains the client optimizer's groups; model_parameters only names what trains.
        return client.opt.param_groups
    if model_parameters is None:
        return [{"params": [p for p in model.parameters()]}]
    items = list(model_parameters)
    if not items:
        raise ValueError("zinf: model_parameters is empty")
    if all(isinstance(g, dict) for g in items):
        groups = []
        for g in items:
            if "params" not in g:
                raise ValueError("zinf: a parameter group has no 'params'")
            params = g["params"]
            params = [params] if isinstance(params, torch.Tensor) else list(params)
            groups.append(dict(g, params=params))
        return groups
    if all(isinstance(p, torch.Tensor) for p in items):
        return [{"params": items}]
    if all(isinstance(p, tuple) and len(p) == 2 for p in items):  # named_parameters()
        return [{"params": [p for _, p in items]}]
    raise ValueError("zinf: model_parameters must be parameters, (name, parameter) pairs or parameter groups")


def check_uniform(groups, defaults, what):
    """Betas and eps must be the same in every group (zinf's Adam takes one of
    each); options zinf cannot apply must keep their defaults."""
    for i, g in enumerate(groups):
        for key in ("betas", "eps"):
            if key in g and defaults.get(key) is not None:
                a, b = g[key], defaults[key]
                same = tuple(a) == tuple(b) if key == "betas" else float(a) == float(b)
                if not same:
                    raise ValueError("zinf: parameter group %d of %s has %s=%r, the others %r: zinf applies one %s "
                                     "to every group" % (i, what, key, a, b, key))
        for key in g:
            if key not in _APPLIED and key not in _HARMLESS:
                raise ValueError("zinf: parameter group %d of %s sets '%s', which zinf's Adam cannot apply "
                                 "(it applies lr, weight_decay, betas and eps)" % (i, what, key))


def optimizer_config(client):
    """The config's "optimizer" block for a client optimizer."""
    d = client.opt.defaults
    g0 = client.opt.param_groups[0]
    params = {"lr": float(g0.get("lr", d.get("lr", 1e-3))),
              "betas": [float(b) for b in g0.get("betas", d.get("betas", (0.9, 0.999)))],
              "eps": float(g0.get("eps", d.get("eps", 1e-8))),
              "weight_decay": float(g0.get("weight_decay", d.get("weight_decay", 0.0)))}
    return {"type": client.mode, "params": params}


class ZinfOptimizer(torch.optim.Optimizer):
    """The optimizer a script holds under zinf: its param_groups are the
    groups zinf trains (a client optimizer's own group dicts when one was
    given, so a scheduler made on either changes the same lr), and a torch
    lr scheduler may change each group's 'lr' and 'weight_decay'. zinf's
    engine runs the update: step() and zero_grad() here do nothing (the
    engine's step at the accumulation boundary is the optimizer step)."""

    def __init__(self, groups, defaults, engine):
        # torch's constructor copies the groups; share the caller's dicts instead.
        super().__init__([{"params": [torch.nn.Parameter(torch.empty(0))]}], dict(defaults))
        self.param_groups = groups
        for g in self.param_groups:
            for k, v in defaults.items():
                g.setdefault(k, v)
        self._engine = engine

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        return loss

    def zero_grad(self, set_to_none=True):
        pass

    def state_dict(self):
        return {"param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
                "zinf": "the optimizer state (masters, m, v) is in zinf's checkpoints"}

    def load_state_dict(self, state):
        for g, saved in zip(self.param_groups, state.get("param_groups", [])):
            for k, v in saved.items():
                if k != "params":
                    g[k] = v


class ConfigScheduler:
    """DeepSpeed's config scheduler (WarmupLR, WarmupDecayLR,
    WarmupCosineLR) as the object initialize returns: the engine computes
    the lr; this reports it (get_lr, get_last_lr) and mirrors it into the
    optimizer's groups. step() is the engine's (a no-op here)."""

    def __init__(self, engine, kind):
        self._engine = engine
        self.kind = kind
        self.last_batch_iteration = -1

    def get_lr(self):
        return self._engine.get_lr()

    def get_last_lr(self):
        return self._engine.get_lr()

    def step(self, last_batch_iteration=None):
        pass

    def state_dict(self):
        return {"last_batch_iteration": self._engine.global_steps - 1, "kind": self.kind}

    def load_state_dict(self, state):
        self.last_batch_iteration = state.get("last_batch_iteration", -1)


def check_lr(value, where):
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError("zinf: %s: lr must be a finite number >= 0, got %r" % (where, value))
    return v
