#!/usr/bin/env python3
"""Derives a Hugging Face `tokenizer.json` and `tokenizer_config.json` from a GGUF file.

    scripts/gguf_tokenizer.py MODEL.gguf OUT_DIR

For byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`), as SmolLM2 has: the vocabulary,
the merges, the control tokens as special added tokens, and the pre-tokenizer llama.cpp uses for
`tokenizer.ggml.pre = smollm` (digits split one by one, then GPT-2's byte-level split). The
config carries the chat template and the special tokens, as `transformers` writes them. The
output is deterministic (sorted keys, no timestamps), so its checksum can be pinned.

Needs the `gguf` package (PyPI; pure Python with numpy). No torch, no network.
"""

import json
import os
import sys

from gguf import GGUFReader

# llama.cpp token types (llama_token_type).
CONTROL = 3
USER_DEFINED = 4


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, out_dir = sys.argv[1], sys.argv[2]
    reader = GGUFReader(path)
    model = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre")
    if model != "gpt2":
        sys.exit(f"{path}: tokenizer.ggml.model is {model!r}; only byte-level BPE (gpt2) is supported")
    if pre not in ("smollm", "gpt2", "default", None):
        sys.exit(f"{path}: pre-tokenizer {pre!r} is not supported by this script")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    bos = tokens[field(reader, "tokenizer.ggml.bos_token_id")]
    eos = tokens[field(reader, "tokenizer.ggml.eos_token_id")]
    pad_id = field(reader, "tokenizer.ggml.padding_token_id")
    pad = tokens[pad_id] if pad_id is not None else eos

    added = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, (t, ty) in enumerate(zip(tokens, types))
        if ty in (CONTROL, USER_DEFINED)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    pre_tokenizers = [byte_level]
    if pre == "smollm":
        pre_tokenizers.insert(0, {"type": "Digits", "individual_digits": True})
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_tokenizers},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": list(merges),
        },
    }
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token")),
        "chat_template": field(reader, "tokenizer.chat_template"),
        "model_max_length": field(reader, "llama.context_length"),
    }
    os.makedirs(out_dir, exist_ok=True)
    for name, value in (("tokenizer.json", tokenizer), ("tokenizer_config.json", config)):
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        os.replace(tmp, os.path.join(out_dir, name))


if __name__ == "__main__":
    main()
