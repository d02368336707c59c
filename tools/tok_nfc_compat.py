#!/usr/bin/env python3
"""Finds the code points where Hugging Face tokenizers' NFC (its Rust normalization tables are
older than Unicode 15) differs from utf8proc's NFC, and prints them as the C range table
HF_NFC_OPAQUE in src/tokenizer/bpe.c.

HF does not know these marks (Unicode 11..15 additions), so it treats each as a starter with no
decomposition that composes with nothing. bpe.c reproduces that by cutting the text at them and
running utf8proc's NFC on the pieces in between. The script checks that emulation against HF on
every probe and on random strings and fails if any difference is left.

    .venv/bin/python tools/tok_nfc_compat.py
"""
import ctypes
import ctypes.util
import random
import sys

from tokenizers import normalizers

lib = ctypes.CDLL(ctypes.util.find_library("utf8proc") or "libutf8proc.so.2")
libc = ctypes.CDLL(ctypes.util.find_library("c"))
for fn in (lib.utf8proc_NFC, lib.utf8proc_NFD):
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p]


class Prop(ctypes.Structure):
    _fields_ = [("category", ctypes.c_int16), ("combining_class", ctypes.c_int16)]


lib.utf8proc_get_property.restype = ctypes.POINTER(Prop)
lib.utf8proc_unicode_version.restype = ctypes.c_char_p


def call(fn, s):
    p = fn(s.encode())
    r = ctypes.string_at(p).decode()
    libc.free(ctypes.c_void_p(p))
    return r


def nfc(s):
    return call(lib.utf8proc_NFC, s)


def nfd(s):
    return call(lib.utf8proc_NFD, s)


def probes(c):
    d = nfd(c)
    return [c, d, "a\u0345" + c, "a" + c + "\u0334", "a" + c + "\u0301", c + "\u0301", "\u0915" + c,
            d + "\u0334", d[:1] + "\u0334" + d[1:]]


def main():
    hf = normalizers.NFC()
    cands = set()
    for cp in range(0x300, 0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        if lib.utf8proc_get_property(cp).contents.combining_class or nfd(c) != c:
            cands.add(cp)
            cands.update(ord(x) for x in nfd(c) if ord(x) >= 0x300)
    cands = sorted(cands)
    opaque = set()
    for cp in cands:
        if any(hf.normalize_str(s) != nfc(s) for s in probes(chr(cp))):
            opaque.add(cp)
            opaque.update(ord(x) for x in nfd(chr(cp)) if ord(x) >= 0x300)

    def emulate(s):
        out, seg = [], []
        for ch in s:
            if ord(ch) in opaque:
                out += [nfc("".join(seg)), ch]
                seg = []
            else:
                seg.append(ch)
        return "".join(out) + nfc("".join(seg))

    n_bad = sum(hf.normalize_str(s) != emulate(s) for cp in cands for s in probes(chr(cp)))
    rng = random.Random(1)
    pool = [chr(c) for c in cands] + list("abcAé\u0915\u1100\u1161")
    for _ in range(200000):
        s = "".join(rng.choice(pool) for _ in range(rng.randrange(1, 8)))
        n_bad += hf.normalize_str(s) != emulate(s)
    if n_bad:
        sys.exit(f"emulation still differs from HF on {n_bad} strings")
    ranges = []
    for cp in sorted(opaque):
        if ranges and ranges[-1][1] + 1 == cp:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    print(f"/* {len(opaque)} code points, {len(ranges)} ranges; utf8proc "
          f"{lib.utf8proc_unicode_version().decode()}; {len(cands)} candidates checked */")
    body = ", ".join(f"{{0x{a:X}, 0x{b:X}}}" for a, b in ranges)
    print("static const uint32_t HF_NFC_OPAQUE[][2] = {" + body + "};")


if __name__ == "__main__":
    main()
