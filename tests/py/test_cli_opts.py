"""The option parser of every `tulip` subcommand (src/cli/opts.c) and its generated help.

Each subcommand's --help exits 0 and lists the options the repository's callers use (the Makefile
demo, tests/py, tools/, bench/, tests/gpu/ scripts: the lists below are that interface, written out
here, not read from the binary), and exactly the TL_* environment switches the source reads that
reach the subcommand: the switches are found by scanning src/ for "TL_..." string literals (the
getenv names), so a switch added or renamed in the code without its help line fails here. An
unknown option or a bad value is a usage error: exit 2, a message naming the option and the value.
`--opt=value` reads as `--opt value` in every subcommand."""
import os
import re
import signal
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINS = [b for b in ("build/cpu/tulip", "build/asan/tulip") if os.path.exists(os.path.join(ROOT, b))]
TULIP = os.path.join(ROOT, "build/cpu/tulip")
MODEL = "tests/data/tiny-a"
TOKENIZER = "tests/data/tiny-tokenizer/tokenizer.json"

OPTIONS = {
    "run": ["-m", "--model", "--prompt-ids", "-p", "--prompt", "-n", "--temperature", "--top-k", "--top-p",
            "--min-p", "--seed", "--presence-penalty", "--frequency-penalty", "--repetition-penalty",
            "--print-ids", "--system", "--no-thinking", "--raw", "--tokenizer", "--ignore-eos",
            "--dump-logits", "--backend", "--threads", "--ctx", "--allow-test-shape",
            "--speculative-tokens"],
    "chat": ["-m", "--model", "--tokenizer", "--system", "--no-thinking", "--hide-thinking", "-n",
             "--temperature", "--top-k", "--top-p", "--min-p", "--presence-penalty", "--seed", "--ctx",
             "--backend", "--threads", "--allow-test-shape", "--no-prefix-cache"],
    "serve": ["--model", "--tokenizer", "--served-model-name", "--host", "--port", "--api-key",
              "--max-seqs", "--ctx", "--kv-tokens", "--queue", "--step-tokens", "--gather-us",
              "--max-body", "--max-conns", "--drain-timeout", "--idle-timeout", "--trace",
              "--keepalive", "--backend", "--threads",
              "--allow-test-shape", "--random-weights", "--weight-bits", "--seed", "--test-mode",
              "--prefix-cache-gb", "--no-prefix-cache", "--prefix-snap-every", "--device"],
    "bench": ["--random-weights", "--bits", "--seed", "--model", "--lengths", "--gen", "--repeats", "--json",
              "--prof", "--ops", "--allow-test-shape"],
    "info": ["--model", "--allow-test-shape"],
    "tokenize": ["--tokenizer", "--decode", "--batch", "--split-special", "--skip-special", "--count",
                 "--bench"],
    "prompt": ["--messages", "--tools", "--batch", "--no-thinking", "--preserve-thinking",
               "--no-generation-prompt"],
    "quantize": ["--in", "--out", "--bits", "--group", "--shard-gb"],
}

# Which subcommands run the code of each source directory that may read a TL_* switch.
ENGINE = {"run", "chat", "serve", "bench"}
DIR_CMDS = {"cuda": ENGINE, "engine": ENGINE, "cpu": ENGINE, "model": ENGINE | {"info", "quantize"},
            "server": {"serve"}, "tokenizer": {"run", "chat", "serve", "tokenize", "prompt"},
            "common": set(OPTIONS)}


def tl_switches_in_source():
    """{switch name: set of subcommands} from the "TL_NAME" literals of src/ (outside src/cli)."""
    found = {}
    for d in sorted(os.listdir(os.path.join(ROOT, "src"))):
        if d == "cli":
            continue
        for dirpath, _, files in os.walk(os.path.join(ROOT, "src", d)):
            for f in files:
                if not f.endswith((".c", ".h", ".cu", ".cuh")):
                    continue
                text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                for name in re.findall(r'"(TL_[A-Z0-9_]+)"', text):
                    assert d in DIR_CMDS, f"src/{d} reads {name}: say here which subcommands run src/{d}"
                    found.setdefault(name, set()).update(DIR_CMDS[d])
    return found


