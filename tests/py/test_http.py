"""HTTP hygiene and the small endpoints of a real `tulip serve` (CPU backend, tests/data/tiny-a):
request smuggling through conflicting Content-Length headers (raw sockets: the smuggled second
request must never run), Content-Type: application/json on POST (415), 405 with Allow, CORS off by
default and on with --allowed-origins, /tokenize and /detokenize against Hugging Face tokenizers
on the same tokenizer.json (the reference), /version, /ping and HEAD /health."""
import json
import socket

import pytest
from tokenizers import Tokenizer

from srv_util import BINARIES, TOKENIZER, Server, sanitizer_report

TOK = Tokenizer.from_file(TOKENIZER)
N_VOCAB = TOK.get_vocab_size(with_added_tokens=True)


def _start(which, *args):
    return Server(BINARIES[which], "--ctx", "2048", "--max-seqs", "2", *args)


def _stop(s):
    rc, err = s.stop()
    assert rc == 0, err[-3000:]
    assert sanitizer_report(err) is None, err[-5000:]


@pytest.fixture(scope="module", params=sorted(BINARIES))
def srv(request):
    s = _start(request.param)
    yield s
    _stop(s)


@pytest.fixture(scope="module", params=[("cpu", "http://a.example, http://b.example"),
                                        ("asan", "*")])
def cors(request):
    which, origins = request.param
    s = _start(which, "--allowed-origins", origins)
    s.origins = origins
    yield s
    _stop(s)


