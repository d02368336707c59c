"""Operations of `tulip serve` (docs/architecture.md §6.7, README "Running as a service"): the
socket opens before the model loads and every route but /version answers 503 until it is ready
(and /health 503 again while draining); the vLLM-compatible metrics page, parsed whole by
prometheus_client's own parser, with vLLM's names, labels and bucket boundaries (written out below
from vllm/v1/metrics/loggers.py, the reference) and values that move with real requests exactly
as the responses' usage says; one log line per request (text or --log-format json) and a periodic
stats line; X-Request-Id honoured, echoed, generated, validated; several --served-model-name
aliases; the API key from a file or TULIP_API_KEY (never on the command line); --host with a name;
`tulip --version`; the checkpoint's chat template compared with the Qwen3.6 template (the reference
copy in ../shared/data, as tests/py/chat_ref.py reads it)."""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from srv_util import BINARIES, MODEL, ROOT, TOKENIZER, sanitizer_report

TEMPLATE = os.path.join(ROOT, "..", "shared", "data", "qwen3.6-chat-template.jinja")

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py, PrometheusStatLogger).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def buckets_125(max_value):
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out, e = [], 1
    while True:
        for m in (1, 2, 5):
            if m * e > max_value:
                return out
            out.append(m * e)
        e *= 10


