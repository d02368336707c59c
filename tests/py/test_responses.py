"""End to end: POST /v1/responses (the stateless Responses API) on a real `tulip serve` (CPU
backend, tests/data/tiny-a), driven by the official openai client's `client.responses` and raw
HTTP, with the plain and the ASan+UBSan build.

As in test_server.py, reasoning and tool calls come from the test-only `tulip_test_script`
request field (honoured with --test-mode): the engine emits the given token ids (taken from
Hugging Face tokenizers, the reference), and everything after it is the real path. The rendered
prompt is read back from the --trace file (the trace id of a request is its response id)."""
import json

import openai
import pytest
from tokenizers import Tokenizer

from srv_util import BINARIES, TOKENIZER, Server, sanitizer_report

TOK = Tokenizer.from_file(TOKENIZER)
MODEL_NAME = "tiny-a"
TOOLS = [{"type": "function", "name": "get_weather", "description": "weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                          "days": {"type": "integer"}}}}]
CALL = ("Let me look.</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def ids(text):
    return TOK.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module", params=sorted(BINARIES))
def srv(request, tmp_path_factory):
    trace = str(tmp_path_factory.mktemp("trace") / "trace.jsonl")
    s = Server(BINARIES[request.param], "--test-mode", "--ctx", "2048", "--trace", trace)
    s.trace_path = trace
    yield s
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def scripted(client, text, **kw):
    extra = kw.pop("extra_body", {})
    extra["tulip_test_script"] = ids(text)
    return client.responses.create(model=MODEL_NAME, input=kw.pop("input", "Hello there"),
                                   extra_body=extra, **kw)


def prompt_of(srv, resp_id):
    with open(srv.trace_path) as f:
        lines = [json.loads(line) for line in f]
    (p,) = [x["data"] for x in lines if x["id"] == resp_id and x["event"] == "prompt"]
    return p


def events_of(stream):
    evs = list(stream)
    assert [e.sequence_number for e in evs] == list(range(len(evs)))
    assert [e.type for e in evs[:2]] == ["response.created", "response.in_progress"]
    return evs


def test_text_nonstream(srv, client):
    r = scripted(client, "I think</think>\n\nThe answer")
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed"
    assert r.model == MODEL_NAME and r.incomplete_details is None
    assert [o.type for o in r.output] == ["reasoning", "message"]
    rs, msg = r.output
    assert [c.text for c in rs.content] == ["I think"]
    assert msg.role == "assistant" and msg.status == "completed"
    assert [c.type for c in msg.content] == ["output_text"] and msg.content[0].text == "The answer"
    assert r.output_text == "The answer"
    n_out = len(ids("I think</think>\n\nThe answer")) + 1  # + the EOS that ends the script
    assert r.usage.output_tokens == n_out
    assert r.usage.output_tokens_details.reasoning_tokens == len(ids("I think</think>"))
    p = prompt_of(srv, r.id)
    assert p.startswith("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")
    assert r.usage.input_tokens == len(ids(p))
    assert r.usage.total_tokens == r.usage.input_tokens + n_out


def test_text_stream_matches_final(client):
    text = "I think</think>\n\nThe answer is 42."
    evs = events_of(scripted(client, text, stream=True))
    types = [e.type for e in evs]
    assert types[-1] == "response.completed"
    final = evs[-1].response
    assert final.status == "completed" and final.output_text == "The answer is 42."
    deltas = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    assert deltas == "The answer is 42."
    (done,) = [e for e in evs if e.type == "response.output_text.done"]
    assert done.text == deltas
    thought = "".join(e.delta for e in evs if e.type == "response.reasoning_text.delta")
    assert thought == "I think"
    # item lifecycle, in the order the API sends it
    msg_events = [t for t in types if t.startswith("response.") and "reasoning" not in t]
    assert msg_events[2:] == [
        "response.output_item.added", "response.content_part.added",  # reasoning item
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",  # message item
        *["response.output_text.delta"] * msg_events.count("response.output_text.delta"),
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    added = [e.item.id for e in evs if e.type == "response.output_item.added"]
    assert added == [o.id for o in final.output]
    assert {e.item_id for e in evs if e.type == "response.output_text.delta"} == {added[1]}


def test_instructions_and_roles(srv, client):
    r = scripted(client, "Ok.", instructions="Be brief.", reasoning={"effort": "none"},
                 input=[{"role": "developer", "content": "Use metric units."},
                        {"role": "user", "content": [{"type": "input_text", "text": "Hi "},
                                                     {"type": "input_text", "text": "there"}]},
                        {"type": "message", "role": "assistant",
                         "content": [{"type": "output_text", "text": "Hello!"}]},
                        {"role": "user", "content": "Weather?"}])
    assert r.output_text == "Ok."
    assert prompt_of(srv, r.id) == (
        "<|im_start|>system\nBe brief.\n\nUse metric units.<|im_end|>\n"
        "<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reasoning_effort(srv, client):
    text = "I think</think>\n\nThe answer"
    on = scripted(client, text, reasoning={"effort": "high"})
    assert [o.type for o in on.output] == ["reasoning", "message"]
    assert prompt_of(srv, on.id).endswith("<|im_start|>assistant\n<think>\n")
    off = scripted(client, "The answer", reasoning={"effort": "none"})
    assert [o.type for o in off.output] == ["message"] and off.output_text == "The answer"
    assert off.usage.output_tokens_details.reasoning_tokens == 0
    assert prompt_of(srv, off.id).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    minimal = scripted(client, "The answer", reasoning={"effort": "minimal"})
    assert [o.type for o in minimal.output] == ["message"]


def test_function_call_and_follow_up(srv, client):
    r = scripted(client, CALL, tools=TOOLS, input="Weather in Paris?")
    assert r.status == "completed"
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    fc = r.output[1]
    assert fc.name == "get_weather" and fc.call_id.startswith("call_") and fc.id.startswith("fc_")
    assert json.loads(fc.arguments) == {"city": "Paris", "days": 3}
    assert fc.status == "completed"
    assert "<tools>" in prompt_of(srv, r.id)

    evs = events_of(scripted(client, CALL, tools=TOOLS, input="Weather in Paris?", stream=True))
    args = "".join(e.delta for e in evs if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in evs if e.type == "response.function_call_arguments.done"]
    assert done.arguments == args and json.loads(args) == {"city": "Paris", "days": 3}
    (added,) = [e.item for e in evs if e.type == "response.output_item.added"
                and e.item.type == "function_call"]
    assert added.name == "get_weather" and added.call_id.startswith("call_")
    assert evs[-1].type == "response.completed"
    assert evs[-1].response.output[1].arguments == args

    # the call and its output go back as input items (reasoning included), as the SDK returns them
    history = [{"role": "user", "content": "Weather in Paris?"}]
    history += [o.model_dump(exclude_none=True) for o in r.output]
    history.append({"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"})
    r2 = scripted(client, "It is sunny.", tools=TOOLS, input=history,
                  reasoning={"effort": "none"})
    assert r2.output_text == "It is sunny."
    p = prompt_of(srv, r2.id)
    assert ("<|im_start|>assistant\n<think>\nLet me look.\n</think>\n\n<tool_call>\n"
            "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n") in p
    # the same conversation through chat completions renders the same prompt
    chat = client.chat.completions.create(
        model=MODEL_NAME, max_tokens=1, tools=[{"type": "function", "function": {
            k: v for k, v in TOOLS[0].items() if k != "type"}}],
        messages=[{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "reasoning_content": "Let me look.",
                   "tool_calls": [{"id": fc.call_id, "type": "function", "function": {
                       "name": "get_weather", "arguments": fc.arguments}}]},
                  {"role": "tool", "tool_call_id": fc.call_id, "content": "sunny"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert prompt_of(srv, chat.id) == p


def test_tool_choice_named_forces_the_call(client):
    r = client.responses.create(model=MODEL_NAME, input="Hi", tools=TOOLS, max_output_tokens=40,
                                temperature=0, reasoning={"effort": "none"},
                                tool_choice={"type": "function", "name": "get_weather"})
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"


def test_max_output_tokens_incomplete(client):
    r = client.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=3,
                                reasoning={"effort": "none"},
                                extra_body={"tulip_test_script": ids("one two three four five")})
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.max_output_tokens == 3
    assert r.output_text == TOK.decode(ids("one two three four five")[:3])
    evs = events_of(client.responses.create(
        model=MODEL_NAME, input="Hello", max_output_tokens=3, stream=True,
        reasoning={"effort": "none"},
        extra_body={"tulip_test_script": ids("one two three four five")}))
    assert evs[-1].type == "response.incomplete"
    assert evs[-1].response.incomplete_details.reason == "max_output_tokens"


def test_stateless_refusals(srv, client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model=MODEL_NAME, input="Hi", previous_response_id="resp_123")
    assert ei.value.status_code == 400 and ei.value.body["param"] == "previous_response_id"
    assert "stateless" in ei.value.body["message"]
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model=MODEL_NAME, input="Hi", store=True)
    assert ei.value.body["param"] == "store" and "stores no responses" in ei.value.body["message"]
    # store=false and harmless fields are accepted
    r = client.responses.create(model=MODEL_NAME, input="Hi", store=False, max_output_tokens=2,
                                metadata={"k": "v"}, user="u1", include=[],
                                reasoning={"effort": "none", "summary": "auto"},
                                text={"format": {"type": "text"}}, truncation="disabled")
    assert r.usage.output_tokens == 2 and r.metadata == {"k": "v"}


def err_of(srv, body):
    st, data = srv.post_json("/v1/responses", body)
    assert set(data) == {"error"}, data
    return st, data["error"]


def test_bad_input(srv):
    cases = [
        ({"input": "Hi", "background": True}, "background"),
        ({"input": "Hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "Hi", "text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x",
                                             "schema": {"type": "string", "pattern": "a"}}}},
         "response_format"),
        ({"input": "Hi", "truncation": "auto"}, "truncation"),
        ({"input": "Hi", "top_logprobs": 2}, "top_logprobs"),
        ({"input": "Hi", "max_tool_calls": 2}, "max_tool_calls"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content[0].type"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": "Hi", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({}, "input"),
        ({"input": "Hi", "frobnicate": 1}, "frobnicate"),
    ]
    for body, param in cases:
        st, e = err_of(srv, body)
        assert st == 400 and e["param"] == param, (body, e)
    st, _, data = srv.request("POST", "/v1/responses", b'{"input": ')
    assert st == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"
    st, e = err_of(srv, {"model": "gpt-5", "input": "Hi"})
    assert st == 404 and e["code"] == "model_not_found"


def test_failure(client):
    """An engine failure during a stream ends it with response.failed (the error inside); before
    any output of a non-streaming request it is a plain 500 with an OpenAI-shaped body."""
    evs = events_of(client.responses.create(
        model=MODEL_NAME, input="Hello", max_output_tokens=50, stream=True,
        reasoning={"effort": "none"}, extra_body={"tulip_test_fail_after": 3}))
    assert evs[-1].type == "response.failed"
    assert evs[-1].response.status == "failed"
    assert "injected failure" in evs[-1].response.error.message
    with pytest.raises(openai.InternalServerError) as ei:
        client.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=2,
                                extra_body={"tulip_test_fail_after": 1})
    assert ei.value.body["type"] == "server_error" and "injected failure" in ei.value.body["message"]
    # the server is fine afterwards
    r = client.responses.create(model=MODEL_NAME, input="Hello", max_output_tokens=2)
    assert r.usage.output_tokens == 2
