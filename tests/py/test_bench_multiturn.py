"""bench/multiturn.py (the prefix cache's multi-turn benchmark) at smoke size on the CPU backend and
the tiny model: it runs with the cache and without, prints a table per concurrency level, and its
numbers hold what the cache promises: no cached tokens without it; with it, from turn 2 on, at
least 95% of the tokens the template makes reusable (issue 14's target) are served from the cache.
Two conversations run in lockstep: every turn is sent after both finished the previous turn's
probe, every probe after both turns were answered; the server's queue / prefill split (/metrics)
is read at every barrier, per turn for the turns and for the probes. Timings are not checked (no
timed tests), only that each phase counted its requests. --in-context runs `tulip bench` per level
and turn with the turn's new tokens after its cached ones (the yardstick of a perfect cache)."""
import json
import os
import subprocess
import sys

import pytest

from srv_util import MODEL, ROOT, TOKENIZER


@pytest.mark.parametrize("binary", ["cpu"])
def test_multiturn_smoke(tmp_path, binary):
    out = tmp_path / "mt.json"
    serve = (f"--model {MODEL} --tokenizer {TOKENIZER} --allow-test-shape --backend cpu "
             "--threads 1 --ctx 2048 --max-seqs 4")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "multiturn.py"),
                        "--bin", os.path.join(ROOT, "build", binary, "tulip"), "--serve-args", serve,
                        "--sys-tokens", "150", "--turn-tokens", "20", "--gen", "6", "--turns", "3",
                        "--convs", "1 2", "--in-context", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("| turn | prompt tokens | TTFT cached ms") == 2
    assert r.stdout.count("new tokens in context ms | cached - in context ms |") == 2
    res = json.loads(out.read_text())
    for level in ("1", "2"):
        on, off = res["on"][level], res["off"][level]
        assert len(on) == len(off) == 3 * int(level)
        assert all(x["cached_tokens"] == 0 for x in off)
        for x in on:
            assert x["ttft_s"] > 0 and x["prompt_tokens"] > x["reusable_tokens"]
            if x["turn"] >= 2:
                assert x["cached_tokens"] >= 0.95 * x["reusable_tokens"] > 0, x
                # the fresh prompt of the turn's new tokens alone: within 5% (or 8 tokens)
                new = x["prompt_tokens"] - x["cached_tokens"]
                assert x["fresh_ttft_s"] > 0 and abs(x["fresh_tokens"] - new) <= max(8, new // 20), x
    assert r.stdout.count("| turn | cached: queue ms | cached: prefill ms |") == 2
    for level in ("1", "2"):  # the server's split from /metrics, one row a turn
        split = res["split_on"][level]
        assert [p["turn"] for p in split] == [1, 2, 3]
        for p in split:
            assert p["cached"]["requests"] == int(level), p  # the turn's requests, no probe
            assert p["cached"]["queue_ms"] >= 0 and p["cached"]["prefill_ms"] > 0, p
            if p["turn"] == 1:
                assert p["alone"] is None, p  # nothing cached yet: no probe
            else:
                assert p["alone"]["requests"] == int(level) and p["alone"]["prefill_ms"] > 0, p
    for mode in ("on", "off"):  # lockstep at 2 conversations
        rows = res[mode]["2"]
        for t in (1, 2, 3):
            cur = [x for x in rows if x["turn"] == t]
            assert len(cur) == 2
            assert min(x["fresh_sent_s"] for x in cur) >= max(x["answered_s"] for x in cur), cur
            if t > 1:
                prev = [x for x in rows if x["turn"] == t - 1]
                assert min(x["sent_s"] for x in cur) >= max(x["done_s"] for x in prev), (prev, cur)
    yard = res["in_context"]  # the yardstick: every level and turn from 2 on, sized from the turn
    assert sorted(yard) == ["1 2", "1 3", "2 2", "2 3"], yard
    for key, y in yard.items():
        level, turn = (int(x) for x in key.split())
        on = [x for x in res["on"][str(level)] if x["turn"] == turn]
        new = sum(x["prompt_tokens"] - x["cached_tokens"] for x in on) / len(on)
        ctx = sum(x["cached_tokens"] for x in on) / len(on)
        assert abs(y["new"] - new) <= 1 and abs(y["context"] - ctx) <= 1 and y["ms"] > 0, (key, y)
