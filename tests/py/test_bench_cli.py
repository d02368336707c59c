"""`tulip bench` end to end on the CPU backend (src/cli/bench.c through tl_engine_step; CI has no
GPU), in the plain and the ASan+UBSan build: the markdown table's rows and columns parse, the speeds
are positive, `--batch B` reports the aggregate of B sequences (ms per step = 1000 x B / tok/s), the
header names the sampling settings, which are the server's defaults (docs/model.md §6: the model
card's thinking row, or temperature / top_k / top_p of the checkpoint's generation_config.json)
unless --greedy is given, and bad options exit 2 with a message.

The expected sampling values are the model card's (docs/model.md §6) and the ones this test writes
into a generation_config.json; that they reach tl_engine_step is shown by a generation config the
engine must refuse (top_p 0), which fails the bench unless --greedy replaces it."""
import json
import math
import os
import re
import subprocess
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINS = [b for b in ("build/cpu/tulip", "build/asan/tulip") if os.path.exists(os.path.join(ROOT, b))]
MODEL = "tests/data/tiny-a"
# the brief's command: a test-shape model on the CPU backend, one short length
BASE = ["--model", MODEL, "--allow-test-shape", "--backend", "cpu", "--lengths", "8", "--gen", "4",
        "--repeats", "1"]
COLUMNS = ["ctx", "prefill tok/s", "prefill TFLOP/s", "decode tok/s", "decode GB/s"]
MODEL_CARD = "temperature 1, top-k 20, top-p 0.95, min-p 0, presence penalty 1.5, frequency penalty 0, " \
             "repetition penalty 1"
GREEDY = "temperature 0, top-k 0, top-p 1, min-p 0, presence penalty 0, frequency penalty 0, " \
         "repetition penalty 1"


