#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

Seeds are valid inputs: the DeepSpeed configs of tests/fixtures, and files shaped
like the ones the tests generate (tests/dataset/data_test_util.h,
hf_tokenizer_test.cc, safetensors_test.cc, engine checkpoints, Hugging Face
folders written by ExportHfCheckpoint), plus small cuts of the real
tokenizer.json files in ../shared/data/tokenizers when they are there. The
output is checked in; run this again after a format changes:

    python3 tests/fuzz/make_seeds.py

Only the standard library; deterministic (same files every run).
"""
import json
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
TOKENIZERS = os.environ.get("ZINF_TOKENIZER_DIR", os.path.join(ROOT, "..", "shared", "data", "tokenizers"))


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def dumps(obj, indent=None):
    return json.dumps(obj, indent=indent, ensure_ascii=False)


# ---- DeepSpeed configs ----------------------------------------------------------

def config_seeds():
    data = os.path.join(ROOT, "tests", "fixtures")
    for name in sorted(os.listdir(data)):
        if name.endswith(".json"):
            with open(os.path.join(data, name), "rb") as f:
                write("fuzz_config", name, f.read())
    write("fuzz_config", "empty.json", "{}")
    write("fuzz_config", "zinf_block.json", dumps({
        "train_batch_size": 32, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True},
                              "offload_optimizer": {"device": "nvme", "nvme_path": ["/nvme0", "/nvme1"],
                                                    "buffer_count": 4, "ratio": 1.0},
                              "sub_group_size": 1e9, "stage3_max_live_parameters": 1e9},
        "aio": {"block_size": 1048576, "queue_depth": 32, "intra_op_parallelism": 2, "single_submit": False,
                "overlap_events": True, "io_backend": "async_io"},
        "zinf": {"device": "cuda:0", "device_memory": "4G", "host_memory": 17179869184, "optimizer_threads": 4,
                 "comm_timeout_s": 600, "gradients": "nvme", "checksums": True, "stop_on_nonfinite_loss": True,
                 "gradient_accumulation": "sum", "active_offload": True, "matmul": "bf16", "attention": "flash",
                 "aio": {"rings": 2, "fixed_buffers": True, "sqpoll": False, "buffered": False,
                         "phased_swaps": True}}}, indent=2))
    write("fuzz_config", "auto_everywhere.json", dumps({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                 "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                          "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto",
                              "stage3_gather_16bit_weights_on_model_save": True}}, indent=2))
    write("fuzz_config", "cosine_deprecated.json", dumps({
        "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, "cpu_offload": True,
                                                                   "allgather_partitions": True,
                                                                   "overlap_comm": None},
        "bfloat16": {"enabled": True},
        "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                 "weight_decay": 0.1, "adam_w_mode": False, "torch_adam": True}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_min_ratio": 0.01, "cos_min_ratio": 0.1,
                                                           "warmup_num_steps": 100, "total_num_steps": 1000,
                                                           "warmup_type": "linear"}},
        "steps_per_print": 10, "wall_clock_breakdown": False, "prescale_gradients": False,
        "communication_data_type": "fp32", "tensor_parallel": {"autotp_size": 1}}, indent=2))
    write("fuzz_config", "zero_bool.json", dumps({"zero_optimization": True, "allgather_size": 5e8,
                                                   "fp16": {"enabled": True}}))


# ---- tokenizer.json ---------------------------------------------------------------

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
LLAMA3_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
               "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
MARKERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>",
           "<|im_end|>", "<s>", "</s>"]


def spell(s):
    return "".join(B2U[b] for b in s.encode("utf-8"))


def byte_level_vocab(words, merges):
    vocab = {B2U[b]: b for b in range(256)}
    for w in words:
        vocab.setdefault(spell(w), len(vocab))
    return vocab, [[spell(l), spell(r)] for l, r in merges]


def added(first_id, markers=MARKERS):
    return [{"id": first_id + i, "content": m, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for i, m in enumerate(markers)]


def tokenizer_seeds():
    vocab, merges = byte_level_vocab(["he", "ll", "hell", "hello", " w", " wo", "rl", " worl", " world"],
                                     [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (" ", "w"), (" w", "o"),
                                      ("r", "l"), (" wo", "rl"), (" worl", "d")])
    base = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added(len(vocab)),
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": False},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                                "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": merges}}
    write("fuzz_tokenizer", "byte_level_markers.json", dumps(base))
    llama3 = json.loads(dumps(base))
    llama3["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    llama3["model"]["ignore_merges"] = True
    llama3["model"]["merges"] = [" ".join(m) for m in merges]  # the older "left right" form
    write("fuzz_tokenizer", "llama3_shape.json", dumps(llama3))
    qwen = json.loads(dumps(llama3))
    qwen["normalizer"] = {"type": "NFC"}
    qwen["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2_REGEX
    qwen["added_tokens"] = added(len(vocab), ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                              "</think>"])
    qwen["added_tokens"][0]["special"] = True
    qwen["added_tokens"][3]["special"] = False
    write("fuzz_tokenizer", "qwen_shape.json", dumps(qwen))
    gpt2 = json.loads(dumps(base))
    gpt2["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                             "use_regex": True}
    gpt2["added_tokens"] = added(len(vocab), ["<|endoftext|>"])
    write("fuzz_tokenizer", "gpt2_shape.json", dumps(gpt2))
    split_gpt2 = json.loads(dumps(base))
    split_gpt2["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": GPT2_REGEX}, "behavior": "Isolated"}
    write("fuzz_tokenizer", "split_gpt2.json", dumps(split_gpt2))

    # SentencePiece-style (Llama 2, Mistral): Metaspace or Prepend/Replace, byte fallback, unk.
    sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        sp_vocab["<0x%02X>" % b] = 3 + b
    pieces = ["\u2581", "a", "b", "h", "i", "\u2581a", "ab", "\u2581ab", "\u2581h", "\u2581hi", "hi"]
    for p in pieces:
        sp_vocab.setdefault(p, len(sp_vocab))
    sp_merges = ["\u2581 a", "a b", "\u2581a b", "\u2581 h", "h i", "\u2581h i"]
    llama2 = {"version": "1.0", "truncation": None, "padding": None,
              "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": False, "special": True}
                               for i, c in [(0, "<unk>"), (1, "<s>"), (2, "</s>")]],
              "normalizer": {"type": "Sequence", "normalizers": [
                  {"type": "Prepend", "prepend": "\u2581"},
                  {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
              "pre_tokenizer": None, "post_processor": None,
              "decoder": {"type": "Sequence", "decoders": [
                  {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                  {"type": "ByteFallback"}, {"type": "Fuse"},
                  {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
              "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                        "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "vocab": sp_vocab,
                        "merges": sp_merges}}
    write("fuzz_tokenizer", "llama2_shape.json", dumps(llama2))
    meta = json.loads(dumps(llama2))
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                             "split": True}
    meta["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
    meta["model"]["byte_fallback"] = False
    write("fuzz_tokenizer", "metaspace_first.json", dumps(meta))
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}
    meta["decoder"] = None
    write("fuzz_tokenizer", "metaspace_old.json", dumps(meta))

    # Cuts of the real files: the first ids, the merges among them, their added tokens.
    for family, keep in [("llama3", 1200), ("qwen3", 1200), ("llama2", 1200)]:
        path = os.path.join(TOKENIZERS, family, "tokenizer.json")
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        kept = {t: i for t, i in j["model"]["vocab"].items() if i < keep}
        merges = []
        for m in j["model"]["merges"]:
            l, r = m.split(" ", 1) if isinstance(m, str) else m
            if l in kept and r in kept and l + r in kept:
                merges.append(m)
        j["model"]["vocab"] = kept
        j["model"]["merges"] = merges
        j["added_tokens"] = j["added_tokens"][:12]
        write("fuzz_tokenizer", "real_%s_cut.json" % family, dumps(j))


# ---- safetensors ------------------------------------------------------------------

def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, bytes)] in data order."""
    header, offset, data = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    f32 = struct.pack("<6f", 0.5, -1.0, 2.0, 3.25, 1e-3, -7.0)
    write("fuzz_safetensors", "f32.safetensors", safetensors([("w", "F32", [2, 3], f32)], {"format": "pt"}))
    bf16 = bytes([0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40, 0x80, 0x7f])
    f16 = struct.pack("<4e", 1.0, -2.0, 65504.0, 6e-8)
    f64 = struct.pack("<2d", 1.0 / 3.0, -1e300)
    write("fuzz_safetensors", "mixed.safetensors", safetensors([
        ("model.embed_tokens.weight", "BF16", [2, 2], bf16), ("model.norm.weight", "F16", [4], f16),
        ("lm_head.weight", "F64", [1, 2], f64), ("step", "I64", [], struct.pack("<q", 7)),
        ("mask", "BOOL", [3], b"\x01\x00\x01"), ("ids", "U8", [0, 5], b""),
        ("fp8", "F8_E4M3", [2], b"\x38\x40"), ("h", "I32", [1], struct.pack("<i", -5))], {"format": "pt",
                                                                                             "note": "seed"}))
    write("fuzz_safetensors", "empty.safetensors", safetensors([]))
    write("fuzz_safetensors", "unpadded.safetensors", safetensors([("x", "F32", [1], struct.pack("<f", 1.0))],
                                                                   pad=False))


