"""bench/structured.sh (issue 16's constrained-decoding speed protocol) at smoke size on the CPU
backend and the tiny model: it serves, runs tools/loadtest.py unconstrained and with
bench/structured_schema.json at each client count, and prints both rows per count with 0 errors
and the ratio table. Timings are not checked (no timed tests): only the plumbing."""
import json
import os
import re
import subprocess

from srv_util import MODEL, ROOT, TOKENIZER


def test_structured_bench_smoke(tmp_path):
    env = dict(os.environ, BIN=os.path.join(ROOT, "build", "cpu", "tulip"), MODEL=MODEL,
               TOKENIZER=TOKENIZER, DURATION="2", MAX_TOKENS="24", PROMPT_WORDS="8",
               LEVELS="1 4", OUT=str(tmp_path))
    r = subprocess.run(["bash", os.path.join(ROOT, "bench", "structured.sh"), "--allow-test-shape",
                        "--backend", "cpu", "--threads", "1"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = re.findall(r"^\| (\d+) \| (unconstrained|json_schema) \| (\d+) \| (\d+) \|.*\| ([0-9.]+) \|$",
                      r.stdout, re.M)
    assert sorted((n, m) for n, m, *_ in rows) == \
        [("1", "json_schema"), ("1", "unconstrained"), ("4", "json_schema"), ("4", "unconstrained")]
    for n, m, reqs, errs, tok_s in rows:
        assert int(errs) == 0 and int(reqs) >= 1 and float(tok_s) > 0, (n, m)
    ratios = re.findall(r"^\| (\d+) \| ([0-9.]+) \|$", r.stdout, re.M)
    assert [n for n, _ in ratios] == ["1", "4"] and all(float(q) > 0 for _, q in ratios)
    for n in ("1", "4"):
        res = json.loads((tmp_path / f"n{n}-schema.json").read_text())
        assert res["response_format"] == "json_schema" and res["errors"] == 0
        # ignore_eos: every request is MAX_TOKENS long, constrained or not
        assert res["output_tokens"] == 24 * res["requests"]
        free = json.loads((tmp_path / f"n{n}-free.json").read_text())
        assert free["response_format"] == "text" and free["output_tokens"] == 24 * free["requests"]
