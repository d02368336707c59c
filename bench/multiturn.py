#!/usr/bin/env python3
"""Multi-turn prefix-cache benchmark (issue 14, docs/architecture.md §4.1): replays agent-like
conversations against `tulip serve` and reports the time to first token of every turn with the
prefix cache and without it (--no-prefix-cache), and how many prompt tokens were served from the
cache against how many the chat template makes reusable.

A conversation: a system prompt of about --sys-tokens tokens (instructions and JSON tool
definitions, the same for every conversation), then --turns turns, each adding about
--turn-tokens tokens of user text and generating exactly --gen tokens (ignore_eos), thinking off
(--thinking to turn it on). --convs "1 8" runs 1 conversation, then 8 at once (threads, one
request in flight per conversation), all sharing the system prompt. Reusable tokens of a turn:
the previous turn's prompt without its generation prompt (measured with /tokenize), which is
what the template renders the same way in the next turn. Each conversation's turns carry
`X-Session-Id: multiturn-<seed>`, so behind a balancer (bench/replicas.sh) it stays on one replica.

The server is started here (cache on, then off) from --bin with --serve-args, unless --url is
given (then only that server is measured, and --mode names it). Only the standard library.

  bench/multiturn.py                                   # H200: random 4-bit weights, the protocol
  bench/multiturn.py --bin build/cpu/tulip --serve-args "--model tests/data/tiny-a \\
      --tokenizer tests/data/tiny-tokenizer/tokenizer.json --allow-test-shape --backend cpu" \\
      --sys-tokens 200 --turn-tokens 30 --gen 8 --turns 3 --convs "1 2"   # CI smoke size

Every cached turn is followed by a prompt of the turn's new (uncached) token count under its own
cache_salt: its TTFT is what prefilling only the new part costs without the context, so "cached -
alone" is the cache's overhead (issue 14: at most 10 ms) plus the new tokens' attention over the
cached prefix, which the probe does not do (about 2.5 ms a conversation at 500 new tokens after
9.3K on the H200); `tulip bench --lengths 512 --context 8800` measures the prefill of the new
tokens in context on the engine directly (`--batch N --prefill-together`: N conversations' new
tokens in one step). --no-fresh skips it. --in-context runs exactly that yardstick after the
server runs, per level and turn: `--bin bench` with the turn's mean new tokens after its mean
cached tokens (--batch = the level, --prefill-together), i.e. what prefilling only the new tokens
costs when they attend to the cached context, and prints it beside the cached TTFT (bench
arguments from --bench-args, else taken from --serve-args: the model or random weights, bits,
backend, threads). Every request biases one word token (--first-token
visible, the default), so the first generated token streams text at once in the turn and in its
probe alike. With several conversations they
run in lockstep: all send turn t at once, and once all have their answers, all send their probes
at once, so a cached turn and its probe each share the engine with the same kind of requests
(free-running, --no-lockstep, a conversation's cached turn often shared steps with other
conversations' probes and the difference was mostly which requests happened to overlap).

In lockstep the server's own split of the time is read from its /metrics (vLLM's request
histograms) at every barrier: for the cached turns and for the probes of each turn, the mean time
a request waited in the queue (arrival to admission) and spent in prefill (admission to its first
token), so a gap between the two says whether it is waiting or computing. When the server is
started here, its request log (every request named by X-Request-Id) adds per turn the time before
the queue (body, template, tokenizer: prep), queue to first token, queue to the first chunk handed
to the socket, and what the client's TTFT adds beyond those (the wire and the client).

Prints a markdown table per concurrency level (mean over the conversations of each turn) and, with
--json FILE, every measurement."""
import argparse
import http.client
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("alpha beta gamma delta file path read write search query result error value table "
         "index record update create delete list open close status check build test run deploy "
         "config option module function return string number object array field schema").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Client:
    def __init__(self, url):
        u = url.split("//", 1)[-1].rstrip("/")
        self.host, self.port = u.split(":")[0], int(u.split(":")[1])
        self.model = json.loads(self.get("/v1/models"))["data"][0]["id"]
        self.done, self.lock = 0, threading.Lock()  # chats answered (server_times waits for them)
        self.bias = None  # logit_bias of every chat (set_visible_first)

    def set_visible_first(self, word="Hello"):
        """Every chat from now on carries logit_bias {id of `word` (its first token): 100}: greedy decoding then
        generates that word every step, so the first token is visible text at once and the
        client's first-content time is the time to the first token (with random weights the
        first tokens are often special or partial UTF-8 pieces that stream no text, which put
        1-5 decode steps into a cached turn's TTFT but never into a probe's, max_tokens 1)."""
        c, r = self.post("/tokenize", {"prompt": word})
        out = json.loads(r.read())
        c.close()
        if not out.get("tokens"):  # its first piece is ASCII text too where it splits
            raise RuntimeError(f"/tokenize of {word!r}: {out}")
        self.bias = {str(out["tokens"][0]): 100}

    def get(self, path):
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request("GET", path)
        body = c.getresponse().read()
        c.close()
        return body

    def post(self, path, body, stream=False, session=None, rid=None):
        c = http.client.HTTPConnection(self.host, self.port, timeout=3600)
        h = {"Content-Type": "application/json"}
        if session:  # a balancer in front keeps the conversation on one replica (docs/deploy.md)
            h["X-Session-Id"] = session
        if rid:  # names the server's request log line (server_log)
            h["X-Request-Id"] = rid
        c.request("POST", path, json.dumps(body), h)
        return c, c.getresponse()

    def tokens(self, messages, gen_prompt, kwargs):
        c, r = self.post("/tokenize", {"messages": messages, "add_generation_prompt": gen_prompt,
                                       "chat_template_kwargs": kwargs})
        out = json.loads(r.read())
        c.close()
        if "count" not in out:
            raise RuntimeError(f"/tokenize: {out}")
        return out["count"]

    def chat(self, messages, gen, kwargs, session=None, extra=None, rid=None):
        """One streamed turn: (text, ttft seconds, usage)."""
        body = {"model": self.model, "messages": messages, "max_tokens": gen, "ignore_eos": True,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                "chat_template_kwargs": kwargs, **(extra or {})}
        if self.bias:
            body["logit_bias"] = self.bias
        t0 = time.perf_counter()
        c, r = self.post("/v1/chat/completions", body, session=session, rid=rid)
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]}")
        text, ttft, usage = "", None, None
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                d = ch.get("delta", {})
                piece = (d.get("content") or "") + (d.get("reasoning_content") or "")
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                text += d.get("content") or ""
        c.close()
        with self.lock:
            self.done += 1
        return text, ttft if ttft is not None else time.perf_counter() - t0, usage


