"""Stage 10: servers of their own, each started and stopped by its test: a full queue answers 429,
an engine core that dies fails the requests in flight with 503, the CLI starts, serves and stops
on SIGTERM, and a bad flag is refused before torch loads. Every loop is bounded (client timeouts,
polling deadlines). The module's one shared server: tests/test_l10_server.py."""
import json

import httpx
import pytest

from l10_serving import metrics, running_server, wait_idle
from test_l10_server import PROMPT


@pytest.mark.deep      # a server of its own: a process and a model load more
def test_a_full_queue_gets_429_and_the_server_keeps_serving():
    with running_server("tiny-qwen3", max_pending=2) as (base, _):
        body = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.Client(timeout=60) as h, h.stream("POST", f"{base}/v1/completions", json=body), \
                h.stream("POST", f"{base}/v1/completions", json=body):
            refused = httpx.post(f"{base}/v1/completions", json=dict(body, stream=False), timeout=30)
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert metrics(base)["num_requests_pending"] == 2
        wait_idle(base)                                       # the two hung up: aborted
        ok = httpx.post(f"{base}/v1/completions", json=dict(body, stream=False, max_tokens=4), timeout=30)
        assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.deep      # a server of its own: a process and a model load more
def test_an_engine_core_that_dies_fails_the_requests_in_flight_with_503_and_health_says_so():
    import os
    import signal
    with running_server("tiny-qwen3") as (base, server):
        body = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            next(lines)
            os.kill(server.async_llm.proc.pid, signal.SIGKILL)      # the engine core dies mid-stream
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and '"error"' in rest[-2] and "engine core exited" in rest[-2]
        assert httpx.get(f"{base}/health", timeout=10).status_code == 503
        r = httpx.post(f"{base}/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}, timeout=30)
        assert r.status_code == 503


@pytest.mark.deep      # a server of its own: a process and a model load more
def test_the_cli_starts_logs_one_line_serves_and_stops_on_sigterm_aborting_the_stream(tmp_path):
    import os
    import re
    import signal
    import subprocess
    import sys
    import time
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "l10_server", "--port", "0", "--max-num-seqs", "8"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline, line = time.monotonic() + 120, ""
        while "serving" not in line:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the server exited before its start line"
            assert time.monotonic() < deadline, "no start line in 120 s"
        base = re.search(r"at (http://\S+)/v1", line).group(1)
        assert "tiny-qwen3" in line and "KV" in line and "blocks" in line
        body = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as r:
            events = []
            for event in r.iter_lines():
                events.append(event)
                if len(events) == 4:
                    proc.send_signal(signal.SIGTERM)
        chunks = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
        assert [e for e in events if e][-1] == "data: [DONE]"
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
        assert proc.wait(timeout=60) == 0
        rest = proc.stderr.read()
        assert "aborting 1 prompt(s) in flight" in rest and "stopped after" in rest
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_bad_flag_is_refused_before_torch_loads():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "l10_server", "--max-num-seqs", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "max_num_seqs must be a positive integer" in r.stderr    # (its declaration's check)
    r = subprocess.run([sys.executable, "-c", "import sys, l10_server.__main__ as m\n"
                        "try:\n    m.main(['--port', '70000'])\nexcept Exception as e:\n    print(e)\n"
                        "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=60)
    assert "--port must be in [0, 65535]" in r.stdout and r.stdout.strip().endswith("False")
