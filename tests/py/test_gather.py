"""tulip serve --gather-us (src/server/sched.h, tl_sched_params.gather_us): an idle engine that
gets a request waits until no other request has arrived for the gap before its first step, so
requests sent together share that step instead of all but the first waiting for it. Observed
through vLLM's queue-time histogram in /metrics (arrival to admission): with a 0.3 s gap a lone
request waits at least 0.3 s; a second request sent 0.1 s into the gap starts a new gap, so the
first waits at least 0.4 s and the second at least 0.3 s (without that restart the two would wait
0.3 + 0.2 s). With decoding streams running the engine never gathers (it is not idle). Only lower
bounds on waits are asserted: no timed targets."""
import threading
import time

import pytest

from srv_util import BINARIES, Server

GAP_S = 0.3


def queue_sums(srv):
    """(requests, queue seconds) summed over /metrics' vllm:request_queue_time_seconds."""
    m = srv.metrics()
    n = sum(v for k, v in m.items() if k.startswith("vllm:request_queue_time_seconds_count"))
    s = sum(v for k, v in m.items() if k.startswith("vllm:request_queue_time_seconds_sum"))
    return n, s


def ask(srv, text, out):
    st, body = srv.post_json("/v1/completions", {"prompt": text, "max_tokens": 2, "temperature": 0})
    out.append((st, body))


@pytest.mark.parametrize("binary", ["cpu"])
def test_gather_waits_for_a_quiet_gap(binary):
    srv = Server(BINARIES[binary], "--gather-us", str(int(GAP_S * 1e6)))
    try:
        out = []
        n0, s0 = queue_sums(srv)
        ask(srv, "one request alone", out)
        srv.wait_metric_sum("vllm:request_queue_time_seconds_count", n0 + 1)
        n1, s1 = queue_sums(srv)
        assert out[0][0] == 200 and n1 == n0 + 1, out
        assert s1 - s0 >= GAP_S, s1 - s0
        th = threading.Thread(target=ask, args=(srv, "the first of two", out))
        th.start()
        time.sleep(GAP_S / 3)
        ask(srv, "the second of two", out)
        th.join(timeout=120)
        assert [st for st, _ in out] == [200, 200, 200], out
        srv.wait_metric_sum("vllm:request_queue_time_seconds_count", n1 + 2)
        n2, s2 = queue_sums(srv)
        assert n2 == n1 + 2
        # the first: GAP_S / 3 until the second arrives, then a whole gap; the second: a gap
        assert s2 - s1 >= GAP_S / 3 + 2 * GAP_S - 0.01, s2 - s1
    finally:
        srv.stop()


@pytest.mark.parametrize("binary", ["cpu"])
def test_no_gathering_while_streams_run(binary):
    srv = Server(BINARIES[binary], "--gather-us", str(int(GAP_S * 1e6)))
    try:
        out = []
        long = threading.Thread(target=lambda: out.append(srv.post_json(
            "/v1/completions", {"prompt": "a long one", "max_tokens": 400, "temperature": 0,
                                "ignore_eos": True}, timeout=300)))
        long.start()
        srv.wait_metric_sum("vllm:generation_tokens_total", 5, timeout=60)  # it is decoding
        n0, s0 = queue_sums(srv)
        ask(srv, "joins the running step", out)
        srv.wait_metric_sum("vllm:request_queue_time_seconds_count", n0 + 1)
        n1, s1 = queue_sums(srv)
        long.join(timeout=300)
        assert [st for st, _ in out] == [200, 200], out
        # the long stream was still running (it counts only when it ends), so the engine was not
        # idle: no gap was waited
        assert n1 == n0 + 1 and s1 - s0 < GAP_S, (n1 - n0, s1 - s0)
        assert out[1][1]["usage"]["completion_tokens"] == 400
    finally:
        srv.stop()
