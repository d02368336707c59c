"""End to end: a real `tulip serve` (CPU backend, tests/data/tiny-a, the tiny tokenizer) driven by
the official openai client and raw HTTP, once with the plain build and once with the ASan+UBSan
build (every test is parametrized over both; the sanitizer run fails on any report at shutdown).

A random tiny model never writes </think> or a tool call, so reasoning, tool-call and stop-string
round trips use the test-only `tulip_test_script` request field (honoured only with --test-mode):
the engine still runs the forward pass but emits the given token ids; template, tokenizer,
detokenizer, stop matcher, parser, SSE and client are the real ones. Script ids come from Hugging
Face tokenizers on the same tokenizer.json (the reference, not our BPE)."""
import json
import signal
import socket
import threading
import time

import openai
import pytest
from tokenizers import Tokenizer

from srv_util import BINARIES, TOKENIZER, Server, sanitizer_report

TOK = Tokenizer.from_file(TOKENIZER)
MODEL_NAME = "tiny-a"
EOS = [287, 289]  # <|endoftext|>, <|im_end|> (tiny tokenizer)
USER = [{"role": "user", "content": "Hello there"}]


def ids(text):
    return TOK.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module", params=sorted(BINARIES))
def srv(request, tmp_path_factory):
    trace = str(tmp_path_factory.mktemp("trace") / "trace.jsonl")
    s = Server(BINARIES[request.param], "--test-mode", "--ctx", "2048", "--max-seqs", "16",
               "--queue", "32", "--trace", trace)
    s.trace_path = trace
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


# ---------------------------------------------------------------- basic endpoints