def raw(srv, data, timeout=30):
    """Sends raw bytes and reads until the server closes the connection."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except ConnectionResetError:  # closed with our unread bytes: what came before counts
        pass
    s.close()
    return out


def statuses(resp):
    """The status codes of every HTTP response in a raw byte stream."""
    return [int(line.split()[1]) for line in resp.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


def counter(srv, endpoint, status):
    return srv.metrics().get(f'tulip_requests_total{{endpoint="{endpoint}",status="{status}"}}', 0)


# ---------------------------------------------------------------- request smuggling


SMUGGLED = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 39\r\nConnection: close\r\n\r\n"
            b'{"prompt":"smuggled","max_tokens":1}   ')


@pytest.mark.parametrize("first_short", [True, False])
def test_conflicting_content_length_is_refused(srv, first_short):
    assert len(SMUGGLED.split(b"\r\n\r\n", 1)[1]) == 39
    body = b'{"prompt":"hi","max_tokens":1}'
    lens = [len(body), len(body) + len(SMUGGLED)]
    if not first_short:
        lens.reverse()
    before_ok = counter(srv, "completions", 200)
    before_bad = counter(srv, "completions", 400)
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % tuple(lens)) + body + SMUGGLED
    resp = raw(srv, req)
    assert statuses(resp) == [400], resp
    err = json.loads(resp.split(b"\r\n\r\n", 1)[1])["error"]
    assert "Content-Length" in err["message"]
    # Neither the first request nor the smuggled one generated anything.
    assert counter(srv, "completions", 200) == before_ok
    assert counter(srv, "completions", 400) == before_bad + 1


def test_content_length_with_chunked_is_refused(srv):
    before = counter(srv, "tokenize", 200)
    req = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
           b'10\r\n{"prompt":"abc"}\r\n0\r\n\r\n')
    resp = raw(srv, req)
    assert statuses(resp) == [400], resp
    assert "Transfer-Encoding" in json.loads(resp.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    assert counter(srv, "tokenize", 200) == before


def test_equal_repeated_content_length_and_chunked_alone_work(srv):
    body = b'{"prompt":"abc"}'
    req = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
           % (len(body), len(body))) + body
    resp = raw(srv, req)
    assert statuses(resp) == [200], resp
    assert json.loads(resp.split(b"\r\n\r\n", 1)[1])["tokens"] == TOK.encode("abc").ids
    req = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
           b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    resp = raw(srv, req)
    assert statuses(resp) == [200], resp


def test_http_layer_errors(srv):
    # libmicrohttpd answers these itself, before tulip sees the request; its bodies are built in
    # (HTML), so only the status is checked.
    bad_chunk = (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
    assert statuses(raw(srv, bad_chunk)) == [400]
    huge = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n"
    assert statuses(raw(srv, huge)) == [431]
    # Over --max-body, announced or chunked: tulip's JSON 413.
    resp = raw(srv, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % (8 * 1024 * 1024 + 1))
    assert statuses(resp) == [413], resp
    assert "over the limit" in json.loads(resp.split(b"\r\n\r\n", 1)[1])["error"]["message"]


# ---------------------------------------------------------------- Content-Type, 405


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/jsonx",
                                   "application/json-seq"])
def test_post_needs_json_content_type(srv, ctype):
    before = counter(srv, "completions", 200)
    headers = {"Content-Type": ctype} if ctype else {}
    c_body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    if ctype is None:
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
               b"Connection: close\r\n\r\n" % len(c_body)) + c_body
        resp = raw(srv, req)
        assert statuses(resp) == [415], resp
        data = resp.split(b"\r\n\r\n", 1)[1]
    else:
        st, _, data = srv.request("POST", "/v1/completions", c_body, headers=headers)
        assert st == 415
    err = json.loads(data)["error"]
    assert "application/json" in err["message"]
    assert counter(srv, "completions", 200) == before


@pytest.mark.parametrize("ctype", ["application/json", "Application/JSON",
                                   "application/json; charset=utf-8",
                                   "application/json;charset=UTF-8"])
def test_json_content_type_variants_accepted(srv, ctype):
    st, _, data = srv.request("POST", "/tokenize", {"prompt": "x"}, headers={"Content-Type": ctype})
    assert st == 200, data


@pytest.mark.parametrize("method,path,allow", [
    ("DELETE", "/health", {"GET", "HEAD"}),
    ("POST", "/health", {"GET", "HEAD"}),
    ("GET", "/v1/chat/completions", {"POST"}),
    ("PUT", "/v1/completions", {"POST"}),
    ("POST", "/v1/models", {"GET"}),
    ("DELETE", "/v1/models/tiny-a", {"GET"}),
    ("GET", "/tokenize", {"POST"}),
    ("POST", "/version", {"GET"}),
])
def test_405_has_allow(srv, method, path, allow):
    st, h, data = srv.request(method, path, b"{}" if method != "GET" else None)
    assert st == 405
    assert {m.strip() for m in h["Allow"].split(",")} == allow
    assert method in json.loads(data)["error"]["message"]


def test_unknown_path_is_404(srv):
    assert srv.request("GET", "/nope")[0] == 404


# ---------------------------------------------------------------- CORS


def test_cors_off_by_default(srv):
    st, h, _ = srv.request("OPTIONS", "/v1/chat/completions",
                           headers={"Origin": "http://a.example",
                                    "Access-Control-Request-Method": "POST"})
    assert st == 405
    assert h["Allow"] == "POST"
    assert not [k for k in h if k.lower().startswith("access-control-")]
    st, h, _ = srv.request("GET", "/v1/models", headers={"Origin": "http://a.example"})
    assert st == 200
    assert not [k for k in h if k.lower().startswith("access-control-")]


def test_cors_preflight_allowed(cors):
    st, h, data = cors.request("OPTIONS", "/v1/chat/completions",
                               headers={"Origin": "http://b.example",
                                        "Access-Control-Request-Method": "POST",
                                        "Access-Control-Request-Headers":
                                            "authorization, content-type"})
    assert st == 204 and data == b""
    want = "*" if cors.origins == "*" else "http://b.example"
    assert h["Access-Control-Allow-Origin"] == want
    assert "POST" in {m.strip() for m in h["Access-Control-Allow-Methods"].split(",")}
    assert {m.strip().lower() for m in h["Access-Control-Allow-Headers"].split(",")} >= {
        "authorization", "content-type"}


def test_cors_responses(cors):
    st, h, _ = cors.request("GET", "/v1/models", headers={"Origin": "http://a.example"})
    assert st == 200
    assert h["Access-Control-Allow-Origin"] == ("*" if cors.origins == "*" else "http://a.example")
    assert h.get("Vary") == (None if cors.origins == "*" else "Origin")
    st, h, _ = cors.request("POST", "/tokenize", {"prompt": "a"},
                            headers={"Origin": "http://a.example"})
    assert st == 200 and "Access-Control-Allow-Origin" in h
    # No Origin: no CORS header.
    st, h, _ = cors.request("GET", "/v1/models")
    assert st == 200 and "Access-Control-Allow-Origin" not in h


def test_cors_other_origin(cors):
    """An origin not in the list gets no CORS headers (preflight 403); with '*' every origin is in
    the list."""
    anyone = cors.origins == "*"
    st, h, _ = cors.request("OPTIONS", "/v1/chat/completions",
                            headers={"Origin": "http://evil.example",
                                     "Access-Control-Request-Method": "POST"})
    assert st == (204 if anyone else 403)
    assert h.get("Access-Control-Allow-Origin") == ("*" if anyone else None)
    st, h, _ = cors.request("GET", "/v1/models", headers={"Origin": "http://evil.example"})
    assert st == 200 and h.get("Access-Control-Allow-Origin") == ("*" if anyone else None)
    # The answer depends on the Origin unless every origin is allowed: caches must know.
    assert h.get("Vary") == (None if anyone else "Origin")
    # An allowed origin differing only by a suffix is another origin.
    if not anyone:
        st, h, _ = cors.request("GET", "/v1/models", headers={"Origin": "http://a.example.evil"})
        assert st == 200 and "Access-Control-Allow-Origin" not in h
    # The form-POST attack: a simple cross-origin POST is refused before it can generate.
    st, h, _ = cors.request("POST", "/v1/completions", b"prompt=hi",
                            headers={"Origin": "http://evil.example",
                                     "Content-Type": "application/x-www-form-urlencoded"})
    assert st == 415 and h.get("Access-Control-Allow-Origin") == ("*" if anyone else None)


# ---------------------------------------------------------------- small endpoints


TEXTS = ["Hello world", "  spaces\tand\nnewlines ", "héllo wörld ✓ 日本語", "<think>x</think>",
         "a<|im_end|>b", "1234567890"]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_detokenize_roundtrip(srv, text):
    st, r = srv.post_json("/tokenize", {"model": "tiny-a", "prompt": text})
    assert st == 200, r
    want = TOK.encode(text, add_special_tokens=False).ids
    assert r["tokens"] == want
    assert r["count"] == len(want)
    st, d = srv.post_json("/detokenize", {"tokens": r["tokens"]})
    assert st == 200, d
    assert d["prompt"] == TOK.decode(want, skip_special_tokens=False)


def test_tokenize_max_model_len(srv):
    _, _, data = srv.request("GET", "/v1/models")
    max_len = json.loads(data)["data"][0]["max_model_len"]
    st, r = srv.post_json("/tokenize", {"prompt": "x"})
    assert st == 200 and r["max_model_len"] == max_len == 2048


# The Qwen3.6 chat template's text for one user turn (the reference rendering, by hand from the
# template: a user turn, then the generation prompt opening a thinking block, or with thinking off
# an empty one).
CHAT_CASES = [
    ({}, "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<think>\n"),
    ({"add_generation_prompt": False}, "<|im_start|>user\nhi there<|im_end|>\n"),
    ({"chat_template_kwargs": {"enable_thinking": False}},
     "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
]


@pytest.mark.parametrize("extra,text", CHAT_CASES)
def test_tokenize_messages(srv, extra, text):
    body = {"messages": [{"role": "user", "content": "hi there"}], **extra}
    st, r = srv.post_json("/tokenize", body)
    assert st == 200, r
    assert r["tokens"] == TOK.encode(text, add_special_tokens=False).ids
    assert r["count"] == len(r["tokens"])


@pytest.mark.parametrize("body", [
    {}, {"prompt": 5}, {"prompt": "a", "messages": [{"role": "user", "content": "x"}]},
    {"messages": "hi"}, {"messages": []}, {"prompt": "a", "bogus": 1},
    {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"},
])
def test_tokenize_bad_requests(srv, body):
    st, r = srv.post_json("/tokenize", body)
    assert st == 400, r
    assert r["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [
    {}, {"tokens": "abc"}, {"tokens": [-1]}, {"tokens": [N_VOCAB]}, {"tokens": [1, 2 ** 40]},
    {"tokens": [1.5]}, {"tokens": ["1"]}, {"tokens": [1], "bogus": True},
])
def test_detokenize_bad_ids(srv, body):
    st, r = srv.post_json("/detokenize", body)
    assert st == 400, r
    assert r["error"]["type"] == "invalid_request_error"


def test_detokenize_empty(srv):
    assert srv.post_json("/detokenize", {"tokens": []}) == (200, {"prompt": ""})


def test_tokenize_not_json(srv):
    st, _, data = srv.request("POST", "/tokenize", b"{nope")
    assert st == 400 and "JSON" in json.loads(data)["error"]["message"]


def test_version_ping_head_health(srv):
    st, h, data = srv.request("GET", "/version")
    assert st == 200 and h["Content-Type"] == "application/json"
    v = json.loads(data)["version"]
    assert isinstance(v, str) and v
    st, _, data = srv.request("GET", "/ping")
    assert st == 200
    get_st, _, get_body = srv.request("GET", "/health")
    head_st, h, head_body = srv.request("HEAD", "/health")
    assert get_st == head_st == 200
    assert json.loads(get_body) == {"status": "ok"}
    assert head_body == b""
    # On the wire: the headers and nothing after them.
    resp = raw(srv, b"HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert statuses(resp) == [200]
    assert resp.endswith(b"\r\n\r\n")


def test_api_key_scope():
    """--api-key guards /v1/*, /tokenize and /detokenize; not /version, /ping, /health, nor a CORS
    preflight (browsers send it without credentials)."""
    s = Server(BINARIES["cpu"], "--allowed-origins", "http://a.example", api_key="sk-k")
    try:
        no_key = {"Authorization": ""}
        assert s.request("POST", "/tokenize", {"prompt": "a"}, headers=no_key)[0] == 401
        assert s.request("POST", "/detokenize", {"tokens": [1]}, headers=no_key)[0] == 401
        assert s.request("POST", "/tokenize", {"prompt": "a"})[0] == 200
        for path in ("/version", "/ping", "/health"):
            assert s.request("GET", path, headers=no_key)[0] == 200, path
        st, h, _ = s.request("OPTIONS", "/v1/chat/completions",
                             headers={**no_key, "Origin": "http://a.example",
                                      "Access-Control-Request-Method": "POST"})
        assert st == 204 and h["Access-Control-Allow-Origin"] == "http://a.example"
    finally:
        _stop(s)