def server_times(client):
    """(requests finished, their queue seconds, their prefill seconds) summed so far, from the
    server's /metrics (vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds). The
    server records a request once its connection completes, just after the client has read the
    last bytes: read again (up to 2 s) until every chat the client has seen answered is
    counted, or a phase's mean could take a request of the next one."""
    deadline = time.perf_counter() + 2.0
    while True:
        v = {}
        for line in client.get("/metrics").decode().splitlines():
            m = re.match(r"^vllm:request_(queue|prefill)_time_seconds_(sum|count)(?:\{[^}]*\})? "
                         r"(\S+)$", line)
            if m:
                v[m.group(1), m.group(2)] = v.get((m.group(1), m.group(2)), 0.0) + float(m.group(3))
        n = v.get(("queue", "count"), 0.0)
        if n >= client.done or time.perf_counter() > deadline:
            return n, v.get(("queue", "sum"), 0.0), v.get(("prefill", "sum"), 0.0)
        time.sleep(0.005)


def phase_split(marks, turns):
    """Per turn, the cached turns' and the probes' mean queue and prefill ms from the /metrics
    marks taken at the barriers (2 a turn, then one after the last probes); None where a phase
    finished no request."""
    def delta(a, b):
        n = b[0] - a[0]
        return {"requests": n, "queue_ms": 1000 * (b[1] - a[1]) / n,
                "prefill_ms": 1000 * (b[2] - a[2]) / n} if n > 0 else None
    if len(marks) != 2 * turns + 1:
        return []
    return [{"turn": t + 1, "cached": delta(marks[2 * t], marks[2 * t + 1]),
             "alone": delta(marks[2 * t + 1], marks[2 * t + 2])} for t in range(turns)]