def test_models_health_metrics(srv, client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    st, body = srv.request("GET", "/health")[0], srv.request("GET", "/health")[2]
    assert st == 200 and json.loads(body)["status"] == "ok"
    m = srv.metrics()
    for key in ["tulip_queue_depth", "tulip_running_sequences", "tulip_sessions_active",
                "tulip_kv_usage_ratio", "tulip_generation_tokens_total",
                "tulip_time_to_first_token_seconds_count", "tulip_inter_token_latency_seconds_count"]:
        assert key in m, key
    assert m["tulip_state_slots_total"] == 16
    st, _, body = srv.request("GET", "/nope")
    assert st == 404 and "error" in json.loads(body)
    st, _, body = srv.request("GET", "/v1/chat/completions")
    assert st == 405


# ---------------------------------------------------------------- chat

def test_chat_nonstream_and_usage(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=12,
                                       temperature=0)
    c = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL_NAME
    assert c.finish_reason == "length"
    assert c.message.role == "assistant"
    # Thinking is on by default: a model that never closes </think> produced only reasoning.
    assert r.usage.completion_tokens == 12
    assert r.usage.completion_tokens_details.reasoning_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    # The prompt is the rendered template: <|im_start|>user\nHello there<|im_end|>\n
    # <|im_start|>assistant\n<think>\n, tokenized by the reference tokenizer.
    ref = ids("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert r.usage.prompt_tokens == len(ref)


def test_chat_stream_matches_nonstream(client):
    kw = dict(model=MODEL_NAME, messages=USER, max_tokens=16, temperature=0,
              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True,
                                                 stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 0
    # without include_usage no usage chunk
    plain = list(client.chat.completions.create(stream=True, **kw))
    assert all(ch.choices for ch in plain)


def test_seed_determinism(client):
    kw = dict(model=MODEL_NAME, messages=USER, max_tokens=24, temperature=1.0, top_p=1.0,
              extra_body={"top_k": 0})
    a = client.chat.completions.create(seed=1234, **kw)
    b = client.chat.completions.create(seed=1234, **kw)
    assert a.choices[0].message.reasoning_content == b.choices[0].message.reasoning_content
    others = {client.chat.completions.create(seed=s, **kw).choices[0].message.reasoning_content
              for s in (1, 2, 3)}
    assert len(others | {a.choices[0].message.reasoning_content}) > 1


def test_logprobs(client):
    # presence_penalty 0: logprobs are of the unmodified logits, so only then is the greedy
    # choice their top entry
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=6,
                                       temperature=0, presence_penalty=0, logprobs=True,
                                       top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == 6
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # greedy: the chosen token is the most likely one
        assert abs(t.logprob - tops[0]) < 1e-5


# ---------------------------------------------------------------- scripted output

def scripted(client, text, stream=False, **kw):
    extra = kw.pop("extra_body", {})
    extra["tulip_test_script"] = ids(text)
    return client.chat.completions.create(model=MODEL_NAME, messages=kw.pop("messages", USER),
                                          stream=stream, extra_body=extra, **kw)


def test_reasoning_round_trip(client):
    text = "I think</think>\n\nThe answer"
    r = scripted(client, text)
    m = r.choices[0].message
    assert m.reasoning_content == "I think"
    assert m.content == "The answer"
    assert r.choices[0].finish_reason == "stop"
    n_reason = ids("I think</think>")
    assert r.usage.completion_tokens == len(ids(text)) + 1  # + the EOS that ends the script
    assert r.usage.completion_tokens_details.reasoning_tokens == len(n_reason)
    chunks = list(scripted(client, text, stream=True))
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or ""
                        for ch in chunks if ch.choices)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert reasoning == "I think" and content == "The answer"


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}]
CALL = ("Let me look.</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def test_tool_call_round_trip(client):
    r = scripted(client, CALL, tools=TOOLS)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.reasoning_content == "Let me look."
    assert not c.message.content
    (tc,) = c.message.tool_calls
    assert tc.type == "function" and tc.id.startswith("call_")
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Paris", "days": 3}

    # streaming, as OpenAI streams it: name first (with id), then argument deltas by index
    chunks = list(scripted(client, CALL, stream=True, tools=TOOLS))
    name, args, call_id = None, "", None
    for ch in chunks:
        if not ch.choices or not ch.choices[0].delta.tool_calls:
            continue
        for d in ch.choices[0].delta.tool_calls:
            assert d.index == 0
            if d.id:
                call_id = d.id
            if d.function.name:
                name = d.function.name
            args += d.function.arguments or ""
    assert call_id and name == "get_weather"
    assert json.loads(args) == {"city": "Paris", "days": 3}
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"

    # the result goes back into the history and renders (template tool turn)
    history = USER + [c.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": tc.id, "content": "sunny"}]
    r2 = scripted(client, "It is sunny.", messages=history, tools=TOOLS,
                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r2.choices[0].message.content == "It is sunny."
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens


def test_tool_choice_named_forces_the_call(client):
    """Named tool_choice: once the reasoning is over (here: thinking off, so at once) the server
    forces '<tool_call>\n<function=NAME>\n'; even a random model then produces that call."""
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=USER, tools=TOOLS, max_tokens=40, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    (tc,) = r.choices[0].message.tool_calls
    assert tc.function.name == "get_weather"
    assert isinstance(json.loads(tc.function.arguments), dict)


def test_parallel_tool_calls_false_keeps_first(client):
    two = CALL + "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n" \
                 "</function>\n</tool_call>"
    r = scripted(client, two, tools=TOOLS)
    assert [json.loads(t.function.arguments)["city"] for t in r.choices[0].message.tool_calls] == \
        ["Paris", "Rome"]
    r = scripted(client, two, tools=TOOLS, parallel_tool_calls=False)
    assert [json.loads(t.function.arguments)["city"] for t in r.choices[0].message.tool_calls] == \
        ["Paris"]
    chunks = list(scripted(client, two, stream=True, tools=TOOLS, parallel_tool_calls=False))
    idx = {d.index for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls
           for d in ch.choices[0].delta.tool_calls}
    assert idx == {0}


def test_tool_choice_none_is_plain_text(client):
    r = scripted(client, CALL, tools=TOOLS, tool_choice="none")
    assert r.choices[0].finish_reason == "stop"
    assert not r.choices[0].message.tool_calls
    assert "<tool_call>" in r.choices[0].message.content


def test_stop_strings_never_leak(client):
    # "STOP" is four single-character tokens in the tiny vocabulary: it is split across tokens.
    assert len(ids(" STOP")) >= 4
    kw = dict(stop=["STOP", "zzz"], extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    r = scripted(client, "Hello STOP world", **kw)
    assert r.choices[0].message.content == "Hello "
    assert r.choices[0].finish_reason == "stop"
    chunks = list(scripted(client, "Hello STOP world", stream=True, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "Hello "
    # a partial match that does not complete is released
    r = scripted(client, "a STOx b", **kw)
    assert r.choices[0].message.content == "a STOx b"


def test_trace_file(srv, client):
    r = scripted(client, "Hi there", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    chunks = list(scripted(client, "Yo", stream=True))
    with open(srv.trace_path) as f:
        lines = [json.loads(line) for line in f]
    mine = [x for x in lines if x["id"] == r.id]
    events = [x["event"] for x in mine]
    assert events[:3] == ["request", "prompt", "queued"] and events[-1] == "response"
    assert mine[1]["data"].startswith("<|im_start|>user\nHello there<|im_end|>")
    assert json.loads(mine[-1]["data"])["choices"][0]["message"]["content"] == "Hi there"
    streamed = [x for x in lines if x["id"] == chunks[0].id and x["event"] == "chunk"]
    assert len(streamed) == len(chunks)


# ---------------------------------------------------------------- completions

def test_completions_text_and_ids(srv, client):
    r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=5, temperature=0)
    assert r.object == "text_completion"
    assert r.usage.prompt_tokens == len(ids("Hello")) and r.usage.completion_tokens == 5
    r2 = client.completions.create(model=MODEL_NAME, prompt=ids("Hello"), max_tokens=5,
                                   temperature=0)
    assert r2.choices[0].text == r.choices[0].text
    chunks = list(client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=5,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    r3 = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=3, temperature=0,
                                   logprobs=2)
    assert len(r3.choices[0].logprobs.token_logprobs) == 3
    assert all(len(d) <= 2 for d in r3.choices[0].logprobs.top_logprobs)


# ---------------------------------------------------------------- the context limit

CTX = 64  # --ctx of the `small_ctx` server


@pytest.fixture(scope="module", params=sorted(BINARIES))
def small_ctx(request):
    s = Server(BINARIES[request.param], "--ctx", str(CTX), "--max-seqs", "4")
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


def chat_prompt_of(srv, n_prompt):
    """Messages whose rendered prompt is exactly n_prompt tokens (the server's own count)."""
    for k in range(1, 4 * CTX):
        msgs = [{"role": "user", "content": " ".join(["a"] * k)}]
        st, body = srv.post_json("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
        if st == 200 and body["usage"]["prompt_tokens"] == n_prompt:
            return msgs
        if st != 200 or body["usage"]["prompt_tokens"] > n_prompt:
            break
    pytest.fail(f"no message renders to {n_prompt} prompt tokens")


@pytest.mark.parametrize("gap", [1, 2, 30])
def test_chat_ends_at_the_context(small_ctx, gap):
    """Without max_tokens a chat request runs until the context is full: it ends with "length"
    when prompt + generated tokens are exactly --ctx (never ctx + 1), streaming or not, and the
    session is freed."""
    cl = small_ctx.client()
    msgs = chat_prompt_of(small_ctx, CTX - gap)
    r = cl.chat.completions.create(model=MODEL_NAME, messages=msgs, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == CTX - gap
    assert r.usage.prompt_tokens + r.usage.completion_tokens == CTX, r.usage
    assert r.choices[0].finish_reason == "length"
    chunks = list(cl.chat.completions.create(model=MODEL_NAME, messages=msgs, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True}))
    usage = chunks[-1].usage
    assert usage.prompt_tokens + usage.completion_tokens == CTX, usage
    fins = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert fins == ["length"]
    small_ctx.wait_metric("tulip_sessions_active", lambda v: v == 0)


def test_completions_max_tokens_up_to_the_context(small_ctx):
    """Completions always have a max_tokens (OpenAI default 16); the largest accepted one,
    ctx - prompt, fills the context exactly, streaming or not; one more is refused up front."""
    cl = small_ctx.client()
    n_prompt = CTX - 20
    prompt = [(7 * i) % 250 + 3 for i in range(n_prompt)]
    r = cl.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, max_tokens=20,
                              extra_body={"ignore_eos": True})
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 20)
    assert r.choices[0].finish_reason == "length"
    chunks = list(cl.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0,
                                        max_tokens=20, stream=True,
                                        stream_options={"include_usage": True},
                                        extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.prompt_tokens + chunks[-1].usage.completion_tokens == CTX
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    st, e = small_ctx.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 21})
    assert st == 400 and e["error"]["code"] == "context_length_exceeded"


# ---------------------------------------------------------------- concurrency and aborts

def test_16_concurrent_streams(srv):
    results, errors = [None] * 16, []

    def run(i):
        try:
            c = srv.client()
            text, fin = "", None
            for ch in c.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=20,
                                                temperature=0, stream=True, seed=i):
                if ch.choices:
                    d = ch.choices[0].delta
                    text += (d.content or "") + (getattr(d, "reasoning_content", None) or "")
                    fin = ch.choices[0].finish_reason or fin
            results[i] = (text, fin)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(r and r[1] == "length" for r in results)
    # greedy decoding of one prompt: batching must not change the result
    assert len({r[0] for r in results}) == 1


def test_client_abort_frees_session(srv, client):
    before = srv.metrics().get('tulip_sequences_finished_total{reason="cancelled"}', 0)
    # max_tokens near the context (2,048): a client slowed by a loaded machine must still find the
    # sequence running when it hangs up (with 400 the tiny model once finished first: no cancel)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=1900,
                                            stream=True, extra_body={"ignore_eos": True})
    got = 0
    for ch in stream:
        got += 1
        if got == 3:
            break
    stream.close()
    srv.wait_metric('tulip_sequences_finished_total{reason="cancelled"}', lambda v: v > before)
    srv.wait_metric("tulip_sessions_active", lambda v: v == 0)
    # the server still serves (ignore_eos: a sampled random model may draw a stop token early)
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=3,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


def test_abort_nonstream_waiting_client(srv):
    """A non-streaming client that hangs up while its request runs is cancelled too."""
    before = srv.metrics().get('tulip_sequences_finished_total{reason="cancelled"}', 0)
    body = json.dumps({"model": MODEL_NAME, "messages": USER, "max_tokens": 1900,
                       "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.05)
    s.close()
    srv.wait_metric('tulip_sequences_finished_total{reason="cancelled"}', lambda v: v > before)
    srv.wait_metric("tulip_sessions_active", lambda v: v == 0)


def test_error_inside_stream(client):
    """After the headers an error travels as a data frame; the official client raises it.
    ignore_eos: a sampled end of sequence before the third token would end the stream normally
    (the failure is injected after the third token; the tiny model samples with temperature 1)."""
    stream = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=50,
                                            stream=True,
                                            extra_body={"tulip_test_fail_after": 3,
                                                        "ignore_eos": True})
    with pytest.raises(openai.APIError) as ei:
        for _ in stream:
            pass
    assert "injected failure" in str(ei.value)
    # before the headers, the same failure is a plain 500 with an OpenAI-shaped body
    with pytest.raises(openai.InternalServerError) as ei:
        client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=2,
                                       extra_body={"tulip_test_fail_after": 1})
    assert ei.value.body["type"] == "server_error"


def test_loadtest_tool(srv, tmp_path):
    """tools/loadtest.py against this server: numbers come out and nothing fails."""
    import subprocess
    import sys
    from srv_util import ROOT
    out = tmp_path / "lt.json"
    p = subprocess.run([sys.executable, f"{ROOT}/tools/loadtest.py", "--url", srv.base, "-n", "4",
                        "-t", "1.5", "--max-tokens", "8", "--prompt-words", "8",
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["errors"] == 0 and res["requests"] >= 4
    assert res["output_tokens"] == 8 * res["requests"]
    assert res["output_tok_s"] > 0 and res["ttft_p50_ms"] > 0 and res["itl_p50_ms"] > 0
    assert "| 4 |" in p.stdout
    # --distinct-prompts: every request's prompt differs, so the prefix cache serves (almost)
    # nothing of it; the same prompt every time is served from the cache
    hits = []
    for extra in ([], ["--distinct-prompts"]):
        before = srv.metrics()
        p = subprocess.run([sys.executable, f"{ROOT}/tools/loadtest.py", "--url", srv.base, "-n",
                            "2", "-t", "1.0", "--max-tokens", "4", "--prompt-words", "40",
                            "--json", str(out), *extra], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0 and json.loads(out.read_text())["errors"] == 0, p.stderr
        k = "tulip_prefix_cache_hit_tokens_total"
        hits.append(srv.metrics()[k] - before[k])
    assert hits[0] > 0 and hits[1] < hits[0] / 4, hits


# ---------------------------------------------------------------- bad input

def err_of(srv, path, body, **kw):
    st, data = srv.post_json(path, body, **kw)
    assert set(data) == {"error"}, data
    e = data["error"]
    assert {"message", "type", "param", "code"} <= set(e), e
    return st, e


def test_bad_input(srv, client):
    chat = "/v1/chat/completions"
    st, _, data = srv.request("POST", chat, b'{"messages": [')
    assert st == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"
    st, _, data = srv.request("POST", chat, b"\xff\xfe garbage")
    assert st == 400
    st, e = err_of(srv, chat, {"messages": USER, "temperature": "hot"})
    assert st == 400 and e["param"] == "temperature"
    st, e = err_of(srv, chat, {"messages": USER, "max_tokens": -5})
    assert st == 400 and e["param"] == "max_tokens"
    st, e = err_of(srv, chat, {"messages": [{"role": "wizard", "content": "x"}]})
    assert st == 400 and e["param"] == "messages[0].role"
    st, e = err_of(srv, chat, {"messages": []})
    assert st == 400 and e["param"] == "messages"
    st, e = err_of(srv, chat, {"messages": [{"role": "user"}]})
    assert st == 400 and e["param"] == "messages[0].content"
    st, e = err_of(srv, chat, {"model": "gpt-4o", "messages": USER})
    assert st == 404 and e["code"] == "model_not_found"
    # template-level error: a system message that is not first
    st, e = err_of(srv, chat, {"messages": USER + [{"role": "system", "content": "late"}]})
    assert st == 400
    # unsupported fields are named, through the official client too
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=MODEL_NAME, messages=USER, n=17)  # 1..16
    assert ei.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=MODEL_NAME, prompt="a", best_of=2)
    assert ei.value.body["param"] == "best_of" and ei.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=MODEL_NAME, messages=USER,
                                       extra_body={"guided_json": {"type": "array", "uniqueItems": True}})
    assert ei.value.body["param"] == "guided_json" and "uniqueItems" in ei.value.body["message"]
    # over the context (2048): decided before queuing
    long_text = " ".join("w%d" % i for i in range(2000))
    admitted = srv.metrics()["tulip_prompt_tokens_total"]
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=MODEL_NAME,
                                       messages=[{"role": "user", "content": long_text}])
    assert ei.value.body["code"] == "context_length_exceeded"
    assert ei.value.body["n_ctx"] == 2048 and ei.value.body["n_prompt_tokens"] > 2048
    st, e = err_of(srv, "/v1/completions", {"prompt": [5] * 100, "max_tokens": 2000})
    assert st == 400 and e["code"] == "context_length_exceeded"
    # rejected before queuing: no prompt token of either request reached the engine
    assert srv.metrics()["tulip_prompt_tokens_total"] == admitted
    st, e = err_of(srv, "/v1/completions", {"prompt": [5, 400]})
    assert st == 400 and e["param"] == "prompt"
    # nothing above disturbed the server
    assert srv.metrics()["tulip_sessions_active"] == 0
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=2)
    assert r.usage.completion_tokens == 2


