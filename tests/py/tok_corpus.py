"""Test strings for the tokenizer reference tests (tests/py/test_tokenizer.py): hand-written
edge cases plus seeded random mixes of the scripts and whitespace that byte-level BPE and the
Qwen pre-tokenizer regex treat specially. Deterministic: the same seed gives the same corpus."""
import random

QWEN36_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
]

# Every character the regex's \s / \S and the Oniguruma rewrite care about.
WHITESPACE = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\x1c", "\x1d", "\x1e", "\x1f", "\x85",
              "\xa0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005",
              "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f",
              "\u205f", "\u3000", "\u180e", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]

HAND = [
    "", " ", "  ", "\n", "\r\n", "Hello world", "Hello, world! How's it going?",
    "I'M HERE, YOU'RE THERE, WE'LL SEE, THEY'D KNOW, IT'S, DON'T, I'VE",
    "it's 's 't 're 've 'm 'll 'd 'S 'T 'RE 'Ve 'mM",
    "The year 2024 had 366 days; π≈3.14159; 1,000,000.50 USD; ١٢٣ ٤٥٦; ௧௨௩; Ⅻ ½ ²",
    "中文分词测试：我们今天去公园玩。日本語のテキストとカタカナ、ひらがな。한국어 텍스트입니다.",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️‍🔥 🧑🏿‍🚀 1️⃣ 🇫🇷🇩🇪 ☺︎ ☺️",
    "Combining: e\u0301 a\u0308 o\u0302\u0323 n\u0303 Z\u0335\u0321\u0322\u0327 i\u0307\u0301 \u0301\u0301start",
    "Hangul jamo: \u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af",
    "Devanagari: नमस्ते दुनिया, क्षत्रिय, हिन्दी में लिखा गया पाठ। ॐ",
    "Arabic: مرحبا بالعالم، كيف حالك؟ السَّلَامُ عَلَيْكُمْ ١٢٣",
    "Hebrew: שָׁלוֹם עוֹלָם; Thai: สวัสดีชาวโลก; Tamil: வணக்கம் உலகம்",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] >> 2; }\r\n// done\r\n",
    "if x != y && z >= 10 || !w { println!(\"{:?}\", v); }",
    "<html><body class=\"x\">&nbsp;&amp;</body></html>",
    "   leading spaces", "trailing spaces   ", "\t\t\ttabs\t\t", "\n\n\nnewlines\n\n\n",
    "a\r\nb\rc\nd\r\n\r\ne\n\r", " \r\n \r\n  \n\t \n", "mixed  \t \n  \t\n\n  end",
    "nbsp\xa0here\xa0\xa0and\u202fnarrow", "line\u2028sep\u2029para", "mongolian\u180evowel\u180e\u180e",
    "zero\u200bwidth\u200c\u200djoiners\ufeffbom", "ideographic\u3000space\u3000\u3000",
    "x" * 300, " " * 500, "\n" * 200, "\t" * 100 + "x", " \n" * 100, "ab" * 200,
    "1234567890" * 20, "!!!???...,,,;;;:::" * 5, "'''''''", "''s's'", "....'ll",
    "Ä ä Ö ö Ü ü ß ẞ Å Ω ℃ ﬁ ﬀ ㎏ ＡＢＣ １２３",
    "\u212b \u2126 \u00c5 A\u030a \u1e9b\u0323 \uac00\u11a8",
    # letters, marks and digits newer than PCRE2's Unicode 14 (HF's Oniguruma knows them)
    "New: \u1c89\u1c8a \ua7cb abc\U000318e4\U000318e5 \U00010d40\U00010d41 1\u0897 \U00031350's x\U00010d69y",
    "\U000318e4 \U000318e4\U000318e4, (\U00013460) \u0cf3\u0ece 12\U0001e5f1\U0001e5f2 '\U000105c0",
]

