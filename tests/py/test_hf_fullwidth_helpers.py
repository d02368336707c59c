"""tools/hf_fullwidth.py's pure helpers without torch: seed lists, NMSE, the per-mode verdicts
against the transformers-bf16 yardstick (issue 13) and the output table. Inputs are seeded random
logits with noise of an exactly known NMSE; expected verdicts follow from the bounds written in
the script's docstring (2x transformers-bf16's NMSE, floor 1e-4; decode path 1e-4; near-ties)."""
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import hf_fullwidth as hf  # noqa: E402

V, STEPS = 2000, 6


def ref_case(seed=0):
    """Reference logits [STEPS, V] with a clear top-1 (margin 10) at every step, and its tokens."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((STEPS, V)).astype(np.float32)
    toks = [int(x) for x in rng.integers(0, V, STEPS)]
    for s, t in enumerate(toks):
        ref[s, t] = ref[s].max() + 10.0
    return ref, toks


def noisy(ref, target, seed):
    """ref + noise whose NMSE against ref is exactly target (per row, in float64)."""
    rng = np.random.default_rng(seed)
    out = np.empty(ref.shape, np.float64)
    for s in range(ref.shape[0]):
        r = ref[s].astype(np.float64)
        n = rng.standard_normal(r.shape)
        n *= math.sqrt(target * (r * r).sum() / (n * n).sum())
        out[s] = r + n
    return out


def test_parse_seeds():
    assert hf.parse_seeds("1,2,3,5,7,11,13,21") == [1, 2, 3, 5, 7, 11, 13, 21]
    assert hf.parse_seeds(" 13 ") == [13]
    for bad in ("", "1,,2", "a", "1,1", "-3", "1.5", "2,"):
        with pytest.raises(ValueError):
            hf.parse_seeds(bad)


def test_nmse_hand_worked():
    assert hf.nmse([3, 5], [3, 4]) == pytest.approx(1 / 25)
    assert hf.nmse([0, 0], [1, 1]) == pytest.approx(1.0)
    assert hf.top2_margin([1.0, 4.0, 2.5]) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        hf.nmse([1, 2], [0, 0])


def test_noisy_helper_hits_target():
    ref, _ = ref_case()
    got = noisy(ref, 3e-3, 1)
    for s in range(STEPS):
        assert hf.nmse(got[s], ref[s]) == pytest.approx(3e-3, rel=1e-9)


@pytest.mark.parametrize("kind", ["gemm", "tc"])
def test_relative_bound_after_prompt(kind):
    ref, toks = ref_case()
    hfl = noisy(ref, 1e-2, 2)
    ok, rows, _ = hf.evaluate(kind, noisy(ref, 1.9e-2, 3), toks, ref, toks, hfl, STEPS)
    assert ok and rows[0]["result"] == "PASS" and rows[0]["ratio"] == pytest.approx(1.9, rel=1e-6)
    ok, rows, _ = hf.evaluate(kind, noisy(ref, 2.1e-2, 3), toks, ref, toks, hfl, STEPS)
    assert not ok and rows[0]["point"] == "after the prompt" and rows[0]["result"] == "FAIL"


def test_relative_bound_floor_is_the_decode_bound():
    ref, toks = ref_case()
    hfl = noisy(ref, 1e-7, 2)
    assert hf.evaluate("gemm", noisy(ref, 9e-5, 3), toks, ref, toks, hfl, STEPS)[0]
    assert not hf.evaluate("gemm", noisy(ref, 1.1e-4, 3), toks, ref, toks, hfl, STEPS)[0]


def test_decode_path_absolute_bound_and_worst_step():
    ref, toks = ref_case()
    hfl = noisy(ref, 1e-2, 2)  # the yardstick does not loosen the decode path
    got = noisy(ref, 5e-5, 3)
    ok, rows, summ = hf.evaluate("decode", got, toks, ref, toks, hfl, STEPS)
    assert ok and [r["result"] for r in rows] == ["PASS", "PASS", "PASS"]
    assert summ["worst_nmse"] == pytest.approx(5e-5, rel=1e-6)
    got[3] = noisy(ref[3:4], 2e-4, 4)[0]
    ok, rows, _ = hf.evaluate("decode", got, toks, ref, toks, hfl, STEPS)
    assert not ok
    assert rows[1]["point"] == "step 3 (worst of 1..5)" and rows[1]["result"] == "FAIL"
    assert rows[1]["tulip"] == pytest.approx(2e-4, rel=1e-6)


def test_decode_steps_bounded_on_tc_not_on_gemm():
    ref, toks = ref_case()
    hfl = noisy(ref, 1e-3, 2)
    got = noisy(ref, 1e-3, 3)
    got[4] = noisy(ref[4:5], 3e-3, 5)[0]  # 3x transformers-bf16 at step 4
    ok, rows, _ = hf.evaluate("tc", got, toks, ref, toks, hfl, STEPS)
    assert not ok and rows[1]["point"].startswith("step 4 ") and rows[1]["result"] == "FAIL"
    assert rows[1]["ratio"] == pytest.approx(3.0, rel=1e-6)
    ok, rows, _ = hf.evaluate("gemm", got, toks, ref, toks, hfl, STEPS)
    assert ok and rows[1]["result"] == "info"


def tie_case():
    """Step 0 of the reference at a near-tie (margin 0.01) that tulip's logits swap."""
    ref, toks = ref_case()
    a, b = toks[0], (toks[0] + 1) % V
    ref[0, b] = ref[0, a] - 0.01
    got = noisy(ref, 1e-6, 3)
    got[0, a], got[0, b] = ref[0, a], ref[0, a] + 0.01
    got_toks = list(toks)
    got_toks[0] = b
    return ref, toks, got, got_toks


