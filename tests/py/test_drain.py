"""Draining for a load balancer (docs/deploy.md, docs/architecture.md §6.4), on the CPU backend
with the tiny model: /health is 200 when ready; after SIGTERM it is 503 {"status":"draining"} at
once, on a new connection too (the socket stays open, so a balancer's check sees the drain, not a
refused connection); a new request gets 503 with an OpenAI error body that says so, Retry-After
and Connection: close; the stream that was running completes normally ([DONE], finish_reason
"length" after exactly max_tokens chunks of content); the process exits 0."""
import http.client
import json
import signal
import threading
import time

from srv_util import BINARIES, Server, sanitizer_report

CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2000, "stream": True,
        "ignore_eos": True, "stream_options": {"include_usage": True}}


def raw(port, method, path, body=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    c.close()
    return out


def sse_events(body):
    """The JSON payloads of an SSE body, and whether it ended with [DONE]."""
    evs, done = [], False
    for line in body.decode().splitlines():
        if line.startswith("data: "):
            if line == "data: [DONE]":
                done = True
            else:
                evs.append(json.loads(line[6:]))
    return evs, done


def test_health_200_when_ready():
    s = Server(BINARIES["cpu"])
    try:
        st, h, body = raw(s.port, "GET", "/health")
        assert (st, json.loads(body)) == (200, {"status": "ok"})
        assert "retry-after" not in h
    finally:
        rc, err = s.stop()
    assert rc == 0, err


def test_sigterm_drains_for_a_balancer():
    s = Server(BINARIES["cpu"], "--drain-timeout", "60", "--max-seqs", "2")
    got, started, checked = {}, threading.Event(), threading.Event()

    def stream():
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        c.request("POST", "/v1/chat/completions", json.dumps(CHAT),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        got["status"] = r.status
        first = r.read1(64)
        started.set()
        checked.wait(60)  # the stream's reader stalls until the checks below are done
        got["body"] = first + r.read()
        c.close()

    t = threading.Thread(target=stream)
    t.start()
    try:
        assert started.wait(60)
        t_sig = time.time()
        s.proc.send_signal(signal.SIGTERM)
        # /health turns 503 at once (within the signal loop's 200 ms tick)
        while True:
            st, h, body = raw(s.port, "GET", "/health")
            if st != 200 or time.time() - t_sig > 5:
                break
            time.sleep(0.02)
        assert (st, json.loads(body)) == (503, {"status": "draining"}), (st, body)
        assert time.time() - t_sig < 2
        assert h.get("retry-after") == "1"
        # a new request on a new connection: 503, a clear OpenAI error, Retry-After, close
        st, h, body = raw(s.port, "POST", "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4})
        assert st == 503, body
        err = json.loads(body)["error"]
        assert err["type"] == "server_error" and "draining" in err["message"], err
        assert h.get("retry-after") == "1" and h.get("connection", "").lower() == "close", h
        # the running stream has not been cut
        assert s.proc.poll() is None
    finally:
        checked.set()
        t.join(120)
        rc, err = s.stop(timeout=90)
    assert rc == 0, err[-3000:]
    assert "draining" in err
    assert sanitizer_report(err) is None, err[-3000:]
    assert got["status"] == 200
    evs, done = sse_events(got["body"])
    assert done, got["body"][-300:]
    fins = [c["finish_reason"] for e in evs for c in e.get("choices", []) if c.get("finish_reason")]
    assert fins == ["length"], fins
    assert evs[-1]["usage"]["completion_tokens"] == CHAT["max_tokens"], evs[-1]
