#!/usr/bin/env python3
"""One world under every launcher: launch_script.py (a DeepSpeed script for
several ranks, with its own torch.distributed calls between the engine's)
under mpirun, torchrun, the deepspeed launcher and accelerate launch gives
the same per-step losses and the same final weights on every rank; the real
DeepSpeed under torchrun gives the same losses (1e-5); ZeRO-3 with NVMe
tiers and 4 ranks too; tasks with srun's variables (SLURM_PROCID, ...) too.
A rank that dies, fails or stops answering stops the
others, and the message names it. HF's Trainer (hf_trainer_script.py) on two
ranks under torchrun, mpirun and accelerate launch trains as one rank with
twice the accumulation: the same logged losses, grad norms, eval loss and
saved weights; a checkpoint saved on two ranks resumes on two.

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
    if launcher.startswith("accelerate-deepspeed:"):  # accelerate's DeepSpeed plugin, with this config file
        config = launcher.split(":", 1)[1]
        return [os.path.join(BIN, "accelerate"), "launch", "--use_deepspeed", "--num_processes", str(n),
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(_port())] + (["--deepspeed_config_file", config] if config else [])
    raise ValueError(launcher)


def _slurm_env(n, argv, cwd, timeout):
    """n processes with the variables Slurm's srun gives each task
    (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE) and a
    rendezvous address, as a batch script exports it: srun's route without
    Slurm. Returns (the command, a CompletedProcess-like result: the worst
    exit status and every task's output)."""
    port = str(_port())
    procs = []
    for k in range(n):
        env = dict(_env(), SLURM_PROCID=str(k), SLURM_NTASKS=str(n), SLURM_LOCALID=str(k),
                   SLURM_NTASKS_PER_NODE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "-u", *argv], env=env, cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    return [sys.executable, *argv], subprocess.CompletedProcess(argv, max(abs(p.returncode) for p in procs),
                                                               "".join(outputs), "")


def _launch(name, launcher, n, *args, expect_ok=True, timeout=600):
    """Runs launch_script.py under `launcher` with n processes; returns
    (every rank's output, the launcher's stdout + stderr)."""
    d = os.path.join(SCRATCH, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if launcher == "slurm-env":
        cmd, r = _slurm_env(n, [SCRIPT, "--out", os.path.join(d, "out"), *args], d, timeout)
    else:
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


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "accelerate", "slurm-env"])
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


# ---- HF's Trainer on several ranks -----------------------------------------------------------------------

TRAINER = os.path.join(HERE, "hf_trainer_script.py")


