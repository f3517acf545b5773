#!/usr/bin/env python3
"""The reference side of decoder_torch_test.cc: transformers' own models
(GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, eager attention) in float64, run on zinf's parameters, with
the loss and every gradient written back in zinf's layout.

zinf's unit tensors are mapped to the model's parameter names as views
(slices and transposes: q/k/v are column blocks of zinf's qkv_w [C, S], an
nn.Linear weight is [out, in] where zinf's is [in, out], GPT-2's Conv1D is
[in, out] like zinf's) and the model runs on them through
torch.func.functional_call, so autograd carries the gradients back to zinf's
layout and the test checks zinf's kernels and its unit layout at once. Every
parameter of the model must get exactly one of zinf's tensors. Nothing of the
forward is written here: the embedding, norms, RoPE (with Llama 3 scaling),
attention, MLP and head are the library's. The loss is the mean
cross-entropy over the targets that are >= 0, computed here in float64
(transformers' ForCausalLMLoss shifts the labels and casts the logits to
float32).

  torch_decoder.py DIR
    DIR/case.json   the config (and "model_type", "sliding_window") and the run's shape
    DIR/params.bin  every unit's fp32 parameters in zinf's layout, in unit order
    DIR/tokens.bin, DIR/targets.bin  int32 [B*T] (a target < 0 is ignored)
  writes DIR/loss.txt and DIR/grads.bin (float64, zinf's layout, unit order).
  When DIR/hf holds a Hugging Face folder (zinf's export of the same
  parameters in fp32), it is loaded with AutoModelForCausalLM.from_pretrained
  (nothing missing, unexpected or mismatched), each of its tensors must equal
  the oracle's mapping of zinf's tensor bit for bit, and its logits in fp32
  must be the oracle's float64 logits within 1e-5 relative (max|a - b| /
  max|b|).
"""
import json
import math
import os
import sys

import numpy as np
import torch

LOGITS_TOLERANCE = 1e-5


def unit_tensors(c):
    """zinf's unit layout (src/model/gpt_config.h): per unit, (name, shape)."""
    C, V, T = c["embed_dim"], c["vocab_size"], c["max_seq_len"]
    H, KV, D, I = c["num_heads"], c["kv_heads"], c["head_dim"], c["mlp_dim"]
    S = (H + 2 * KV) * D
    ln = c["norm"] == "layernorm"
    fc = 2 * I if c["mlp"] == "swiglu" else I
    units = [[("wte", (V, C))] + ([("wpe", (T, C))] if c["positions"] == "learned" else [])]
    for _ in range(c["num_layers"]):
        u = [("ln1_w", (C,))] + ([("ln1_b", (C,))] if ln else [])
        u += [("qkv_w", (C, S))] + ([("qkv_b", (S,))] if c["qkv_bias"] else [])
        u += [("q_norm_w", (D,)), ("k_norm_w", (D,))] if c["qk_norm"] else []
        u += [("attn_proj_w", (H * D, C))] + ([("attn_proj_b", (C,))] if c["linear_bias"] else [])
        u += [("ln2_w", (C,))] + ([("ln2_b", (C,))] if ln else [])
        u += [("fc_w", (C, fc))] + ([("fc_b", (fc,))] if c["linear_bias"] else [])
        u += [("fc_proj_w", (I, C))] + ([("fc_proj_b", (C,))] if c["linear_bias"] else [])
        units.append(u)
    units.append([("lnf_w", (C,))] + ([("lnf_b", (C,))] if ln else []) +
                 ([] if c["tied_head"] else [("lm_head_w", (V, C))]))
    return units


def load_units(c, flat):
    units, at = [], 0
    for u in unit_tensors(c):
        d = {}
        for name, shape in u:
            n = math.prod(shape)
            d[name] = flat[at:at + n].reshape(shape).clone().requires_grad_(True)
            at += n
        units.append(d)
    assert at == flat.numel(), (at, flat.numel())
    return units


def is_gpt2(c):
    return c["positions"] == "learned"