class Serve:
    """A `tulip serve` on the tiny model; reads stdout for the loading and listening lines."""

    def __init__(self, *args, binary="cpu", env=None, model=MODEL, wait_ready=True, host=None):
        self.err = tempfile.NamedTemporaryFile(prefix="tulip-ops-", suffix=".log", delete=False)
        cmd = [BINARIES[binary], "serve", "--model", model, "--tokenizer", TOKENIZER,
               "--allow-test-shape", "--backend", "cpu", "--threads", "1", "--port", "0", *args]
        if host:
            cmd += ["--host", host]
        e = dict(os.environ)
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        e.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=e, cwd=ROOT)
        self.port = None
        self.lines = []
        line = self.proc.stdout.readline()
        self.lines.append(line)
        m = re.search(r"loading the model; http://[^:]+:(\d+) answers 503", line)
        if not m:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("no loading line: %r\n%s" % (line, self.stderr()))
        self.port = int(m.group(1))
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if "listening on http://" in line:
                return line
        raise RuntimeError("not ready:\n" + "".join(self.lines) + self.stderr())

    def request(self, method, path, body=None, headers=None, conn=None):
        c = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=json.dumps(body) if body is not None else None, headers=h)
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def chat(self, max_tokens=4, headers=None, model=None, **extra):
        body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": max_tokens,
                **extra}
        if model:
            body["model"] = model
        return self.request("POST", "/v1/chat/completions", body, headers)

    def metrics_text(self):
        st, _, data = self.request("GET", "/metrics")
        assert st == 200
        return data.decode()

    def stderr(self):
        self.err.flush()
        with open(self.err.name, errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        text = self.stderr()
        os.unlink(self.err.name)
        return self.proc.returncode, text


def samples(text):
    """{(name, frozenset(labels)): value} of a metrics page parsed by prometheus_client, and the
    families by name."""
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    out = {}
    for f in fams.values():
        for s in f.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out, fams


# ---------------------------------------------------------------------------------------------

def test_version_cli():
    """`tulip --version`: the version, the commit the binary was built from (the Makefile bakes it
    in; git confirms it is HEAD or an ancestor: a build may predate the last commit), and "cpu
    only" for the CPU build."""
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    r = subprocess.run([BINARIES["cpu"], "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    m = re.fullmatch(r"tulip (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}(?:-dirty)?|unknown), "
                     r"cpu only\)\n", r.stdout)
    assert m, r.stdout
    if head:  # built in this checkout: the commit is this repository's HEAD or one before it
        c = m.group(2).split("-")[0]
        anc = subprocess.run(["git", "merge-base", "--is-ancestor", c, "HEAD"], cwd=ROOT)
        assert c != "unknown" and anc.returncode == 0, (c, head)


def test_loading_then_ready():
    """While the (delayed) load runs, /health and /ping answer 503 {"status":"loading"}, HEAD
    /health 503 without a body, API routes 503 with an error body, /version 200; then 200."""
    s = Serve(env={"TL_TEST_LOAD_DELAY_MS": "4000"}, wait_ready=False)
    try:
        st, h, body = s.request("GET", "/health")
        assert (st, json.loads(body)) == (503, {"status": "loading"})
        assert h["content-type"] == "application/json"
        st, _, body = s.request("GET", "/ping")
        assert (st, json.loads(body)) == (503, {"status": "loading"})
        st, _, body = s.request("HEAD", "/health")
        assert st == 503 and body == b""
        st, _, body = s.chat()
        assert st == 503 and "loading" in json.loads(body)["error"]["message"]
        for path in ("/v1/models", "/metrics"):
            assert s.request("GET", path)[0] == 503, path
        st, _, body = s.request("POST", "/tokenize", {"prompt": "hi"})
        assert st == 503
        st, _, body = s.request("GET", "/version")
        v = json.loads(body)
        assert st == 200 and v["chat_template"] == "unchecked" and v["arch"] == "cpu only"
        s.wait_ready()
        st, _, body = s.request("GET", "/health")
        assert (st, json.loads(body)) == (200, {"status": "ok"})
        assert s.chat()[0] == 200
    finally:
        rc, err = s.stop()
    assert rc == 0, err


def test_signal_while_loading_exits():
    """SIGTERM during the load: the process leaves at once with status 0 and says why."""
    s = Serve(env={"TL_TEST_LOAD_DELAY_MS": "30000"}, wait_ready=False)
    assert s.request("GET", "/health")[0] == 503
    t0 = time.time()
    rc, err = s.stop(timeout=20)
    assert rc == 0 and time.time() - t0 < 10, err
    assert "SIGTERM while loading" in err


def test_drain_waits_for_admitted():
    """A request the engine thread has taken off the queue but not yet started is still waited
    for by a drain (the scheduler once counted only the queue and the running jobs it had
    published, and a SIGTERM in between cancelled the request). TL_TEST_ADMIT_DELAY_MS holds the
    request in that window for 1.5 s; the SIGTERM comes 0.5 s into it."""
    s = Serve("--drain-timeout", "20", env={"TL_TEST_ADMIT_DELAY_MS": "1500"})
    got = {}

    def run():
        try:
            got["r"] = s.request("POST", "/v1/completions",
                                 {"prompt": "hello", "max_tokens": 4, "temperature": 0})
        except Exception as e:  # noqa: BLE001 - reported below
            got["e"] = repr(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.5)
    s.proc.send_signal(signal.SIGTERM)
    t.join(60)
    rc, err = s.stop()
    assert rc == 0, err
    assert "r" in got, got.get("e")
    st, _, body = got["r"]
    assert st == 200, body
    assert json.loads(body)["choices"][0]["finish_reason"] == "length"


def test_draining_health_503():
    """After SIGTERM, a connection opened before it still gets answers: /health 503
    {"status":"draining"} while a stream finishes. The stream's reader stalls after its first
    bytes until /health was checked, so the drain is still waiting for it (whether the engine is
    still generating or the rest of the stream is still to be written) at that moment."""
    s = Serve("--drain-timeout", "20")
    keep = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    assert s.request("GET", "/health", conn=keep)[0] == 200
    got, started, checked = {}, threading.Event(), threading.Event()

    def stream():
        # a small receive buffer: the server's writes stall within a few KB, so the stream stays
        # in flight however fast the model generates (the whole stream would fit in default
        # socket buffers and finish by itself)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(120)
        sock.connect(("127.0.0.1", s.port))
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        c.sock = sock
        body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3000, "stream": True,
                "ignore_eos": True}
        c.request("POST", "/v1/chat/completions", json.dumps(body),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        got["status"] = r.status
        first = r.read1(64)
        started.set()
        checked.wait(30)
        got["body"] = first + r.read()
        c.close()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(30)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    try:
        st, _, body = s.request("GET", "/health", conn=keep)
        assert (st, json.loads(body)["status"]) == (503, "draining")
    finally:
        checked.set()
        t.join(120)
        keep.close()
        rc, err = s.stop()
    assert rc == 0, err
    assert got["status"] == 200 and got["body"].rstrip().endswith(b"data: [DONE]")


def test_gateway_inference_extension_metrics():
    """The series the Gateway API inference extension's endpoint picker scrapes with its vLLM
    defaults (gateway-api-inference-extension pkg/epp/server/options.go: TotalQueuedRequestsMetric
    vllm:num_requests_waiting, TotalRunningRequestsMetric vllm:num_requests_running,
    KVCacheUsagePercentageMetric vllm:kv_cache_usage_perc, LoRAInfoMetric vllm:lora_requests_info,
    CacheInfoMetric vllm:cache_config_info with labels block_size and num_gpu_blocks) are gauges
    on the page. With --kv-tokens 4096 the pool is 4096 / 64 = 64 pages of 64 tokens (64-token
    pages: docs/architecture.md §4), idle: usage 0, nothing running or waiting. No LoRA: max_lora
    0, no adapters, the value a current Unix time (the EPP keeps the newest series)."""
    s = Serve("--kv-tokens", "4096")
    try:
        _, fams = samples(s.metrics_text())
    finally:
        s.stop()
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "vllm:lora_requests_info", "vllm:cache_config_info"):
        assert name in fams and fams[name].type == "gauge", name
        assert len(fams[name].samples) == 1, fams[name].samples
    one = lambda n: fams[n].samples[0]  # noqa: E731
    assert one("vllm:num_requests_waiting").value == 0
    assert one("vllm:num_requests_running").value == 0
    assert one("vllm:kv_cache_usage_perc").value == 0
    cc = one("vllm:cache_config_info")
    assert (cc.labels["block_size"], cc.labels["num_gpu_blocks"], cc.value) == ("64", "64", 1)
    lora = one("vllm:lora_requests_info")
    assert {k: lora.labels[k] for k in ("max_lora", "running_lora_adapters",
                                        "waiting_lora_adapters")} == \
        {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert abs(lora.value - time.time()) < 60


def test_vllm_metrics_page():
    """The whole page parses with prometheus_client; the vLLM families have vLLM's types, labels
    and bucket boundaries; after real requests the token counters moved by exactly the usage the
    responses reported, and the request-level series by the number of requests."""
    s = Serve("--served-model-name", "tiny-main,tiny-alias", "--ctx", "4096")
    try:
        before, fams = samples(s.metrics_text())
        lab = {"model_name": "tiny-main", "engine": "0"}
        key = lambda name, **extra: (name, frozenset({**lab, **extra}.items()))
        types = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
                 "vllm:kv_cache_usage_perc": "gauge", "vllm:prompt_tokens": "counter",
                 "vllm:generation_tokens": "counter", "vllm:num_preemptions": "counter",
                 "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
                 "vllm:request_success": "counter",
                 "vllm:time_to_first_token_seconds": "histogram",
                 "vllm:inter_token_latency_seconds": "histogram",
                 "vllm:e2e_request_latency_seconds": "histogram",
                 "vllm:request_queue_time_seconds": "histogram",
                 "vllm:request_prefill_time_seconds": "histogram",
                 "vllm:request_decode_time_seconds": "histogram",
                 "vllm:request_inference_time_seconds": "histogram",
                 "vllm:request_prompt_tokens": "histogram",
                 "vllm:request_generation_tokens": "histogram"}
        for name, typ in types.items():
            assert name in fams and fams[name].type == typ, (name, fams.get(name))
            for smp in fams[name].samples:
                lbl = dict(smp.labels)
                lbl.pop("le", None)
                lbl.pop("finished_reason", None)
                assert lbl == lab, (name, smp)
        want_buckets = {"vllm:time_to_first_token_seconds": TTFT_BUCKETS,
                        "vllm:inter_token_latency_seconds": ITL_BUCKETS,
                        "vllm:e2e_request_latency_seconds": REQUEST_BUCKETS,
                        "vllm:request_queue_time_seconds": REQUEST_BUCKETS,
                        "vllm:request_prompt_tokens": buckets_125(4096),
                        "vllm:request_generation_tokens": buckets_125(4096)}
        for name, b in want_buckets.items():
            les = [sm.labels["le"] for sm in fams[name].samples if sm.name == name + "_bucket"]
            assert [float(x) for x in les[:-1]] == b and les[-1] == "+Inf", (name, les)
        reasons = {sm.labels["finished_reason"] for sm in fams["vllm:request_success"].samples}
        assert reasons == {"stop", "length", "abort", "error"}
        assert before[key("vllm:prefix_cache_queries_total")] == 0  # no prefix cache yet

        prompt = gen = itl = 0
        n = 4
        for i in range(n):
            st, h, body = s.chat(max_tokens=3 + i, ignore_eos=True,
                                 model="tiny-alias" if i % 2 else None)
            assert st == 200, body
            u = json.loads(body)["usage"]
            assert json.loads(body)["choices"][0]["finish_reason"] == "length"
            prompt += u["prompt_tokens"]
            gen += u["completion_tokens"]
            itl += u["completion_tokens"] - 1
        # a request's series are recorded when its HTTP connection completes (reqlog.c), which
        # may be just after the client has read the body: wait (bounded) for the last one
        ok_key = key("vllm:request_success_total", finished_reason="length")
        for _ in range(100):
            after, fams = samples(s.metrics_text())
            if after.get(ok_key, 0) - before.get(ok_key, 0) >= n:
                break
            time.sleep(0.05)
        d = lambda k: after[k] - before.get(k, 0)
        assert d(key("vllm:prompt_tokens_total")) == prompt
        assert d(key("vllm:generation_tokens_total")) == gen
        assert d(key("vllm:request_success_total", finished_reason="length")) == n
        assert d(key("vllm:request_success_total", finished_reason="stop")) == 0
        assert d(key("vllm:time_to_first_token_seconds_count")) == n
        assert d(key("vllm:inter_token_latency_seconds_count")) == itl
        for name in ("e2e_request_latency_seconds", "request_queue_time_seconds",
                     "request_prefill_time_seconds", "request_decode_time_seconds",
                     "request_inference_time_seconds", "request_prompt_tokens",
                     "request_generation_tokens"):
            assert d(key(f"vllm:{name}_count")) == n, name
        assert d(key("vllm:request_prompt_tokens_sum")) == prompt
        assert d(key("vllm:request_generation_tokens_sum")) == gen
        # the +Inf bucket equals the count; buckets are cumulative
        for name in types:
            if types[name] != "histogram":
                continue
            bs = [sm.value for sm in fams[name].samples if sm.name == name + "_bucket"]
            assert bs == sorted(bs) and bs[-1] == after[key(name + "_count")], name
        # tulip's own series stay, with the same token totals
        assert d(("tulip_generation_tokens_total", frozenset())) == gen
        # the engine thread drops a finished job from its running list just after the reader saw
        # the end, so the gauge may still count it for a moment
        deadline = time.time() + 10
        while samples(s.metrics_text())[0][key("vllm:num_requests_running")] != 0:
            assert time.time() < deadline
            time.sleep(0.02)
    finally:
        rc, err = s.stop()
    assert rc == 0, err


