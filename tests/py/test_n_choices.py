"""Issue 15 item 1: several choices (`n`) and several prompts per request (docs/api.md §6), against
a live `tulip serve` (CPU backend, tests/data/tiny-a, plain and ASan builds) driven by the official
openai client.

Expected values come from definitions and references, never from the server: choice indices and
their order (OpenAI/vLLM: prompt_index * n + i), prompt token counts from Hugging Face tokenizers
on the same tokenizer.json and the jinja2 reference renderer (chat_ref.py), completion token counts
from max_tokens with ignore_eos, prefix-cache hits from the snapshot rule of docs/architecture.md
§4.1 (the end of the last message, or one token before the end of an identical completions
prompt) and reproducibility/distinctness from the seed + index rule."""
import json
import random

import openai
import pytest
from tokenizers import Tokenizer

import chat_ref
from srv_util import BINARIES, TOKENIZER, Server, sanitizer_report

TOK = Tokenizer.from_file(TOKENIZER)
MODEL_NAME = "tiny-a"
USER = [{"role": "user", "content": "Hello there"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


def ids(text):
    return TOK.encode(text, add_special_tokens=False).ids


def chat_count(messages, add_generation_prompt=True):
    status, prompt = chat_ref.render(chat_ref.load_template(), {
        "messages": messages, "enable_thinking": False,
        "add_generation_prompt": add_generation_prompt})
    assert status == "ok"
    return len(ids(prompt))


@pytest.fixture(scope="module", params=sorted(BINARIES))
def srv(request):
    s = Server(BINARIES[request.param], "--test-mode", "--ctx", "1024", "--max-seqs", "8")
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def chat(client, n, **kw):
    extra = dict(NO_THINK, **kw.pop("extra_body", {}))
    return client.chat.completions.create(model=MODEL_NAME, messages=kw.pop("messages", USER),
                                          n=n, extra_body=extra, **kw)


def texts(r):
    return [c.message.content for c in r.choices]


def test_n3_sampled_distinct_and_reproducible(client):
    a = chat(client, 3, temperature=1.0, seed=1234, max_tokens=12)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert len(set(texts(a))) == 3, texts(a)  # three RNG streams (seed + i)
    b = chat(client, 3, temperature=1.0, seed=1234, max_tokens=12)
    assert texts(b) == texts(a)
    # choice i is the stream seed + i: choice 1 of seed s is choice 0 of seed s + 1
    c = chat(client, 1, temperature=1.0, seed=1235, max_tokens=12)
    assert c.choices[0].message.content == a.choices[1].message.content
    for ch in a.choices:
        assert ch.finish_reason in ("stop", "length")


def test_stream_reassembles_to_non_stream(client):
    kw = dict(temperature=1.0, seed=99, max_tokens=10)
    ref = chat(client, 3, **kw)
    chunks = list(chat(client, 3, stream=True, stream_options={"include_usage": True}, **kw))
    got, fins = ["", "", ""], [None, None, None]
    for ch in chunks:
        for c in ch.choices:
            got[c.index] += c.delta.content or ""
            if c.finish_reason:
                assert fins[c.index] is None  # one finish per choice
                fins[c.index] = c.finish_reason
    assert got == texts(ref)
    assert fins == [c.finish_reason for c in ref.choices]
    assert chunks[-1].usage.completion_tokens == ref.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == ref.usage.prompt_tokens


def test_greedy_choices_identical(client):
    r = chat(client, 2, temperature=0, max_tokens=8)
    assert len(r.choices) == 2 and texts(r)[0] == texts(r)[1]
    lp = chat(client, 2, temperature=0, max_tokens=4, logprobs=True, top_logprobs=2)
    assert all(c.logprobs and len(c.logprobs.content) >= 1 for c in lp.choices)


def test_chat_usage_counts_prompt_once(client):
    n, m = 3, 5
    r = chat(client, n, max_tokens=m, temperature=0.7, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == chat_count(USER)  # the prompt once, not n times
    assert r.usage.completion_tokens == n * m
    assert r.usage.total_tokens == r.usage.prompt_tokens + n * m


def test_completions_several_prompts(client):
    prompts = ["Hello", "The cat sat", "Once upon"]
    n, m = 2, 4
    r = client.completions.create(model=MODEL_NAME, prompt=prompts, n=n, max_tokens=m,
                                  temperature=0, echo=True, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == list(range(len(prompts) * n))
    for k, c in enumerate(r.choices):
        p = prompts[k // n]
        assert c.text.startswith(p), (k, c.text)  # echo per prompt
        single = client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=m,
                                           temperature=0, extra_body={"ignore_eos": True})
        assert c.text == p + single.choices[0].text
    assert r.usage.prompt_tokens == sum(len(ids(p)) for p in prompts)
    assert r.usage.completion_tokens == len(prompts) * n * m
    # token-id prompts, streamed: every chunk carries its choice's index
    tok_prompts = [ids(p) for p in prompts]
    got = [""] * len(prompts)
    for ch in client.completions.create(model=MODEL_NAME, prompt=tok_prompts, max_tokens=m,
                                        temperature=0, stream=True,
                                        extra_body={"ignore_eos": True}):
        for c in ch.choices:
            got[c.index] += c.text
    assert got == [c.text[len(p):] for c, p in zip(r.choices[::n], prompts)]


def test_limits_refused(srv):
    for body, param in (({"messages": USER, "n": 17}, "n"), ({"messages": USER, "n": 0}, "n")):
        st, b = srv.post_json("/v1/chat/completions", dict(body, model=MODEL_NAME))
        assert st == 400 and b["error"]["param"] == param, b
    st, b = srv.post_json("/v1/completions",
                          {"model": MODEL_NAME, "prompt": ["a"] * 65})
    assert st == 400 and b["error"]["param"] == "prompt", b
    st, b = srv.post_json("/v1/completions",
                          {"model": MODEL_NAME, "prompt": ["a"] * 9, "n": 16})
    assert st == 400 and b["error"]["param"] == "n", b
    st, b = srv.post_json("/v1/completions", {"model": MODEL_NAME, "prompt": "a", "best_of": 2})
    assert st == 400 and b["error"]["param"] == "best_of", b
    st, b = srv.post_json("/v1/completions", {"model": MODEL_NAME, "prompt": ["a", [1, 2]],
                                              "echo": True})
    assert st == 400 and b["error"]["param"] == "echo", b


def test_failed_choice_fails_request(srv, client):
    with pytest.raises(openai.InternalServerError):
        chat(client, 3, max_tokens=8, extra_body={"tulip_test_fail_after": 2})
    stream = chat(client, 3, max_tokens=8, stream=True, extra_body={"tulip_test_fail_after": 2})
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    srv.wait_metric("tulip_running_sequences", lambda v: v == 0)
    assert len(chat(client, 2, max_tokens=2).choices) == 2


def test_cancelled_stream_frees_every_job(srv, client):
    stream = chat(client, 4, max_tokens=900, stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    for _ in range(6):
        next(it)
    assert srv.metrics()["tulip_running_sequences"] > 0
    stream.close()
    srv.wait_metric("tulip_running_sequences", lambda v: v == 0, timeout=20)
    srv.wait_metric("tulip_queue_depth", lambda v: v == 0)
    assert len(chat(client, 2, max_tokens=2).choices) == 2


def hit_tokens(srv):
    return srv.metrics()["tulip_prefix_cache_hit_tokens_total"]


def test_chat_n4_prefills_once(srv, client):
    rnd = random.Random(15)
    system = " ".join(rnd.choice(["alpha", "beta", "gamma", "delta", "omega"]) for _ in range(80))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Go"}]
    snap = chat_count(msgs, add_generation_prompt=False)  # the end of the last message
    h0 = hit_tokens(srv)
    r = chat(client, 4, messages=msgs, max_tokens=2)
    assert r.usage.prompt_tokens == chat_count(msgs)
    assert hit_tokens(srv) - h0 == 3 * snap  # choices 1..3 restored the first one's snapshot


def test_completions_identical_prompt_prefills_once(srv, client):
    rnd = random.Random(16)
    prompt = " ".join(rnd.choice(["red", "green", "blue", "cyan"]) for _ in range(60))
    n_prompt = len(ids(prompt))
    h0 = hit_tokens(srv)
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, n=4, max_tokens=2)
    assert r.usage.prompt_tokens == n_prompt
    assert hit_tokens(srv) - h0 == 3 * (n_prompt - 1)  # all but the last prompt token


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = ("Let me look.</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n</function>\n</tool_call>")


def test_per_choice_stop_reasoning_and_tool_calls(client):
    # a scripted output (every choice emits it): each choice parses its own stop string...
    kw = dict(stop=["STOP"], extra_body={"tulip_test_script": ids("Hello STOP world")})
    r = chat(client, 2, **kw)
    assert texts(r) == ["Hello ", "Hello "] and [c.finish_reason for c in r.choices] == ["stop"] * 2
    got = ["", ""]
    for ch in chat(client, 2, stream=True, **kw):
        for c in ch.choices:
            got[c.index] += c.delta.content or ""
    assert got == ["Hello ", "Hello "]
    # ... and its own reasoning and tool call, with distinct call ids
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, n=3, tools=TOOLS,
                                       extra_body={"tulip_test_script": ids(CALL)})
    assert [c.finish_reason for c in r.choices] == ["tool_calls"] * 3
    for c in r.choices:
        assert c.message.reasoning_content == "Let me look."
        (tc,) = c.message.tool_calls
        assert tc.function.name == "get_weather" and json.loads(tc.function.arguments) == {"city": "Paris"}
    assert len({c.message.tool_calls[0].id for c in r.choices}) == 3
    names, fins = {}, {}
    for ch in client.chat.completions.create(model=MODEL_NAME, messages=USER, n=3, tools=TOOLS,
                                             stream=True,
                                             extra_body={"tulip_test_script": ids(CALL)}):
        for c in ch.choices:
            for d in c.delta.tool_calls or []:
                if d.function.name:
                    names[c.index] = d.function.name
            if c.finish_reason:
                fins[c.index] = c.finish_reason
    assert names == {0: "get_weather", 1: "get_weather", 2: "get_weather"}
    assert fins == {0: "tool_calls", 1: "tool_calls", 2: "tool_calls"}
