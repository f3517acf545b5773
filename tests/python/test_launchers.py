#!/usr/bin/env python3
"""One world under every launcher: launch_script.py (a DeepSpeed script for
several ranks, with its own torch.distributed calls between the engine's)
under mpirun, torchrun, the deepspeed launcher and accelerate launch gives
the same per-step losses and the same final weights on every rank; the real
DeepSpeed under torchrun gives the same losses (1e-5); ZeRO-3 with NVMe
tiers and 4 ranks too. A rank that dies, fails or stops answering stops the
others, and the message names it.

  test_launchers.py [pytest arguments, e.g. -k killed]

Scratch space: $ZINF_TEST_DIR/python-launchers (default /tmp). Skipped (exit
77) without torch, transformers, deepspeed, accelerate, mpirun or zinf's C++
core (which carries zinf's collectives over torch.distributed).
"""
import os
import shutil
import socket
import subprocess
import sys

try:
    import pytest
    import torch
    import transformers  # noqa: F401
    import deepspeed  # noqa: F401
    import accelerate  # noqa: F401
except ImportError as e:
    print("SKIP: %s" % e)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SCRATCH = os.path.join(os.environ.get("ZINF_TEST_DIR", "/tmp"), "python-launchers")
BIN = os.path.dirname(sys.executable)
SCRIPT = os.path.join(HERE, "launch_script.py")
if not shutil.which("mpirun"):
    print("SKIP: no mpirun")
    sys.exit(77)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
from zinf import _units  # noqa: E402

if _units.extension()[0] is None:
    print("SKIP: zinf's C++ core is not built (%s)" % _units.extension()[1])
    sys.exit(77)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ, DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               OMP_NUM_THREADS="1", ZINF_LOG_LEVEL="error", PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    for k in list(env):
        if k.startswith(("OMPI_", "PMI", "PMIX_", "SLURM_")) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                      "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                                                      "MASTER_PORT"):
            del env[k]
    for k in ("PYTHONPATH", "ZINF_LIBRARY", "ZINF_TORCH_EXTENSION"):  # the runs have a folder of their own
        if env.get(k) and os.path.exists(env[k].split(os.pathsep)[0]):
            env[k] = os.pathsep.join(os.path.abspath(p) for p in env[k].split(os.pathsep))
    return env


def _command(launcher, n):
    py = [sys.executable, "-u"]
    if launcher == "mpirun":
        return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n), *py]
    if launcher == "torchrun":
        return [os.path.join(BIN, "torchrun"), "--nproc_per_node", str(n), "--master_port", str(_port())]
    if launcher == "deepspeed":
        return [os.path.join(BIN, "deepspeed"), "--num_gpus", str(n), "--master_port", str(_port())]
    if launcher == "accelerate":
        return [os.path.join(BIN, "accelerate"), "launch", "--multi_gpu", "--num_processes", str(n),
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(_port())]
    raise ValueError(launcher)


def _launch(name, launcher, n, *args, expect_ok=True, timeout=600):
    """Runs launch_script.py under `launcher` with n processes; returns
    (every rank's output, the launcher's stdout + stderr)."""
    d = os.path.join(SCRATCH, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cmd = _command(launcher, n) + [SCRIPT, "--out", os.path.join(d, "out"), *args]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=d)
    log = r.stdout + r.stderr
    if not expect_ok:
        assert r.returncode != 0, log[-3000:]
        return None, log
    assert r.returncode == 0, "%s failed:\n%s" % (" ".join(cmd), log[-5000:])
    outs = [torch.load(os.path.join(d, "out", "rank-%d.pt" % k)) for k in range(n)]
    assert all(o["world"] == n for o in outs), [o["world"] for o in outs]
    return outs, log


def _same_weights(outs, ref):
    for o in outs:
        assert o["weights"].keys() == ref["weights"].keys()
        for k, w in ref["weights"].items():
            assert torch.equal(o["weights"][k], w), k


@pytest.fixture(scope="module")
def reference():
    """Stage 2 under mpirun, 2 ranks: what every other launcher must give."""
    outs, _ = _launch("mpirun-z2", "mpirun", 2, "--stage", "2")
    _same_weights(outs, outs[0])
    return outs[0]


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "accelerate"])
def test_every_launcher_trains_the_same_bits(reference, launcher):
    outs, _ = _launch(launcher + "-z2", launcher, 2, "--stage", "2")
    assert outs[0]["losses"] == reference["losses"], (outs[0]["losses"], reference["losses"])
    _same_weights(outs, reference)
    print("  %s, 2 ranks, stage 2: losses and weights equal mpirun's bit for bit" % launcher)


def test_deepspeed_under_torchrun_gives_the_same_losses(reference):
    outs, _ = _launch("deepspeed-engine-z2", "torchrun", 2, "--stage", "2", "--engine", "deepspeed")
    worst = max(abs(a - b) / abs(b) for a, b in zip(reference["losses"], outs[0]["losses"]))
    print("  zinf vs DeepSpeed, torchrun, 2 ranks, stage 2: worst relative loss difference %.2e" % worst)
    assert worst <= 1e-5, (reference["losses"], outs[0]["losses"])


@pytest.mark.parametrize("n,args", [(2, ("--stage", "3", "--nvme", "nvme")), (4, ("--stage", "1"))],
                         ids=["z3nvme-2", "z1-4"])
def test_torchrun_equals_mpirun(n, args):
    name = "%s-%d" % (args[1], n)
    ref, _ = _launch("mpirun-" + name, "mpirun", n, *args)
    outs, _ = _launch("torchrun-" + name, "torchrun", n, *args)
    assert outs[0]["losses"] == ref[0]["losses"], (outs[0]["losses"], ref[0]["losses"])
    _same_weights(outs + ref, ref[0])
    print("  torchrun vs mpirun, %d ranks, %s: equal bit for bit" % (n, " ".join(args)))


def test_a_killed_rank_stops_the_others_naming_it():
    _, log = _launch("killed", "torchrun", 2, "--stage", "3", "--nvme", "nvme", "--die-at", "2", "--die-rank", "1",
                     expect_ok=False, timeout=120)
    assert "rank      : 1" in log and "exitcode  : -9" in log, log[-4000:]


def test_a_failed_engine_is_named_on_its_peers():
    _, log = _launch("failed", "torchrun", 2, "--stage", "3", "--nvme", "nvme", "--fault", "eio:30",
                     "--die-rank", "1", expect_ok=False, timeout=120)
    assert "rank 1 stopped: IoError" in log and "[rank0]" in log, log[-4000:]


def test_a_silent_rank_is_named_within_the_timeout():
    _, log = _launch("silent", "torchrun", 2, "--stage", "2", "--hang-at", "2", "--die-rank", "1",
                     "--comm-timeout", "3", expect_ok=False, timeout=120)
    assert "no progress after 3.0 s; silent ranks: 1" in log, log[-4000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s", "-p", "no:cacheprovider", *sys.argv[1:]]))
