#!/usr/bin/env python3
"""Load test for an OpenAI-compatible server (tulip serve, vLLM, llama.cpp ...): N concurrent
streaming chat clients for T seconds, each sending requests back to back.

Reports time to first token (request sent -> first chunk that carries text, reasoning or a tool
call) p50/p99, inter-token latency (gaps between such chunks; one chunk is normally one token)
p50/p99, aggregate output tokens/s (sum of usage.completion_tokens of finished requests over the
wall time), requests done and errors. Only the Python standard library: http.client with a
hand-rolled SSE reader, so 64+ clients in threads cost little next to the server.

  tools/loadtest.py --url http://127.0.0.1:8000 -n 8 -t 30 --max-tokens 256
  tools/loadtest.py ... --json out.json     # also write the numbers as JSON
  tools/loadtest.py ... --response-format rf.json   # constrained decoding (bench/structured.sh)

Every request asks for exactly --max-tokens tokens (ignore_eos, a tulip/vLLM extension; pass
--no-ignore-eos for servers without it), so runs compare at a fixed output length."""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ttft, self.itl = [], []
        self.tokens = 0
        self.requests = 0
        self.errors = 0
        self.error_samples = []

    def add(self, ttft, itl, tokens):
        with self.lock:
            if ttft is not None:
                self.ttft.append(ttft)
            self.itl.extend(itl)
            self.tokens += tokens
            self.requests += 1

    def error(self, what):
        with self.lock:
            self.errors += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(what)


def one_request(conn, path, headers, body, stats, deadline_hard):
    t0 = time.perf_counter()
    conn.request("POST", path, body=body, headers=headers)
    resp = conn.getresponse()
    if resp.status != 200:
        stats.error(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        return
    ttft, last, itl, tokens, finished = None, None, [], 0, False
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(4096)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    finished = True
                    continue
                obj = json.loads(data)
                if "error" in obj:
                    stats.error(obj["error"].get("message", "error in stream"))
                    return
                if obj.get("usage"):
                    tokens = obj["usage"].get("completion_tokens", 0)
                for ch in obj.get("choices", []):
                    d = ch.get("delta", {})
                    if d.get("content") or d.get("reasoning_content") or d.get("tool_calls") \
                            or ch.get("text"):
                        now = time.perf_counter()
                        if ttft is None:
                            ttft = now - t0
                        else:
                            itl.append(now - last)
                        last = now
        if time.perf_counter() > deadline_hard:
            stats.error("hard deadline")
            return
    if not finished:
        stats.error("stream ended without [DONE]")
        return
    stats.add(ttft, itl, tokens)


def client_loop(args, stats, t_end):
    u = urllib.parse.urlparse(args.url)
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    words = ("the quick brown fox jumps over a lazy dog while seven tall ships sail "
             "across the quiet harbour at dawn").split()
    prompt = " ".join(words[i % len(words)] for i in range(args.prompt_words))
    req = {"model": args.model, "messages": [{"role": "user", "content": prompt}],
           "max_tokens": args.max_tokens, "stream": True,
           "stream_options": {"include_usage": True}, "temperature": args.temperature}
    if not args.no_ignore_eos:
        req["ignore_eos"] = True
    if args.no_think:
        req["chat_template_kwargs"] = {"enable_thinking": False}
    if args.response_format is not None:
        req["response_format"] = args.response_format
    body = json.dumps(req)
    conn, rng = None, random.Random()
    while time.perf_counter() < t_end:
        if args.distinct_prompts:  # a different prompt per request: no shared prefix, no twins
            req["messages"][0]["content"] = " ".join(rng.choice(words)
                                                     for _ in range(args.prompt_words))
            body = json.dumps(req)
        try:
            if conn is None:
                conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=args.timeout)
            one_request(conn, "/v1/chat/completions", headers, body, stats,
                        t_end + args.timeout)
        except Exception as e:  # noqa: BLE001 - counted, the run goes on
            stats.error(repr(e))
            if conn:
                conn.close()
            conn = None
            time.sleep(0.1)
    if conn:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("-n", "--concurrency", type=int, default=8)
    ap.add_argument("-t", "--duration", type=float, default=30, help="seconds")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-words", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--model", default=None, help="default: the first of /v1/models")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--no-think", action="store_true", help="chat_template_kwargs.enable_thinking=false")
    ap.add_argument("--no-ignore-eos", action="store_true")
    ap.add_argument("--distinct-prompts", action="store_true",
                    help="a random prompt per request (default: one prompt for every request, so "
                    "the prefix cache serves it and greedy streams are identical)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--response-format", default=None, metavar="FILE",
                    help="a JSON file whose object is sent as every request's response_format\n"
                         "(e.g. {\"type\": \"json_schema\", \"json_schema\": {...}})")
    args = ap.parse_args()
    if args.response_format is not None:
        with open(args.response_format) as f:
            args.response_format = json.load(f)
        if not isinstance(args.response_format, dict):
            ap.error("--response-format: the file must hold a JSON object")

    if args.model is None:
        u = urllib.parse.urlparse(args.url)
        c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=30)
        h = {"Authorization": "Bearer " + args.api_key} if args.api_key else {}
        c.request("GET", "/v1/models", headers=h)
        r = c.getresponse()
        args.model = json.loads(r.read())["data"][0]["id"]
        c.close()

    stats = Stats()
    t0 = time.perf_counter()
    t_end = t0 + args.duration
    threads = [threading.Thread(target=client_loop, args=(args, stats, t_end), daemon=True)
               for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    res = {
        "url": args.url, "model": args.model, "concurrency": args.concurrency,
        "duration_s": round(wall, 3), "max_tokens": args.max_tokens,
        "prompt_words": args.prompt_words, "distinct_prompts": args.distinct_prompts,
        "requests": stats.requests, "errors": stats.errors, "error_samples": stats.error_samples,
        "response_format": (args.response_format or {}).get("type", "text"),
        "output_tokens": stats.tokens, "output_tok_s": round(stats.tokens / wall, 2),
        "ttft_p50_ms": round(percentile(stats.ttft, 50) * 1e3, 2),
        "ttft_p99_ms": round(percentile(stats.ttft, 99) * 1e3, 2),
        "itl_p50_ms": round(percentile(stats.itl, 50) * 1e3, 3),
        "itl_p99_ms": round(percentile(stats.itl, 99) * 1e3, 3),
        "itl_mean_ms": round(statistics.fmean(stats.itl) * 1e3, 3) if stats.itl else float("nan"),
    }
    print(f"| clients | requests | errors | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
          f"| output tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {res['concurrency']} | {res['requests']} | {res['errors']} | {res['ttft_p50_ms']} | "
          f"{res['ttft_p99_ms']} | {res['itl_p50_ms']} | {res['itl_p99_ms']} | "
          f"{res['output_tok_s']} |")
    for e in stats.error_samples:
        print("error:", e, file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if stats.requests > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