def test_request_id_and_log_lines():
    """X-Request-Id is echoed and names the log line; absent, one is generated; a bad one is a 400
    naming the header. The log line carries the tokens, TTFT, duration and finish reason."""
    s = Serve("--log-stats-interval", "0.3")
    try:
        st, h, body = s.chat(max_tokens=3, ignore_eos=True, headers={"X-Request-Id": "ab.C-1:2_z"})
        assert st == 200 and h["x-request-id"] == "ab.C-1:2_z"
        usage = json.loads(body)["usage"]
        # a stream whose first token is text (biased), so its first chunk goes out at once
        st, _, body = s.request("POST", "/tokenize", {"prompt": "hello"})
        word = json.loads(body)["tokens"][0]
        st, h, _ = s.chat(max_tokens=3, ignore_eos=True, stream=True, logit_bias={str(word): 100},
                          headers={"X-Request-Id": "stream-1"})
        assert st == 200
        st, h, _ = s.chat(max_tokens=2)
        gen_id = h["x-request-id"]
        assert st == 200 and re.fullmatch(r"req-[A-Za-z0-9]{24}", gen_id), gen_id
        for bad in ("has space", "x" * 129, "semi;colon"):
            st, h, body = s.chat(headers={"X-Request-Id": bad})
            assert st == 400 and "X-Request-Id" in json.loads(body)["error"]["message"], bad
        st, h, _ = s.request("GET", "/health")
        assert st == 200 and h["x-request-id"].startswith("req-")
        time.sleep(0.8)  # a stats interval passes
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    line = [ln for ln in err.splitlines() if ln.startswith("tulip: request ab.C-1:2_z ")]
    assert len(line) == 1, err
    m = re.search(r" chat status=200 prompt_tokens=(\d+) generation_tokens=(\d+) ttft=([0-9.]+)s "
                  r"prep=([0-9.]+)s first_out=(-|[0-9.]+s) duration=([0-9.]+)s finish=length$",
                  line[0])
    assert m, line
    assert int(m.group(1)) == usage["prompt_tokens"] and int(m.group(2)) == usage["completion_tokens"]
    ttft, prep, dur = float(m.group(3)), float(m.group(4)), float(m.group(6))
    assert ttft + prep <= dur + 1e-3, line  # both inside the request's time (4-digit rounding)
    assert m.group(5) == "-", line  # not a stream
    line = [ln for ln in err.splitlines() if ln.startswith("tulip: request stream-1 ")]
    m = re.search(r" ttft=([0-9.]+)s prep=([0-9.]+)s first_out=([0-9.]+)s duration=([0-9.]+)s ",
                  line[0] if len(line) == 1 else "")
    assert m, (line, err)
    ttft, first_out, dur = float(m.group(1)), float(m.group(3)), float(m.group(4))
    assert ttft <= first_out + 1e-4 and first_out <= dur + 1e-3, line  # duration: 3 digits
    assert any(ln.startswith(f"tulip: request {gen_id} chat status=200") for ln in err.splitlines())
    assert re.search(r"^tulip: stats running=\d+ waiting=\d+ kv_cache_usage=[0-9.]+% "
                     r"prompt=[0-9.]+ tok/s generation=[0-9.]+ tok/s requests_finished=\d+",
                     err, re.M), err


