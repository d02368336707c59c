"""The reference renderer for tests/py/test_chat.py: jinja2 configured the way Hugging Face's
transformers sets it up in apply_chat_template (transformers/utils/chat_template_utils.py,
_compile_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]) (transformers also adds its AssistantTracker extension, which only
matters for {% generation %} blocks that this template does not use), tojson replaced by
json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False), and the
raise_exception / strftime_now globals.

One pre-processing step is applied, as servers (vLLM) do before rendering and as tulip's
chat.c does: tool-call arguments given as a JSON string are json.loads()-ed first.
"""
import copy
import json
import os
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEMPLATE_PATH = os.path.join(ROOT, "..", "shared", "data", "qwen3.6-chat-template.jinja")


class TemplateRaised(Exception):
    """The template's own raise_exception(message)."""


def _raise_exception(message):
    raise TemplateRaised(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def load_template(path=TEMPLATE_PATH):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    with open(path, encoding="utf-8") as f:
        return env.from_string(f.read())


def preprocess(messages):
    """Parses tool-call arguments given as JSON strings (chat.h); raises ValueError if invalid."""
    messages = copy.deepcopy(messages)
    if not isinstance(messages, list):
        return messages
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("tool_calls"), list):
            continue
        for tc in m["tool_calls"]:
            if not isinstance(tc, dict):
                continue
            fn = tc["function"] if "function" in tc else tc
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.loads(fn["arguments"])
    return messages


def render(template, case):
    """Returns ("ok", prompt), ("raise", template message) or ("error", exception text)."""
    kwargs = dict(messages=case["messages"], tools=case.get("tools"),
                  add_generation_prompt=case.get("add_generation_prompt", True),
                  enable_thinking=case.get("enable_thinking", True),
                  preserve_thinking=case.get("preserve_thinking", False),
                  bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    try:
        kwargs["messages"] = preprocess(kwargs["messages"])
        return "ok", template.render(**kwargs)
    except TemplateRaised as e:
        return "raise", str(e)
    except (jinja2.exceptions.TemplateError, TypeError, ValueError, AttributeError) as e:
        return "error", "%s: %s" % (type(e).__name__, e)
