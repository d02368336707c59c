"""Issue 15 item 1 end to end: the request fields clients send, against a live `tulip serve` (CPU
backend, tests/data/tiny-a, plain and ASan builds) driven by the official openai client.

Expected values come from the definitions and from Hugging Face tokenizers on the same
tokenizer.json (token ids), never from the server: a +100 logit bias must make every sampled token
that token (greedy and sampled), -100 must keep the greedy token out, min_tokens must hold EOS
back for exactly that many tokens (EOS itself forced by a +100 bias, so the count is exact),
stop_token_ids must end at the first such token, echo must put the prompt first."""
import pytest
from tokenizers import Tokenizer

from srv_util import BINARIES, TOKENIZER, Server, sanitizer_report

TOK = Tokenizer.from_file(TOKENIZER)
MODEL_NAME = "tiny-a"
EOS_IM_END = 289  # <|im_end|> (tiny tokenizer)
USER = [{"role": "user", "content": "Hello there"}]


def ids(text):
    return TOK.encode(text, add_special_tokens=False).ids


def one_id(text):
    t = ids(text)
    assert len(t) == 1, (text, t)
    return t[0]


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


def complete(client, prompt="Hello", **kw):
    extra = kw.pop("extra_body", {})
    return client.completions.create(model=MODEL_NAME, prompt=prompt, extra_body=extra, **kw)


def test_logit_bias_forces_and_bans(client):
    z = one_id("Z")
    for temp in (0, 1.0):
        r = complete(client, max_tokens=6, temperature=temp, logit_bias={str(z): 100},
                     extra_body={"ignore_eos": True})
        assert r.choices[0].text == "Z" * 6, r.choices[0].text
    # -100 bans: Z at +100 and Y at +99 gives Z; Z at -100 and Y at +99 gives Y
    y = one_id("Y")
    r = complete(client, max_tokens=3, temperature=0, logit_bias={str(z): 100, str(y): 99},
                 extra_body={"ignore_eos": True})
    assert r.choices[0].text == "ZZZ"
    r = complete(client, max_tokens=3, temperature=0, logit_bias={str(z): -100, str(y): 99},
                 extra_body={"ignore_eos": True})
    assert r.choices[0].text == "YYY"
    # the logprob reported is that of the unmodified distribution: a forced token keeps its own
    r2 = complete(client, max_tokens=1, temperature=0, logprobs=1, logit_bias={str(z): 100})
    assert r2.choices[0].logprobs.token_logprobs[0] < -0.01


def test_min_tokens_holds_eos_back(client):
    bias = {str(EOS_IM_END): 100}
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=20,
                                       temperature=0, logit_bias=bias)
    assert r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
    for m in (3, 7):
        r = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=20,
                                           temperature=0, logit_bias=bias,
                                           extra_body={"min_tokens": m})
        # m tokens with EOS banned, then the forced EOS
        assert r.usage.completion_tokens == m + 1, r.usage
        assert r.choices[0].finish_reason == "stop"


def test_stop_token_ids(client):
    z = one_id("Z")
    r = complete(client, max_tokens=10, temperature=1.0, logit_bias={str(z): 100},
                 extra_body={"stop_token_ids": [z], "ignore_eos": True})
    assert r.usage.completion_tokens == 1
    assert r.choices[0].finish_reason == "stop"


def test_include_stop_str_in_output(client):
    kw = {"stop": ["STOP"], "extra_body": {"tulip_test_script": ids("Hello STOP world"),
                                           "chat_template_kwargs": {"enable_thinking": False}}}
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, **kw)
    assert r.choices[0].message.content == "Hello "
    kw["extra_body"]["include_stop_str_in_output"] = True
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, **kw)
    assert r.choices[0].message.content == "Hello STOP"
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=USER, stream=True,
                                                 **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello STOP"


def test_echo(client):
    plain = complete(client, max_tokens=4, temperature=0)
    r = complete(client, max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text == "Hello" + plain.choices[0].text
    chunks = list(complete(client, max_tokens=4, temperature=0, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_tolerant_fields_accepted(client):
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=USER, max_tokens=2, user="u1", metadata={"k": "v"},
        store=True, service_tier="auto", parallel_tool_calls=False, reasoning_effort="low",
        stream=True, stream_options={"include_usage": True},
        extra_body={"prompt_cache_key": "abc", "safety_identifier": "s"})
    chunks = list(r)
    assert chunks[-1].usage is not None


def test_reasoning_effort_and_history(client):
    text = "I think</think>\n\nThe answer"
    base = {"tulip_test_script": ids(text)}
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, extra_body=base)
    m = r.choices[0].message
    # both names carry the reasoning (docs/api.md §2)
    assert m.reasoning_content == "I think" and m.model_extra.get("reasoning") == "I think"
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=USER, stream=True,
                                                 extra_body=base))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == "I think"
    # reasoning_effort "none": thinking off, everything is content
    r = client.chat.completions.create(model=MODEL_NAME, messages=USER, reasoning_effort="none",
                                       extra_body=base)
    assert r.choices[0].message.content.startswith("I think")
    # a history turn with `reasoning` instead of reasoning_content is accepted
    hist = USER + [{"role": "assistant", "content": "A", "reasoning": "R"},
                   {"role": "user", "content": "more"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=hist, max_tokens=2)
    assert r.choices[0].finish_reason in ("length", "stop")


def test_output_changing_fields_refused(srv):
    for field, value in (("audio", {"voice": "x"}), ("verbosity", "low"),
                         ("prediction", {"type": "content", "content": "x"}),
                         ("web_search_options", {})):
        st, body = srv.post_json("/v1/chat/completions",
                                 {"model": MODEL_NAME, "messages": USER, field: value})
        assert st == 400 and body["error"]["param"] == field, body
    st, body = srv.post_json("/v1/chat/completions",
                             {"model": MODEL_NAME, "messages": USER, "logit_bias": {"5": 101}})
    assert st == 400 and body["error"]["param"] == "logit_bias.5", body


def test_default_chat_template_kwargs():
    s = Server(BINARIES["cpu"], "--test-mode", "--ctx", "512",
               "--default-chat-template-kwargs", '{"enable_thinking": false}')
    try:
        c = s.client()
        text = "I think</think>\n\nThe answer"
        r = c.chat.completions.create(model=MODEL_NAME, messages=USER,
                                      extra_body={"tulip_test_script": ids(text)})
        assert r.choices[0].message.content.startswith("I think")  # thinking off by default
        r = c.chat.completions.create(
            model=MODEL_NAME, messages=USER,
            extra_body={"tulip_test_script": ids(text),
                        "chat_template_kwargs": {"enable_thinking": True}})
        assert r.choices[0].message.reasoning_content == "I think"
        assert r.choices[0].message.content == "The answer"
    finally:
        rc, err = s.stop()
    assert rc == 0, err[-3000:]