# ---------------------------------------------------------------- limits: auth, body, queue

@pytest.fixture(scope="module", params=sorted(BINARIES))
def strict(request):
    s = Server(BINARIES[request.param], "--ctx", "4096", "--max-seqs", "1", "--queue", "1",
               "--max-body", "65536", "--keepalive", "0.2", api_key="sk-test")
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


def test_api_key(strict):
    with pytest.raises(openai.AuthenticationError):
        strict.client(api_key="wrong").models.list()
    st, _, data = strict.request("GET", "/v1/models", headers={"Authorization": ""})
    assert st == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
    assert strict.request("GET", "/health", headers={"Authorization": ""})[0] == 200
    assert [m.id for m in strict.client().models.list().data] == [MODEL_NAME]


def test_oversize_body(strict):
    big = {"messages": [{"role": "user", "content": "x" * 100000}]}
    st, _, data = strict.request("POST", "/v1/chat/completions", big)
    assert st == 413 and "error" in json.loads(data)
    # chunked upload without Content-Length: caught while reading
    c = socket.create_connection(("127.0.0.1", strict.port))
    c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
              b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    for _ in range(20):
        c.sendall(b"1000\r\n" + b"y" * 4096 + b"\r\n")
    c.sendall(b"0\r\n\r\n")
    reply = c.recv(4096)
    c.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:100]