# ---- Hugging Face config.json (+ index) ------------------------------------------

def hf_pieces(c):
    """The tensor names and shapes of hf_checkpoint.cc's PiecesOf, in unit order."""
    C, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    H = c["num_attention_heads"]
    Hkv = c.get("num_key_value_heads") or H
    D = c.get("head_dim") or C // H
    I = c["intermediate_size"]
    Q, K = H * D, Hkv * D
    qkv_bias = c.get("attention_bias", c["model_type"] == "qwen2")
    out = [("model.embed_tokens.weight", [V, C])]
    for layer in range(L):
        n = "model.layers.%d." % layer
        out += [(n + "input_layernorm.weight", [C]), (n + "self_attn.q_proj.weight", [Q, C]),
                (n + "self_attn.k_proj.weight", [K, C]), (n + "self_attn.v_proj.weight", [K, C])]
        if qkv_bias:
            out += [(n + "self_attn.q_proj.bias", [Q]), (n + "self_attn.k_proj.bias", [K]),
                    (n + "self_attn.v_proj.bias", [K])]
        if c["model_type"] == "qwen3":
            out += [(n + "self_attn.q_norm.weight", [D]), (n + "self_attn.k_norm.weight", [D])]
        out += [(n + "self_attn.o_proj.weight", [C, Q]), (n + "post_attention_layernorm.weight", [C]),
                (n + "mlp.gate_proj.weight", [I, C]), (n + "mlp.up_proj.weight", [I, C]),
                (n + "mlp.down_proj.weight", [C, I])]
    out.append(("model.norm.weight", [C]))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [V, C]))
    return out


