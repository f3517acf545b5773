#!/usr/bin/env python3
"""A DeepSpeed training script for several ranks, as a user writes one for
torchrun, the deepspeed launcher, accelerate launch or mpirun: the world
from deepspeed.init_distributed(), each rank on its own batches, the
script's own torch.distributed calls (a barrier, an all_reduce of the loss
for the log) between the engine's, gradient accumulation and clipping.
Writes, per rank, every step's loss averaged over the ranks and the final
weights (as whole tensors) to OUT/rank-R.pt.

  launch_script.py --engine zinf|deepspeed --stage 1|2|3 [--nvme DIR] --out OUT [--steps N]
      [--die-at STEP --die-rank R]  (that rank kills itself with SIGKILL at that step)
      [--fault SPEC --die-rank R]     (ZINF_FAULT=SPEC on that rank only: its engine fails)
      [--hang-at STEP --die-rank R --comm-timeout S]  (that rank stops answering at that step)
"""
import argparse
import os
import signal
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["deepspeed", "zinf"], default="zinf")
    ap.add_argument("--stage", type=int, choices=[1, 2, 3], required=True)
    ap.add_argument("--nvme", default=None, help="ZeRO-3 with parameters and optimizer state on NVMe here")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--die-at", type=int, default=-1)
    ap.add_argument("--die-rank", type=int, default=1)
    ap.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    ap.add_argument("--fault", default=None)
    ap.add_argument("--hang-at", type=int, default=-1)
    ap.add_argument("--comm-timeout", type=float, default=None)
    args = ap.parse_args()
    rank_env = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    if args.fault and int(rank_env) == args.die_rank:
        os.environ["ZINF_FAULT"] = args.fault  # before libzinf is loaded
    if args.engine == "deepspeed":
        import deepspeed
    else:
        import zinf.deepspeed as deepspeed
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    deepspeed.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=False, attn_implementation="eager"))
    zero = {"stage": args.stage, "offload_optimizer": {"device": "cpu"}}
    if args.nvme:
        os.makedirs(args.nvme, exist_ok=True)
        zero = {"stage": 3, "stage3_param_persistence_threshold": 0,
                "offload_param": {"device": "nvme", "nvme_path": args.nvme},
                "offload_optimizer": {"device": "nvme", "nvme_path": args.nvme}}
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-6,
                                                        "weight_decay": 0.01}},
              "zero_optimization": zero, "steps_per_print": 1000000}
    if args.engine == "zinf":
        config["zinf"] = {"optimizer_threads": 1}
        if args.comm_timeout:
            config["zinf"]["comm_timeout_s"] = args.comm_timeout
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    assert engine.train_batch_size() == 2 * 2 * world, engine.train_batch_size()
    g = torch.Generator().manual_seed(100 + rank)  # this rank's batches
    losses = []
    dist.barrier()
    start = time.perf_counter()
    for step in range(args.steps):
        if step == args.die_at and rank == args.die_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.hang_at and rank == args.die_rank:
            time.sleep(3600)
        total = torch.zeros(())
        for _ in range(2):
            x = torch.randint(0, 128, (2, 16), generator=g)
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        dist.all_reduce(total)  # the log's loss: every rank's
        losses.append(float(total) / (2 * world))
    seconds = time.perf_counter() - start
    weights = {n: t.detach().clone() for n, t in engine.module.state_dict().items()}  # whole, at every stage
    os.makedirs(args.out, exist_ok=True)
    torch.save({"losses": losses, "weights": weights, "world": world, "seconds": seconds},
               os.path.join(args.out, "rank-%d.pt" % rank))
    if rank == 0:
        print("%s stage %d on %d ranks: %.3f s a step; losses %s" % (
            args.engine, args.stage, world, seconds / args.steps, " ".join("%.6f" % v for v in losses)))


if __name__ == "__main__":
    sys.exit(main())
