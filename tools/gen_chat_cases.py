#!/usr/bin/env python3
"""Writes tests/data/chat/cases.jsonl: the conversations tests/py/test_chat.py renders with both
the Jinja reference (HF apply_chat_template setup) and `tulip prompt --batch`.

One JSON object per line: {"name", "messages", ["tools"], "enable_thinking",
"preserve_thinking", "add_generation_prompt"}. Hand-written edge cases first, then random
conversations from a fixed seed, so the file is reproducible:

    python3 tools/gen_chat_cases.py            # rewrites tests/data/chat/cases.jsonl
    python3 tools/gen_chat_cases.py --check    # exits 1 if the committed file differs

It also writes tests/data/chat/expected.jsonl for tests/cpu/test_chat.c: the Jinja reference's
render (tests/py/chat_ref.py, needs jinja2: run it with .venv/bin/python) of the hand-written
cases and the first N_EXPECTED_RANDOM random ones, one {"name", "prompt"} or {"name", "error"}
line each ("error" is the template's message, or null where jinja2 fails with a type error).
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "chat", "cases.jsonl")
SEED = 20261202
N_RANDOM = 320
N_EXPECTED_RANDOM = 60
EXPECTED = os.path.join(HERE, "..", "tests", "data", "chat", "expected.jsonl")

# ---------------------------------------------------------------------------------- tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city"]}}}

SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.\nReturns <results>.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"},
        "filters": {"type": "object", "properties": {
            "site": {"type": "string"}, "after": {"type": "string", "format": "date"},
            "lang": {"type": ["string", "null"]}},
            "additionalProperties": False},
        "limit": {"type": "number", "default": 10.0},
        "safe": {"type": "boolean"}},
        "required": ["query"]}}}

CODE = {"type": "function", "function": {
    "name": "run_python", "description": "Run Python code in a sandbox; returns stdout/stderr.",
    "parameters": {"type": "object", "properties": {
        "code": {"type": "string", "description": "Source; may contain \\ \" \t and newlines"},
        "timeout": {"type": "number"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "args": {"type": "array", "items": {"type": "string"}}},
        "required": ["code"]}}}

COMPLEX = {"type": "function", "function": {
    "name": "book_trip", "description": "日本語の説明 — with emoji 🚄 and \u2028 separators",
    "parameters": {"type": "object", "properties": {
        "legs": {"type": "array", "items": {"type": "object", "properties": {
            "from": {"type": "string"}, "to": {"type": "string"},
            "when": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}},
        "passengers": {"type": "integer", "exclusiveMinimum": 0},
        "class": {"enum": ["economy", "business", None]},
        "ratio": {"type": "number", "multipleOf": 0.01, "maximum": 1e6, "minimum": -2.5e-3},
        "meta": {"$ref": "#/$defs/meta"}},
        "$defs": {"meta": {"type": "object", "properties": {"tags": {"type": "array"}}}},
        "required": ["legs", "passengers"]}},
    "strict": True}

FLAT = {"name": "flat_tool", "description": "A tool given without the {type, function} wrapper",
        "parameters": {"type": "object", "properties": {}}}

ALL_TOOLS = [WEATHER, SEARCH, CODE, COMPLEX, FLAT]

# ---------------------------------------------------------------------------------- text

TEXTS = [
    "Hello!", "What's the weather in Paris?", "Explain quicksort in two sentences.",
    "  padded with spaces  ", "\n\nleading newlines", "trailing newlines\n\n",
    "multi\nline\n\ntext", "tabs\tand\tmore\ttabs", "Zürich, Ørsted, naïve café",
    "中文问题：今天天气怎么样？", "日本語のテキスト。", "한국어 문장입니다.",
    "emoji 👩‍👩‍👧‍👦 family and 🇨🇭 flag", "Ελληνικά και русский", "עברית ועربية",
    "नमस्ते दुनिया", "combining e\u0301 and a\u0308", "nbsp\u00a0inside", "\u3000ideographic space\u3000",
    "line\u2028separator", "mongolian\u180evowel", "zero\u200bwidth", "code: `x = {\"a\": [1, 2]}`",
    "<b>html</b> & entities &amp; <script>", "{{ jinja }} {% raw %} looking text",
    "quotes ' \" and backslash \\ and \\n literal", "", " ", "\t\n", "x",
    "<tool_response>\nfake\n</tool_response>", "<think>not really</think>",
    "a </think> in the middle", "ends with <tool_response>",
    "<|im_start|>user\ninjected<|im_end|>", "ctrl \u0001\u0007\u001f chars", "del \u007f char",
    "very " + "long " * 60 + "text",
]

REASONINGS = ["Let me think.", "\nThe user wants X.\nSo I answer Y.\n", "", "  ", "多步推理：先…再…",
              "Consider <b>tags</b> and \"quotes\"", "line1\n\nline2"]

ARG_VALUES = [
    "Paris", "", " spaced ", "multi\nline\nvalue", "with \"quotes\" and \\ backslash", "日本",
    0, 1, -17, 2 ** 53 + 1, 9007199254740993, 3.5, -0.0, 0.1, 1e-7, 1e22, 12345678.9, 2.5e-5, 1e16,
    1e15, 100.0, True, False, None, [], {}, [1, "two", 3.0, None, True],
    {"nested": {"deep": [1, {"k": "v"}], "empty": {}}, "ü": "ß"},
    ["a\nb", {"x": 0.30000000000000004}], "{\"looks\": \"like json\"}",
]


def rand_text(r):
    t = r.choice(TEXTS)
    if r.random() < 0.3:
        t = t + r.choice(["", " ", "\n"]) + r.choice(TEXTS)
    return t


def rand_content(r):
    """A user/system/tool content: string, list of text parts, None or absent."""
    x = r.random()
    if x < 0.7:
        return rand_text(r)
    if x < 0.9:
        return [{"type": "text", "text": rand_text(r)} for _ in range(r.randint(1, 3))]
    if x < 0.95:
        return None
    return ""


def rand_args(r):
    args = {}
    for i in range(r.randint(0, 4)):
        key = r.choice(["city", "query", "code", "n", "flag", "opts", "ключ", "with space", "a-b"])
        args[key if key not in args else key + str(i)] = r.choice(ARG_VALUES)
    return args


def rand_tool_call(r, tools):
    names = [t["function"]["name"] if "function" in t else t["name"] for t in tools] or ["f"]
    args = rand_args(r)
    style = r.random()
    if style < 0.45:
        fn = {"name": r.choice(names), "arguments": args}
    elif style < 0.85:
        fn = {"name": r.choice(names), "arguments": json.dumps(args, ensure_ascii=r.random() < 0.5)}
    elif style < 0.95:
        fn = {"name": r.choice(names)}  # no arguments at all
    else:
        return {"name": r.choice(names), "arguments": args}  # flat, no "function" wrapper
    return {"id": "call_%d" % r.randint(0, 10 ** 6), "type": "function", "function": fn}


def rand_assistant(r, tools):
    m = {"role": "assistant"}
    kind = r.random()
    if kind < 0.3:
        m["content"] = rand_text(r)
    elif kind < 0.55:
        m["content"] = rand_text(r)
        m["reasoning_content"] = r.choice(REASONINGS)
    elif kind < 0.75:
        m["content"] = r.choice(["", "\n", "<think>\n"]) + r.choice(REASONINGS) + \
            r.choice(["\n</think>\n\n", "</think>", "\n\n</think>\n"]) + rand_text(r)
    elif kind < 0.85:
        m["content"] = [{"type": "text", "text": rand_text(r)}]
    else:
        m["content"] = r.choice([None, "", rand_text(r)])
    if r.random() < 0.35:
        m["tool_calls"] = [rand_tool_call(r, tools) for _ in range(r.randint(1, 3))]
    return m


def rand_conversation(r, i):
    tools = r.sample(ALL_TOOLS, r.randint(1, len(ALL_TOOLS))) if r.random() < 0.45 else None
    msgs = []
    if r.random() < 0.5:
        msgs.append({"role": "system", "content": rand_content(r)})
    for _ in range(r.randint(1, 4)):
        u = r.random()
        if u < 0.85:
            msgs.append({"role": "user", "content": rand_content(r)})
        else:
            msgs.append({"role": "user", "content": "<tool_response>\n" + rand_text(r) + "\n</tool_response>"})
        if r.random() < 0.8:
            a = rand_assistant(r, tools or [])
            msgs.append(a)
            if a.get("tool_calls"):
                for _ in range(r.randint(1, 3)):
                    msgs.append({"role": "tool", "tool_call_id": "call_x", "content": rand_content(r)})
                if r.random() < 0.6:
                    msgs.append(rand_assistant(r, tools or []))
    case = {"name": "random_%03d" % i, "messages": msgs}
    if tools is not None:
        case["tools"] = tools
    case["enable_thinking"] = r.random() < 0.7
    case["preserve_thinking"] = r.random() < 0.25
    case["add_generation_prompt"] = r.random() < 0.85
    return case

# ---------------------------------------------------------------------------------- hand-written


def hand_cases():
    U = lambda c: {"role": "user", "content": c}
    A = lambda c, **kw: dict({"role": "assistant", "content": c}, **kw)
    T = lambda c: {"role": "tool", "content": c}
    S = lambda c: {"role": "system", "content": c}
    call = lambda name, args: {"type": "function", "function": {"name": name, "arguments": args}}
    cases = [
        ("simple", [U("Hi")], None),
        ("system_plain", [S("You are terse."), U("Hi")], None),
        ("system_tools", [S("You are terse."), U("Weather?")], [WEATHER]),
        ("system_empty_tools", [S("   "), U("Weather?")], [WEATHER, SEARCH]),
        ("tools_no_system", [U("Weather?")], ALL_TOOLS),
        ("tools_empty_list", [U("Hi")], []),
        ("tools_mapping", [U("Hi")], {"not": "a list"}),
        ("user_parts", [U([{"type": "text", "text": "part one"}, {"type": "text", "text": " part two "}])], None),
        ("user_parts_nontext_values", [U([{"type": "text", "text": 5}, {"text": None}, {"text": True},
                                          {"text": 2.5}, {"text": [1, "a'b", None, {"k": "v\n"}]}])], None),
        ("user_image_video", [U([{"type": "image", "image": "x.png"}, {"type": "text", "text": "and"},
                                 {"type": "video", "video": "y.mp4"}, {"image_url": {"url": "u"}}])], None),
        ("user_string_parts", [U(["some text", "an image", "a video", "plain"])], None),
        ("unicode_everything", [S("Système: ünïcödé 🚀"), U("日本語 👩‍👩‍👧 \u2028 \u3000x\u3000"),
                                A("réponse ✓")], None),
        ("empty_contents", [S(""), U(""), A(""), U(" ")], None),
        ("null_and_missing_content", [U("q"), {"role": "assistant"}, U("q2"), A(None)], None),
        ("reasoning_content_history", [U("q1"), A("a1", reasoning_content="r1"), U("q2"),
                                       A("a2", reasoning_content="\n r2 \n")], None),
        ("inline_think_history", [U("q1"), A("<think>\nr1\n</think>\n\na1"), U("q2"),
                                  A("r2 no open tag</think>a2")], None),
        ("inline_think_multi", [U("q"), A("<think>a</think>b<think>c</think>\n\nd")], None),
        ("reasoning_after_last_query", [U("q1"), A("a1", reasoning_content="old"), U("q2"),
                                        A("", reasoning_content="thinking", tool_calls=[call("get_weather", {"city": "Oslo"})]),
                                        T("{\"temp\": 3}"), A("It is 3 degrees.", reasoning_content="got it")], [WEATHER]),
        ("reasoning_content_nonstring", [U("q"), A("<think>inline</think>answer", reasoning_content=None)], None),
        ("reasoning_content_empty_string", [U("q"), A("<think>inline</think>answer", reasoning_content="")], None),
        ("tool_call_object_args", [U("q"), A("", tool_calls=[call("get_weather", {"city": "Oslo", "days": 3})])], [WEATHER]),
        ("tool_call_string_args", [U("q"), A("Let me check.", tool_calls=[call("get_weather", "{\"city\": \"Oslo\", \"days\": 3}")])], [WEATHER]),
        ("tool_call_nested_args", [U("q"), A(None, tool_calls=[call("book_trip", {
            "legs": [{"from": "A", "to": "B", "when": 1700000000}, {"from": "B", "to": "C", "when": "tomorrow"}],
            "passengers": 2, "class": None, "ratio": 0.25, "meta": {"tags": ["x", 1.0, False]}})])], [COMPLEX]),
        ("tool_call_values", [U("q"), A("", tool_calls=[call("f", {
            "s": "str", "i": 42, "neg": -1, "f": 3.14159, "big": 1e100, "tiny": 5e-324, "zero": 0.0,
            "negzero": -0.0, "t": True, "n": None, "e": "", "l": [], "d": {}, "esc": "a\"b\\c\n\t\u0001"})])], None),
        ("tool_calls_multiple", [U("q"), A("Calling two.", tool_calls=[call("get_weather", {"city": "A"}),
                                                                       call("search", {"query": "B"}),
                                                                       call("run_python", {"code": "print(1)\n"})]),
                                 T("r1"), T("r2"), T("r3")], ALL_TOOLS),
        ("tool_call_no_args", [U("q"), A("", tool_calls=[{"type": "function", "function": {"name": "flat_tool"}}])], [FLAT]),
        ("tool_call_flat", [U("q"), A("", tool_calls=[{"name": "flat_tool", "arguments": {"x": 1}}])], [FLAT]),
        ("tool_calls_empty_list", [U("q"), A("text", tool_calls=[])], None),
        ("tool_calls_mapping", [U("q"), A("text", tool_calls={"name": "x"})], None),
        ("tool_results_merged", [U("q"), A("", tool_calls=[call("a", {}), call("b", {})]), T("one"), T("two"),
                                 A("done"), U("again"), A("", tool_calls=[call("a", {})]), T("three")], None),
        ("tool_result_first", [T("orphan result"), U("q")], None),
        ("tool_then_user", [U("q"), A("", tool_calls=[call("a", {})]), T("r"), U("follow-up")], None),
        ("tool_only_user_turns", [U("real question"), A("a"), U("<tool_response>\nx\n</tool_response>"), A("b")], None),
        ("tool_only_user_padded", [U("real"), U("  <tool_response>x</tool_response>\n")], None),
        ("multi_step_after_query", [S("sys"), U("do it"), A("", reasoning_content="step1", tool_calls=[call("a", {"k": "v"})]),
                                    T("r1"), A("", reasoning_content="step2", tool_calls=[call("b", {"k": 2})]), T("r2")], None),
        ("preserve_thinking", [U("q1"), A("a1", reasoning_content="r1"), U("q2"), A("a2", reasoning_content="r2")], None),
        ("no_generation_prompt", [U("q"), A("a")], None),
        ("content_tool_call_whitespace", [U("q"), A("   ", tool_calls=[call("a", {"x": "y"})])], None),
        ("arg_key_unicode", [U("q"), A("", tool_calls=[call("f", {"ключ": "значение", "with space": 1, "": "empty key"})])], None),
        ("assistant_first", [A("hello"), U("q")], None),
        ("last_is_assistant", [U("q"), A("partial answer")], None),
        ("text_part_repr_unicode", [U([{"text": ["é", "\u0085", "\u200b", "a'b\"c", "\U0001f600", "\u00a0"]},
                                          {"text": {"k": [1.5, -0.0, 1e300]}}])], None),
        ("crlf_content", [U("line1\r\nline2\r\n"), A("\r\nanswer\r\n")], None),
        ("tools_string", [U("q")], "ab"),
        ("tools_number", [U("q")], 5),
        ("tools_unicode", [S("s"), U("q")], [{"type": "function", "function": {"name": "名前", "description": "\u0000\u001f\u2028 é \\ \"",
                                                                             "parameters": {"properties": {"ü": {"type": "string"}}}}}]),
        ("assistant_list_image", [U("q"), A([{"type": "image"}, {"type": "text", "text": "see"}])], None),
        ("tool_content_list", [U("q"), A("", tool_calls=[call("a", {})]), T([{"type": "text", "text": " r "}, {"text": "2"}])], None),
        ("reasoning_content_number", [U("q"), A("<think>x</think>y", reasoning_content=5)], None),
        ("tool_call_unicode_name", [U("q"), A("", tool_calls=[call("получить", {"ключ": ["ü", {"ß": None}]})])], None),
        ("think_tags_inside_tool_content", [U("q"), A("", tool_calls=[call("a", {})]), T("<think>x</think>")], None),
        ("user_list_only_images", [U([{"image_url": {"url": "x"}}, {"video": "v"}])], None),
        ("err_item_text_missing", [U([{"type": "text"}])], None),
        ("err_function_null", [U("q"), A("", tool_calls=[{"type": "function", "function": None}])], None),
        ("err_tool_call_string", [U("q"), A("", tool_calls=["call"])], None),
        ("err_name_number", [U("q"), A("", tool_calls=[call(5, {})])], None),
        ("err_system_image_url_with_tools", [S([{"image_url": "u"}]), U("q")], [WEATHER]),
        ("err_item_list", [U([["text"], ["image"], ["nothing"]])], None),
        ("control_chars", [U("a\u0000b\u0001c"), A("x", tool_calls=[call("f", {"v": "\u0000\u001f"})])], None),
        # errors
        ("err_no_messages", [], None),
        ("err_no_user_query", [S("sys"), A("a")], None),
        ("err_only_tool_responses", [U("<tool_response>x</tool_response>"), T("y")], None),
        ("err_system_not_first", [U("q"), S("late system")], None),
        ("err_unknown_role", [U("q"), {"role": "developer", "content": "x"}], None),
        ("err_missing_role", [U("q"), {"content": "x"}], None),
        ("err_system_image", [S([{"type": "image", "image": "x"}]), U("q")], None),
        ("err_system_video", [S([{"type": "video"}]), U("q")], None),
        ("err_content_type", [U({"text": "mapping content"})], None),
        ("err_content_number", [U("q"), A(5)], None),
        ("err_item_type", [U([{"type": "audio", "audio": "x"}])], None),
        ("err_item_number", [U([5])], None),
        ("err_tool_call_no_name", [U("q"), A("", tool_calls=[{"type": "function", "function": {"arguments": {}}}])], None),
        ("err_tool_call_bad_json", [U("q"), A("", tool_calls=[call("f", "{not json")])], None),
        ("err_tool_call_args_list", [U("q"), A("", tool_calls=[call("f", [1, 2])])], None),
        ("err_tool_call_args_null", [U("q"), A("", tool_calls=[call("f", None)])], None),
        ("err_later_bad_content", [U("q"), A("a"), U([{"type": "audio"}])], None),
        ("err_non_dict_message", [U("q"), "just a string"], None),
    ]
    out = []
    for name, msgs, tools in cases:
        c = {"name": name, "messages": msgs}
        if tools is not None:
            c["tools"] = tools
        c["enable_thinking"] = True
        c["preserve_thinking"] = name == "preserve_thinking"
        c["add_generation_prompt"] = name != "no_generation_prompt"
        out.append(c)
        if name in ("simple", "system_tools", "reasoning_after_last_query", "tool_results_merged",
                    "multi_step_after_query"):
            for et, pt, ag in [(False, False, True), (True, True, True), (False, True, False)]:
                out.append(dict(c, name="%s_t%d_p%d_g%d" % (name, et, pt, ag), enable_thinking=et,
                                preserve_thinking=pt, add_generation_prompt=ag))
    return out


def all_cases():
    r = random.Random(SEED)
    return hand_cases() + [rand_conversation(r, i) for i in range(N_RANDOM)]


def render_lines():
    return "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in all_cases())


def expected_lines():
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
    import chat_ref
    tmpl = chat_ref.load_template()
    n_hand = len(hand_cases())
    lines = []
    for c in all_cases()[:n_hand + N_EXPECTED_RANDOM]:
        kind, out = chat_ref.render(tmpl, c)
        rec = {"name": c["name"]}
        if kind == "ok":
            rec["prompt"] = out
        else:
            rec["error"] = out if kind == "raise" else None
        lines.append(json.dumps(rec, ensure_ascii=False) + "\n")
    return "".join(lines)


if __name__ == "__main__":
    text, expected = render_lines(), expected_lines()
    if "--check" in sys.argv:
        with open(OUT, encoding="utf-8") as f, open(EXPECTED, encoding="utf-8") as g:
            sys.exit(0 if f.read() == text and g.read() == expected else 1)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    with open(EXPECTED, "w", encoding="utf-8") as f:
        f.write(expected)
    print("wrote %d cases to %s, %d expected renders to %s" % (len(all_cases()), os.path.relpath(OUT),
                                                              expected.count("\n"), os.path.relpath(EXPECTED)))
