"""What tools/train_tiny_mtp.py writes opens in tulip: its BPE tokenizer (trained here on the first
part of the script's own corpus) tokenizes as `tokenizers` does, its tensor layout and config load
with the MTP head bound, and greedy decoding with --speculative-tokens gives the tokens of plain
decoding, in the plain and the ASan+UBSan build. The weights are drawn at random (torch is not
needed: the script's layout, BF16 writer and config code run without it); the training itself
runs on the GPU machine (docs/developing.md). When the trained checkpoint tests/data/tiny-trained
is committed, the same checks run on it too, plus a floor on its first draft's acceptance."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import train_tiny_mtp as ttm  # noqa: E402

BINS = [b for b in ("build/cpu/tulip", "build/asan/tulip") if os.path.exists(os.path.join(ROOT, b))]
TRAINED = os.path.join(ROOT, "tests", "data", "tiny-trained")
SAMPLE = ("Return the number of items in the list.\n\n    >>> len([1, 2, 3])\n    3\n"
          "Raise ValueError if x is négatif; see https://docs.python.org/3/ <|im_end|> done.")


def draw(name, shape, rng):
    if name.endswith("A_log"):
        return np.log(rng.uniform(1.0, 8.0, shape)).astype(np.float32)
    if name.endswith("linear_attn.norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    std = 0.1 if "norm" in name or name.endswith("dt_bias") else 1.0 / np.sqrt(shape[-1])
    return (std * rng.standard_normal(shape)).astype(np.float32)


@pytest.fixture(scope="module")
def random_ckpt(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("tiny-trained-random"))
    text = ttm.corpus_text()[:400_000]
    tok = ttm.train_tokenizer(text)
    rng = np.random.default_rng(17)
    shapes = dict(ttm.trunk_shapes(ttm.TEXT), **ttm.head_shapes(ttm.TEXT))
    ttm.write_checkpoint(out, {k: draw(k, s, rng) for k, s in shapes.items()}, tok)
    return out, tok


def run(binary, *args, stdin=None):
    return subprocess.run([os.path.join(ROOT, binary), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, input=stdin)


def test_layout_written(random_ckpt):
    out, _ = random_ckpt
    names = sorted(os.listdir(out))
    assert names == ["config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"]
    w = ttm.st_read_f32(os.path.join(out, "model.safetensors"))
    shapes = dict(ttm.trunk_shapes(ttm.TEXT), **ttm.head_shapes(ttm.TEXT))
    assert {k: list(v.shape) for k, v in w.items()} == shapes
    a = w["mtp.fc.weight"]
    assert np.isfinite(a).all() and a.std() > 0


def test_bf16_rounding():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5e-3, 3.0e38], dtype=np.float32)
    bits = ttm.bf16_bits(x)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); 1 + 3*2^-8 rounds up
    assert back[0] == 1.0 and back[1] == 1.0 and back[2] == np.float32(1.015625)
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -8)


@pytest.mark.parametrize("binary", BINS)
def test_tokenizer_matches_tokenizers(random_ckpt, binary):
    out, tok = random_ckpt
    r = run(binary, "tokenize", "--tokenizer", out, stdin=SAMPLE)
    assert r.returncode == 0, r.stderr
    assert [int(t) for t in r.stdout.split()] == tok.encode(SAMPLE).ids
    assert ttm.special_ids()["<|im_end|>"] in tok.encode(SAMPLE).ids


def models(random_ckpt):
    return [random_ckpt[0]] + ([TRAINED] if os.path.isdir(TRAINED) else [])


@pytest.mark.parametrize("binary", BINS)
def test_info_binds_head(random_ckpt, binary):
    for m in models(random_ckpt):
        r = run(binary, "info", "--model", m, "--allow-test-shape")
        assert r.returncode == 0, r.stderr
        assert "head bound" in r.stdout and "LLLA" in r.stdout, r.stdout


def spec_counts(stderr):
    m = re.search(r"speculation: (\d+) steps drafted (\d+) tokens, (\d+) accepted .*position:"
                  r" 1: (\d+)/(\d+) 2: (\d+)/(\d+)", stderr)
    assert m, stderr
    return [int(x) for x in m.groups()]


@pytest.mark.parametrize("binary", BINS)
def test_speculative_greedy_equals_plain(random_ckpt, binary):
    """The chat path (-p) and --prompt-ids; K = 2 gives plain decoding's ids, and the counters on
    stderr add up (per position: accepted <= drafted, position 2 only where 1 was)."""
    for m in models(random_ckpt):
        r = run(binary, "run", "--model", m, "--allow-test-shape", "-p", "What does len do?",
                "-n", "12", "--seed", "7")
        assert r.returncode == 0, r.stderr
        base = ["run", "--model", m, "--allow-test-shape", "--prompt-ids", "100,200,300,400",
                "-n", "40", "--temperature", "0", "--print-ids", "--ignore-eos"]
        plain = run(binary, *base)
        spec = run(binary, *base, "--speculative-tokens", "2")
        assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
        assert len(plain.stdout.split()) == 40 and spec.stdout == plain.stdout
        steps, drafted, acc, a1, d1, a2, d2 = spec_counts(spec.stderr)
        assert drafted == d1 + d2 and acc == a1 + a2 and 0 < d1 <= steps and d2 <= d1
        assert a1 <= d1 and a2 <= min(a1, d2) and steps + acc <= 40 - 1
        if m == TRAINED:  # a trained head agrees with the trunk at least this often
            assert a1 >= 0.25 * d1, spec.stderr


def test_corpus_and_prompts():
    """The corpus is the same text each time (what the held-out split and spec_measure.py's
    prompts rely on), megabytes of it, and the prompts are distinct passages of its last 5%."""
    a, b = ttm.corpus_text(), ttm.corpus_text()
    assert a == b and len(a) > 1_000_000
    ps = ttm.held_out_prompts(4)
    assert len(set(ps)) == 4 and all(len(p) > 100 and p in a[len(a) * 19 // 20:] for p in ps)
