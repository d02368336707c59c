"""The prefix cache end to end (docs/architecture.md §4.1, §6.1): a live `tulip serve` (CPU backend,
tiny model) with the cache, and one started with --no-prefix-cache as the reference, driven by
the official openai client and raw HTTP.

A second chat turn reports `usage.prompt_tokens_details.cached_tokens` equal to the first turn's
prompt without its generation prompt (the snapshot point; its length comes from /tokenize with
add_generation_prompt false, whose renders test_chat.py checks against jinja2), and gives the
same greedy text as the server without the cache (stream and not); completions with token ids
reuse the previous prompt; a cache_salt sees nothing of another salt's cache; the Anthropic and
Responses APIs report the cached tokens in their own fields; /metrics counts queries, hits and
hit tokens. Plain and ASan builds."""
import json

import pytest

from srv_util import BINARIES, Server, sanitizer_report

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
SYSTEM = ("You are a helpful assistant with tools. " * 12).strip()


@pytest.fixture(scope="module", params=sorted(BINARIES))
def pair(request):
    on = Server(BINARIES[request.param], "--ctx", "2048", "--max-seqs", "4")
    off = Server(BINARIES[request.param], "--ctx", "2048", "--max-seqs", "4", "--no-prefix-cache")
    yield on, off
    for s in (on, off):
        rc, err = s.stop()
        assert rc == 0, err[-3000:]
        assert sanitizer_report(err) is None, err[-5000:]


def chat(client, msgs, **kw):
    return client.chat.completions.create(model="tiny-a", messages=msgs, temperature=0,
                                          max_tokens=12, extra_body=dict(NO_THINK, **kw))


def cut_point(srv, msgs):
    """Tokens of the prompt without its generation prompt: the snapshot point of a chat turn."""
    st, r = srv.post_json("/tokenize", {"messages": msgs, "add_generation_prompt": False,
                                        "chat_template_kwargs": {"enable_thinking": False}})
    assert st == 200
    return r["count"]


def turns(srv, salt=None, stream=False):
    """Three turns of one conversation; per turn (text, usage)."""
    c = srv.client()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]
    out = []
    for k in range(3):
        extra = {"cache_salt": salt} if salt else {}
        if stream:
            s = c.chat.completions.create(model="tiny-a", messages=msgs, temperature=0,
                                          max_tokens=12, stream=True,
                                          stream_options={"include_usage": True},
                                          extra_body=dict(NO_THINK, **extra))
            text, usage = "", None
            for ch in s:
                if ch.choices and ch.choices[0].delta.content:
                    text += ch.choices[0].delta.content
                if ch.usage:
                    usage = ch.usage
        else:
            r = chat(c, msgs, **extra)
            text, usage = r.choices[0].message.content or "", r.usage
        out.append((text, usage, cut_point(srv, msgs)))
        msgs = msgs + [{"role": "assistant", "content": text},
                       {"role": "user", "content": f"Tell me more, part {k}"}]
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_chat_turns_cached_and_equal(pair, stream):
    on, off = pair
    a, b = turns(on, salt=f"chat-{stream}"), turns(off, salt=f"chat-{stream}")
    for k in range(3):
        assert a[k][0] == b[k][0]  # the same greedy text
        assert b[k][1].prompt_tokens_details.cached_tokens == 0
        assert a[k][1].prompt_tokens == b[k][1].prompt_tokens
    assert a[0][1].prompt_tokens_details.cached_tokens == 0
    for k in (1, 2):  # each turn reuses the previous turn up to its last message
        assert a[k][1].prompt_tokens_details.cached_tokens == a[k - 1][2], (k, a[k][1])
    if stream:  # the streamed usage chunk carries it too
        c = turns(on, salt=f"chat-{stream}", stream=True)
        assert [x[0] for x in c] == [x[0] for x in a]
        assert c[0][1].prompt_tokens_details.cached_tokens > 0  # turn 1 is cached now


def test_salt_isolates(pair):
    on, _ = pair
    a = turns(on, salt="tenant-a")
    assert a[1][1].prompt_tokens_details.cached_tokens > 0
    b = turns(on, salt="tenant-b")  # the same conversation under another salt
    assert b[0][1].prompt_tokens_details.cached_tokens == 0
    assert b[1][1].prompt_tokens_details.cached_tokens == a[1][1].prompt_tokens_details.cached_tokens
    st, r = on.post_json("/v1/chat/completions",
                         {"model": "tiny-a", "messages": [{"role": "user", "content": "x"}],
                          "cache_salt": 5})
    assert st == 400 and "cache_salt" in json.dumps(r)


def test_completions_token_ids(pair):
    on, off = pair
    p1 = [(i * 37) % 250 + 3 for i in range(90)]
    p2 = p1 + [(i * 11) % 250 + 3 for i in range(20)]
    res = {}
    for name, s in (("on", on), ("off", off)):
        c = s.client()
        r1 = c.completions.create(model="tiny-a", prompt=p1, temperature=0, max_tokens=6)
        r2 = c.completions.create(model="tiny-a", prompt=p2, temperature=0, max_tokens=6)
        res[name] = (r1, r2)
    assert res["on"][1].choices[0].text == res["off"][1].choices[0].text
    assert res["on"][0].usage.prompt_tokens_details.cached_tokens == 0
    assert res["on"][1].usage.prompt_tokens_details.cached_tokens == 90  # the end of p1
    assert res["off"][1].usage.prompt_tokens_details.cached_tokens == 0