def test_log_format_json():
    """--log-format json: the request and stats lines are JSON objects with the same facts."""
    s = Serve("--log-format", "json", "--log-stats-interval", "0.3")
    try:
        st, h, body = s.chat(max_tokens=3, ignore_eos=True, headers={"X-Request-Id": "json-1"})
        assert st == 200
        usage = json.loads(body)["usage"]
        st, _, _ = s.chat(model="no-such-model", headers={"X-Request-Id": "json-2"})
        assert st == 404
        time.sleep(0.8)
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    objs = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    req = [o for o in objs if o.get("event") == "request"]
    one = [o for o in req if o["id"] == "json-1"]
    assert len(one) == 1, err
    o = one[0]
    assert o["route"] == "chat" and o["status"] == 200 and o["finish_reason"] == "length"
    assert o["prompt_tokens"] == usage["prompt_tokens"]
    assert o["generation_tokens"] == usage["completion_tokens"]
    assert 0 <= o["ttft_s"] <= o["duration_s"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o["time"])
    two = [o for o in req if o["id"] == "json-2"]
    assert len(two) == 1 and two[0]["status"] == 404 and two[0]["finish_reason"] is None
    stats = [o for o in objs if o.get("event") == "stats"]
    assert stats and {"running", "waiting", "kv_cache_usage", "prompt_tokens_per_s",
                      "generation_tokens_per_s", "requests_finished"} <= set(stats[0])


