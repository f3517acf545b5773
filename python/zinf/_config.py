"""DeepSpeed configs as zinf's Python front-ends take them: a dict, a JSON
text or a file's path; "auto" values resolved from the model and the trainer
as Hugging Face's DeepSpeed integration does (through zinf's C library, the
same rules as `zinf train`); and the launcher's world checked against the
one zinf forms (MPI), so that no script trains silent copies of a model.
"""
import ctypes
import json
import math
import os

from . import _capi
from ._capi import check


def load(config):
    """The config as a dict. A str is a path when it names a file, JSON text
    when it starts with '{'; anything else is an error naming it."""
    if isinstance(config, dict):
        return _finite(json.loads(json.dumps(config)), "")  # a copy the caller cannot change under us
    if hasattr(config, "__fspath__"):
        config = os.fspath(config)
    if not isinstance(config, str):
        raise TypeError("zinf: config must be a dict, a JSON text or a path to a JSON file, not %s"
                        % type(config).__name__)
    text = config.strip()
    if text.startswith("{"):
        source, body = "the config text", text
    elif os.path.isfile(config):
        source = config
        with open(config) as f:
            body = f.read()
    else:
        raise FileNotFoundError("zinf: the config file '%s' does not exist" % config)
    try:
        parsed = json.loads(body)
    except ValueError as e:
        raise ValueError("zinf: %s is not valid JSON: %s" % (source, e)) from None
    if not isinstance(parsed, dict):
        raise ValueError("zinf: %s must hold a JSON object, not %s" % (source, type(parsed).__name__))
    return _finite(parsed, "")


# Keys whose "never" a client writes as float("inf") (accelerate's DeepSpeed
# plugin sets steps_per_print so, HF passes the dict on): zinf reads no value
# from them, and JSON has no infinity, so they are dropped.
_INFINITE_MEANS_NEVER = ("steps_per_print",)


def _finite(config, prefix):
    """`config` with no non-finite number: a key of _INFINITE_MEANS_NEVER at
    +inf is dropped; any other NaN or infinity is an error naming its path
    (JSON cannot carry it to the engine)."""
    for key in list(config):
        value, path = config[key], prefix + key
        if isinstance(value, dict):
            _finite(value, path + ".")
        elif isinstance(value, float) and not math.isfinite(value):
            if value > 0 and path in _INFINITE_MEANS_NEVER:
                del config[key]
            else:
                raise ValueError("zinf: the config's \"%s\" is %r; give a finite number" % (path, value))
    return config


def auto_keys(config, prefix=""):
    """The dotted paths of every "auto" value in a config dict."""
    out = []
    for key, value in config.items():
        path = prefix + key
        if isinstance(value, dict):
            out += auto_keys(value, path + ".")
        elif isinstance(value, str) and value == "auto":
            out.append(path)
        elif isinstance(value, list) and any(v == "auto" for v in value):
            out.append(path)
    return out


def resolve_auto(config, context):
    """(config with every "auto" replaced, notes). `context`: hidden_size, lr,
    weight_decay, micro_batch_size, gradient_accumulation_steps,
    gradient_clipping, total_num_steps, warmup_num_steps, world_size (None:
    unknown). A value that cannot be resolved raises ZinfError naming the key.
    Keys zinf's config does not know are left for its parser to name."""
    if not auto_keys(config):
        return config, []
    ctx = {k: v for k, v in context.items() if v is not None}
    out, notes = ctypes.c_void_p(), ctypes.c_void_p()
    check(_capi.lib().zinf_config_resolve_auto(json.dumps(config).encode(), json.dumps(ctx).encode(),
                                               ctypes.byref(out), ctypes.byref(notes)), "resolve \"auto\" values")
    resolved = json.loads(_capi.take_string(out))
    lines = [line for line in _capi.take_string(notes).splitlines() if line]
    # Keep the caller's own structure: only the "auto" leaves change.
    merged = json.loads(json.dumps(config))
    for path in auto_keys(config):
        src, dst = resolved, merged
        keys = path.split(".")
        for k in keys[:-1]:
            src = src.get(k, {}) if isinstance(src, dict) else {}
            dst = dst[k]
        if isinstance(src, dict) and keys[-1] in src and src[keys[-1]] is not None:
            dst[keys[-1]] = src[keys[-1]]
        else:
            del dst[keys[-1]]  # derived by the engine (train_batch_size)
    return merged, lines


def launcher_world():
    """(rank, world size, launcher) as the environment says: Open MPI's
    mpirun, MPICH's PMI ("mpirun"); torchrun, the deepspeed launcher or
    accelerate launch (RANK, WORLD_SIZE: "torchrun"); Slurm's srun
    (SLURM_PROCID, SLURM_NTASKS: "srun")."""
    env = os.environ
    for rank_key, size_key, name in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"),
                                     ("PMI_RANK", "PMI_SIZE", "mpirun"),
                                     ("PMIX_RANK", "PMIX_SIZE", "mpirun")):
        if env.get(size_key):
            return int(env.get(rank_key, "0")), int(env[size_key]), name
    if env.get("WORLD_SIZE"):
        return int(env.get("RANK", "0")), int(env["WORLD_SIZE"]), "torchrun"
    if env.get("SLURM_NTASKS") and env.get("SLURM_PROCID"):
        return int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), "srun"
    return 0, 1, None


def check_world(zinf_world):
    """Refuses a run whose launcher started more processes than zinf's
    communicator joined: each process would otherwise train its own copy of
    the model."""
    rank, world, launcher = launcher_world()
    dist_world = None
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist_world = dist.get_world_size()
    except ImportError:
        pass
    expected = max(world, dist_world or 1)
    if expected != zinf_world:
        who = ("torch.distributed's process group has %d ranks" % dist_world if dist_world and dist_world > 1
               else "%s started %d processes" % (launcher or "the launcher", world))
        raise RuntimeError(
            "zinf: %s, but zinf's communicator joined %d, so each process would train its own copy of the "
            "model. Start every process with one launcher (mpirun, torchrun, the deepspeed launcher, accelerate "
            "launch or srun), and do not initialize torch.distributed over a different world"
            % (who, zinf_world))
