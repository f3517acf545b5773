#!/usr/bin/env python3
"""An HF Trainer fine-tuning script that uses DeepSpeed, run with
transformers' own Trainer (the real DeepSpeed) or with zinf.transformers'
(the one line that differs is the import): a tiny random Llama, an
HF-style DeepSpeed config full of "auto" values, gradient accumulation,
evaluation, logging every step, a checkpoint every few steps, and
save_model at the end. Writes the per-step logs (loss, lr, grad_norm) and
the final eval loss as JSON (rank 0's, under a launcher).

  hf_trainer_script.py --engine deepspeed|zinf --zero z2cpu|z3nvme --out OUT.json --scratch DIR
                       [--steps N] [--save-steps N] [--accumulation N] [--resume] [--lora]
                       [--dump-config FILE] [--config-from-launcher]
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
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--resume", action="store_true", help="resume from the last checkpoint in scratch/out")
    ap.add_argument("--lora", action="store_true", help="a peft LoRA model (zinf only)")
    ap.add_argument("--save-steps", type=int, default=10, help="a checkpoint every N steps (0: none)")
    ap.add_argument("--accumulation", type=int, default=2, help="gradient_accumulation_steps")
    ap.add_argument("--dump-config", help="write the DeepSpeed config to this file and exit")
    ap.add_argument("--config-from-launcher", action="store_true",
                    help="no deepspeed= argument: the config comes from accelerate launch --deepspeed_config_file")
    args = ap.parse_args()
    if args.engine == "deepspeed":
        from transformers import Trainer, TrainingArguments
    else:
        from zinf.transformers import Trainer, TrainingArguments
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=False, attn_implementation="eager"))
    if args.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 128, (16,), generator=g) for _ in range(96)]
    train = [{"input_ids": r, "labels": r} for r in rows[:80]]
    evaluation = [{"input_ids": r, "labels": r} for r in rows[80:]]
    nvme = os.path.join(args.scratch, "nvme")
    os.makedirs(nvme, exist_ok=True)
    if args.zero == "z2cpu":
        zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}, "reduce_bucket_size": "auto"}
    else:
        zero = {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": nvme},
                "offload_optimizer": {"device": "nvme", "nvme_path": nvme}, "reduce_bucket_size": "auto",
                "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}
    ds_config = {
        "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    }
    if args.dump_config:
        with open(args.dump_config, "w") as f:
            json.dump(ds_config, f)
        return 0
    out_dir = os.path.join(args.scratch, "out")
    targs = TrainingArguments(output_dir=out_dir, deepspeed=None if args.config_from_launcher else ds_config, per_device_train_batch_size=2,
                              per_device_eval_batch_size=4, gradient_accumulation_steps=args.accumulation, learning_rate=3e-3,
                              adam_epsilon=1e-6, weight_decay=0.1, max_grad_norm=1.0, warmup_steps=4,
                              max_steps=args.steps, logging_steps=1, save_steps=max(args.save_steps, 1),
                              save_strategy="steps" if args.save_steps else "no",
                              eval_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                              seed=0, data_seed=0)
    logs = []

    class Keep(TrainerCallback):
        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                logs_copy = {k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}
                logs_copy["step"] = state.global_step
                logs.update({})
                Keep.rows.append(logs_copy)
    Keep.rows = logs
    trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=evaluation, callbacks=[Keep()])
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    metrics = trainer.evaluate()
    trainer.save_model(os.path.join(args.scratch, "final"))
    if not trainer.is_world_process_zero():
        return 0
    with open(args.out, "w") as f:
        json.dump({"logs": logs, "eval_loss": metrics["eval_loss"],
                   "zinf": getattr(trainer, "zinf_engine", None) is not None}, f)
    print("%s %s: %d steps logged, eval loss %.6f" % (args.engine, args.zero, len(logs), metrics["eval_loss"]))


if __name__ == "__main__":
    sys.exit(main())