def bench(*args, binary="build/cpu/tulip"):
    return subprocess.run([os.path.join(ROOT, binary), "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def parse(stdout):
    """(the line above the table, header cells, {ctx: {column: cell}}) of a bench table."""
    lines = stdout.splitlines()
    table = [ln for ln in lines if ln.startswith("|")]
    assert len(table) >= 3 and lines.index(table[0]) >= 1, stdout
    above = lines[lines.index(table[0]) - 2]
    assert lines[lines.index(table[0]) - 1] == "", stdout
    cells = lambda ln: [c.strip() for c in ln.strip().strip("|").split("|")]  # noqa: E731
    head = cells(table[0])
    assert all(re.fullmatch(r"-+:", c) for c in cells(table[1])) and len(cells(table[1])) == len(head)
    rows = {}
    for ln in table[2:]:
        c = cells(ln)
        assert len(c) == len(head), (ln, head)
        rows[c[0]] = dict(zip(head, c))
    return above, head, rows


@pytest.mark.parametrize("binary", BINS)
def test_batch1_table(binary):
    r = bench(*BASE, binary=binary)
    assert r.returncode == 0, r.stderr
    above, head, rows = parse(r.stdout)
    assert head[:5] == COLUMNS and head[5] == "% of HBM (no GPU)" and len(head) == 6, head
    assert above.startswith("batch 1 on the cpu backend, 4 decode steps; sampling: "), above
    assert list(rows) == ["8", "mean"]
    row = rows["8"]
    assert float(row["prefill tok/s"]) > 0 and float(row["decode tok/s"]) > 0
    assert row["decode GB/s"] == "" and row["% of HBM (no GPU)"] == ""  # no GPU: no bytes or ceiling
    assert rows["mean"]["prefill tok/s"] == row["prefill tok/s"]
    assert rows["mean"]["decode tok/s"] == row["decode tok/s"]


@pytest.mark.parametrize("binary", BINS)
def test_batch3_aggregates(binary):
    r = bench(*BASE[:5], "--lengths", "8,16", "--gen", "4", "--repeats", "2", "--batch", "3", binary=binary)
    assert r.returncode == 0, r.stderr
    above, head, rows = parse(r.stdout)
    assert head[:5] == COLUMNS and head[6:] == ["decode ms/step"], head
    assert above.startswith("batch 3 on the cpu backend, 4 decode steps; "), above
    assert list(rows) == ["8", "16", "mean"]
    for ctx in ("8", "16"):
        tps, ms = float(rows[ctx]["decode tok/s"]), float(rows[ctx]["decode ms/step"])
        assert tps > 0 and ms > 0
        # aggregate: 3 tokens per step, so one step takes 3 / (tok/s) seconds (cells rounded)
        assert math.isclose(ms, 3000.0 / tps, rel_tol=2e-3), (tps, ms)
        assert rows[ctx]["decode GB/s"] == ""
    mean = lambda col: (float(rows["8"][col]) + float(rows["16"][col])) / 2  # noqa: E731
    for col in ("prefill tok/s", "decode tok/s", "decode ms/step"):
        assert math.isclose(float(rows["mean"][col]), mean(col), rel_tol=0, abs_tol=0.06), col


@pytest.mark.parametrize("binary", BINS)
def test_speculative(binary):
    """--speculative-tokens on the tiny model with an MTP head: the caption gives the acceptance
    and tokens per step per length (at least 1: the sample; at most 1 + K), the JSON the same
    fields; a model without a head runs with speculation off, said on stderr."""
    args = ["--model", "tests/data/tiny-mtp", *BASE[2:5], "--lengths", "8,16", "--gen", "12",
            "--repeats", "1", "--speculative-tokens", "2"]
    r = bench(*args, binary=binary)
    assert r.returncode == 0, r.stderr
    above, head, rows = parse(r.stdout)
    assert head[6:] == ["decode ms/step"], head
    m = re.search(r"12 decode tokens per sequence \(speculative decoding, 2 MTP draft tokens a step; "
                  r"drafts accepted / tokens per step and sequence: 8: ([0-9.]+)% / ([0-9.]+), "
                  r"16: ([0-9.]+)% / ([0-9.]+)\); sampling: ", above)
    assert m, above
    for acc, per in ((m[1], m[2]), (m[3], m[4])):
        assert 0 <= float(acc) <= 100 and 1 <= float(per) <= 3
    j = json.loads(bench(*args, "--json", binary=binary).stdout)
    assert j["speculative_tokens"] == 2
    assert all(0 <= row["spec_acceptance"] <= 1 and 1 <= row["spec_tokens_per_step"] <= 3
               for row in j["rows"])
    for row in j["rows"]:  # per draft position; the overall rate lies between the two
        p1, p2 = row["spec_acceptance_per_pos"]
        assert 0 <= p2 <= 1 and 0 <= p1 <= 1
        assert min(p1, p2) - 1e-4 <= row["spec_acceptance"] <= max(p1, p2) + 1e-4
    assert re.search(r"speculation: .*accepted by draft position: 1: [0-9.]+% 2: [0-9.]+%",
                     r.stderr), r.stderr
    r = bench(*BASE, "--speculative-tokens", "2", binary=binary)
    assert r.returncode == 0 and "speculative decoding off: the checkpoint has no MTP head" in r.stderr
    assert "decode steps" in parse(r.stdout)[0]


def test_batch_json():
    r = bench(*BASE, "--batch", "3", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["backend"] == "cpu" and j["batch"] == 3 and j["greedy"] is False
    assert j["gpu_hbm_gbps"] is None and j["weights_gb"] is None
    assert [row["ctx"] for row in j["rows"]] == [8]
    row = j["rows"][0]
    assert row["gen_tps"] > 0 and row["prefill_tps"] > 0 and row["gen_gbps"] is None
    assert math.isclose(row["gen_ms_per_step"], 3000.0 / row["gen_tps"], rel_tol=2e-3)
    assert j["sampling"] == {"temperature": 1, "top_k": 20, "top_p": 0.95, "min_p": 0, "presence_penalty": 1.5,
                             "frequency_penalty": 0, "repetition_penalty": 1}


def sampling_of(r):
    assert r.returncode == 0, r.stderr
    return parse(r.stdout)[0].split("; sampling: ", 1)[1]


def model_copy(tmp_path, genconfig):
    """tiny-a's config and weights in a new directory, with genconfig (a dict, or None: no file)."""
    d = tmp_path / "model"
    d.mkdir()
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join(ROOT, MODEL, f), d / f)
    if genconfig is not None:
        (d / "generation_config.json").write_text(json.dumps(genconfig))
    return str(d)


def test_default_sampling_is_the_servers():
    # tiny-a's generation_config.json holds the model card's temperature, top_k and top_p
    assert sampling_of(bench(*BASE)) == f"the server's defaults (the checkpoint's generation_config.json): " \
                                        f"{MODEL_CARD}"


def test_default_sampling_without_generation_config(tmp_path):
    args = ["--model", model_copy(tmp_path, None)] + BASE[2:]
    assert sampling_of(bench(*args)) == f"the server's defaults (the model card's): {MODEL_CARD}"


def test_generation_config_replaces_temperature_top_k_top_p(tmp_path):
    d = model_copy(tmp_path, {"temperature": 0.6, "top_k": 5, "top_p": 0.8, "eos_token_id": 287})
    want = "temperature 0.6, top-k 5, top-p 0.8, min-p 0, presence penalty 1.5, frequency penalty 0, " \
           "repetition penalty 1"
    assert sampling_of(bench("--model", d, *BASE[2:])).endswith(f"generation_config.json): {want}")


def test_greedy_header():
    assert sampling_of(bench(*BASE, "--greedy")) == f"greedy (--greedy: argmax, no penalties): {GREEDY}"
    assert sampling_of(bench(*BASE, "--greedy", "--batch", "2")) == \
        f"greedy (--greedy: argmax, no penalties): {GREEDY}"


def test_sampling_reaches_the_engine_step(tmp_path):
    """A generation config the server would take but the engine refuses (top_p 0): the bench's steps
    fail with the engine's message; --greedy does not use it and runs."""
    d = model_copy(tmp_path, {"temperature": 1.0, "top_k": 20, "top_p": 0.0})
    r = bench("--model", d, *BASE[2:])
    assert r.returncode == 1 and "prefill at 8: batch entry 0: top_p is not in (0, 1]" in r.stderr, r.stderr
    assert bench("--model", d, *BASE[2:], "--greedy").returncode == 0


@pytest.mark.parametrize("args, message", [
    (["--batch", "0"], "bad value '0' for --batch: expected an integer from 1 to 1024"),
    (["--batch", "1025"], "bad value '1025' for --batch: expected an integer from 1 to 1024"),
    (["--batch", "two"], "bad value 'two' for --batch"),
    (["--batch", "3", "--max-seqs", "2"], "--batch 3 needs 3 sequence slots, but --max-seqs is 2"),
    (["--ops"], "--ops needs the CUDA backend"),
    (["--prof"], "--prof needs the CUDA backend"),
    (["--prof-prefill"], "--prof-prefill needs the CUDA backend"),
    (["--profile-range", "prefill"], "--profile-range needs the CUDA backend"),
    (["--profile-range", "decode", "--gen", "2"], "--gen must be at least 3"),
    (["--profile-range", "both"], "bad value 'both' for --profile-range"),
    (["--random-weights"], "give --random-weights or --model DIR, not both"),
])
def test_bad_options_exit_2(args, message):
    r = bench(*BASE, *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert r.stdout == ""


def test_batch_within_max_seqs_runs():
    r = bench(*BASE, "--batch", "2", "--max-seqs", "3")
    assert r.returncode == 0, r.stderr
    assert parse(r.stdout)[0].startswith("batch 2 on the cpu backend")


def test_context_before_the_prompt():
    """--context P: each sequence holds P tokens (prefilled untimed) before its timed prompt, the
    yardstick of a turn after a cached prefix (issue 14); the header and the JSON say so."""
    r = bench(*BASE[:5], "--lengths", "16", "--context", "40", "--gen", "3", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    above, head, rows = parse(r.stdout)
    assert "each prompt after 40 tokens of context (prefilled untimed)" in above, above
    assert list(rows) == ["16", "mean"] and float(rows["16"]["prefill tok/s"]) > 0
    r = bench(*BASE[:5], "--lengths", "16", "--context", "40", "--gen", "3", "--repeats", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["context"] == 40 and out["rows"][0]["ctx"] == 16 and out["rows"][0]["prefill_tps"] > 0
    assert json.loads(bench(*BASE, "--json").stdout)["context"] == 0


def test_prefill_together():
    """--prefill-together: the --batch prompts (after their --context) in one timed step; prefill
    tok/s counts all of their tokens; the header and the JSON say so."""
    args = (*BASE[:5], "--lengths", "8", "--context", "5", "--batch", "3", "--prefill-together",
            "--gen", "2", "--repeats", "1")
    r = bench(*args)
    assert r.returncode == 0, r.stderr
    above, head, rows = parse(r.stdout)
    assert "each prompt after 5 tokens of context" in above and \
        "the 3 prompts prefilled together in one timed step" in above, above
    assert float(rows["8"]["prefill tok/s"]) > 0 and float(rows["8"]["decode tok/s"]) > 0
    out = json.loads(bench(*args, "--json").stdout)
    assert out["prefill_together"] is True and out["batch"] == 3 and out["rows"][0]["prefill_tps"] > 0
    assert json.loads(bench(*BASE, "--json").stdout)["prefill_together"] is False


def test_context_beyond_the_models_context_exit_2():
    max_pos = json.load(open(os.path.join(ROOT, MODEL, "config.json")))["text_config"]["max_position_embeddings"]
    r = bench(*BASE[:5], "--lengths", "8", "--context", str(max_pos - 8), "--gen", "4", "--repeats", "1")
    assert r.returncode == 2, r.stderr
    assert (f"--lengths up to 8 with --gen 4 and --context need a context of {max_pos + 5} tokens; "
            f"this model allows {max_pos}") in r.stderr, r.stderr


def test_lengths_beyond_the_models_context_exit_2():
    max_pos = json.load(open(os.path.join(ROOT, MODEL, "config.json")))["text_config"]["max_position_embeddings"]
    r = bench(*BASE[:5], "--lengths", str(max_pos), "--gen", "4", "--repeats", "1")
    assert r.returncode == 2, r.stderr
    assert f"need a context of {max_pos + 5} tokens; this model allows {max_pos}" in r.stderr, r.stderr


def test_spec_curve_script():
    """bench/spec_curve.sh on the tiny MTP model: the cost table has K = 0 and each K asked, with
    each phase's time, and the curve one row per acceptance rate whose tok/s grow with the rate
    (more tokens a step at the same measured cost)."""
    env = dict(os.environ, TULIP="build/cpu/tulip", LEN="16", GEN="6", KS="1 3",
               ARGS="--model tests/data/tiny-mtp --allow-test-shape --backend cpu")
    r = subprocess.run(["bash", "bench/spec_curve.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if re.match(r"^\| [0-9]", ln)]
    cost = [[c.strip() for c in ln.strip("|").split("|")] for ln in rows[:3]]
    assert [c[0] for c in cost] == ["0", "1", "3"]
    for c in cost[1:]:
        draft, fwd, acc, step = (float(x) for x in c[1:5])
        assert draft > 0 and fwd > 0 and acc >= 0 and step > 0, c
    curve = [[c.strip() for c in ln.strip("|").split("|")] for ln in rows[3:]]
    assert [c[0] for c in curve] == ["0.50", "0.60", "0.70", "0.75", "0.80", "0.90"]
    for k in (1, 2):
        tps = [float(c[k].split()[0]) for c in curve]
        assert all(b > a for a, b in zip(tps, tps[1:])), tps
    assert "plain decode:" in r.stdout


def test_env_ab_script():
    """bench/env_ab.sh on the tiny model (CPU): one row per variant in the given order, one
    positive tok/s (ms a step) cell per round, the best equal to the largest round; the same for
    METRIC=prefill (tok/s and ms of the prompt, which agree with its length); a variant whose
    bench fails is named on stderr and reads "failed" while the others still get their numbers
    (exit status 1); a binary that does not exist fails every variant; no VARIANTS and an
    unknown METRIC are usage errors."""
    env = dict(os.environ, TULIP="build/cpu/tulip", LEN="16", GEN="4", ROUNDS="2",
               VARIANTS="-; TL_GEMV_SLICE=0 TL_MOE_SLICE=0",
               ARGS="--model tests/data/tiny-a --allow-test-shape --backend cpu")
    r = subprocess.run(["bash", "bench/env_ab.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in r.stdout.splitlines()
            if ln.startswith("| -") or ln.startswith("| TL_")]
    assert [c[0] for c in rows] == ["-", "TL_GEMV_SLICE=0 TL_MOE_SLICE=0"]
    for c in rows:
        tps = [float(x.split()[0]) for x in c[1:3]]
        assert all(t > 0 for t in tps), c
        assert float(c[3]) == max(tps), c
    r = subprocess.run(["bash", "bench/env_ab.sh"], cwd=ROOT,
                       env=dict(env, METRIC="prefill", LEN="16,32"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "round 1 prefill tok/s (ms the prompt)" in r.stdout, r.stdout
    heads = [ln for ln in r.stdout.splitlines() if ln.startswith("| variant")]
    assert [h.split("|")[1].strip() for h in heads] == ["variant (ctx 16)", "variant (ctx 32)"]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in r.stdout.splitlines()
            if ln.startswith("| -") or ln.startswith("| TL_")]
    assert len(rows) == 4
    for k, c in enumerate(rows):
        for cell in c[1:3]:
            tps, ms = float(cell.split()[0]), float(cell.split()[1].strip("()"))
            n = 16 if k < 2 else 32
            assert tps > 0 and abs(n / tps * 1000 - ms) <= 0.01 * ms + 0.002, cell
    r = subprocess.run(["bash", "bench/env_ab.sh"], cwd=ROOT, env=dict(env, METRIC="both"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "METRIC must be" in r.stderr, r.stderr
    with tempfile.TemporaryDirectory() as d:
        wrap = os.path.join(d, "tulip")
        with open(wrap, "w") as f:
            f.write('#!/bin/sh\n[ -n "${TL_AB_FAIL:-}" ] && exit 3\nexec %s "$@"\n'
                    % os.path.join(ROOT, "build/cpu/tulip"))
        os.chmod(wrap, 0o755)
        r = subprocess.run(["bash", "bench/env_ab.sh"], cwd=ROOT,
                           env=dict(env, TULIP=wrap, ROUNDS="1", VARIANTS="TL_AB_FAIL=1; -"),
                           capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "env_ab: variant 'TL_AB_FAIL=1' failed" in r.stderr, r.stderr
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in r.stdout.splitlines()
            if ln.startswith("| -") or ln.startswith("| TL_")]
    assert [c[0] for c in rows] == ["TL_AB_FAIL=1", "-"], r.stdout
    assert rows[0][1] == "failed" and float(rows[1][1].split()[0]) > 0, rows
    env["TULIP"] = "build/cpu/no-such-tulip"
    r = subprocess.run(["bash", "bench/env_ab.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "env_ab: variant '-' failed" in r.stderr, r.stderr
    env.pop("VARIANTS")
    r = subprocess.run(["bash", "bench/env_ab.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "set VARIANTS" in r.stderr