def to_hf(c, units):
    """The Llama family's parameter names and shapes (src/data/hf_checkpoint.h),
    as views of zinf's tensors. lm_head.weight is the embedding when tied."""
    assert c["norm"] == "rmsnorm" and c["mlp"] == "swiglu" and not c["linear_bias"], c
    H, KV, D, I = c["num_heads"], c["kv_heads"], c["head_dim"], c["mlp_dim"]
    Q, K = H * D, KV * D
    w = {"model.embed_tokens.weight": units[0]["wte"]}
    for i, u in enumerate(units[1:-1]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = u["ln1_w"]
        w[p + "post_attention_layernorm.weight"] = u["ln2_w"]
        qkv = u["qkv_w"]
        w[p + "self_attn.q_proj.weight"] = qkv[:, :Q].t()
        w[p + "self_attn.k_proj.weight"] = qkv[:, Q:Q + K].t()
        w[p + "self_attn.v_proj.weight"] = qkv[:, Q + K:].t()
        if "qkv_b" in u:
            b = u["qkv_b"]
            w[p + "self_attn.q_proj.bias"], w[p + "self_attn.k_proj.bias"] = b[:Q], b[Q:Q + K]
            w[p + "self_attn.v_proj.bias"] = b[Q + K:]
        if "q_norm_w" in u:
            w[p + "self_attn.q_norm.weight"] = u["q_norm_w"]
            w[p + "self_attn.k_norm.weight"] = u["k_norm_w"]
        w[p + "self_attn.o_proj.weight"] = u["attn_proj_w"].t()
        w[p + "mlp.gate_proj.weight"] = u["fc_w"][:, :I].t()
        w[p + "mlp.up_proj.weight"] = u["fc_w"][:, I:].t()
        w[p + "mlp.down_proj.weight"] = u["fc_proj_w"].t()
    w["model.norm.weight"] = units[-1]["lnf_w"]
    w["lm_head.weight"] = units[-1]["lm_head_w"] if "lm_head_w" in units[-1] else units[0]["wte"]
    return w


def gpt2_to_hf(c, units):
    """GPT2LMHeadModel's names: its Conv1D weights are [in, out], zinf's
    layout, so only the names change; the head is tied to wte."""
    assert c["norm"] == "layernorm" and c["linear_bias"] and c["qkv_bias"] and c["tied_head"], c
    w = {"transformer.wte.weight": units[0]["wte"], "transformer.wpe.weight": units[0]["wpe"]}
    for i, u in enumerate(units[1:-1]):
        p = f"transformer.h.{i}."
        for zinf_name, hf in (("ln1_w", "ln_1.weight"), ("ln1_b", "ln_1.bias"), ("qkv_w", "attn.c_attn.weight"),
                              ("qkv_b", "attn.c_attn.bias"), ("attn_proj_w", "attn.c_proj.weight"),
                              ("attn_proj_b", "attn.c_proj.bias"), ("ln2_w", "ln_2.weight"), ("ln2_b", "ln_2.bias"),
                              ("fc_w", "mlp.c_fc.weight"), ("fc_b", "mlp.c_fc.bias"),
                              ("fc_proj_w", "mlp.c_proj.weight"), ("fc_proj_b", "mlp.c_proj.bias")):
            w[p + hf] = u[zinf_name]
    w["transformer.ln_f.weight"] = units[-1]["lnf_w"]
    w["transformer.ln_f.bias"] = units[-1]["lnf_b"]
    w["lm_head.weight"] = units[0]["wte"]
    return w


def model_type(c):
    if is_gpt2(c):
        return "gpt2"
    return c.get("model_type") or ("qwen3" if c["qk_norm"] else "qwen2" if c["qkv_bias"] else "llama")


def hf_config(c):
    """The transformers config of zinf's config (case.json's "config")."""
    import transformers
    kind = model_type(c)
    if kind == "gpt2":
        assert c["mlp"] == "gelu" and c["mlp_dim"] == 4 * c["embed_dim"], c
        return transformers.GPT2Config(vocab_size=c["vocab_size"], n_positions=c["max_seq_len"],
                                       n_embd=c["embed_dim"], n_layer=c["num_layers"], n_head=c["num_heads"],
                                       activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0,
                                       embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                                       bos_token_id=None, eos_token_id=None)
    rope = {"rope_type": "default", "rope_theta": c["rope_theta"]}
    s = c.get("rope_scaling")
    if s:
        rope = {"rope_type": "llama3", "rope_theta": c["rope_theta"], "factor": s["factor"],
                "low_freq_factor": s["low_freq_factor"], "high_freq_factor": s["high_freq_factor"],
                "original_max_position_embeddings": s["original_max_position"]}
    common = dict(vocab_size=c["vocab_size"], hidden_size=c["embed_dim"], intermediate_size=c["mlp_dim"],
                  num_hidden_layers=c["num_layers"], num_attention_heads=c["num_heads"],
                  num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"], max_position_embeddings=c["max_seq_len"],
                  rms_norm_eps=c["norm_eps"], rope_parameters=rope, tie_word_embeddings=c["tied_head"],
                  hidden_act="silu", attention_dropout=0.0)
    if kind == "llama":
        if c["embed_dim"] % c["num_heads"]:
            # transformers 5's LlamaConfig refuses a hidden size that is not a
            # multiple of the head count, though LlamaForCausalLM sizes every
            # projection by head_dim: built with H * D, then set.
            config = transformers.LlamaConfig(attention_bias=False, mlp_bias=False,
                                              **{**common, "hidden_size": c["num_heads"] * c["head_dim"]})
            config.hidden_size = c["embed_dim"]
            return config
        return transformers.LlamaConfig(attention_bias=False, mlp_bias=False, **common)
    if kind == "mistral":
        assert not c["qkv_bias"] and not c["qk_norm"], c
        return transformers.MistralConfig(sliding_window=c.get("sliding_window"), **common)
    if kind == "qwen2":
        assert c["qkv_bias"] and not c["qk_norm"], c
        return transformers.Qwen2Config(use_sliding_window=False, **common)
    assert kind == "qwen3" and c["qk_norm"] and not c["qkv_bias"], c
    return transformers.Qwen3Config(attention_bias=False, use_sliding_window=False, **common)


def build_model(c, dtype=torch.float64):
    """transformers' model of the config, with eager attention, in `dtype`;
    its own (random) parameters are replaced at each call by zinf's."""
    import transformers
    config = hf_config(c)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    return model.eval()


def parameters_by_name(c, model, units):
    """zinf's tensors under the model's parameter names, one for each; any
    name missing or left over is the mapping's bug."""
    w = gpt2_to_hf(c, units) if is_gpt2(c) else to_hf(c, units)
    names = [name for name, _ in model.named_parameters()]  # a tied head appears once, as the embedding
    if c["tied_head"]:
        w = {k: v for k, v in w.items() if k != "lm_head.weight"}
    assert sorted(names) == sorted(w), ("names only the model has", sorted(set(names) - set(w)),
                                       "names only the mapping has", sorted(set(w) - set(names)))
    for name, p in model.named_parameters():
        assert tuple(p.shape) == tuple(w[name].shape), (name, tuple(p.shape), tuple(w[name].shape))
    return w


def logits(model, w, tokens, B, T):
    return torch.func.functional_call(model, w, args=(), kwargs={"input_ids": tokens.long().reshape(B, T),
                                                                 "use_cache": False}).logits


def loss_of(logits_bt, targets):
    return torch.nn.functional.cross_entropy(logits_bt.reshape(targets.numel(), -1), targets.long(), ignore_index=-1)


def read_safetensors(path):
    from safetensors.torch import load_file
    return load_file(path)


def check_hf_folder(c, model, w, tokens, B, T, d):
    """zinf's export: loads with from_pretrained, holds the oracle's tensors
    bit for bit, and gives the oracle's logits."""
    import transformers
    kwargs = {"dtype": torch.float32, "attn_implementation": "eager", "output_loading_info": True}
    try:
        loaded, info = transformers.AutoModelForCausalLM.from_pretrained(d, **kwargs)
    except Exception as e:  # noqa: BLE001
        if "is not a multiple of the number of attention heads" not in str(e):
            raise
        # The refusal hf_config works around: said, then the weights are
        # loaded into the oracle's config.
        print(f"hf folder: from_pretrained refuses its config.json: {str(e).strip().splitlines()[-1].strip()}")
        config = hf_config(c)
        config.architectures = json.load(open(f"{d}/config.json")).get("architectures")
        loaded, info = transformers.AutoModelForCausalLM.from_pretrained(d, config=config, **kwargs)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, f"{d}: from_pretrained reports {problems}"
    if os.path.exists(f"{d}/model.safetensors.index.json"):
        files = sorted(set(json.load(open(f"{d}/model.safetensors.index.json"))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    stored = {}
    for f in files:
        stored.update(read_safetensors(f"{d}/{f}"))
    expected = {k: v for k, v in w.items() if not (k == "lm_head.weight" and c["tied_head"])}
    assert sorted(stored) == sorted(expected), sorted(set(stored) ^ set(expected))
    for name, t in stored.items():
        assert t.dtype == torch.float32, (name, t.dtype)
        assert torch.equal(t.double(), expected[name].detach()), name
    with torch.no_grad():
        got = loaded(input_ids=tokens.long().reshape(B, T), use_cache=False).logits.double()
        want = logits(model, {k: v.detach() for k, v in w.items()}, tokens, B, T)
    rel = ((got - want).abs().max() / want.abs().max()).item()
    print(f"hf folder: {len(files)} safetensors file(s) match by name; from_pretrained gives a "
          f"{type(loaded).__name__}, fp32 logits within {rel:.2e} of the oracle's float64 logits")
    assert rel <= LOGITS_TOLERANCE, f"{d}: logits of the loaded export differ by {rel:.3e} relative"


def main():
    d = sys.argv[1]
    case = json.load(open(f"{d}/case.json"))
    c, B, T = case["config"], case["batch"], case["seq_len"]
    torch.set_num_threads(1)
    flat = torch.from_numpy(np.fromfile(f"{d}/params.bin", dtype="float32")).double()
    units = load_units(c, flat)
    tokens = torch.from_numpy(np.fromfile(f"{d}/tokens.bin", dtype="int32"))
    targets = torch.from_numpy(np.fromfile(f"{d}/targets.bin", dtype="int32"))
    import transformers
    transformers.utils.logging.disable_progress_bar()
    model = build_model(c)
    w = parameters_by_name(c, model, units)
    print(f"oracle: transformers {type(model).__name__}, float64, eager attention")
    loss = loss_of(logits(model, w, tokens, B, T), targets)
    loss.backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for u in units for t in u.values()]
    torch.cat([g.reshape(-1) for g in grads]).numpy().astype("float64").tofile(f"{d}/grads.bin")
    with open(f"{d}/loss.txt", "w") as f:
        f.write(repr(loss.item()) + "\n")
    if os.path.isdir(f"{d}/hf"):
        check_hf_folder(c, model, w, tokens, B, T, d + "/hf")


if __name__ == "__main__":
    main()