POOLS = {
    "ascii_word": list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    "digit": list("0123456789") + ["٣", "७", "๓", "²", "½", "Ⅷ"],
    "punct": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "—", "«", "»", "¿", "¡", "·", "•", "€", "£", "©"],
    "space": WHITESPACE,
    "space_common": [" ", " ", " ", "\n", "\t", "\r\n", "  "],
    "combining": [chr(c) for c in range(0x300, 0x370)] + ["\u0903", "\u093e", "\u0951", "\u064b", "\u0670", "\u20dd", "\ufe0f", "\u302a"],
    "cjk": [chr(c) for c in range(0x4e00, 0x4e00 + 400)] + list("，。！？、；：「」（）"),
    "kana": [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30a1, 0x30fb)],
    "hangul": [chr(c) for c in range(0xac00, 0xac00 + 300)] + [chr(c) for c in range(0x1100, 0x1113)] + [chr(c) for c in range(0x1161, 0x1176)] + [chr(c) for c in range(0x11a8, 0x11c3)],
    "emoji": ["😀", "👍", "🏽", "\u200d", "👨", "👩", "👧", "❤", "\ufe0f", "🔥", "🏳", "🌈", "🇫", "🇷", "⃣", "🧑", "🚀", "🫠"],
    "devanagari": [chr(c) for c in range(0x900, 0x980)],
    "arabic": [chr(c) for c in range(0x600, 0x700)],
    "latin_ext": [chr(c) for c in range(0xc0, 0x250)],
    "greek_cyr": [chr(c) for c in range(0x370, 0x3ff)] + [chr(c) for c in range(0x400, 0x4ff)],
    "contraction": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'Re", "'lL", "'"],
    "specialish": ["<", ">", "|", "<|", "|>", "im_", "end", "<think", "</", "think>", "tool_call"],
}


def rand_mix(rng, n_chars, pools):
    names = list(pools)
    out = []
    while len(out) < n_chars:
        pool = POOLS[rng.choice(names)]
        k = rng.choice([1, 1, 1, 2, 3, 5, 8])
        out.extend(rng.choice(pool) for _ in range(k))
    return "".join(out[:n_chars])


def rand_codepoints(rng, n):
    """Any scalar value: assigned or not, private use, noncharacters; never a surrogate."""
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            c = rng.randrange(0x20, 0x800)
        elif r < 0.8:
            c = rng.randrange(0x800, 0x10000)
        else:
            c = rng.randrange(0x10000, 0x110000)
        if 0xD800 <= c <= 0xDFFF:
            c = 0xFFFD
        out.append(chr(c))
    return "".join(out)


def with_added(rng, added, n=1):
    """Text with added tokens embedded next to letters, spaces, punctuation and each other."""
    parts = []
    for _ in range(rng.randrange(1, 6)):
        parts.append(rand_mix(rng, rng.randrange(0, 12), ["ascii_word", "space_common", "punct", "cjk", "combining", "specialish"]))
        parts.append(rng.choice(added))
    return "".join(parts)


def text_corpus(seed=1234, n_random=3000, added=QWEN36_ADDED):
    rng = random.Random(seed)
    out = list(HAND)
    for tok in added:  # every added token, alone and in context
        out += [tok, "x" + tok + "y", " " + tok + " ", tok + tok, "\n" + tok + "\n\n", "é" + tok + "\u0301",
                tok[:-1], tok[1:], "<" + tok, tok + ">"]
    names = list(POOLS)
    for i in range(n_random):
        kind = i % 6
        if kind == 0:
            s = rand_mix(rng, rng.randrange(1, 60), names)
        elif kind == 1:
            s = rand_mix(rng, rng.randrange(1, 80), ["ascii_word", "space", "punct", "digit", "contraction"])
        elif kind == 2:
            s = rand_mix(rng, rng.randrange(1, 40), ["space", "space_common", "combining", "punct"])
        elif kind == 3:
            s = rand_codepoints(rng, rng.randrange(1, 30))
        elif kind == 4:
            s = with_added(rng, added)
        else:
            s = rand_mix(rng, rng.randrange(100, 600), names)
        out.append(s)
    return out


def byte_corpus(seed=99, n=1000):
    """Random byte strings, mostly invalid UTF-8, some truncated or overlong sequences."""
    rng = random.Random(seed)
    frags = [b"\xc3", b"\xa9", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
             b"\xff", b"\xfe", b"\x80", b"\xbf", b"abc ", b" ", b"\n", "é".encode(), "中".encode(), "😀".encode()]
    out = []
    for i in range(n):
        if i % 2:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))))
        else:
            out.append(b"".join(rng.choice(frags) for _ in range(rng.randrange(1, 12))))
    return out
