"""deepspeed.utils names scripts use: the logger and the ZeRO-3 leaf modules.

set_z3_leaf_modules(model, classes) marks the modules of those classes as
leaves, as DeepSpeed does: at stage 3 the whole subtree of a leaf is one
unit, fetched when the leaf's forward starts (an MoE layer whose experts run
in a data-dependent order). A leaf inside one of zinf's blocks is inside that
block's unit already."""
import logging

import torch

__all__ = ["logger", "set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules", "z3_leaf_module"]

logger = logging.getLogger("zinf.deepspeed")


def _classes(leaf_module_classes):
    out = []
    for c in leaf_module_classes:
        if isinstance(c, type) and issubclass(c, torch.nn.Module):
            out.append(c)
        elif isinstance(c, str):
            out.append(c)
        else:
            raise TypeError("zinf: set_z3_leaf_modules takes nn.Module classes or class names, not %r" % (c,))
    return out


def _matches(module, classes):
    return any(isinstance(module, c) if isinstance(c, type) else type(module).__name__ == c for c in classes)


def _set(model, leaf_module_classes, flag):
    classes = _classes(leaf_module_classes)
    found = [m for m in model.modules() if _matches(m, classes)]
    if not found:
        raise ValueError("zinf: no module of %s in the model" % ", ".join(
            c.__name__ if isinstance(c, type) else c for c in classes))
    for m in found:
        m._z3_leaf = flag
    return found


def set_z3_leaf_modules(model, leaf_module_classes):
    """Marks every module of the given classes as a ZeRO-3 leaf; returns them."""
    return _set(model, leaf_module_classes, True)


def unset_z3_leaf_modules(model, leaf_module_classes):
    return _set(model, leaf_module_classes, False)


def z3_leaf_module(model):
    return getattr(model, "_z3_leaf", False)


def get_z3_leaf_modules(model):
    return [m for m in model.modules() if z3_leaf_module(m)]