def _trainer(name, launcher, n, zero, *args, fresh=True):
    """hf_trainer_script.py with `n` processes (n = 1: no launcher), 12
    steps, a checkpoint every 5, HF's micro-batch 2 with accumulation 2 / n
    (an effective batch of 4 on any world); returns (rank 0's JSON, its
    scratch folder)."""
    import json
    d = os.path.join(SCRATCH, name)
    if fresh:
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d, exist_ok=True)
    cmd = ([sys.executable, "-u"] if n == 1 else _command(launcher, n)) + [
        TRAINER, "--engine", "zinf", "--zero", zero, "--out", os.path.join(d, "out.json"), "--scratch", d,
        "--steps", "12", "--save-steps", "5", "--accumulation", str(2 // n), *args]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=d)
    assert r.returncode == 0, "%s failed:\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-5000:])
    with open(os.path.join(d, "out.json")) as f:
        return json.load(f), d


def _saved_weights(d):
    from safetensors.torch import load_file
    return load_file(os.path.join(d, "final", "model.safetensors"))


_ONE_RANK = {}


def _one_rank_trainer(zero):
    """The Trainer on one process with accumulation 2 (run once per stage):
    what two ranks with accumulation 1 must give."""
    if zero not in _ONE_RANK:
        out, d = _trainer("trainer-1-" + zero, None, 1, zero)
        _ONE_RANK[zero] = (out, _saved_weights(d))
    return _ONE_RANK[zero]


# Stage 3 with NVMe tiers under torchrun alone: every torch launcher takes the one route tested above.
@pytest.mark.parametrize("zero,launcher", [("z2cpu", "torchrun"), ("z2cpu", "mpirun"), ("z2cpu", "accelerate"),
                                           ("z3nvme", "torchrun")])
def test_trainer_on_two_ranks_equals_one_rank_with_twice_the_accumulation(zero, launcher):
    ref, ref_weights = _one_rank_trainer(zero)
    out, d = _trainer("trainer-2-%s-%s" % (launcher, zero), launcher, 2, zero)
    assert [r["step"] for r in out["logs"]] == list(range(1, 13)), out["logs"]
    assert [r["epoch"] for r in out["logs"]] == [r["epoch"] for r in ref["logs"]]  # HF shards the data per rank
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref["logs"], out["logs"]))
    norms = max(abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"] for a, b in zip(ref["logs"], out["logs"]))
    assert worst <= 1e-5 and norms <= 1e-5, (worst, norms)
    assert abs(out["eval_loss"] - ref["eval_loss"]) <= 1e-5 * ref["eval_loss"]
    weights = _saved_weights(d)
    assert weights.keys() == ref_weights.keys()
    diff = max((weights[k] - ref_weights[k]).abs().max().item() for k in weights)
    assert diff <= 1e-5, diff
    # Every checkpoint holds both ranks' state.
    assert os.path.isfile(os.path.join(d, "out", "checkpoint-10", "rng_state_1.pth"))
    print("  Trainer %s, %s, 2 ranks x accumulation 1 vs 1 rank x 2: losses within %.2g, grad norms within %.2g, "
          "eval loss %.6f vs %.6f, saved weights within %.2g" % (zero, launcher, worst, norms, out["eval_loss"],
                                                                 ref["eval_loss"], diff))
    if zero == "z3nvme":
        # Resume on two ranks from checkpoint-5: steps 6-12 again, bit for bit.
        rd = os.path.join(SCRATCH, "trainer-2-resume")
        shutil.rmtree(rd, ignore_errors=True)
        os.makedirs(rd)
        shutil.copytree(os.path.join(d, "out", "checkpoint-5"), os.path.join(rd, "out", "checkpoint-5"))
        again, _ = _trainer("trainer-2-resume", launcher, 2, zero, "--resume", fresh=False)
        full = {r["step"]: r for r in out["logs"]}
        assert [r["step"] for r in again["logs"]] == list(range(6, 13)), again["logs"]
        for r in again["logs"]:
            assert r["loss"] == full[r["step"]]["loss"], (r, full[r["step"]])
        assert again["eval_loss"] == out["eval_loss"]
        print("  resume on 2 ranks from checkpoint-5: steps 6-12 and the eval loss repeat bit for bit")


def test_trainer_under_accelerates_deepspeed_plugin():
    """`accelerate launch --use_deepspeed --deepspeed_config_file F` with
    arguments made without deepspeed=: zinf trains from F (accelerate alone
    would train without any DeepSpeed on the CPU, silently), as one rank
    with twice the accumulation; the plugin without a file is refused."""
    ref, ref_weights = _one_rank_trainer("z2cpu")
    d = os.path.join(SCRATCH, "trainer-accelerate-plugin")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    config = os.path.join(d, "ds_config.json")
    subprocess.run([sys.executable, TRAINER, "--engine", "zinf", "--zero", "z2cpu", "--out", "-", "--scratch", d,
                    "--dump-config", config], check=True, env=_env())
    out, d = _trainer("trainer-accelerate-plugin", "accelerate-deepspeed:" + config, 2, "z2cpu",
                      "--config-from-launcher", fresh=False)
    assert out["zinf"], "the Trainer did not train on zinf"
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref["logs"], out["logs"]))
    assert worst <= 1e-5, worst
    weights = _saved_weights(d)
    diff = max((weights[k] - ref_weights[k]).abs().max().item() for k in weights)
    assert diff <= 1e-5, diff
    print("  accelerate launch --use_deepspeed --deepspeed_config_file, 2 ranks: on zinf, losses within %.2g and "
          "saved weights within %.2g of 1 rank x accumulation 2" % (worst, diff))
    # The plugin without a config file: refused before training.
    cmd = _command("accelerate-deepspeed:", 2) + [TRAINER, "--engine", "zinf", "--zero", "z2cpu", "--out",
                                                   os.path.join(d, "refused.json"), "--scratch", d,
                                                   "--config-from-launcher", "--steps", "2"]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=d)
    log = r.stdout + r.stderr
    assert r.returncode != 0 and "gave no --deepspeed_config_file" in log, log[-3000:]
    assert not os.path.exists(os.path.join(d, "refused.json"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s", "--durations=8", "-p", "no:cacheprovider", *sys.argv[1:]]))
