"""`tulip run --prompt-ids` end to end (loader, engine, CPU backend, sampler, CLI) reproduces the
greedy continuation Hugging Face transformers produced for the tiny fixtures (tests/data/*/ref),
in the plain and the ASan+UBSan build; and bad input gets a clear error, not a crash."""
import os
import subprocess

import pytest
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINS = [b for b in ("build/cpu/tulip", "build/asan/tulip") if os.path.exists(os.path.join(ROOT, b))]


def run(binary, *args):
    return subprocess.run([os.path.join(ROOT, binary), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("binary", BINS)
@pytest.mark.parametrize("fixture", ["tiny-a", "tiny-b"])
def test_run_greedy_matches_hf(binary, fixture):
    ref = load_file(os.path.join(ROOT, "tests/data", fixture, "ref.safetensors"))
    prompt = ",".join(str(int(i)) for i in ref["prompt_ids"])
    want = [int(i) for i in ref["decode_ids"]]
    r = run(binary, "run", "--model", f"tests/data/{fixture}", "--allow-test-shape", "--prompt-ids",
            prompt, "-n", str(len(want)), "--temperature", "0", "--print-ids", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    assert [int(t) for t in r.stdout.split()] == want


def test_binaries_exist():
    assert "build/cpu/tulip" in BINS and "build/asan/tulip" in BINS


@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", "1,2,3"], "hidden_size=64, this engine is built for 2048"),
    (["--allow-test-shape", "--prompt-ids", "1,2,x"], "comma-separated list of token ids"),
    (["--allow-test-shape", "--prompt-ids", "1,320"], "token id 320 out of range"),
])
def test_run_bad_input_is_an_error(args, message):
    r = run("build/cpu/tulip", "run", "--model", "tests/data/tiny-a", *args, "-n", "2")
    assert r.returncode != 0
    assert message in r.stderr


def test_run_missing_model_names_the_file(tmp_path):
    r = run("build/cpu/tulip", "run", "--model", str(tmp_path), "--prompt-ids", "1", "-n", "1")
    assert r.returncode != 0
    assert "config.json" in r.stderr
