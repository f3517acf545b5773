#!/usr/bin/env python3
"""The reference side of hf_tokenizer_oracle_test.cc and ChatDataTemplateTest
(chat_data_test.cc): Hugging Face's own libraries, run with the interpreter
of scripts/setup's environment.

  hf_tokenizer_oracle.py encode TOKENIZER_JSON IN.json OUT.json
      `tokenizers`' Tokenizer.from_file. IN.json is an array of texts.
      OUT.json gets {"texts": [...], "tokens": [...]}: per text, "ids" (the
      text encoded without the post-processor's tokens: no BOS), "decoded"
      (those ids decoded with special tokens kept; the library's decode has
      no clean-up of spaces, that is transformers' option) and "reencoded"
      (the decoded text encoded again); per id from 0 to the vocabulary's
      size with added tokens, the id alone decoded, or null where the id has
      no token.

  hf_tokenizer_oracle.py chat MODEL_DIR IN.json OUT.json
      transformers' AutoTokenizer.from_pretrained(MODEL_DIR) (its
      tokenizer.json and tokenizer_config.json, offline). IN.json is an array
      of conversations, each an array of {role, content}. OUT.json gets, per
      conversation, {"ids": [...]}: apply_chat_template(tokenize=True,
      add_generation_prompt=False), the template's own rendering.
"""
import json
import os
import sys


def encode(tokenizer_json, texts):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer_json)
    out = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        reencoded = tok.encode(decoded, add_special_tokens=False).ids
        out.append({"ids": ids, "decoded": decoded, "reencoded": reencoded})
    n = tok.get_vocab_size(with_added_tokens=True)
    present = [i for i in range(n) if tok.id_to_token(i) is not None]
    decoded = tok.decode_batch([[i] for i in present], skip_special_tokens=False)
    tokens = [None] * n
    for i, d in zip(present, decoded):
        tokens[i] = d
    return {"texts": out, "tokens": tokens}


def chat(model_dir, conversations):
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for messages in conversations:
        r = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
        ids = r["input_ids"] if hasattr(r, "keys") else r  # transformers 5 returns a BatchEncoding
        out.append({"ids": [int(i) for i in ids]})
    return out


def main():
    mode, source, in_path, out_path = sys.argv[1:5]
    with open(in_path, encoding="utf-8") as f:
        data = json.load(f)
    result = encode(source, data) if mode == "encode" else chat(source, data) if mode == "chat" else None
    if result is None:
        sys.exit(f"unknown mode {mode!r}: encode or chat")
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
