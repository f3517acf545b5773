"""The world zinf's engine joins, whatever launched the processes.

- mpirun (Open MPI; MPICH or Slurm with PMI): zinf's MPI communicator, as
  zinf train uses.
- torchrun, the deepspeed launcher, accelerate launch (RANK / WORLD_SIZE)
  and Slurm's srun (SLURM_PROCID / SLURM_NTASKS): torch.distributed is
  initialized as DeepSpeed initializes it (unless the script or the trainer
  did), and zinf's collectives run over a gloo process group of their own
  (src/torch/torch_comm.cc): zinf numbers and orders them and does the
  reductions itself, so the bits equal mpirun's.
- One process: the 1-rank communicator.

Why torch.distributed and not a rendezvous of zinf's own: under these
launchers the job already has a store and a backend that every rank joined
(the launcher's MASTER_ADDR/PORT), and scripts and trainers call
dist.get_rank(), barriers and all_reduce on it; a second set of sockets
would be one more thing to fail. zinf's group is its own (new_group), so no
collective of the script's ever interleaves with the engine's.
"""

import ctypes
import datetime
import os

from . import _capi, _config, _units

_COMMS = [0]  # communicators made in this process: each gets its own keys on the store


def _env_summary():
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
            "SLURM_NTASKS")
    return ", ".join("%s=%s" % (k, os.environ[k]) for k in keys if k in os.environ)


def check_core():
    """Refuses a world of several processes under a torch launcher without
    the C++ core that carries zinf's collectives over torch.distributed:
    before torch.distributed waits for the peers, so that every rank stops
    at once, naming the fix."""
    rank, world, launcher = _config.launcher_world()
    if world <= 1 or launcher == "mpirun":
        return
    module, why = _units.extension()
    if module is None or not hasattr(module, "create_comm"):
        raise RuntimeError(
            "zinf: rank %d of %d started by %s (%s): zinf's collectives over torch.distributed need its C++ core, "
            "which is not loaded (%s). Install zinf with `pip install .` (or build it with scripts/build), or "
            "launch with `mpirun -np %d python ...`" % (rank, world, launcher, _env_summary(), why or "too old",
                                                        world))


def check_before_engine(device_type):
    """Refuses, before any engine exists, a world zinf cannot serve: several
    processes on GPUs under a torch launcher (zinf's GPU collectives form
    their world under mpirun only), or such a world without the C++ core
    (check_core)."""
    rank, world, launcher = _config.launcher_world()
    if world <= 1 or launcher == "mpirun":
        return
    if device_type == "cuda":
        raise RuntimeError(
            "zinf: rank %d of %d started by %s (%s) on a GPU: zinf's collectives on GPUs form their world "
            "under mpirun only. Launch with `mpirun -np %d python ...`, or train on the CPU device"
            % (rank, world, launcher, _env_summary(), world))
    check_core()


def init_torch_distributed(backend=None, timeout=None, init_method=None, distributed_port=29500):
    """torch.distributed over the launcher's world, if not yet initialized:
    the launcher's rendezvous (init_method, else MASTER_ADDR/MASTER_PORT,
    else under mpirun on one node 127.0.0.1:distributed_port; one process
    needs none)."""
    import torch.distributed as dist
    if not dist.is_available() or dist.is_initialized():
        return
    check_core()
    rank, world, launcher = _config.launcher_world()
    kwargs = {"backend": backend or "gloo", "rank": rank, "world_size": world}
    if timeout is not None:
        kwargs["timeout"] = timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=timeout)
    env = os.environ
    if init_method is not None:
        kwargs["init_method"] = init_method
    elif world == 1:
        kwargs["store"] = dist.HashStore()  # one process: no rendezvous to make
    elif env.get("MASTER_ADDR"):
        kwargs["init_method"] = "tcp://%s:%s" % (env["MASTER_ADDR"], env.get("MASTER_PORT", distributed_port))
    elif env.get("OMPI_COMM_WORLD_LOCAL_SIZE") == str(world):
        kwargs["init_method"] = "tcp://127.0.0.1:%s" % env.get("MASTER_PORT", distributed_port)
    else:
        raise RuntimeError("zinf: torch.distributed over %d ranks started by %s (%s) needs the rendezvous address: "
                           "set MASTER_ADDR (rank 0's host) and MASTER_PORT, or pass init_method="
                           % (world, launcher or "the launcher", _env_summary()))
    dist.init_process_group(**kwargs)


def create_comm(timeout_seconds):
    """A zinf_comm for this process's world (see the module comment), owned
    by the caller (zinf_comm_destroy)."""
    L = _capi.lib()
    rank, world, launcher = _config.launcher_world()
    comm = ctypes.c_void_p()
    if world <= 1 or launcher == "mpirun":
        _capi.check(L.zinf_comm_create_mpi(timeout_seconds, ctypes.byref(comm)), "zinf_comm_create_mpi")
        return comm
    import torch.distributed as dist
    init_torch_distributed(timeout=max(timeout_seconds, 1800))
    if dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError("zinf: torch.distributed is rank %d of %d, but %s says rank %d of %d (%s)"
                           % (dist.get_rank(), dist.get_world_size(), launcher, rank, world, _env_summary()))
    # zinf's own group: gloo whatever the default backend is. Its timeout is
    # gloo's; zinf's deadline (timeout_seconds) ends a wait first.
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=max(timeout_seconds, 1800)))
    _COMMS[0] += 1
    store = dist.PrefixStore("zinf/comm%d/" % _COMMS[0], dist.distributed_c10d._get_default_store())
    module, _ = _units.extension()
    fns = {name: ctypes.cast(getattr(L, name), ctypes.c_void_p).value
           for name in ("zinf_comm_create_transport", "zinf_last_error", "zinf_status_name")}
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE") or 1)
    address, code, message = module.create_comm(fns, group, store, rank, world, local, float(timeout_seconds))
    if not address:
        raise _capi.ZinfError(code, "zinf_comm_create_transport", message)
    comm.value = address
    return comm
