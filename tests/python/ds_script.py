#!/usr/bin/env python3
"""A DeepSpeed training script as a user writes one, run with the real
deepspeed package or with zinf.deepspeed (the one line that differs is the
import): a tiny transformers Llama, HF Trainer-style parameter groups (no
weight decay on biases and norm weights), a torch LambdaLR given to
initialize as a callable, gradient accumulation and clipping, and a
checkpoint with a tag and client state saved mid-run and loaded back at
the end. Writes every micro-step's loss and every step's lr as JSON.

  ds_script.py --engine deepspeed|zinf --zero z2cpu|z3nvme --out OUT.json --scratch DIR [--steps N]
"""
import argparse
import json
import os
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["deepspeed", "zinf"], required=True)
    ap.add_argument("--zero", choices=["z2cpu", "z3nvme"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sched", choices=["lambda", "cosine"], default="lambda",
                    help="a torch LambdaLR given as a callable, or the config's WarmupCosineLR")
    args = ap.parse_args()
    if args.engine == "deepspeed":
        import deepspeed
    else:
        import zinf.deepspeed as deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=False, attn_implementation="eager"))
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "norm" in n)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    nvme = os.path.join(args.scratch, "nvme")
    os.makedirs(nvme, exist_ok=True)
    if args.zero == "z2cpu":
        zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    else:
        zero = {"stage": 3, "stage3_param_persistence_threshold": 0,
                "offload_param": {"device": "nvme", "nvme_path": nvme},
                "offload_optimizer": {"device": "nvme", "nvme_path": nvme}}
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-6}},
              "zero_optimization": zero, "steps_per_print": 1000000}
    if args.engine == "zinf":
        config["zinf"] = {"optimizer_threads": 1}
    client_scheduler = None
    if args.sched == "lambda":
        client_scheduler = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))  # noqa: E731
    else:  # past its total, to see where it ends
        config["scheduler"] = {"type": "WarmupCosineLR", "params": {"warmup_min_ratio": 0.1, "warmup_num_steps": 2,
                                                                    "warmup_type": "linear", "total_num_steps": 5,
                                                                    "cos_min_ratio": 0.05}}
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=groups, config=config,
                                                           lr_scheduler=client_scheduler)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 128, (2, 16), generator=g) for _ in range(2 * args.steps)]
    losses, lrs = [], []
    ckpt = os.path.join(args.scratch, "ckpt")
    for step in range(args.steps):
        lrs.append([float(x) for x in engine.get_lr()])
        for k in range(2):
            x = batches[2 * step + k]
            boundary = engine.is_gradient_accumulation_boundary()
            assert boundary == (k == 1), (step, k, boundary)
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        if step == args.steps // 2 - 1:
            engine.save_checkpoint(ckpt, tag="mid", client_state={"step": step + 1})
    assert engine.global_steps == args.steps, engine.global_steps
    # Back to the middle: the same losses again from there.
    path, client = engine.load_checkpoint(ckpt)
    assert client["step"] == args.steps // 2, client
    assert "/mid" in path, path
    again = []
    for step in range(args.steps // 2, args.steps):
        for k in range(2):
            x = batches[2 * step + k]
            loss = engine(input_ids=x, labels=x).loss
            engine.backward(loss)
            engine.step()
            again.append(loss.item())
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "lrs": lrs, "resumed": again}, f)
    print("%s %s: %d losses, last %.6f" % (args.engine, args.zero, len(losses), losses[-1]))


if __name__ == "__main__":
    sys.exit(main())