def test_queue_full_429(strict):
    cl = strict.client()
    long = dict(model=MODEL_NAME, messages=USER, max_tokens=4000, stream=True,
                extra_body={"ignore_eos": True})
    a = cl.chat.completions.create(**long)
    next(iter(a))  # running
    release = threading.Event()

    def start_b():  # queued behind a; kept open until the 429 was seen
        b = cl.chat.completions.create(**long)
        release.wait(60)
        b.close()

    tb = threading.Thread(target=start_b)
    tb.start()
    strict.wait_metric("tulip_queue_depth", lambda v: v == 1)
    with pytest.raises(openai.RateLimitError) as ei:
        cl.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=2)
    assert ei.value.body["type"] == "rate_limit_error"
    release.set()
    a.close()
    tb.join(60)
    strict.wait_metric("tulip_sessions_active", lambda v: v == 0)
    strict.wait_metric("tulip_queue_depth", lambda v: v == 0)
    r = cl.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=2)
    assert r.usage.completion_tokens == 2


def test_long_request_outlives_idle_timeout():
    """--idle-timeout closes idle connections only: a non-streaming request that generates for
    longer than the timeout still gets its answer."""
    s = Server(BINARIES["cpu"], "--idle-timeout", "1")
    try:
        t0 = time.time()
        st, body = s.post_json("/v1/completions", {"prompt": "hi", "max_tokens": 4000,
                                                   "ignore_eos": True}, timeout=120)
        assert st == 200 and body["usage"]["completion_tokens"] == 4000
        assert time.time() - t0 > 1.0, "too fast to test the timeout; raise max_tokens"
    finally:
        rc, err = s.stop()
    assert rc == 0, err[-2000:]