def system_prompt(client, target, kwargs):
    """Instructions and tool definitions grown to about `target` tokens."""
    rng = random.Random(1)
    tools, text = [], "You are a coding agent. Follow the rules below.\n"
    while True:
        msgs = [{"role": "system", "content": text + json.dumps(tools)},
                {"role": "user", "content": "x"}]  # the template needs a user turn
        if client.tokens(msgs, False, kwargs) >= target:
            return msgs[0]["content"]
        k = len(tools)
        tools.append({"type": "function", "function": {
            "name": f"tool_{k}", "description": words(rng, 30),
            "parameters": {"type": "object", "properties": {
                f"arg_{i}": {"type": "string", "description": words(rng, 8)} for i in range(4)}}}})
        text += f"Rule {k}: {words(rng, 40)}\n"


def fresh_ttft(client, rng, n_new, tag, session, kwargs, rid=None):
    """TTFT of a prompt of about n_new tokens that nothing cached shares (its own cache_salt):
    the time to prefill only what a cached turn had to prefill."""
    n_words, text = max(1, int(n_new * 0.9)), None
    for _ in range(4):  # tokens grow about linearly with the words: scale the count to fit
        text = words(rng, n_words)
        got = client.tokens([{"role": "user", "content": text}], True, kwargs)
        if abs(got - n_new) <= max(8, n_new // 20):
            break
        n_words = max(1, round(n_words * n_new / max(got, 1)))
    msgs = [{"role": "user", "content": text}]
    _, ttft, usage = client.chat(msgs, 1, kwargs, session=session, extra={"cache_salt": tag},
                                 rid=rid)
    return ttft, got


def conversation(client, conv, sysp, a, kwargs, out, bar=None, t0=0.0):
    """One conversation's turns; bar (lockstep): every conversation sends turn t at once, and
    after all of them have their answers, the probes of turn t go at once too. Each row keeps
    when its turn was sent and answered and its probe sent and done (seconds from t0)."""
    rng = random.Random(conv)  # conv: a seed, different for every level
    msgs = [{"role": "system", "content": sysp}]
    prev_reusable = 0
    for t in range(a.turns):
        msgs.append({"role": "user", "content": f"Turn {t}: " + words(rng, int(a.turn_tokens * 0.9))})
        n_prompt = client.tokens(msgs, True, kwargs)
        if bar:
            bar.wait(timeout=600)
        sent = time.perf_counter() - t0
        rid = f"mt-{conv}-{t + 1}"
        text, ttft, usage = client.chat(msgs, a.gen, kwargs, session=f"multiturn-{conv}", rid=rid)
        answered = time.perf_counter() - t0
        cached = (usage or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)
        row = {"conv": conv, "turn": t + 1, "prompt_tokens": n_prompt, "ttft_s": ttft,
               "cached_tokens": cached, "reusable_tokens": prev_reusable, "sent_s": sent,
               "answered_s": answered, "rid": rid}
        if bar:  # every conversation passes here each turn, probe or not
            bar.wait(timeout=600)
        row["fresh_sent_s"] = time.perf_counter() - t0
        if a.fresh and cached > 0:
            # its own words (the conversation's rng stays as without the fresh prompts)
            row["fresh_ttft_s"], row["fresh_tokens"] = fresh_ttft(
                client, random.Random(f"{conv}-{t}"), n_prompt - cached,
                f"fresh-{conv}-{t}-{random.random()}", f"multiturn-{conv}", kwargs, rid + "-p")
            row["probe_rid"] = rid + "-p"
        row["done_s"] = time.perf_counter() - t0
        out.append(row)
        prev_reusable = client.tokens(msgs, False, kwargs)
        msgs.append({"role": "assistant", "content": text})


def run_level(client, n_conv, sysp, a, kwargs):
    """(rows, per-turn server split) of n_conv conversations."""
    out, threads, errors, marks = [], [], [], []
    seed = random.Random(n_conv).randrange(1 << 30)
    bar = None
    if a.lockstep:  # one conversation too: the barrier then only takes the /metrics marks
        bar = threading.Barrier(n_conv, action=lambda: marks.append(server_times(client)))
    t0 = time.perf_counter()

    def one(c):
        try:
            conversation(client, seed + c, sysp, a, kwargs, out, bar, t0)
        except threading.BrokenBarrierError as e:  # another conversation failed first
            errors.append(e)
        except Exception as e:  # reported after the join: the run fails
            errors.insert(0, e)
            if bar:
                bar.abort()

    for c in range(n_conv):
        th = threading.Thread(target=one, args=(c,))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    if bar:
        marks.append(server_times(client))
    return out, phase_split(marks, a.turns)


def start_server(a, extra):
    log = tempfile.NamedTemporaryFile(prefix="tulip-mt-", suffix=".log", delete=False)
    cmd = [a.bin, "serve", "--port", "0", *shlex.split(a.serve_args), *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    deadline = time.time() + 900
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        m = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if m:
            return p, m.group(1), log.name
    p.kill()
    raise RuntimeError("tulip serve did not start: " + open(log.name).read()[-3000:])


def stop_server(p):
    p.terminate()
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()


BENCH_FLAGS = {"--model": "--model", "--random-weights": None, "--weight-bits": "--bits",
               "--allow-test-shape": None, "--backend": "--backend", "--threads": "--threads",
               "--state-dtype": "--state-dtype", "--seed": "--seed"}


def bench_args_of(serve_args):
    """`tulip bench` arguments for the model --serve-args serves (BENCH_FLAGS: serve's flag ->
    bench's; None: a flag without a value, kept as is)."""
    words, out, i = shlex.split(serve_args), [], 0
    while i < len(words):
        w = words[i]
        if w in BENCH_FLAGS and BENCH_FLAGS[w] is None:
            out.append(w)
        elif w in BENCH_FLAGS and i + 1 < len(words):
            out += [BENCH_FLAGS[w], words[i + 1]]
            i += 1
        i += 1
    return out


def in_context(a, res_on):
    """{(level, turn): ms}: `tulip bench` prefilling the turn's mean new tokens after its mean
    cached tokens, the level's sequences in one step (issue 14's yardstick)."""
    args = shlex.split(a.bench_args) if a.bench_args else bench_args_of(a.serve_args)
    out = {}
    for n in a.levels:
        for t in range(2, a.turns + 1):
            on = [r for r in res_on[n] if r["turn"] == t]
            new = round(sum(r["prompt_tokens"] - r["cached_tokens"] for r in on) / len(on))
            ctx = round(sum(r["cached_tokens"] for r in on) / len(on))
            if new < 1:
                continue
            cmd = [a.bin, "bench", *args, "--lengths", str(new), "--context", str(ctx), "--batch",
                   str(n), "--prefill-together", "--gen", "4", "--repeats", "2", "--json"]
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900)
            if r.returncode:
                raise RuntimeError(f"{' '.join(cmd)}: {r.stderr[-2000:]}")
            tps = json.loads(r.stdout)["rows"][0]["prefill_tps"]
            out[(n, t)] = {"new": new, "context": ctx, "ms": 1000.0 * n * new / tps}
    return out


def measure(url, a, kwargs):
    """({level: rows}, {level: per-turn server split})"""
    client = Client(url)
    if a.first_token == "visible":
        client.set_visible_first()
    sysp = system_prompt(client, a.sys_tokens, kwargs)
    res = {n: run_level(client, n, sysp, a, kwargs) for n in a.levels}
    return {n: r[0] for n, r in res.items()}, {n: r[1] for n, r in res.items()}


def split_table(split):
    """The server's queue / prefill split of the cached turns and of the probes, per turn."""
    rows = ["| turn | cached: queue ms | cached: prefill ms | alone: queue ms | "
            "alone: prefill ms |",
            "|---:|---:|---:|---:|---:|"]
    cell = lambda d, k: f"{d[k]:.1f}" if d else "-"
    for p in split:
        rows.append(f"| {p['turn']} | {cell(p['cached'], 'queue_ms')} | "
                    f"{cell(p['cached'], 'prefill_ms')} | {cell(p['alone'], 'queue_ms')} | "
                    f"{cell(p['alone'], 'prefill_ms')} |")
    return "\n".join(rows)


def server_log(text):
    """{request id: {"prep": s, "ttft": s, "first_out": s}} from the server's request log lines
    (docs/architecture.md §6.7): headers to queued, queued to first token, queued to the first
    chunk handed to the socket."""
    out = {}
    for m in re.finditer(r"^tulip: request (\S+) \S+ status=\d+ .*? ttft=([0-9.]+)s "
                         r"prep=([0-9.]+)s first_out=([0-9.]+)s ", text, re.M):
        out[m.group(1)] = {"ttft": float(m.group(2)), "prep": float(m.group(3)),
                           "first_out": float(m.group(4))}
    return out


def log_table(rows, log, turns):
    """Per turn, the cached turns' and the probes' mean prep / server TTFT / first out (ms) from
    the request log, and the client's TTFT beyond prep + first out (the wire and the client)."""
    out = ["| turn | cached: prep | ttft | first out | client - (prep + first out) | "
           "alone: prep | ttft | first out | client - (prep + first out) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in range(1, turns + 1):
        cells = []
        for key, ck in (("rid", "ttft_s"), ("probe_rid", "fresh_ttft_s")):
            got = [(log[r[key]], r[ck]) for r in rows if r["turn"] == t and r.get(key) in log]
            if not got:
                cells += ["-"] * 4
                continue
            mean = lambda f: 1000 * sum(f(g) for g in got) / len(got)
            cells += [f"{mean(lambda g: g[0]['prep']):.1f}", f"{mean(lambda g: g[0]['ttft']):.1f}",
                      f"{mean(lambda g: g[0]['first_out']):.1f}",
                      f"{mean(lambda g: g[1] - g[0]['prep'] - g[0]['first_out']):+.1f}"]
        out.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def table(res_on, res_off, n_conv, a, yard=None):
    rows = ["| turn | prompt tokens | TTFT cached ms | TTFT uncached ms | cached tokens | "
            "reusable | cached / reusable | TTFT of the new tokens alone ms | cached - alone ms |"
            + (" new tokens in context ms | cached - in context ms |" if yard else ""),
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if yard else "")]
    for t in range(1, a.turns + 1):
        on = [r for r in res_on[n_conv] if r["turn"] == t]
        off = [r for r in res_off[n_conv] if r["turn"] == t] if res_off else []
        mean = lambda xs, k: sum(x[k] for x in xs) / len(xs) if xs else float("nan")
        reus, cach = mean(on, "reusable_tokens"), mean(on, "cached_tokens")
        fr = [r for r in on if "fresh_ttft_s" in r]
        fresh = (f"{1000 * mean(fr, 'fresh_ttft_s'):.1f} | "
                 f"{1000 * (mean(fr, 'ttft_s') - mean(fr, 'fresh_ttft_s')):+.1f}") if fr else "- | -"
        unc = f"{1000 * mean(off, 'ttft_s'):.1f}" if off else "-"
        y = yard.get((n_conv, t)) if yard else None
        yc = (f" {y['ms']:.1f} | {1000 * mean(on, 'ttft_s') - y['ms']:+.1f} |" if y else
              " - | - |") if yard else ""
        rows.append(f"| {t} | {mean(on, 'prompt_tokens'):.0f} | {1000 * mean(on, 'ttft_s'):.1f} | "
                    f"{unc} | {cach:.0f} | {reus:.0f} | "
                    + (f"{cach / reus:.3f}" if reus else "-") + f" | {fresh} |" + yc)
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "tulip"))
    ap.add_argument("--serve-args", default="--random-weights --weight-bits 4 "
                    "--tokenizer bench/out/multiturn/tokenizer.json --ctx 32768 --max-seqs 16")
    ap.add_argument("--url", help="measure this running server only")
    ap.add_argument("--mode", default="cached", help="with --url: what the server is (label)")
    ap.add_argument("--sys-tokens", type=int, default=8192)
    ap.add_argument("--turn-tokens", type=int, default=500)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--convs", default="1 8")
    ap.add_argument("--thinking", action="store_true")
    ap.add_argument("--no-lockstep", dest="lockstep", action="store_false",
                    help="conversations run freely (turns and probes of different conversations "
                    "overlap at random) instead of sending each turn, then each probe, together")
    ap.add_argument("--no-fresh", dest="fresh", action="store_false",
                    help="skip the TTFT of each cached turn's new tokens alone (a prompt of that "
                    "many tokens under its own cache_salt, sent right after the turn)")
    ap.add_argument("--cached-only", action="store_true",
                    help="skip the server without the prefix cache (the uncached column reads -): "
                    "for A/B runs of server settings that only the cached turns feel")
    ap.add_argument("--first-token", choices=("visible", "model"), default="visible",
                    help="visible (default): every request biases one word token by +100 "
                    "(logit_bias), so the first generated token streams text and TTFT is the time "
                    "to the first token; model: no bias (with random weights the first visible "
                    "text can come several tokens in)")
    ap.add_argument("--in-context", action="store_true",
                    help="after the server runs, time each cached turn's new tokens prefilled in "
                    "context with `--bin bench` (issue 14's yardstick; not with --url)")
    ap.add_argument("--bench-args", help="with --in-context: the `tulip bench` model arguments "
                    "(default: taken from --serve-args)")
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    a.levels = [int(x) for x in a.convs.split()]
    kwargs = {"enable_thinking": bool(a.thinking)}
    if "bench/out/multiturn/tokenizer.json" in a.serve_args:  # the default: the shared Qwen3 one
        os.makedirs(os.path.join(ROOT, "bench/out/multiturn"), exist_ok=True)
        subprocess.run(f"gunzip -c ../shared/data/qwen3-tokenizer.json.gz > "
                       f"bench/out/multiturn/tokenizer.json", shell=True, check=True, cwd=ROOT)
    if a.url:
        res_on, split_on = measure(a.url, a, kwargs)
        res_off, log_on = None, {}
    else:
        res_on = res_off = split_on = None
        log_on = {}
        runs = (([], "on"),) if a.cached_only else (([], "on"), (["--no-prefix-cache"], "off"))
        for extra, name in runs:
            p, url, log = start_server(a, extra)
            try:
                r, sp = measure(url, a, kwargs)
            finally:
                stop_server(p)
                if name == "on":
                    log_on = server_log(open(log, errors="replace").read())
                os.unlink(log)
            if name == "on":
                res_on, split_on = r, sp
            else:
                res_off = r
    yard = in_context(a, res_on) if a.in_context and not a.url else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    print(f"multiturn: commit {commit}, system ~{a.sys_tokens} tokens, {a.turns} turns of "
          f"~{a.turn_tokens} tokens, {a.gen} generated, thinking {'on' if a.thinking else 'off'}, "
          f"first token {a.first_token}")
    for n in a.levels:
        print(f"\n{n} conversation(s) at once (means per turn)\n")
        print(table(res_on, res_off, n, a, yard))
        if split_on.get(n):
            print(f"\nthe server's split (/metrics), cache on: mean per request\n")
            print(split_table(split_on[n]))
        if log_on and any(r["rid"] in log_on for r in res_on[n]):
            print(f"\nthe server's request log, cache on: mean per request, ms\n")
            print(log_table(res_on[n], log_on, a.turns))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"on": res_on, "off": res_off, "split_on": split_on, "log_on": log_on,
                       "in_context": {f"{n} {t}": v for (n, t), v in (yard or {}).items()}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
