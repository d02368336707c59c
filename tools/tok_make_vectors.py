#!/usr/bin/env python3
"""Writes tests/data/tok/tiny_vectors.json: text -> ids from Hugging Face tokenizers (the
reference) on the tiny tokenizer, for tests/cpu/test_bpe.c. Entries are {"text": str, "ids": [...]}
or, for invalid UTF-8, {"hex": bytes.hex(), "ids": [...]} where the ids are HF's encoding of
bytes.decode("utf-8", errors="replace") (HF refuses invalid input itself).

    .venv/bin/python tools/tok_make_vectors.py
"""
import json
import os
import sys

from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
import tok_corpus  # noqa: E402


def main():
    tok = Tokenizer.from_file(os.path.join(ROOT, "tests", "data", "tiny-tokenizer", "tokenizer.json"))
    rnd = tok_corpus.text_corpus(seed=2024, n_random=150)
    texts = tok_corpus.HAND + rnd[-150:] + [f"a{t}b {t}" for t in tok_corpus.QWEN36_ADDED]
    out = [{"text": s, "ids": tok.encode(s).ids} for s in texts]
    out += [{"hex": b.hex(), "ids": tok.encode(b.decode("utf-8", errors="replace")).ids}
            for b in tok_corpus.byte_corpus(seed=7, n=40)]
    path = os.path.join(ROOT, "tests", "data", "tok", "tiny_vectors.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {len(out)} vectors", file=sys.stderr)


if __name__ == "__main__":
    main()
