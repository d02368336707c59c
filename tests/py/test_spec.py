"""Speculative decoding end to end (docs/architecture.md §3.6): `tulip serve` on the tiny model
with an MTP head (tests/data/tiny-mtp), with --speculative-tokens 3 and without (the reference),
CPU backend, plain and ASan builds, driven by the official openai client.

Greedy outputs are identical to the reference: text, token logprobs and top logprobs, finish
reason and completion token counts, for several max_tokens (never exceeded), with stop strings
(cut at the same place), with several requests in flight at once (sequences drafting and
prefilling in one step), and on chat turns that hit the prefix cache (which still draft).
/metrics counts drafted and accepted tokens under vLLM's names on the speculating server only.
The head's random weights rarely agree with the trunk, so these runs mostly exercise the
rejection path; the accept path is covered bit for bit by tests/cpu/test_spec.c."""
import concurrent.futures
import os
import re

import pytest

from srv_util import BINARIES, ROOT, Server, sanitizer_report

MODEL = os.path.join(ROOT, "tests", "data", "tiny-mtp")
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
PROMPTS = ["The quick brown fox", "Once upon a time", "def main():", "1, 2, 3,"]


@pytest.fixture(scope="module", params=sorted(BINARIES))
def pair(request):
    common = ("--model", MODEL, "--ctx", "1024", "--max-seqs", "4")
    spec = Server(BINARIES[request.param], *common, "--speculative-tokens", "3")
    plain = Server(BINARIES[request.param], *common)
    yield spec, plain
    for s in (spec, plain):
        rc, err = s.stop()
        assert rc == 0, err[-3000:]
        assert sanitizer_report(err) is None, err[-5000:]


def complete(srv, prompt, **kw):
    r = srv.client().completions.create(model="tiny-mtp", prompt=prompt, temperature=0, **kw)
    c = r.choices[0]
    lp = c.logprobs
    return (c.text, c.finish_reason, r.usage.completion_tokens,
            lp and (lp.tokens, lp.token_logprobs, lp.top_logprobs))


def test_startup_line(pair):
    spec, plain = pair
    assert "speculative decoding: up to 3 draft tokens per step" in spec.stderr()
    assert "speculative decoding" not in plain.stderr()


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 17, 40])
def test_greedy_equal(pair, max_tokens):
    spec, plain = pair
    for p in PROMPTS:
        a = complete(spec, p, max_tokens=max_tokens, logprobs=3)
        b = complete(plain, p, max_tokens=max_tokens, logprobs=3)
        assert a == b, (p, a, b)
        assert a[2] <= max_tokens


def test_stop_strings(pair):
    spec, plain = pair
    for p in PROMPTS:
        full = complete(plain, p, max_tokens=30)[0]
        if len(full) < 8:
            continue
        stop = full[len(full) // 2: len(full) // 2 + 2]
        a = complete(spec, p, max_tokens=30, stop=[stop])
        b = complete(plain, p, max_tokens=30, stop=[stop])
        assert a == b
        assert a[1] == "stop" and stop not in a[0]


def test_concurrent(pair):
    spec, plain = pair
    jobs = [(p, m) for p in PROMPTS for m in (7, 25)]

    def run(srv):
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            return list(ex.map(lambda a: complete(srv, a[0], max_tokens=a[1], logprobs=2), jobs))

    assert run(spec) == run(plain)


def drafted(srv):
    return sum(v for k, v in srv.metrics().items()
               if k.startswith("vllm:spec_decode_num_draft_tokens_total"))


def test_chat_turns_with_prefix_cache(pair):
    """Turns 2 and 3 start from the prefix cache and still draft (the head's rows come back
    with the snapshot), with the plain server's output."""
    spec, plain = pair
    outs = []
    for srv in (spec, plain):
        c = srv.client()
        msgs = [{"role": "system", "content": "You answer briefly. " * 8},
                {"role": "user", "content": "Hello there"}]
        texts = []
        for turn in range(3):
            d0 = drafted(spec)
            r = c.chat.completions.create(model="tiny-mtp", messages=msgs, temperature=0,
                                          max_tokens=10, extra_body=NO_THINK)
            texts.append((r.choices[0].message.content, r.usage.completion_tokens))
            if srv is spec and turn > 0:
                assert r.usage.prompt_tokens_details.cached_tokens > 0
                if r.usage.completion_tokens > 1:
                    assert drafted(spec) > d0, f"turn {turn + 1}: a cache hit did not draft"
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "And then?"}]
        outs.append(texts)
    assert outs[0] == outs[1]


def test_metrics(pair):
    spec, plain = pair
    complete(spec, PROMPTS[0], max_tokens=20)
    m = spec.metrics()
    drafted = [v for k, v in m.items() if k.startswith("vllm:spec_decode_num_draft_tokens_total")]
    accepted = [v for k, v in m.items()
                if k.startswith("vllm:spec_decode_num_accepted_tokens_total")]
    drafts = [v for k, v in m.items() if k.startswith("vllm:spec_decode_num_drafts_total")]
    assert drafted and drafted[0] > 0
    assert accepted and 0 <= accepted[0] <= drafted[0]
    assert drafts and drafts[0] > 0 and drafted[0] <= 3 * drafts[0]
    per_pos = {k: v for k, v in m.items()
               if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total{")}
    assert sorted(re.search(r'position="(\d)"', k)[1] for k in per_pos) == ["0", "1", "2"]
    vals = [per_pos[k] for k in sorted(per_pos, key=lambda k: re.search(r'position="(\d)"', k)[1])]
    assert sum(vals) == accepted[0] and vals[0] >= vals[1] >= vals[2] >= 0
    assert not any(k.startswith("vllm:spec_decode") for k in plain.metrics())