def tulip(*args, binary=TULIP, **kw):
    kw.setdefault("timeout", 60)
    return subprocess.run([os.path.join(ROOT, binary), *args], cwd=ROOT, capture_output=True, text=True, **kw)


def test_source_has_the_known_switches():
    """The scan finds the switches the code had when this test was written (a guard on the scan)."""
    found = tl_switches_in_source()
    assert len(found) >= 5 and "TL_CUDA_SYNC" in found and "TL_NORM_CHECK" in found, sorted(found)
    assert found["TL_CUDA_SYNC"] == ENGINE
    assert found["TL_NORM_CHECK"] == ENGINE | {"info", "quantize"}


HELP_COL = 32  # where every option's and switch's help text starts


def help_sections(out):
    """(option lines, environment lines) of a --help output."""
    opts = out.split("\noptions:\n")[1].split("\n\n")[0].splitlines()
    env = out.split("\nenvironment (TL_* switches read by this command):\n")[1].splitlines()
    return opts, env


def option_names(line):
    """The spellings of the option a help line describes: ["-m", "--model"], ["-n"], ..."""
    m = re.match(r"^  (?:(-\w)(?:, | |$))?\s*(--[a-z][a-z0-9-]*)?", line)
    return [n for n in m.groups() if n]


@pytest.mark.parametrize("binary", BINS)
@pytest.mark.parametrize("cmd", sorted(OPTIONS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_options_and_switches(binary, cmd, flag):
    r = tulip(cmd, flag, binary=binary)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: tulip {cmd} "), r.stdout
    opts, env = help_sections(r.stdout)
    listed = [n for line in opts for n in option_names(line)]
    missing = [o for o in OPTIONS[cmd] + ["--help", "-h"] if o not in listed]
    assert not missing, f"tulip {cmd} --help lacks {missing}:\n{r.stdout}"
    assert len(listed) == len(set(listed)), listed
    shown = [re.match(r"^  (TL_[A-Z0-9_]+)", line).group(1) for line in env if line.startswith("  TL_")]
    want = sorted(n for n, cmds in tl_switches_in_source().items() if cmd in cmds)
    assert sorted(shown) == want, "\n".join(env)
    if not want:
        assert env == ["  (none: no TL_* switch affects this command)"]


def test_help_one_line_each():
    """Each option and each switch is one line: its name, then its help from the same column."""
    for cmd in OPTIONS:
        opts, env = help_sections(tulip(cmd, "--help").stdout)
        lines = opts + [e for e in env if e.startswith("  TL_")]
        for i, line in enumerate(lines):
            if line.startswith(" " * HELP_COL):  # the help of a name too long for the column
                prev = lines[i - 1].rstrip()
                assert i > 0 and option_names(prev) and len(prev) >= HELP_COL - 1, (prev, line)
                assert line[HELP_COL] != " ", line
                continue
            assert option_names(line) or line.startswith("  TL_"), line
            if len(line.rstrip()) >= HELP_COL - 1 and i + 1 < len(lines) and \
                    lines[i + 1].startswith(" " * HELP_COL):
                continue  # e.g. --default-chat-template-kwargs JSON: its help on the next line
            assert len(line) > HELP_COL and line[HELP_COL - 1] == " " and line[HELP_COL] != " ", line


@pytest.mark.parametrize("binary", BINS)
@pytest.mark.parametrize("cmd", sorted(OPTIONS))
def test_unknown_option_exits_2(binary, cmd):
    for arg in ("--no-such-option", "--no-such-option=1", "-Z", "positional"):
        r = tulip(cmd, arg, binary=binary)
        assert r.returncode == 2, (cmd, arg, r.stderr)
        name = arg.split("=")[0]
        assert f"tulip {cmd}: " in r.stderr and f"'{name}'" in r.stderr, r.stderr
        assert r.stdout == ""


@pytest.mark.parametrize("cmd, args, option, value", [
    ("chat", ["--model", MODEL, "-n", "many"], "-n", "many"),
    ("chat", ["--model", MODEL, "--top-k=1.5"], "--top-k", "1.5"),
    ("chat", ["--model", MODEL, "--backend", "tpu"], "--backend", "tpu"),
    ("serve", ["--model", MODEL, "--port", "70000"], "--port", "70000"),
    ("serve", ["--model", MODEL, "--port=http"], "--port", "http"),
    ("serve", ["--model", MODEL, "--max-seqs", "-4"], "--max-seqs", "-4"),
    ("serve", ["--model", MODEL, "--kv-tokens", "1e9"], "--kv-tokens", "1e9"),
    ("serve", ["--model", MODEL, "--drain-timeout", "inf"], "--drain-timeout", "inf"),
    ("serve", ["--model", MODEL, "--max-body", "-1"], "--max-body", "-1"),
    ("serve", ["--model", MODEL, "--device", "-1"], "--device", "-1"),
    ("serve", ["--model", MODEL, "--device", "gpu1"], "--device", "gpu1"),
    ("serve", ["--random-weights", "--weight-bits", "8"], "--weight-bits", "8"),
    ("bench", ["--random-weights", "--gen", "0"], "--gen", "0"),
    ("bench", ["--random-weights", "--repeats=17"], "--repeats", "17"),
    ("bench", ["--random-weights", "--bits", "3"], "--bits", "3"),
    ("bench", ["--random-weights", "--lengths", "256,4x"], "--lengths", "256,4x"),
    ("bench", ["--random-weights", "--lengths", "0"], "--lengths", "0"),
    ("bench", ["--random-weights", "--seed", "1.5"], "--seed", "1.5"),
    ("quantize", ["--in", MODEL, "--out", "/nonexistent/q", "--group", "big"], "--group", "big"),
    ("quantize", ["--in", MODEL, "--out", "/nonexistent/q", "--shard-gb=-1"], "--shard-gb", "-1"),
])
def test_bad_value_exits_2_naming_option_and_value(cmd, args, option, value):
    r = tulip(cmd, *args)
    assert r.returncode == 2, r.stderr
    assert f"bad value '{value}' for {option}: expected " in r.stderr, r.stderr


@pytest.mark.parametrize("cmd, args, message", [
    ("chat", [], "--model DIR is required"),
    ("serve", [], "--model DIR is required"),
    ("bench", [], "--random-weights or --model DIR is required"),
    ("info", [], "--model DIR is required"),
    ("tokenize", [], "--tokenizer PATH is required"),
    ("prompt", [], "--messages FILE.json"),
    ("quantize", ["--in", MODEL], "--in and --out are required"),
    ("serve", ["--model"], "--model needs a value"),
    ("serve", ["--model", MODEL, "--backend", "cpu", "--device", "1"],
     "--device 1: the CPU backend has no devices (only 0)"),
    ("info", ["--model", MODEL, "--allow-test-shape=yes"], "--allow-test-shape takes no value"),
])
def test_missing_or_malformed_exits_2(cmd, args, message):
    r = tulip(cmd, *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_bench_options_parse_before_the_backend():
    """A CPU-only build parses bench's options (so --help and errors work) and then says it has no
    CUDA backend."""
    r = tulip("bench", "--random-weights", "--bits=16", "--lengths=256,4K", "--gen=8", "--repeats=1", "--json")
    assert r.returncode == 2 and "no CUDA backend" in r.stderr, r.stderr


def test_info_equals_form():
    a = tulip("info", "--model", MODEL, "--allow-test-shape")
    b = tulip("info", f"--model={MODEL}", "--allow-test-shape")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    strip = lambda s: re.sub(r"opened in [0-9.]+ s", "", s)  # noqa: E731
    assert "hidden 64" in a.stdout and strip(a.stdout) == strip(b.stdout)


def test_tokenize_equals_form():
    text = "Hello, world! 123"
    a = tulip("tokenize", "--tokenizer", TOKENIZER, input=text)
    b = tulip("tokenize", f"--tokenizer={TOKENIZER}", input=text)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert len(a.stdout.split()) > 3 and a.stdout == b.stdout
    back = tulip("tokenize", f"--tokenizer={TOKENIZER}", "--decode", input=a.stdout)
    assert back.returncode == 0 and back.stdout == text


def test_prompt_equals_form(tmp_path):
    (tmp_path / "m.json").write_text('[{"role": "user", "content": "Hi"}]')
    a = tulip("prompt", "--messages", str(tmp_path / "m.json"), "--no-thinking")
    b = tulip("prompt", f"--messages={tmp_path / 'm.json'}", "--no-thinking")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and "<|im_start|>user\nHi<|im_end|>" in a.stdout


def test_chat_equals_form():
    """One greedy turn through `tulip chat`, options in both spellings: the same answer."""
    common = ["--allow-test-shape", "--no-thinking"]
    spaced = ["--model", MODEL, "--tokenizer", TOKENIZER, "--backend", "cpu", "--threads", "1", "-n", "6",
              "--temperature", "0", "--ctx", "512"]
    joined = [f"--model={MODEL}", f"--tokenizer={TOKENIZER}", "--backend=cpu", "--threads=1", "-n6",
              "--temperature=0", "--ctx=512"]
    a = tulip("chat", *spaced, *common, input="Hello\n")
    b = tulip("chat", *joined, *common, input="Hello\n")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout.strip() and a.stdout == b.stdout


def test_chat_reuses_turns():
    """Three greedy turns of `tulip chat`: with the prefix cache (turns 2 and 3 start from the
    snapshot the turn before left at the end of its last message) the same answers as with
    --no-prefix-cache, and the cache reports reused prompt tokens."""
    args = ["--model", MODEL, "--tokenizer", TOKENIZER, "--backend", "cpu", "--threads", "1", "-n", "6",
            "--temperature", "0", "--ctx", "512", "--allow-test-shape", "--no-thinking"]
    lines = "Hello\nTell me more\nAnd more\n"
    a = tulip("chat", *args, input=lines)
    b = tulip("chat", *args, "--no-prefix-cache", input=lines)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and a.stdout.count("\n") >= 3
    m = re.search(r"prefix cache: (\d+) of (\d+) prompt tokens reused", a.stderr)
    assert m and 0 < int(m.group(1)) < int(m.group(2)), a.stderr
    assert "reused" not in b.stderr


def test_quantize_equals_form(tmp_path):
    """tulip quantize with --opt=value writes the same checkpoint as with --opt value."""
    outs = []
    for form, d in (("spaced", tmp_path / "a"), ("joined", tmp_path / "b")):
        args = (["--in", MODEL, "--out", str(d), "--bits", "4", "--group", "32"] if form == "spaced" else
                [f"--in={MODEL}", f"--out={d}", "--bits=4", "--group=32"])
        r = tulip("quantize", *args, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append({f: open(d / f, "rb").read() for f in sorted(os.listdir(d))})
    assert "config.json" in outs[0] and outs[0] == outs[1]
    assert b'"group_size": 32' in outs[0]["config.json"] or b'"group_size":32' in outs[0]["config.json"]


def test_serve_equals_form():
    """tulip serve takes its options as --opt=value: it starts on the port asked (0: any) with the
    name asked, which /v1/models reports."""
    import json
    import urllib.request
    p = subprocess.Popen([TULIP, "serve", f"--model={MODEL}", f"--tokenizer={TOKENIZER}", "--allow-test-shape",
                          "--backend=cpu", "--threads=1", "--port=0", "--served-model-name=opts-test",
                          "--max-seqs=2", "--ctx=256", "--queue=0"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for _ in range(50):
            line = p.stdout.readline()
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, p.stderr.read() if p.poll() is not None else "no listening line"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as resp:
            ids = [m["id"] for m in json.load(resp)["data"]]
        assert ids == ["opts-test"]
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    assert p.returncode == 0


def test_serve_device_without_cuda_is_an_error_at_startup():
    """--device N > 0 when the backend chosen is the CPU one (a CPU-only build picks it for the
    test-shape model): the load fails at startup with a message naming the device, exit 1, no
    server left running."""
    p = subprocess.run([TULIP, "serve", f"--model={MODEL}", f"--tokenizer={TOKENIZER}",
                        "--allow-test-shape", "--threads=1", "--port=0", "--device", "2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert "device 2: the CPU backend has no devices (only 0)" in p.stderr, p.stderr
    assert "listening on" not in p.stdout