def test_top1_swap_at_a_tie_transformers_bf16_cannot_resolve():
    ref, toks, got, got_toks = tie_case()
    hfl = noisy(ref, 1e-2, 2)  # largest |error| far above the 0.01 margin
    ok, rows, summ = hf.evaluate("gemm", got, got_toks, ref, toks, hfl, STEPS)
    assert ok, rows
    assert rows[0]["top1"].startswith("tulip no (near-tie") and summ["first_divergence"] == 0
    assert rows[-1]["point"] == "greedy tokens" and rows[-1]["result"] == "PASS"
    # a yardstick that resolves the tie: the swap is a failure
    ok, rows, _ = hf.evaluate("gemm", got, got_toks, ref, toks, noisy(ref, 1e-12, 2), STEPS)
    assert not ok and rows[0]["result"] == "FAIL" and rows[-1]["result"] == "FAIL"
    # the decode path: no error measured before step 0, so a split there always fails
    assert not hf.evaluate("decode", got, got_toks, ref, toks, hfl, STEPS)[0]


def test_greedy_split_later_only_at_a_near_tie():
    ref, toks = ref_case()
    a, b = toks[3], (toks[3] + 7) % V
    ref[3, b] = ref[3, a] - 1e-3  # a near-tie at step 3
    got = noisy(ref, 5e-5, 3)  # rms error ~0.007 per logit: the largest is well above 1e-3
    got_toks = list(toks)
    got_toks[3] = b
    hfl = noisy(ref, 1e-2, 2)
    ok, rows, summ = hf.evaluate("decode", got, got_toks, ref, toks, hfl, STEPS)
    assert summ["first_divergence"] == 3 and summ["noise"] > 1e-3
    assert ok and rows[-1]["result"] == "PASS" and "near-tie" in rows[-1]["top1"]
    assert rows[1]["point"].endswith("(worst of 1..3)")  # compared up to the split
    ref[3, b] = ref[3, a] - 5.0  # a clear margin: the split is a failure
    ok, rows, _ = hf.evaluate("decode", got, got_toks, ref, toks, hfl, STEPS)
    assert not ok and rows[-1]["result"] == "FAIL"


def test_short_token_list_fails():
    ref, toks = ref_case()
    hfl = noisy(ref, 1e-2, 2)
    ok, rows, _ = hf.evaluate("gemm", noisy(ref, 1e-3, 3), toks[:4], ref, toks, hfl, STEPS)
    assert not ok and rows[-1]["result"] == "FAIL"


def test_table_and_summary():
    rows = [{"seed": 13, "mode": "bf16 gemm-path prefill", "point": "after the prompt", "tulip": 1.25e-2,
             "hf": 1.0e-2, "ratio": 1.25, "top1": "tulip yes, hf yes", "result": "PASS"},
            {"seed": 13, "mode": "4-bit tensor-core decode", "point": "greedy tokens", "tulip": None,
             "hf": None, "ratio": None, "top1": "identical 32/32", "result": "PASS"},
            {"seed": 21, "mode": "bf16 gemm-path prefill", "point": "after the prompt", "tulip": 3e-3,
             "hf": 0.0, "ratio": math.inf, "top1": "tulip yes, hf yes", "result": "FAIL"}]
    lines = hf.format_table(rows).splitlines()
    assert lines[0] == ("| seed | mode | point | tulip NMSE | hf-bf16 NMSE | ratio | top-1 agree | "
                        "result |")
    assert len(lines) == 2 + len(rows) and all(l.count("|") == 9 for l in lines)
    assert lines[2] == ("| 13 | bf16 gemm-path prefill | after the prompt | 1.250e-02 | 1.000e-02 | "
                        "1.25 | tulip yes, hf yes | PASS |")
    assert lines[3].split("|")[4:7] == [" - ", " - ", " - "]
    assert "| inf |" in lines[4]
    assert hf.summary_line(rows[:2], [13]) == "PASS hf_fullwidth: 2 rows, none failed (seeds 13)"
    s = hf.summary_line(rows, [13, 21])
    assert s.startswith("FAIL hf_fullwidth: 1 of 3 rows failed (seeds 13,21): seed 21 bf16")
    assert hf.summary_line([], [1]).startswith("FAIL")


def test_rows_from_a_real_run_format():
    ref, toks = ref_case()
    ok, rows, _ = hf.evaluate("tc", noisy(ref, 1e-3, 3), toks, ref, toks, noisy(ref, 1e-3, 2), STEPS)
    assert ok and [r["point"] for r in rows] == ["after the prompt", rows[1]["point"], "greedy tokens"]
    table = hf.format_table([{"seed": 1, "mode": "bf16 tensor-core decode", **r} for r in rows])
    assert table.count("PASS") == 3
