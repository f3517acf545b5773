"""DeepSpeed's user API over zinf: a DeepSpeed training script runs on zinf by
changing one import,

    import zinf.deepspeed as deepspeed
    engine, optimizer, dataloader, lr_scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config="ds_config.json")
    for batch in dataloader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()

initialize() takes DeepSpeed's arguments and returns DeepSpeed's 4-tuple.
The engine (zinf.torch.Engine) is an nn.Module with DeepSpeed's engine
methods; the optimizer is a torch.optim.Optimizer whose param_groups a torch
lr scheduler may change (zinf applies them at the next optimizer step). zinf
runs Adam/AdamW with its own kernels on the config's tiers: another optimizer
class is refused here, naming it, as is anything else zinf cannot honour.
"""
import os

import torch

from .. import _config, _world
from .. import torch as _zt
from . import accelerator, comm, utils, zero  # noqa: F401
from . import ops  # noqa: F401
from .zero import _built_under_init

__version__ = "0.19.8+zinf"  # the DeepSpeed API level this mirrors

DeepSpeedEngine = _zt.Engine


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=29500, verbose=True, timeout=None,
                     init_method=None, dist_init_required=None, config=None, rank=-1, world_size=-1):
    """torch.distributed initialized over the launcher's world, as DeepSpeed
    initializes it (scripts call dist.get_rank(), barriers, all_reduce of
    metrics): the backend is the accelerator's (gloo on the CPU, NCCL on
    CUDA) unless dist_backend names one; the rendezvous is init_method,
    else the launcher's MASTER_ADDR/MASTER_PORT, else, under mpirun on one
    node, 127.0.0.1:distributed_port; one process alone needs none. Already
    initialized: nothing to do. zinf's engine joins the same world
    (zinf/_world.py)."""
    import torch.distributed as dist
    rank_, world, launcher = _config.launcher_world()
    if dist_init_required is False or not dist.is_available() or dist.is_initialized():
        return
    if world_size not in (-1, world) or rank not in (-1, rank_):
        raise ValueError("zinf: init_distributed(rank=%d, world_size=%d) disagrees with the launcher's world "
                         "(rank %d of %d)" % (rank, world_size, rank_, world))
    backend = dist_backend or accelerator.get_accelerator().communication_backend_name()
    _world.init_torch_distributed(backend, timeout, init_method, distributed_port)


def _config_from(args, config, config_params):
    if config is None and config_params is not None:
        config = config_params
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    if from_args is None and args is not None:
        from_args = getattr(args, "deepscale_config", None)
    if from_args is not None:
        if config is not None:
            raise ValueError("zinf: a config was given both in args.deepspeed_config and to initialize(); give one")
        config = from_args
    if config is None:
        raise ValueError("zinf: no DeepSpeed config: pass config= (a dict or a JSON file's path) or "
                         "args.deepspeed_config")
    return _config.load(config)


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               distributed_port=29500, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               mesh_param=None, config_params=None):
    """(engine, optimizer, training_dataloader, lr_scheduler), as
    deepspeed.initialize returns them; see the module comment."""
    if model is None:
        raise ValueError("zinf: initialize() needs a model")
    if mpu is not None or mesh_param is not None:
        raise ValueError("zinf: model parallelism (mpu, mesh_param) is not supported: zinf runs data parallel "
                         "ZeRO stages 0-3")
    cfg = _config_from(args, config, config_params)
    for key in ("tensor_parallel", "pipeline", "sequence_parallel_size"):
        if key in cfg:
            raise ValueError("zinf: the config's \"%s\" is not supported (zinf runs data parallel ZeRO stages 0-3)"
                             % key)
    init_distributed(distributed_port=distributed_port, dist_init_required=dist_init_required)
    streamed = getattr(model, "_zinf_weights", None) is not None  # from_pretrained under zero.Init
    whole = not streamed and _built_under_init(model)
    engine = _zt.Engine(model, cfg, optimizer=optimizer, model_parameters=model_parameters,
                        lr_scheduler=lr_scheduler)
    engine.built_under_zero_init = whole
    dataloader = None
    if training_data is not None:
        sampler = torch.utils.data.DistributedSampler(training_data, num_replicas=engine.world_size,
                                                      rank=engine.rank)
        batch = engine.train_micro_batch_size_per_gpu()  # the config's, derived as DeepSpeed derives it
        dataloader = torch.utils.data.DataLoader(training_data, batch_size=batch, sampler=sampler,
                                                 collate_fn=collate_fn,
                                                 drop_last=bool(cfg.get("dataloader_drop_last", False)))
    return engine, engine.optimizer, dataloader, engine.lr_scheduler


def add_config_arguments(parser):
    """DeepSpeed's command-line flags, as DeepSpeed adds them: --deepspeed,
    --deepspeed_config and the deprecated --deepscale, --deepscale_config
    (a script adds --local_rank itself, if it wants it)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations (zinf)")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="run with zinf (DeepSpeed's flag: kept so that scripts keep their command lines)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="the DeepSpeed JSON config")
    group.add_argument("--deepscale", default=False, action="store_true", help="deprecated; as --deepspeed")
    group.add_argument("--deepscale_config", default=None, type=str, help="deprecated; as --deepspeed_config")
    return parser
