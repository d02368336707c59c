#!/usr/bin/env python3
"""Finds the code points that Hugging Face tokenizers' regex engine (Oniguruma, Unicode 16 in
tokenizers 0.23.3) puts in \\p{L}, \\p{M}, \\p{N} or \\p{Z} but this machine's PCRE2 (10.42,
Unicode 14) does not (they are unassigned there), and prints them as the C range tables that
src/tokenizer/bpe_regex.c adds to those classes when it rewrites a pre-tokenizer regex for PCRE2.
Fails if PCRE2 has members HF lacks (the rewrite only adds) or if, after the rewrite, any class
still differs.

    .venv/bin/python tools/tok_regex_compat.py
"""
import ctypes
import ctypes.util
import sys

from tokenizers import Regex, pre_tokenizers

lib = ctypes.CDLL(ctypes.util.find_library("pcre2-8") or "libpcre2-8.so.0")
lib.pcre2_compile_8.restype = ctypes.c_void_p
lib.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int),
                                ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
lib.pcre2_match_data_create_8.restype = ctypes.c_void_p
lib.pcre2_match_data_create_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
lib.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32,
                              ctypes.c_void_p, ctypes.c_void_p]
lib.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
PCRE2_UTF, PCRE2_UCP, PCRE2_CONFIG_UNICODE_VERSION = 0x00080000, 0x00020000, 10

CPS = [c for c in range(0x80, 0x110000) if not 0xD800 <= c <= 0xDFFF]
CLASSES = ["L", "M", "N", "Z"]


def pcre_members(pattern):
    err, off = ctypes.c_int(), ctypes.c_size_t()
    p = pattern.encode()
    code = lib.pcre2_compile_8(p, len(p), PCRE2_UTF | PCRE2_UCP, ctypes.byref(err), ctypes.byref(off), None)
    assert code, (pattern, err.value)
    md = lib.pcre2_match_data_create_8(4, None)
    out = set()
    for c in CPS:
        b = chr(c).encode()
        if lib.pcre2_match_8(code, b, len(b), 0, 0, md, None) >= 0:
            out.add(c)
    return out


def hf_members(pattern):
    s = "".join(chr(c) for c in CPS)
    non = set()
    for piece, _ in pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(s):
        non.update(ord(ch) for ch in piece)
    return set(CPS) - non


def ranges(cps):
    r = []
    for c in sorted(cps):
        if r and r[-1][1] + 1 == c:
            r[-1][1] = c
        else:
            r.append([c, c])
    return r


def main():
    buf = ctypes.create_string_buffer(64)
    lib.pcre2_config_8(PCRE2_CONFIG_UNICODE_VERSION, buf)
    extra = {}
    for k in CLASSES:
        pc, hf = pcre_members(r"\p{%s}" % k), hf_members(r"\p{%s}" % k)
        if pc - hf:
            sys.exit(f"PCRE2 has {len(pc - hf)} members of \\p{{{k}}} that HF lacks: cannot emulate by adding")
        extra[k] = ranges(hf - pc)
    for k in CLASSES:  # the rewritten classes must now agree
        body = "".join(f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in extra[k])
        if pcre_members(r"[\p{%s}%s]" % (k, body)) != hf_members(r"\p{%s}" % k):
            sys.exit(f"rewritten \\p{{{k}}} still differs")
    if extra["Z"]:
        sys.exit("\\p{Z} differs now: bpe_regex.c needs an HF_EXTRA_Z table (and \\s uses \\p{Z})")
    print(f"/* PCRE2 Unicode {buf.value.decode()}; HF tokenizers' Oniguruma adds "
          + ", ".join(f"{k}: {sum(b - a + 1 for a, b in extra[k])}" for k in CLASSES) + " */")
    for k in CLASSES[:3]:
        body = ", ".join(f"{{0x{a:X}, 0x{b:X}}}" for a, b in extra[k])
        print(f"static const uint32_t HF_EXTRA_{k}[][2] = {{{body}}};")


if __name__ == "__main__":
    main()
