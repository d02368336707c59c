"""packaging/tulip.service: `systemd-analyze verify` accepts it (no warning at all: the tool exits
0 on many problems and only prints them) with ExecStart pointed at the binary built here, the
verifier does reject a broken unit (so the check can fail), the unit restarts on failure and gives
the drain more time than tulip's --drain-timeout before SIGKILL, and its ExecStart command line
really starts a server (the tiny model in place of the checkpoint, a key file, port 0)."""
import os
import re
import shlex
import signal
import subprocess

from srv_util import BINARIES, MODEL, ROOT, TOKENIZER

UNIT = os.path.join(ROOT, "packaging", "tulip.service")


def unit_lines():
    with open(UNIT) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]


def setting(name):
    vals = [ln.split("=", 1)[1] for ln in unit_lines() if ln.startswith(name + "=")]
    assert len(vals) == 1, (name, vals)
    return vals[0]


def verify(text, tmp_path, name="tulip.service"):
    p = tmp_path / name
    p.write_text(text)
    return subprocess.run(["systemd-analyze", "verify", str(p)], capture_output=True, text=True,
                          timeout=60)


def test_systemd_analyze_verify(tmp_path):
    with open(UNIT) as f:
        text = f.read().replace("/usr/local/bin/tulip", os.path.abspath(BINARIES["cpu"]))
    r = verify(text, tmp_path)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr
    bad = text.replace("Restart=on-failure", "Restart=bogus")
    r = verify(bad, tmp_path, "bad.service")
    assert "restart specifier" in r.stderr, r.stderr


def test_restart_and_drain_timeout():
    assert setting("Restart") == "on-failure"
    assert setting("KillSignal") == "SIGTERM"
    drain = float(re.search(r"--drain-timeout (\d+)", setting("ExecStart")).group(1))
    assert float(setting("TimeoutStopSec")) > drain


def test_execstart_starts_a_server(tmp_path):
    """ExecStart as systemd would run it, with TULIP_ARGS naming the tiny model."""
    key = tmp_path / "api-key"
    key.write_text("secret\n")
    cmd = setting("ExecStart").replace("/usr/local/bin/tulip", os.path.abspath(BINARIES["cpu"]))
    cmd = cmd.replace("/etc/tulip/api-key", str(key)).replace("--port 8000", "--port 0")
    args = []
    for a in shlex.split(cmd):
        if a == "$TULIP_ARGS":
            args += ["--model", MODEL, "--tokenizer", TOKENIZER, "--allow-test-shape",
                     "--backend", "cpu", "--threads", "1"]
        else:
            args.append(a)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        lines = [p.stdout.readline() for _ in range(3)]
        assert "listening on http://" in lines[-1] and "API key required" in lines[-1], lines
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
