#!/usr/bin/env python3
"""Writes tests/data/tiny-tokenizer/tokenizer.json, the tokenizer of the tiny test models:
byte-level BPE exactly like Qwen3.6's (NFC, the Qwen3.5 Split regex, ByteLevel) with
  ids 0..255    the 256 byte symbols, id = byte value
  ids 256..286  31 merges of common English pairs
  ids 287..319  the 33 Qwen3.6 added tokens in docs/model.md §4.2 order (<|endoftext|> = 287,
                <|im_start|> = 288, <|im_end|> = 289, <tool_call> = 301, <think> = 311, ...)
320 ids in all = the tiny model's vocabulary size.

    tools/tok_make_tiny.py [OUT]   (default tests/data/tiny-tokenizer/tokenizer.json)
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "py"))
from tok_corpus import QWEN36_ADDED  # noqa: E402
from tok_tiktoken_to_json import NOT_SPECIAL, bytes_to_unicode  # noqa: E402

QWEN35_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
                r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

MERGES = ["Ġ t", "h e", "i n", "e r", "a n", "Ġt he", "o n", "r e", "Ġ a", "e n", "a t", "o r",
          "e s", "Ġ s", "i s", "Ġ w", "i t", "Ġ o", "n d", "e d", "in g", "Ġ c", "o u", "Ġ b",
          "Ġ f", "a r", "a l", "Ġ i", "Ġ p", "Ġa nd", "Ġo f"]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "data", "tiny-tokenizer", "tokenizer.json")
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for m in MERGES:
        a, b = m.split(" ")
        assert a in vocab and b in vocab, m
        assert a + b not in vocab, m
        vocab[a + b] = len(vocab)
    assert len(vocab) == 287 and len(QWEN36_ADDED) == 33
    added = [{"id": 287 + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": c not in NOT_SPECIAL} for i, c in enumerate(QWEN36_ADDED)]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    d = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_REGEX}, "behavior": "Isolated", "invert": False},
            bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": MERGES},
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