def test_keepalive_while_queued(strict):
    """A stream waiting for its first token (here: queued behind another) gets ': keepalive'
    comments, and the client leaving the queue frees everything."""
    cl = strict.client()
    a = cl.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=4000, stream=True,
                                   extra_body={"ignore_eos": True})
    next(iter(a))
    body = json.dumps({"model": MODEL_NAME, "messages": USER, "max_tokens": 4, "stream": True})
    # 30 s: under ASan on a 2-core machine busy with the first stream, one CI run saw no byte of
    # this response within 10 s (it answers in ~0.2 s alone); the keepalive comments come every
    # 0.2 s (--keepalive), so without them the wait still ends in a failure
    c = socket.create_connection(("127.0.0.1", strict.port), timeout=30)
    c.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(body), body)).encode())
    got = b""
    deadline = time.time() + 30
    while b": keepalive" not in got and time.time() < deadline:
        got += c.recv(4096)
    assert got.startswith(b"HTTP/1.1 200") and b"text/event-stream" in got
    assert b": keepalive" in got
    c.close()
    a.close()
    strict.wait_metric("tulip_sessions_active", lambda v: v == 0)
    strict.wait_metric("tulip_queue_depth", lambda v: v == 0)


@pytest.mark.parametrize("which", sorted(BINARIES))
def test_small_kv_pool_preempts_and_completes(which):
    """--kv-tokens on the CPU backend is a real pool (6 pages of 64 tokens) shared by 6 sequences
    that each grow to 2 pages: the pool runs short, running sequences are preempted and
    recomputed, and every stream still gets exactly the text it gets alone, to its own
    max_tokens ("length"), with no error; /metrics reports the pages and counts the preemptions.
    A prompt larger than the whole pool (but within the context) is a 400 at once."""
    s = Server(BINARIES[which], "--ctx", "1024", "--max-seqs", "6", "--kv-tokens", "384",
               "--step-tokens", "32", "--queue", "16")
    try:
        m = s.metrics()
        assert m["tulip_kv_cache_pages_total"] == 6 and m["tulip_kv_cache_pages_free"] == 6
        assert m["tulip_kv_cache_pages_used"] == 0 and m["tulip_kv_cache_page_tokens"] == 64
        assert m["tulip_num_preemptions_total"] == 0

        st, body = s.post_json("/v1/completions", {"prompt": [65] * 400, "max_tokens": 4})
        assert st == 400 and body["error"]["code"] == "context_length_exceeded", body
        assert "KV cache" in body["error"]["message"] and body["error"]["param"] == "prompt"

        prompts = [[(7 * k + 3 * i) % 250 + 3 for i in range(20 + 5 * k)] for k in range(6)]
        req = dict(model=MODEL_NAME, max_tokens=80, temperature=0,
                   extra_body={"ignore_eos": True})
        cl = s.client()
        alone = [cl.completions.create(prompt=p, **req).choices[0].text for p in prompts]
        assert s.metrics()["tulip_num_preemptions_total"] == 0  # one at a time: room enough

        results = [None] * len(prompts)

        def run(k):
            text, fins = "", []
            for ch in cl.completions.create(prompt=prompts[k], stream=True, **req):
                text += ch.choices[0].text
                fins.append(ch.choices[0].finish_reason)
            results[k] = (text, fins)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        for k, (text, fins) in enumerate(results):
            assert fins[-1] == "length" and all(f is None for f in fins[:-1])
            assert text == alone[k], k
        m = s.wait_metric("tulip_kv_cache_pages_free", lambda v: v == 6)
        assert m == 6 and s.metrics()["tulip_kv_cache_pages_used"] == 0
        assert s.metrics()["tulip_num_preemptions_total"] > 0
        assert s.metrics()['tulip_sequences_finished_total{reason="error"}'] == 0
    finally:
        rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


