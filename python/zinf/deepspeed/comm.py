"""deepspeed.comm's rank queries over zinf's world (MPI: mpirun's ranks)."""
from .. import _config


def get_rank(group=None):
    return _config.launcher_world()[0]


def get_world_size(group=None):
    return _config.launcher_world()[1]


def get_local_rank():
    import os
    return int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0")))


def is_initialized():
    return True


def barrier(group=None):
    """Every rank waits for the others: through torch.distributed when it is
    initialized, else through the newest zinf engine's communicator (between
    optimizer steps); one rank: nothing to wait for."""
    import torch.distributed as dist
    if get_world_size() == 1:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        return
    from ..torch import live_engine
    engine = live_engine()
    if engine is None:
        raise RuntimeError("zinf.deepspeed.comm.barrier with %d ranks needs a zinf engine (deepspeed.initialize) "
                           "or torch.distributed initialized" % get_world_size())
    engine.barrier()
