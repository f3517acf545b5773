#!/usr/bin/env python3
"""A TRL fine-tuning script as its users write one, run on the real
DeepSpeed or on zinf: SFTTrainer (or DPOTrainer) on a tiny random Llama with
a word-level tokenizer made here, SFTConfig(deepspeed=...) as TRL's docs
write it, logging every step. Writes the per-step logs and which engine ran
as JSON.

  trl_script.py --engine deepspeed|zinf --trainer sft|dpo --stage 2|3 --out OUT.json --scratch DIR
                [--route enable|zinf-args] [--steps N] [--bf16]

--route (zinf only): `enable` calls zinf.transformers.enable() and keeps
TRL's own config class; `zinf-args` hands zinf.transformers.TrainingArguments
to the TRL trainer, which rebuilds its own config from them.
"""
import argparse
import json
import os
import sys

import torch


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({"t%d" % i: i for i in range(3, 128)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def words(g, n):
    return " ".join("t%d" % int(i) for i in torch.randint(3, 128, (n,), generator=g))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["deepspeed", "zinf"], required=True)
    ap.add_argument("--trainer", choices=["sft", "dpo"], default="sft")
    ap.add_argument("--stage", type=int, choices=[2, 3], default=2)
    ap.add_argument("--route", choices=["enable", "zinf-args"], default="enable")
    ap.add_argument("--out", required=True)
    ap.add_argument("--scratch", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--bf16", action="store_true", help="TRL's default precision (fp32 without it)")
    args = ap.parse_args()
    if args.engine == "zinf" and args.route == "enable":
        import zinf.transformers
        zinf.transformers.enable()  # the one line: TRL's own classes from here on
    import datasets
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback
    import trl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    # A vocabulary past the tokenizer's, so that the embeddings and the head
    # outweigh a block, as in real models (zinf then makes them units of their own).
    model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         tie_word_embeddings=False, attn_implementation="eager",
                                         pad_token_id=0, eos_token_id=1, bos_token_id=1))
    g = torch.Generator().manual_seed(1)
    if args.trainer == "sft":
        data = datasets.Dataset.from_dict({"text": [words(g, 12) for _ in range(64)]})
        config_class, trainer_class = trl.SFTConfig, trl.SFTTrainer
        extra = {"max_length": 32}
    else:
        prompts = [words(g, 6) for _ in range(64)]
        data = datasets.Dataset.from_dict({"prompt": prompts, "chosen": [words(g, 5) for _ in prompts],
                                           "rejected": [words(g, 5) for _ in prompts]})
        config_class, trainer_class = trl.DPOConfig, trl.DPOTrainer
        extra = {"max_length": 32, "beta": 0.1}
    zero = {"stage": args.stage, "offload_optimizer": {"device": "cpu"}}
    if args.stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_prefetch_bucket_size="auto")
    ds_config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "zero_optimization": zero,
                 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                          "weight_decay": "auto"}}}
    common = dict(output_dir=os.path.join(args.scratch, "out"), deepspeed=ds_config, per_device_train_batch_size=2,
                  gradient_accumulation_steps=2, learning_rate=3e-3, max_grad_norm=1.0, max_steps=args.steps,
                  logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
                  seed=0, data_seed=0, bf16=args.bf16)
    if args.engine == "zinf" and args.route == "zinf-args":
        from zinf.transformers import TrainingArguments
        targs = TrainingArguments(**common)
    else:
        targs = config_class(**common, **extra)
    rows = []

    class Keep(TrainerCallback):
        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                rows.append({k: float(v) for k, v in logs.items() if isinstance(v, (int, float))})

    if args.trainer == "dpo":
        import copy
        extra_trainer = {"ref_model": copy.deepcopy(model)}  # the starting weights, frozen
    else:
        extra_trainer = {}
    trainer = trainer_class(model=model, args=targs, train_dataset=data, processing_class=tokenizer(),
                            callbacks=[Keep()], **extra_trainer)
    trainer.train()
    engine = "zinf" if getattr(trainer, "zinf_engine", None) is not None else (
        "deepspeed" if getattr(trainer, "is_deepspeed_enabled", False) else "torch")
    with open(args.out, "w") as f:
        json.dump({"logs": rows, "engine": engine}, f)
    print("%s %s stage %d on %s: %d steps, last loss %.6f" % (args.engine, args.trainer, args.stage, engine, len(rows),
                                                              rows[-1]["loss"] if rows else float("nan")))


if __name__ == "__main__":
    sys.exit(main())