@pytest.mark.parametrize("which", sorted(BINARIES))
def test_device_lost_503_and_exit_1(which):
    """A lost device (injected as a failed engine step) answers 503 and ends the process with
    status 1 so a supervisor restarts it."""
    s = Server(BINARIES[which], "--test-mode")
    st, body = s.post_json("/v1/chat/completions",
                           {"messages": USER, "max_tokens": 20, "tulip_test_fail_after": 2,
                            "tulip_test_fail_lost": True})
    assert st == 503 and body["error"]["type"] == "server_error", body
    s.proc.wait(timeout=30)
    rc, err = s.stop()
    assert rc == 1, err[-3000:]
    assert "the engine failed" in err
    assert sanitizer_report(err) is None, err[-5000:]


# ---------------------------------------------------------------- shutdown

@pytest.mark.parametrize("which", sorted(BINARIES))
def test_sigterm_drains(which):
    s = Server(BINARIES[which], "--drain-timeout", "20")
    cl = s.client()
    stream = cl.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=300,
                                        stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it)
    s.proc.send_signal(signal.SIGTERM)
    n = 0
    fin = None
    for ch in it:
        if ch.choices and ch.choices[0].finish_reason:
            fin = ch.choices[0].finish_reason
        n += 1
    assert fin == "length"  # the running stream was allowed to finish
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert "draining" in err
    assert sanitizer_report(err) is None, err[-5000:]