def hf_index(c, max_shard_bytes=4096):
    """The index ExportHfCheckpoint writes for fp32 shards of at most max_shard_bytes."""
    shards, items = [], []
    for name, shape in hf_pieces(c):
        size = 4
        for d in shape:
            size *= d
        if not shards or (shards[-1] > 0 and shards[-1] + size > max_shard_bytes):
            shards.append(0)
        shards[-1] += size
        items.append((name, len(shards) - 1))
    n = len(shards)
    if n == 1:
        return None
    weight_map = {name: "model-%05d-of-%05d.safetensors" % (s + 1, n) for name, s in items}
    return {"metadata": {"total_size": sum(shards)}, "weight_map": weight_map}


def hf_config_seeds():
    tiny = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32, "hidden_size": 8,
            "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 4, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
            "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
    variants = {
        "llama3": tiny,
        "llama_tied": dict(tiny, tie_word_embeddings=True, rope_scaling=None, num_key_value_heads=2),
        "mistral": dict(tiny, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=4096,
                        rope_scaling=None, rope_theta=1e6),
        "qwen2": dict(tiny, model_type="qwen2", architectures=["Qwen2ForCausalLM"], attention_bias=True,
                      use_sliding_window=False, sliding_window=32, rope_scaling=None),
        "qwen3": dict(tiny, model_type="qwen3", architectures=["Qwen3ForCausalLM"], rope_scaling=None,
                      head_dim=8),
        "transformers5": dict({k: v for k, v in tiny.items() if k not in ("rope_scaling", "rope_theta")},
                              rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 32}, dtype="bfloat16"),
        "one_shard": dict(tiny, vocab_size=8, hidden_size=4, intermediate_size=4, num_hidden_layers=1,
                          num_attention_heads=1, num_key_value_heads=1, head_dim=4, rope_scaling=None),
    }
    for name, c in variants.items():
        text = dumps(c, indent=2)
        write("fuzz_hf_config", name + ".json", text)
        index = hf_index(c)
        if index is not None:
            write("fuzz_hf_config", name + "_index.json", text + "\0" + dumps(index, indent=2))


