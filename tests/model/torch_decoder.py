#!/usr/bin/env python3
"""An independent PyTorch oracle for zinf's decoder family (GPT-2 and the
Llama family): reads a case written by decoder_torch_test.cc, runs the model
in float64 through autograd, and writes the loss and every gradient back.

The model is written here from the Hugging Face architectures (Llama, Qwen2,
Qwen3, Mistral): weights are first renamed into Hugging Face's tensor names
and shapes (nn.Linear weights [out, in]), then the forward uses only those, so
the test checks zinf's kernels and its unit layout at once. forward() runs in
the weights' dtype; tests/tools/torch_train.py imports this module to replay
whole training runs in float32.

  torch_decoder.py DIR
    DIR/case.json   the config and the run's shape
    DIR/params.bin  every unit's fp32 parameters in zinf's layout, in unit order
    DIR/tokens.bin, DIR/targets.bin  int32 [B*T] (a target < 0 is ignored)
  writes DIR/loss.txt and DIR/grads.bin (float64, zinf's layout, unit order).
  When DIR/hf holds a Hugging Face folder (zinf's export of the same
  parameters in fp32), every tensor it has is read by its Hugging Face name
  and must equal the oracle's own renaming bit for bit, and config.json must
  describe the same architecture.
"""
import json
import math
import sys

import torch


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