# ---------------------------------------------------------------- tulip chat

@pytest.mark.parametrize("which", sorted(BINARIES))
def test_tulip_chat_cli(which):
    """Two turns and a /reset through `tulip chat` (stdin not a terminal: no prompts, no colour)."""
    import subprocess
    from srv_util import MODEL
    p = subprocess.run([BINARIES[which], "chat", "--model", MODEL, "--tokenizer", TOKENIZER,
                        "--allow-test-shape", "--backend", "cpu", "-n", "6", "--temperature", "0",
                        "--no-thinking"],
                       input="Hello\nHow are you\n/reset\nHello\n", capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert sanitizer_report(p.stderr) is None, p.stderr[-3000:]
    answers = p.stdout.split("\n")
    assert len([a for a in answers if a]) >= 2
    # greedy, same single-turn conversation after /reset: same answer as the first turn
    assert answers[0] == answers[2], answers


@pytest.mark.parametrize("which", sorted(BINARIES))
def test_sigterm_cancels_after_grace(which):
    """A stream still running when --drain-timeout ends is cancelled: the client gets an error
    frame (not a silent cut), and the server exits 0 promptly."""
    s = Server(BINARIES[which], "--drain-timeout", "0.3")
    cl = s.client()
    stream = cl.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=4000,
                                        stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    with pytest.raises(openai.APIError) as ei:
        for _ in it:
            pass
    assert "cancelled" in str(ei.value)
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert time.time() - t0 < 10
    assert sanitizer_report(err) is None, err[-5000:]


# ---------------------------------------------------------------- backend choice

def write_sparse_production_checkpoint(d):
    """config.json of the published model and a model.safetensors with every tensor the loader
    binds at the production shapes (official HF layout), its data one sparse hole (~67 GB
    apparent, a few kB on disk): enough to reach the backend choice, never to run."""
    text = {"model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
            "vocab_size": 248320, "num_attention_heads": 16, "num_key_value_heads": 2,
            "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4, "num_experts": 256, "num_experts_per_tok": 8,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
            "rms_norm_eps": 1e-06, "max_position_embeddings": 262144, "eos_token_id": 248044,
            "full_attention_interval": 4, "mtp_num_hidden_layers": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                "mrope_interleaved": True}}
    (d / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False, "text_config": text}))
    D, V, E, FF, HD, conv, vd = 2048, 248320, 256, 512, 256, 8192, 4096
    t = {"model.language_model.embed_tokens.weight": [V, D],
         "model.language_model.norm.weight": [D], "lm_head.weight": [V, D]}
    for il in range(40):
        p = f"model.language_model.layers.{il}."
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = [D]
        if (il + 1) % 4 == 0:
            t.update({p + "self_attn.q_proj.weight": [16 * HD * 2, D],
                      p + "self_attn.k_proj.weight": [2 * HD, D],
                      p + "self_attn.v_proj.weight": [2 * HD, D],
                      p + "self_attn.o_proj.weight": [D, 16 * HD],
                      p + "self_attn.q_norm.weight": [HD], p + "self_attn.k_norm.weight": [HD]})
        else:
            t.update({p + "linear_attn.in_proj_qkv.weight": [conv, D],
                      p + "linear_attn.in_proj_z.weight": [vd, D],
                      p + "linear_attn.in_proj_b.weight": [32, D],
                      p + "linear_attn.in_proj_a.weight": [32, D],
                      p + "linear_attn.conv1d.weight": [conv, 1, 4],
                      p + "linear_attn.dt_bias": [32], p + "linear_attn.A_log": [32],
                      p + "linear_attn.norm.weight": [128],
                      p + "linear_attn.out_proj.weight": [D, vd]})
        t.update({p + "mlp.gate.weight": [E, D],
                  p + "mlp.shared_expert.gate_proj.weight": [512, D],
                  p + "mlp.shared_expert.up_proj.weight": [512, D],
                  p + "mlp.shared_expert.down_proj.weight": [D, 512],
                  p + "mlp.shared_expert_gate.weight": [1, D],
                  p + "mlp.experts.gate_up_proj": [E, 2 * FF, D],
                  p + "mlp.experts.down_proj": [E, D, FF]})
    header, off = {}, 0
    for name, shape in t.items():
        n = 2
        for x in shape:
            n *= x
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(d / "model.safetensors", "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        f.truncate(8 + len(h) + off)


@pytest.fixture(scope="module")
def prod_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("prod")
    write_sparse_production_checkpoint(d)
    return d


@pytest.mark.parametrize("which", sorted(BINARIES))
def test_production_model_never_falls_back_to_the_cpu(which, prod_ckpt):
    """Without --backend, a production-shaped model whose CUDA backend cannot open (this build
    has none) is refused by serve, run and chat with a non-zero status, the reason and the way
    to force the CPU on stderr."""
    import subprocess
    model = ["--model", str(prod_ckpt)]
    for args in (["serve", *model, "--tokenizer", TOKENIZER, "--port", "0", "--max-seqs", "1"],
                 ["run", *model, "--prompt-ids", "1,2,3", "-n", "1"],
                 ["chat", *model, "--tokenizer", TOKENIZER, "-n", "1"]):
        p = subprocess.run([BINARIES[which], *args], input="Hello\n", capture_output=True,
                           text=True, timeout=120)
        assert p.returncode != 0, (args[0], p.stdout[-2000:], p.stderr[-2000:])
        assert "CUDA backend cannot open" in p.stderr, (args[0], p.stderr[-2000:])
        assert "no CUDA backend" in p.stderr and "--backend cpu" in p.stderr, p.stderr[-2000:]
        assert sanitizer_report(p.stderr) is None, p.stderr[-3000:]


@pytest.mark.parametrize("which", sorted(BINARIES))
def test_test_shape_model_falls_back_saying_why(which):
    """A test-shape model (the tiny fixture) still runs on the CPU without --backend (CI has no
    GPU), with the reason printed once."""
    import subprocess
    from srv_util import MODEL
    p = subprocess.run([BINARIES[which], "run", "--model", MODEL, "--allow-test-shape",
                        "--prompt-ids", "1,2,3", "-n", "2", "--temperature", "0", "--print-ids"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(p.stdout.split()) == 2
    assert p.stderr.count("CUDA backend cannot open") == 1, p.stderr[-2000:]
    assert "using the CPU backend" in p.stderr