def test_anthropic_and_responses_usage(pair):
    on, _ = pair
    body = {"model": "tiny-a", "max_tokens": 8, "system": SYSTEM + " anthropic",
            "messages": [{"role": "user", "content": "Hi"}]}
    st, r1 = on.post_json("/v1/messages", body)
    assert st == 200 and r1["usage"]["cache_read_input_tokens"] == 0
    body["messages"] += [{"role": "assistant", "content": "Hello"},
                         {"role": "user", "content": "More"}]
    st, count = on.post_json("/v1/messages/count_tokens",
                             {k: v for k, v in body.items() if k != "max_tokens"})
    assert st == 200, count
    st, r2 = on.post_json("/v1/messages", body)
    assert st == 200
    u = r2["usage"]
    assert u["cache_read_input_tokens"] > 0
    assert u["input_tokens"] + u["cache_read_input_tokens"] == count["input_tokens"]
    rb = {"model": "tiny-a", "instructions": SYSTEM + " responses", "input": "Hi",
          "max_output_tokens": 8, "reasoning": {"effort": "none"}}
    st, q1 = on.post_json("/v1/responses", rb)
    assert st == 200 and q1["usage"]["input_tokens_details"]["cached_tokens"] == 0
    rb["input"] = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes"},
                   {"role": "user", "content": "And?"}]
    st, q2 = on.post_json("/v1/responses", rb)
    assert st == 200 and q2["usage"]["input_tokens_details"]["cached_tokens"] > 0


def test_anthropic_and_responses_salt(pair):
    # cache_salt on /v1/messages and /v1/responses (as in chat: 1 to 256 bytes): a second turn
    # under the same salt reads the first turn's cache, the same turn under another salt (or
    # none) reads nothing of it
    on, _ = pair
    ab = {"model": "tiny-a", "max_tokens": 6, "system": SYSTEM + " salted anthropic",
          "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
                       {"role": "user", "content": "Next"}]}
    rb = {"model": "tiny-a", "instructions": SYSTEM + " salted responses", "max_output_tokens": 6,
          "reasoning": {"effort": "none"},
          "input": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
                    {"role": "user", "content": "Next"}]}

    def cached(path, body, salt):
        b = dict(body, **({"cache_salt": salt} if salt else {}))
        st, r = on.post_json(path, b)
        assert st == 200, r
        u = r["usage"]
        return u["cache_read_input_tokens"] if path == "/v1/messages" else \
            u["input_tokens_details"]["cached_tokens"]
    for path, body, turn in (("/v1/messages", ab, "messages"), ("/v1/responses", rb, "input")):
        first = dict(body, **{turn: body[turn][:1]})  # turn 1: its snapshot is what turn 2 reuses
        assert cached(path, first, "s-one") == 0
        assert cached(path, body, "s-two") == 0       # another salt: nothing shared
        assert cached(path, body, None) == 0          # no salt: nothing shared either
        assert cached(path, body, "s-one") > 0        # the same salt: turn 1's prefix
        for bad in (5, "", "x" * 257):
            st, r = on.post_json(path, dict(body, cache_salt=bad))
            assert st == 400 and "cache_salt" in json.dumps(r), (path, bad, r)


def test_metrics(pair):
    on, off = pair
    m = on.metrics()
    assert m["tulip_prefix_cache_queries_total"] >= m["tulip_prefix_cache_hits_total"] > 0
    assert m["tulip_prefix_cache_hit_tokens_total"] > 0
    assert 0 < m["tulip_prefix_cache_used_bytes"] <= m["tulip_prefix_cache_capacity_bytes"]
    assert 0 < m["tulip_prefix_cache_snapshot_bytes"] <= m["tulip_prefix_cache_used_bytes"]
    assert "tulip_prefix_cache_evictions_total" in m
    assert "tulip_prefix_cache_queries_total" not in off.metrics()


def test_snap_every(pair):
    """--prefix-snap-every N: a prompt's prefill leaves a snapshot every N tokens, so a prompt that
    shares only part of it (150 of 200 tokens) reuses it up to the last multiple of N (128 at
    N = 64; nothing at the default 4096), with the same greedy text as without the cache."""
    _, off = pair
    srv = Server(off.binary, "--ctx", "2048", "--max-seqs", "4", "--prefix-snap-every", "64")
    try:
        p1 = [(i * 37) % 250 + 3 for i in range(200)]
        p3 = p1[:150] + [(i * 13) % 250 + 3 for i in range(30)]
        c = srv.client()
        c.completions.create(model="tiny-a", prompt=p1, temperature=0, max_tokens=4)
        r = c.completions.create(model="tiny-a", prompt=p3, temperature=0, max_tokens=6)
        assert r.usage.prompt_tokens_details.cached_tokens == 128
        ref = off.client().completions.create(model="tiny-a", prompt=p3, temperature=0, max_tokens=6)
        assert r.choices[0].text == ref.choices[0].text
    finally:
        rc, err = srv.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


def test_snap_every_chat_turns(pair):
    """With a snapshot interval that falls among a turn's new tokens (every 64 tokens, a 100-word
    user message), the turn's prefill takes the end of its last message inside the step (the
    interval point gives way, sched.c chunk_tokens): the next turn still reuses the prompt up to
    that message end, with the same greedy text as without the cache."""
    _, off = pair
    srv = Server(off.binary, "--ctx", "2048", "--max-seqs", "4", "--prefix-snap-every", "64")
    try:
        c, o = srv.client(), off.client()
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]
        for k in range(3):
            r, ref = chat(c, msgs, cache_salt="snap64"), chat(o, msgs)
            assert r.choices[0].message.content == ref.choices[0].message.content, k
            if k:
                assert r.usage.prompt_tokens_details.cached_tokens == cut, (k, r.usage)
            cut = cut_point(srv, msgs)
            msgs = msgs + [{"role": "assistant", "content": r.choices[0].message.content or ""},
                           {"role": "user", "content": " ".join(f"word{i}" for i in range(100))}]
    finally:
        rc, err = srv.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]
