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


# ---- the option parser on `tulip run` (src/cli/opts.c): both spellings, usage errors ----

def greedy_args(fixture, equals):
    """The greedy reference run's arguments, each value as `--opt=value` (and -nN) or separate."""
    ref = load_file(os.path.join(ROOT, "tests/data", fixture, "ref.safetensors"))
    prompt = ",".join(str(int(i)) for i in ref["prompt_ids"])
    want = [int(i) for i in ref["decode_ids"]]
    pairs = [("--model", f"tests/data/{fixture}"), ("--prompt-ids", prompt), ("--temperature", "0"),
             ("--backend", "cpu"), ("--threads", "1")]
    args = [f"{k}={v}" for k, v in pairs] if equals else [x for kv in pairs for x in kv]
    args += [f"-n{len(want)}"] if equals else ["-n", str(len(want))]
    return args + ["--allow-test-shape", "--print-ids", "--ignore-eos"], want


@pytest.mark.parametrize("binary", BINS)
def test_run_equals_form_matches_hf(binary):
    """`--opt=value` and `-nN` parse as `--opt value` and `-n N`: both reproduce the HF tokens."""
    for equals in (False, True):
        args, want = greedy_args("tiny-a", equals)
        r = run(binary, "run", *args)
        assert r.returncode == 0, (equals, r.stderr)
        assert [int(t) for t in r.stdout.split()] == want, equals


def test_run_equals_form_sampling_same_stream():
    """Sampling options (floats, ints, a 64-bit seed) read the same in both spellings: one seeded
    sampled stream, token for token."""
    opts = [("--temperature", "0.9"), ("--top-k", "40"), ("--top-p", "0.9"), ("--min-p", "0.01"),
            ("--seed", "18446744073709551615"), ("--presence-penalty", "0.5"),
            ("--frequency-penalty", "-0.5"), ("--repetition-penalty", "1.2")]
    base = ["--model", "tests/data/tiny-a", "--allow-test-shape", "--prompt-ids", "1,2,3", "-n", "24",
            "--print-ids", "--ignore-eos", "--threads", "1"]
    a = run("build/cpu/tulip", "run", *base, *[x for kv in opts for x in kv])
    b = run("build/cpu/tulip", "run", *base, *[f"{k}={v}" for k, v in opts])
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert len(a.stdout.split()) == 24
    assert a.stdout == b.stdout


def test_run_text_prompt_keeps_given_top_k():
    """-p without --temperature takes the model card's sampling, but an option given on the command
    line stays: --top-k 1 samples the argmax every step, i.e. the greedy answer."""
    base = ["--model", "tests/data/tiny-a", "--allow-test-shape", "-p", "Hello, who are you?", "-n", "24",
            "--ignore-eos", "--threads", "1", "--print-ids"]
    greedy = run("build/cpu/tulip", "run", *base, "--temperature", "0")
    top1 = run("build/cpu/tulip", "run", *base, "--top-k", "1", "--seed", "7")
    assert greedy.returncode == 0 and top1.returncode == 0, greedy.stderr + top1.stderr
    assert len(greedy.stdout.split()) >= 24
    assert top1.stdout == greedy.stdout


@pytest.mark.parametrize("args, message", [
    (["--no-such-option"], "unknown option '--no-such-option'"),
    (["--no-such-option=3"], "unknown option '--no-such-option'"),
    (["-x"], "unknown option '-x'"),
    (["--temp", "0"], "unknown option '--temp' (did you mean --temperature?)"),
    (["-n", "abc"], "bad value 'abc' for -n: expected an integer"),
    (["-n=5"], "bad value '=5' for -n"),
    (["-n", "-1"], "bad value '-1' for -n"),
    (["--temperature", "hot"], "bad value 'hot' for --temperature"),
    (["--temperature=2.5"], "bad value '2.5' for --temperature: expected a number from 0 to 2"),
    (["--top-p", "nan"], "bad value 'nan' for --top-p"),
    (["--top-k", "5x"], "bad value '5x' for --top-k"),
    (["--seed", "-1"], "bad value '-1' for --seed"),
    (["--seed", "18446744073709551616"], "bad value '18446744073709551616' for --seed"),
    (["--ctx", "99999999999"], "bad value '99999999999' for --ctx"),
    (["--backend", "gpu"], "bad value 'gpu' for --backend: expected one of cpu cuda auto"),
    (["--print-ids=1"], "--print-ids takes no value"),
    (["stray"], "unexpected argument 'stray'"),
    (["-p", "hi"], "give --prompt-ids or -p, not both"),
    (["-n"], "-n needs a value"),
])
def test_run_usage_errors_exit_2(args, message):
    """A usage error exits 2 with one message naming the option and the bad value, before any
    model is loaded (no 'loaded' line on stderr)."""
    r = run("build/cpu/tulip", "run", "--model", "tests/data/tiny-a", "--allow-test-shape", "--prompt-ids",
            "1,2", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert "loaded" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("args, message", [
    ([], "--model DIR is required"),
    (["--model", "tests/data/tiny-a"], "--prompt-ids or -p is required"),
])
def test_run_missing_required_exit_2(args, message):
    r = run("build/cpu/tulip", "run", *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.parametrize("binary", BINS)
def test_run_stops_at_the_context(binary):
    """A sequence never holds more than --ctx tokens: a 4-token prompt with --ctx 8 gives exactly
    4 tokens (the first 4 of the unlimited run) and exits 0."""
    ref = load_file(os.path.join(ROOT, "tests/data/tiny-a/ref.safetensors"))
    prompt = [int(i) for i in ref["prompt_ids"]][:4]
    args = ["run", "--model", "tests/data/tiny-a", "--allow-test-shape", "--prompt-ids",
            ",".join(map(str, prompt)), "-n", "10", "--temperature", "0", "--print-ids",
            "--ignore-eos"]
    full = run(binary, *args)
    cut = run(binary, *args, "--ctx", "8")
    assert full.returncode == 0 and cut.returncode == 0, cut.stderr
    assert len(full.stdout.split()) == 10
    assert cut.stdout.split() == full.stdout.split()[:4]
