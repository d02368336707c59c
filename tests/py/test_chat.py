"""tulip's C chat template (src/tokenizer/chat.c) against the Jinja reference (chat_ref.py: jinja2
set up as Hugging Face's apply_chat_template sets it up), over tests/data/chat/cases.jsonl
(hand-written edge cases + seeded random conversations, tools/gen_chat_cases.py). Every case must
render to identical bytes, or fail in both; where the template itself raises, with the same
message. All cases go through one `tulip prompt --batch` process."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chat_ref  # noqa: E402

ROOT = chat_ref.ROOT
CASES = os.path.join(ROOT, "tests", "data", "chat", "cases.jsonl")
TULIP = os.environ.get("TULIP_BIN", os.path.join(ROOT, "build", "cpu", "tulip"))


def load_cases():
    with open(CASES, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_batch(cases, extra_args=()):
    data = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases).encode("utf-8")
    p = subprocess.run([TULIP, "prompt", "--batch", "-", *extra_args], input=data, capture_output=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    out = [json.loads(line) for line in p.stdout.decode("utf-8").splitlines()]
    assert len(out) == len(cases)
    return out


@pytest.fixture(scope="module")
def template():
    return chat_ref.load_template()


def test_corpus_is_reproducible():
    """The committed corpus is what the seeded generator writes."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import gen_chat_cases
    with open(CASES, encoding="utf-8") as f:
        assert f.read() == gen_chat_cases.render_lines()
    # tests/cpu/test_chat.c's expected renders are the current jinja2 reference's
    with open(gen_chat_cases.EXPECTED, encoding="utf-8") as f:
        assert f.read() == gen_chat_cases.expected_lines()


def test_corpus_matches_jinja(template):
    cases = load_cases()
    assert len(cases) >= 100
    got = run_batch(cases)
    diffs, n_ok, n_raise, n_err = [], 0, 0, 0
    for case, res in zip(cases, got):
        kind, want = chat_ref.render(template, case)
        if kind == "ok":
            n_ok += 1
            if res.get("prompt") != want:
                diffs.append((case["name"], "prompt differs", want, res))
        elif kind == "raise":
            n_raise += 1
            if res.get("error") != want:
                diffs.append((case["name"], "template raised", want, res))
        else:
            n_err += 1
            if "error" not in res:
                diffs.append((case["name"], "jinja failed", want, res))
    print("chat corpus: %d cases compared (%d rendered, %d template errors, %d type errors), %d differences"
          % (len(cases), n_ok, n_raise, n_err, len(diffs)))
    for name, why, want, res in diffs[:5]:
        print("--", name, why, "\nwant:", repr(want), "\ngot: ", repr(res))
    assert not diffs, "%d of %d cases differ (first: %s)" % (len(diffs), len(cases), diffs[0][0])
    assert n_ok >= 100 and n_raise >= 8


def test_fresh_random_conversations(template):
    """More seeded random conversations, generated at test time (not committed): same check."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import random
    import gen_chat_cases
    r = random.Random(7)
    cases = [gen_chat_cases.rand_conversation(r, i) for i in range(600)]
    got = run_batch(cases)
    n_diff = 0
    for case, res in zip(cases, got):
        kind, want = chat_ref.render(template, case)
        key = "prompt" if kind == "ok" else "error"
        if key not in res or (kind != "error" and res[key] != want):
            n_diff += 1
    print("fresh random conversations: %d compared, %d differences" % (len(cases), n_diff))
    assert n_diff == 0


def test_cli_single_case(template, tmp_path):
    """`tulip prompt --messages/--tools` and its flags print exactly the reference, no newline."""
    case = next(c for c in load_cases() if c["name"] == "reasoning_after_last_query")
    (tmp_path / "m.json").write_text(json.dumps(case["messages"]), encoding="utf-8")
    (tmp_path / "t.json").write_text(json.dumps(case["tools"]), encoding="utf-8")
    for flags, et, pt, ag in [([], True, False, True), (["--no-thinking"], False, False, True),
                              (["--preserve-thinking", "--no-generation-prompt"], True, True, False)]:
        p = subprocess.run([TULIP, "prompt", "--messages", str(tmp_path / "m.json"), "--tools",
                            str(tmp_path / "t.json"), *flags], capture_output=True, timeout=30)
        assert p.returncode == 0, p.stderr
        kind, want = chat_ref.render(template, dict(case, enable_thinking=et, preserve_thinking=pt,
                                                    add_generation_prompt=ag))
        assert kind == "ok"
        assert p.stdout.decode("utf-8") == want


def test_cli_object_file_and_stdin(template, tmp_path):
    """--messages also takes {"messages": [...], "tools": [...]}, and "-" reads stdin."""
    case = next(c for c in load_cases() if c["name"] == "tool_calls_multiple")
    body = json.dumps({"messages": case["messages"], "tools": case["tools"]}).encode()
    (tmp_path / "c.json").write_bytes(body)
    kind, want = chat_ref.render(template, case)
    assert kind == "ok"
    for args, stdin in [(["--messages", str(tmp_path / "c.json")], None), (["--messages", "-"], body)]:
        p = subprocess.run([TULIP, "prompt", *args], input=stdin, capture_output=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert p.stdout.decode("utf-8") == want


def test_cli_template_error(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps([{"role": "assistant", "content": "x"}]), encoding="utf-8")
    p = subprocess.run([TULIP, "prompt", "--messages", str(tmp_path / "m.json")], capture_output=True, timeout=30)
    assert p.returncode != 0
    assert p.stdout == b""
    assert "No user query found in messages." in p.stderr.decode()