def to_hf(c, units):
    """Hugging Face names and shapes, as views of zinf's tensors (so autograd
    carries the gradients back to zinf's layout)."""
    H, KV, D, I = c["num_heads"], c["kv_heads"], c["head_dim"], c["mlp_dim"]
    Q, K = H * D, KV * D
    w = {"model.embed_tokens.weight": units[0]["wte"]}
    if "wpe" in units[0]:
        w["wpe"] = units[0]["wpe"]
    for i, u in enumerate(units[1:-1]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = u["ln1_w"]
        w[p + "post_attention_layernorm.weight"] = u["ln2_w"]
        for name in ("ln1_b", "ln2_b"):
            if name in u:
                w[p + ("input_layernorm.bias" if name == "ln1_b" else "post_attention_layernorm.bias")] = u[name]
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
        if "attn_proj_b" in u:
            w[p + "self_attn.o_proj.bias"] = u["attn_proj_b"]
        if c["mlp"] == "swiglu":
            w[p + "mlp.gate_proj.weight"] = u["fc_w"][:, :I].t()
            w[p + "mlp.up_proj.weight"] = u["fc_w"][:, I:].t()
        else:
            w[p + "mlp.fc.weight"] = u["fc_w"].t()
        w[p + "mlp.down_proj.weight"] = u["fc_proj_w"].t()
        for name, hf in (("fc_b", "mlp.fc.bias"), ("fc_proj_b", "mlp.down_proj.bias")):
            if name in u:
                w[p + hf] = u[name]
    w["model.norm.weight"] = units[-1]["lnf_w"]
    if "lnf_b" in units[-1]:
        w["model.norm.bias"] = units[-1]["lnf_b"]
    w["lm_head.weight"] = units[-1]["lm_head_w"] if "lm_head_w" in units[-1] else units[0]["wte"]
    return w


def norm(c, x, weight, bias):
    if c["norm"] == "layernorm":
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps=1e-5)
    return rms_norm(x, weight, c["norm_eps"])


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def inverse_frequencies(c):
    """As transformers' rope utilities compute them (default and "llama3")."""
    D, theta = c["head_dim"], c["rope_theta"]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    s = c.get("rope_scaling")
    if s:
        factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(c, w, tokens, targets, B, T):
    C, H, KV, D = c["embed_dim"], c["num_heads"], c["kv_heads"], c["head_dim"]
    x = w["model.embed_tokens.weight"][tokens.long()].reshape(B, T, C)
    if "wpe" in w:
        x = x + w["wpe"][:T]
    if c["positions"] == "rope":
        angles = torch.arange(T, dtype=torch.float32)[:, None] * inverse_frequencies(c)[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(c["num_layers"]):
        p = f"model.layers.{i}."
        g = lambda name: w.get(p + name)
        h = norm(c, x, g("input_layernorm.weight"), g("input_layernorm.bias"))
        lin = lambda t, name: torch.nn.functional.linear(t, g(name + ".weight"), g(name + ".bias"))
        q = lin(h, "self_attn.q_proj").view(B, T, H, D)
        k = lin(h, "self_attn.k_proj").view(B, T, KV, D)
        v = lin(h, "self_attn.v_proj").view(B, T, KV, D)
        if c["qk_norm"]:
            q = rms_norm(q, g("self_attn.q_norm.weight"), c["norm_eps"])
            k = rms_norm(k, g("self_attn.k_norm.weight"), c["norm_eps"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, D]
        if c["positions"] == "rope":
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        scores = scores.masked_fill(~mask, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + lin(y, "self_attn.o_proj")
        h = norm(c, x, g("post_attention_layernorm.weight"), g("post_attention_layernorm.bias"))
        if c["mlp"] == "swiglu":
            a = torch.nn.functional.silu(lin(h, "mlp.gate_proj")) * lin(h, "mlp.up_proj")
        else:
            a = torch.nn.functional.gelu(lin(h, "mlp.fc"), approximate="tanh")
        x = x + lin(a, "mlp.down_proj")
    x = norm(c, x, w["model.norm.weight"], w.get("model.norm.bias"))
    logits = x @ w["lm_head.weight"].t()
    return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.long(), ignore_index=-1)


def read_safetensors(path):
    """name -> float64 tensor, read with numpy (no safetensors package)."""
    import numpy as np
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    dtypes = {"F32": np.float32, "F64": np.float64, "F16": np.float16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        data = np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=dtypes[t["dtype"]])
        out[name] = torch.from_numpy(data.astype(np.float64).reshape(t["shape"]))
    return out


def check_hf_folder(c, w, d):
    import os
    cfg = json.load(open(f"{d}/config.json"))
    expect = {"hidden_size": c["embed_dim"], "num_hidden_layers": c["num_layers"], "vocab_size": c["vocab_size"],
              "num_attention_heads": c["num_heads"], "num_key_value_heads": c["kv_heads"], "head_dim": c["head_dim"],
              "intermediate_size": c["mlp_dim"], "tie_word_embeddings": c["tied_head"], "rope_theta": c["rope_theta"],
              "rms_norm_eps": c["norm_eps"], "model_type": "qwen3" if c["qk_norm"] else "qwen2" if c["qkv_bias"] else "llama"}
    for key, value in expect.items():
        assert cfg[key] == value, (key, cfg[key], value)
    if os.path.exists(f"{d}/model.safetensors.index.json"):
        files = sorted(set(json.load(open(f"{d}/model.safetensors.index.json"))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    hf = {}
    for f in files:
        hf.update(read_safetensors(f"{d}/{f}"))
    expected = {k: v for k, v in w.items() if not (k == "lm_head.weight" and c["tied_head"]) and k != "wpe"}
    assert sorted(hf) == sorted(expected), (sorted(set(hf) ^ set(expected)))
    for name, t in hf.items():
        assert t.shape == expected[name].shape, (name, t.shape, expected[name].shape)
        assert torch.equal(t, expected[name].detach()), name
    return len(files)


def main():
    d = sys.argv[1]
    case = json.load(open(f"{d}/case.json"))
    c, B, T = case["config"], case["batch"], case["seq_len"]
    flat = torch.from_numpy(__import__("numpy").fromfile(f"{d}/params.bin", dtype="float32")).double()
    units = load_units(c, flat)
    np = __import__("numpy")
    tokens = torch.from_numpy(np.fromfile(f"{d}/tokens.bin", dtype="int32"))
    targets = torch.from_numpy(np.fromfile(f"{d}/targets.bin", dtype="int32"))
    w = to_hf(c, units)
    import os
    if os.path.isdir(f"{d}/hf"):
        print(f"hf folder: {check_hf_folder(c, w, d + '/hf')} safetensors file(s) match by name")
    loss = forward(c, w, tokens, targets, B, T)
    loss.backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for u in units for t in u.values()]
    torch.cat([g.reshape(-1) for g in grads]).numpy().astype("float64").tofile(f"{d}/grads.bin")
    with open(f"{d}/loss.txt", "w") as f:
        f.write(repr(loss.item()) + "\n")


if __name__ == "__main__":
    main()
