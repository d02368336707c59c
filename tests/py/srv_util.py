"""Helpers for the end-to-end server tests: start a real `tulip serve` on 127.0.0.1 (port 0: the
server picks a free port and prints it), talk to it with the official openai client or raw HTTP,
read /metrics, stop it with a signal and collect its exit status and stderr."""
import http.client
import json
import os
import re
import signal
import subprocess
import tempfile
import time

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "tests", "data", "tiny-a")
TOKENIZER = os.path.join(ROOT, "tests", "data", "tiny-tokenizer", "tokenizer.json")
BINARIES = {"cpu": os.path.join(ROOT, "build", "cpu", "tulip"),
            "asan": os.path.join(ROOT, "build", "asan", "tulip")}


class Server:
    def __init__(self, binary, *args, api_key=None):
        self.binary = binary
        self.api_key = api_key
        self.err = tempfile.NamedTemporaryFile(prefix="tulip-serve-", suffix=".log", delete=False)
        cmd = [binary, "serve", "--model", MODEL, "--tokenizer", TOKENIZER, "--allow-test-shape",
               "--backend", "cpu", "--threads", "1", "--port", "0", *args]
        if api_key:
            cmd += ["--api-key", api_key]
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=env, cwd=ROOT)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("tulip serve did not start:\n" + self.stderr())
        self.base = f"http://127.0.0.1:{self.port}"

    def client(self, api_key=None, **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key or self.api_key or "none",
                             max_retries=0, timeout=kw.pop("timeout", 120), **kw)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """Raw HTTP: returns (status, headers dict, body bytes)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def post_json(self, path, body, **kw):
        st, _, data = self.request("POST", path, body, **kw)
        return st, json.loads(data)

    def metrics(self):
        st, _, data = self.request("GET", "/metrics")
        assert st == 200
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def _poll_metrics(self, value, pred, what, timeout):
        deadline = time.time() + timeout
        while True:
            v = value(self.metrics())
            if v is not None and pred(v):
                return v
            if time.time() > deadline:
                raise AssertionError(f"{what} = {v} after {timeout} s")
            time.sleep(0.02)

    def wait_metric(self, key, pred, timeout=10):
        return self._poll_metrics(lambda m: m.get(key), pred, f"metric {key}", timeout)

    def wait_metric_sum(self, prefix, at_least, timeout=10):
        """Waits until the metrics whose keys start with prefix (any labels) sum to at_least."""
        return self._poll_metrics(lambda m: sum(x for k, x in m.items() if k.startswith(prefix)),
                                  lambda v: v >= at_least, f"metrics {prefix}* summed", timeout)

    def stderr(self):
        self.err.flush()
        with open(self.err.name, errors="replace") as f:
            return f.read()

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Signals the server and waits; returns (exit status, stderr)."""
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


def sanitizer_report(stderr):
    """The first line of an ASan/UBSan/LSan report in stderr, or None."""
    for line in stderr.splitlines():
        if ("ERROR: AddressSanitizer" in line or "ERROR: LeakSanitizer" in line
                or "runtime error:" in line):
            return line
    return None
