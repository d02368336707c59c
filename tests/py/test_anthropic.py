"""End to end: the Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) of a real
`tulip serve` (CPU backend, tests/data/tiny-a) driven by the official `anthropic` Python SDK,
once with the plain build and once with the ASan+UBSan build. The server has an API key, which
the SDK sends as x-api-key.

As in test_server.py, reasoning, tool calls and stop sequences come from the test-only
`tulip_test_script` field (--test-mode): the engine emits the given token ids (from Hugging Face
tokenizers, the reference) and everything after it (detokenizer, stop matcher, parser, SSE,
the SDK's own stream accumulation) is real. Expected prompts for count_tokens come from the
reference Jinja renderer of the model's chat template (chat_ref.py) and Hugging Face tokenizers."""
import json

import anthropic
import pytest
from tokenizers import Tokenizer

import chat_ref
from srv_util import BINARIES, TOKENIZER, Server, sanitizer_report

TOK = Tokenizer.from_file(TOKENIZER)
MODEL_NAME = "tiny-a"
KEY = "sk-ant-test"
USER = [{"role": "user", "content": "Hello there"}]
OFF = {"type": "disabled"}
TOOLS = [{"name": "get_weather", "description": "weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                            "days": {"type": "integer"}}}}]
CALL = ("Let me look.</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def ids(text):
    return TOK.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module", params=sorted(BINARIES))
def srv(request):
    s = Server(BINARIES[request.param], "--test-mode", "--ctx", "2048", "--max-seqs", "4",
               api_key=KEY)
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


@pytest.fixture(scope="module")
def client(srv):
    return anthropic.Anthropic(base_url=srv.base, api_key=KEY, max_retries=0, timeout=120)


def scripted(client, text, stream=False, **kw):
    kw.setdefault("messages", USER)
    kw.setdefault("max_tokens", 200)
    kw.setdefault("extra_body", {})["tulip_test_script"] = ids(text)
    if stream:
        with client.messages.stream(model=MODEL_NAME, **kw) as s:
            events = list(s)
            return s.get_final_message(), events
    return client.messages.create(model=MODEL_NAME, **kw)


def test_text_not_streaming(client):
    m = client.messages.create(model=MODEL_NAME, max_tokens=5, messages=USER, thinking=OFF,
                               extra_body={"temperature": 0})
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == MODEL_NAME
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 5 and m.usage.input_tokens > 0
    assert [b.type for b in m.content] == ["text"]


def test_scripted_text_and_usage(client):
    m = scripted(client, "Hi there", thinking=OFF)
    assert [(b.type, b.text) for b in m.content] == [("text", "Hi there")]
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens == len(ids("Hi there")) + 1  # + the EOS that ends the script


def test_streaming_text(client):
    m, events = scripted(client, "Hello streaming world", stream=True, thinking=OFF)
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "content_block_start" in types and "content_block_stop" in types
    assert "message_delta" in types
    deltas = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert "".join(deltas) == "Hello streaming world"
    assert [(b.type, b.text) for b in m.content] == [("text", "Hello streaming world")]
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens == len(ids("Hello streaming world")) + 1
    assert m.usage.input_tokens > 0


def test_ping_event_raw(srv):
    body = {"model": MODEL_NAME, "max_tokens": 3, "stream": True, "messages": USER}
    st, hdr, data = srv.request("POST", "/v1/messages", body)
    assert st == 200 and hdr["Content-Type"] == "text/event-stream"
    names = [ln[7:] for ln in data.decode().splitlines() if ln.startswith("event: ")]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta",
                                                                    "message_stop"]
    assert srv.metrics()['tulip_requests_total{endpoint="messages",status="200"}'] >= 1


def test_system_string_and_blocks(srv, client):
    def count(**kw):
        return client.messages.count_tokens(model=MODEL_NAME, messages=USER, thinking=OFF,
                                            **kw).input_tokens
    blocks = [{"type": "text", "text": "You are "},
              {"type": "text", "text": "terse.", "cache_control": {"type": "ephemeral"}}]
    assert count(system="You are terse.") == count(system=blocks) > count()
    m = scripted(client, "Ok", system=blocks, thinking=OFF)
    assert m.content[0].text == "Ok"


def reference_count(messages, tools=None, enable_thinking=True):
    status, prompt = chat_ref.render(chat_ref.load_template(), {
        "messages": messages, "tools": tools, "enable_thinking": enable_thinking})
    assert status == "ok"
    return len(TOK.encode(prompt, add_special_tokens=False).ids)


def test_count_tokens_matches_reference(client):
    sys_text = "Be brief."
    n = client.messages.count_tokens(model=MODEL_NAME, system=sys_text, messages=USER,
                                     thinking=OFF).input_tokens
    assert n == reference_count([{"role": "system", "content": sys_text}] + USER,
                                enable_thinking=False)
    tools_oai = [{"type": "function", "function": {"name": t["name"],
                                                   "description": t["description"],
                                                   "parameters": t["input_schema"]}}
                 for t in TOOLS]
    n = client.messages.count_tokens(model=MODEL_NAME, messages=USER, tools=TOOLS,
                                     thinking={"type": "enabled",
                                               "budget_tokens": 1024}).input_tokens
    assert n == reference_count(USER, tools=tools_oai, enable_thinking=True)
    # the count is the prompt a generation request prefills
    m = scripted(client, "x", system=sys_text, thinking=OFF)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == reference_count(
        [{"role": "system", "content": sys_text}] + USER, enable_thinking=False)


def test_thinking_enabled_and_disabled(client):
    text = "I think</think>\n\nThe answer"
    on = {"type": "enabled", "budget_tokens": 1024}
    m = scripted(client, text, thinking=on)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "I think" and m.content[1].text == "The answer"
    m, events = scripted(client, text, stream=True, thinking=on)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "I think" and m.content[1].text == "The answer"
    kinds = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "thinking_delta" in kinds and "text_delta" in kinds
    # disabled: no reasoning is parsed; the same tokens are plain text
    m = scripted(client, "The answer", thinking=OFF)
    assert [(b.type, b.text) for b in m.content] == [("text", "The answer")]
    # the rendered prompts differ as the template says (the empty think block when off)
    assert client.messages.count_tokens(model=MODEL_NAME, messages=USER, thinking=OFF) \
        .input_tokens == reference_count(USER, enable_thinking=False)
    assert client.messages.count_tokens(model=MODEL_NAME, messages=USER, thinking=on) \
        .input_tokens == reference_count(USER, enable_thinking=True)


def test_tool_use_and_result(client):
    on = {"type": "enabled", "budget_tokens": 512}
    m = scripted(client, CALL, tools=TOOLS, thinking=on)
    assert m.stop_reason == "tool_use"
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    tu = m.content[1]
    assert tu.name == "get_weather" and tu.input == {"city": "Paris", "days": 3} and tu.id

    m2, events = scripted(client, CALL, stream=True, tools=TOOLS, thinking=on)
    assert m2.stop_reason == "tool_use"
    (tu2,) = [b for b in m2.content if b.type == "tool_use"]
    assert tu2.name == "get_weather" and tu2.input == {"city": "Paris", "days": 3}
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta"
               for e in events)

    history = USER + [{"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                        for b in m.content]},
                      {"role": "user", "content": [
                          {"type": "tool_result", "tool_use_id": tu.id, "content": "sunny"}]}]
    r = scripted(client, "It is sunny.", messages=history, tools=TOOLS, thinking=OFF)
    assert [(b.type, b.text) for b in r.content] == [("text", "It is sunny.")]
    # the whole prompt: Anthropic counts the tokens read from the prefix cache apart
    assert (r.usage.input_tokens + r.usage.cache_read_input_tokens
            > m.usage.input_tokens + m.usage.cache_read_input_tokens)
    # the history renders as the reference renders the same OpenAI-shaped conversation
    oai = USER + [{"role": "assistant", "content": "", "reasoning_content": "Let me look.",
                   "tool_calls": [{"id": tu.id, "type": "function", "function": {
                       "name": "get_weather", "arguments": json.dumps(tu.input)}}]},
                  {"role": "tool", "tool_call_id": tu.id, "content": "sunny"}]
    tools_oai = [{"type": "function", "function": {"name": t["name"],
                                                   "description": t["description"],
                                                   "parameters": t["input_schema"]}}
                 for t in TOOLS]
    assert (r.usage.input_tokens + r.usage.cache_read_input_tokens
            == reference_count(oai, tools=tools_oai, enable_thinking=False))


def test_tool_choice(client):
    # none: the tool-call text stays text
    m = scripted(client, CALL, tools=TOOLS, tool_choice={"type": "none"}, thinking=OFF)
    assert [b.type for b in m.content] == ["text"] and "<tool_call>" in m.content[0].text
    # tool: the call is forced, even from a random model
    m = client.messages.create(model=MODEL_NAME, max_tokens=40, messages=USER, tools=TOOLS,
                               extra_body={"temperature": 0}, thinking=OFF,
                               tool_choice={"type": "tool", "name": "get_weather"})
    calls = [b for b in m.content if b.type == "tool_use"]
    assert calls and calls[0].name == "get_weather" and isinstance(calls[0].input, dict)
    m = scripted(client, CALL, tools=TOOLS, tool_choice={"type": "any"},
                 thinking={"type": "enabled", "budget_tokens": 100})
    assert m.stop_reason == "tool_use"


def test_stop_sequences(client):
    m = scripted(client, "Hello STOP world", stop_sequences=["zzz", "STOP"], thinking=OFF)
    assert m.content[0].text == "Hello "
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    m, _ = scripted(client, "Hello STOP world", stream=True, stop_sequences=["STOP"],
                    thinking=OFF)
    assert m.content[0].text == "Hello "
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"


def test_sampling_fields_accepted(srv, client):
    # temperature/top_p/top_k are API fields this SDK version no longer names: extra_body
    kw = dict(model=MODEL_NAME, max_tokens=3, messages=USER, metadata={"user_id": "u1"},
              service_tier="auto", speed="standard", cache_control={"type": "ephemeral"},
              thinking={"type": "adaptive"}, output_config={"effort": "low"})
    m = client.messages.create(**kw, extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20})
    assert m.usage.output_tokens == 3
    # greedy is reproducible through the Anthropic path and equals the OpenAI path's output
    a = client.messages.create(**kw, extra_body={"temperature": 0})
    b = client.messages.create(**kw, extra_body={"temperature": 0})
    assert a.content == b.content
    st, o = srv.post_json("/v1/chat/completions", {"model": MODEL_NAME, "messages": USER,
                                                   "max_tokens": 3, "temperature": 0})
    assert st == 200
    assert [x.thinking for x in a.content if x.type == "thinking"] == \
        [o["choices"][0]["message"]["reasoning_content"]]
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(**dict(kw, output_config={"format": {"type": "json_schema",
                                                                    "schema": {}}}))
    assert "output_config.format" in ei.value.body["error"]["message"]


def test_auth(srv):
    body = {"model": MODEL_NAME, "max_tokens": 2, "messages": USER}
    bad = anthropic.Anthropic(base_url=srv.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as ei:
        bad.messages.create(model=MODEL_NAME, max_tokens=2, messages=USER)
    assert ei.value.body["type"] == "error"
    assert ei.value.body["error"]["type"] == "authentication_error"
    st, _, _ = srv.request("POST", "/v1/messages", body,
                           headers={"Authorization": "", "x-api-key": KEY})
    assert st == 200
    st, _, _ = srv.request("POST", "/v1/messages", body)  # Bearer (srv_util's default)
    assert st == 200
    st, _, data = srv.request("POST", "/v1/messages", body, headers={"Authorization": ""})
    assert st == 401 and json.loads(data)["error"]["type"] == "authentication_error"


def test_errors_in_anthropic_shape(srv, client):
    with pytest.raises(anthropic.BadRequestError) as ei:
        client.messages.create(model=MODEL_NAME, messages=USER, max_tokens=None)
    assert ei.value.status_code == 400
    assert ei.value.body["type"] == "error"
    assert ei.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in ei.value.body["error"]["message"]
    # a field that would change the output and is not supported: 400 naming it
    st, body = srv.post_json("/v1/messages", {"model": MODEL_NAME, "max_tokens": 5,
                                              "messages": USER, "mcp_servers": []})
    assert st == 400 and "mcp_servers" in body["error"]["message"]
    st, body = srv.post_json("/v1/messages", {"model": MODEL_NAME, "max_tokens": 5,
                                              "messages": [{"role": "user", "content": [
                                                  {"type": "image", "source": {}}]}]})
    assert st == 400 and "image" in body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as ei:
        client.messages.create(model="claude-nonexistent", max_tokens=5, messages=USER)
    assert ei.value.body["error"]["type"] == "not_found_error"
    st, body = srv.post_json("/v1/messages", {"model": MODEL_NAME, "max_tokens": 5,
                                              "messages": [{"role": "system", "content": "x"}]})
    assert st == 400 and body["type"] == "error" and "role" in body["error"]["message"]


def test_generation_failure(client):
    """An engine failure (test-mode injection) is a 500 api_error before the headers and an
    error event after them; the SDK raises on both."""
    kw = dict(model=MODEL_NAME, max_tokens=20, messages=USER, thinking=OFF,
              extra_body={"tulip_test_fail_after": 2})
    with pytest.raises(anthropic.InternalServerError) as ei:
        client.messages.create(**kw)
    assert ei.value.body["type"] == "error" and ei.value.body["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError) as ei:
        with client.messages.stream(**kw) as s:
            for _ in s:
                pass
    assert ei.value.body["error"]["type"] == "api_error"
    assert "generation failed" in ei.value.body["error"]["message"]