def test_served_model_name_aliases():
    """Several names: /v1/models lists each, a request may name any, another name is a 404; the
    responses and the metrics label use the first."""
    s = Serve("--served-model-name", "first, second,third")
    try:
        st, _, body = s.request("GET", "/v1/models")
        assert [m["id"] for m in json.loads(body)["data"]] == ["first", "second", "third"]
        for name in ("first", "second", "third"):
            st, _, body = s.chat(model=name)
            assert st == 200 and json.loads(body)["model"] == "first", (name, body)
            assert s.request("GET", "/v1/models/" + name)[0] == 200
        st, _, body = s.chat(model="fourth")
        assert st == 404 and json.loads(body)["error"]["code"] == "model_not_found"
        assert 'vllm:num_requests_running{model_name="first",engine="0"}' in s.metrics_text()
    finally:
        rc, err = s.stop()
    assert rc == 0, err


def test_api_key_from_file_and_env(tmp_path):
    """--api-key-file and TULIP_API_KEY set the key without putting it on the command line."""
    key = "k-" + os.urandom(8).hex()
    f = tmp_path / "key"
    f.write_text("  " + key + "  \n# second line ignored\n")
    for args, env in ((["--api-key-file", str(f)], None), ([], {"TULIP_API_KEY": key})):
        s = Serve(*args, env=env)
        try:
            with open(f"/proc/{s.proc.pid}/cmdline", "rb") as c:
                assert key.encode() not in c.read()
            assert s.chat()[0] == 401
            assert s.chat(headers={"Authorization": "Bearer wrong"})[0] == 401
            assert s.chat(headers={"Authorization": "Bearer " + key})[0] == 200
            assert "(API key required)" in s.lines[-1]
        finally:
            rc, err = s.stop()
        assert rc == 0, err
    base = [BINARIES["cpu"], "serve", "--model", MODEL, "--allow-test-shape", "--backend", "cpu"]
    r = subprocess.run(base + ["--api-key", "x", "--api-key-file", str(f)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "not both" in r.stderr
    empty = tmp_path / "empty"
    empty.write_text("\n")
    r = subprocess.run(base + ["--api-key-file", str(empty)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 1 and "empty" in r.stderr
    r = subprocess.run(base + ["--api-key-file", str(tmp_path / "missing")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "missing" in r.stderr


def test_host_name():
    """--host takes a name (resolved), not only a numeric address; an unknown name fails clearly."""
    s = Serve(host="localhost")
    try:
        assert "listening on http://localhost:" in s.lines[-1]
        assert s.request("GET", "/health")[0] == 200
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    r = subprocess.run([BINARIES["cpu"], "serve", "--model", MODEL, "--tokenizer", TOKENIZER,
                        "--allow-test-shape", "--backend", "cpu", "--port", "0", "--host",
                        "no-such-host.invalid"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--host no-such-host.invalid" in r.stderr, r.stderr


# ---- the chat template check ----

def model_copy(tmp_path, name):
    """A checkpoint directory of tiny-a's files (symlinked) to which a test adds template files."""
    d = tmp_path / name
    d.mkdir()
    for f in os.listdir(MODEL):
        os.symlink(os.path.join(MODEL, f), d / f)
    return d


@pytest.fixture(scope="module")
def reference_template():
    with open(TEMPLATE, encoding="utf-8") as f:
        return f.read()


def template_state(tmp_path, name, files, *args):
    d = model_copy(tmp_path, name)
    for fname, text in files.items():
        (d / fname).write_text(text, encoding="utf-8")
    s = Serve(*args, model=str(d))
    try:
        st, _, body = s.request("GET", "/version")
        assert st == 200
        state = json.loads(body)["chat_template"]
    finally:
        rc, err = s.stop()
    assert rc == 0, err
    return state, err


def test_template_matches_reference(tmp_path, reference_template):
    """The Qwen3.6 template itself, as chat_template.jinja, as tokenizer_config.json's string, as
    its list form and with CRLF line ends: "match", no warning. No template: "absent"."""
    t = reference_template
    cases = {
        "jinja": {"chat_template.jinja": t},
        "config": {"tokenizer_config.json": json.dumps({"chat_template": t})},
        "list": {"tokenizer_config.json": json.dumps(
            {"chat_template": [{"name": "tool_use", "template": "x"},
                               {"name": "default", "template": t}]})},
        "crlf": {"chat_template.jinja": t.replace("\n", "\r\n") + "\n\n"},
    }
    for name, files in cases.items():
        state, err = template_state(tmp_path, name, files)
        assert state == "match" and "WARNING" not in err, (name, err)
    state, err = template_state(tmp_path, "none", {})
    assert state == "absent" and "WARNING" not in err


def test_template_differs_is_reported(tmp_path, reference_template):
    """One character changed: the server starts, says "differs" on /version and warns on stderr
    naming the file; --strict-template refuses to start (exit 1) with the same message."""
    t = reference_template.replace("<|im_start|>assistant", "<|im_start|>assistant ", 1)
    assert t != reference_template
    state, err = template_state(tmp_path, "changed", {"chat_template.jinja": t})
    assert state == "differs"
    assert re.search(r"WARNING: the checkpoint's chat template \(.*changed/chat_template\.jinja, "
                     r"hash [0-9a-f]{16}\) differs", err), err
    state, err = template_state(tmp_path, "badjson", {"tokenizer_config.json": "{not json"})
    assert state == "differs" and "not valid JSON" in err
    d = model_copy(tmp_path, "strict")
    (d / "chat_template.jinja").write_text(t, encoding="utf-8")
    r = subprocess.run([BINARIES["cpu"], "serve", "--model", str(d), "--tokenizer", TOKENIZER,
                        "--allow-test-shape", "--backend", "cpu", "--port", "0",
                        "--strict-template"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "differs from the Qwen3.6 template" in r.stderr, r.stderr


@pytest.mark.skipif(not os.path.exists(BINARIES["asan"]), reason="no ASan build")
def test_asan_loading_metrics_and_logs():
    """The same paths under ASan+UBSan: a delayed load, requests with ids, the metrics page, a
    drain; no sanitizer report."""
    s = Serve("--log-format", "json", "--log-stats-interval", "0.2", binary="asan",
              env={"TL_TEST_LOAD_DELAY_MS": "500"}, wait_ready=False)
    assert s.request("GET", "/health")[0] == 503
    s.wait_ready()
    try:
        assert s.chat(max_tokens=3, headers={"X-Request-Id": "asan-1"})[0] == 200
        assert s.chat(headers={"X-Request-Id": "bad id"})[0] == 400
        list(text_string_to_metric_families(s.metrics_text()))
        time.sleep(0.5)
    finally:
        rc, err = s.stop()
    assert rc == 0 and sanitizer_report(err) is None, err