# ---- chat JSONL ---------------------------------------------------------------------

def chat_seeds():
    lines = [
        {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                      {"role": "user", "content": "and 3+3?"},
                      {"role": "assistant", "content": "<think>\nadd\n</think>\n\n6"}]},
        {"prompt": "Name a color.", "response": "  Blue  "},
        {"system": "Be kind.", "prompt": "as as as", "completion": "has\n\nhis"},
        {"messages": [{"role": "user", "content": "caf\u00e9 \u4f60\u597d \U0001F600"},
                      {"role": "assistant", "content": "<|im_end|> inside text"}]},
    ]
    write("fuzz_chat", "mixed.jsonl", "\n".join(dumps(l) for l in lines) + "\n")
    write("fuzz_chat", "one_prompt.jsonl", dumps(lines[2]))
    write("fuzz_chat", "blank_lines.jsonl", "\n\n" + dumps(lines[0]) + "\n   \n" + dumps(lines[1]) + "\n")
    long = {"messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": "as " * (i + 1)}
                         for i in range(12)]}
    write("fuzz_chat", "long_alternating.jsonl", dumps(long) + "\n" + dumps(lines[3]) + "\n")


# ---- checkpoint manifests and rank tables -----------------------------------------

def checkpoint_seeds():
    units = [{"name": "embed", "elements": 3000, "steps": 3, "frozen": False,
              "params": [{"name": "wte", "shape": [100, 30], "offset": 0}]},
             {"name": "block0", "elements": 1030, "steps": 3, "frozen": False,
              "params": [{"name": "w", "shape": [32, 32], "offset": 0}, {"name": "b", "shape": [6], "offset": 1024}]},
             {"name": "head", "elements": 8, "steps": 0, "frozen": True,
              "params": [{"name": "g", "shape": [8], "offset": 0}]}]

    def manifest(world):
        return {"format": 2, "world_size": world, "stage": 3, "compute_dtype": "bf16", "boundaries": 3,
                "steps_applied": 3, "loss_scale": {"scale": 65536.0, "cur_hysteresis": 2, "iter": 3,
                                                   "last_overflow_iter": -1, "overflows": 0},
                "units": units, "config": {"zero_optimization": {"stage": 3}},
                "client_state": {"next_step": 3, "model": {"name": "tiny", "vocab_size": 100}}}

    def table(rank, world):
        tensors, offset = [], 0
        for u in units:
            per = (u["elements"] + world - 1) // world
            begin = rank * per
            count = max(0, min(u["elements"], begin + per) - begin)
            if count == 0:
                continue
            for kind in (["master"] if u["frozen"] else ["master", "exp_avg", "exp_avg_sq"]):
                tensors.append({"unit": u["name"], "kind": kind, "begin": begin, "count": count,
                                "offset": offset, "xxh3": (0x9E3779B97F4A7C15 * (offset + 1)) % (1 << 64)})
                offset += (count * 4 + 4095) // 4096 * 4096
        return {"file": "rank-%d.bin" % rank, "align": 4096, "tensors": tensors}

    for world in (1, 2, 3):
        parts = [dumps(manifest(world), indent=1)] + [dumps(table(r, world), indent=1) for r in range(world)]
        write("fuzz_checkpoint", "world%d.txt" % world, "\0".join(parts))
    write("fuzz_checkpoint", "manifest_only.json", dumps(manifest(1)))


# ---- CLI numbers --------------------------------------------------------------------

def cli_seeds():
    for i, text in enumerate(["4096", "512K", "4G", "1.5GiB", "1e9", "124M", "1.5B", "7e9", "350K", " 4 G ",
                              "0", "1T", "2P", "64KiB", "3.5MB", "18446744073709551615", "9.2e18", ".5K",
                              "1e+3", "100b"]):
        write("fuzz_cli_numbers", "n%02d" % i, text)


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    config_seeds()
    tokenizer_seeds()
    safetensors_seeds()
    hf_config_seeds()
    chat_seeds()
    checkpoint_seeds()
    cli_seeds()
    total = sum(len(files) for _, _, files in os.walk(OUT))
    print("wrote %d seed files under %s" % (total, os.path.relpath(OUT, ROOT)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
