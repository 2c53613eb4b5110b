"""Stage 10: servers of their own, each started and stopped by its test: a full queue answers 429,
an engine core that dies (the unguarded core meeting a lone surrogate; a SIGKILL) answers every client
in flight at once and stops the server (the CLI then exits 1), the CLI starts, serves and stops
on SIGTERM, and a bad flag is refused before torch loads. Every loop is bounded (client timeouts,
polling deadlines). The module's one shared server: tests/test_l10_server.py."""
import json
import threading
import time

import httpx
import pytest

from l10_fuzz_bodies import BOUND, PINNED, check
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


def _post(answers: dict, name: str, base: str, body: dict) -> threading.Thread:
    t = threading.Thread(target=lambda: answers.__setitem__(name, httpx.post(f"{base}/v1/completions", json=body,
                                                                             timeout=BOUND)))
    t.start()
    return t


def _until(cond, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["unguarded-core", pytest.param("sigkill", marks=pytest.mark.deep)])
def test_a_dying_engine_core_answers_every_client_at_once_and_the_server_exits(how, monkeypatch):
    """The core dies with clients in flight: a stream (it gets an error event, then [DONE]), a whole
    request (503) and one that waits for its ack (503). Each is answered within 5 s, and the server
    stops (``python -m l10_server`` then exits 1: a supervisor starts a fresh one).

    unguarded-core: the unguarded engine core (tests/l10_planted_core.py) meets the fuzz's pinned lone
    surrogate, which therefore fails the fuzz's check (a 503, not a 400). sigkill: the core is killed."""
    import os
    import signal

    import l10_planted_core
    import l10_server.client
    if how == "unguarded-core":
        monkeypatch.setattr(l10_server.client, "run_engine_core", l10_planted_core.run_unguarded_core)
    long = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True}
    answers: dict = {}
    with running_server("tiny-qwen3") as (base, srv):
        pid = srv.async_llm.proc.pid
        with httpx.stream("POST", f"{base}/v1/completions", json=dict(long, stream=True), timeout=BOUND) as r:
            lines = r.iter_lines()
            next(lines)                                            # the stream is running
            threads = [_post(answers, "whole", base, long)]
            _until(lambda: srv.async_llm.snapshot["running"] == 2, "the whole request runs")
            if how == "sigkill":
                os.kill(pid, signal.SIGSTOP)                       # acks stop coming ...
                threads.append(_post(answers, "waiting", base, {"prompt": PROMPT, "max_tokens": 3}))
                _until(lambda: srv.async_llm.pending == 3, "the third request is submitted")
                t0 = time.monotonic()
                os.kill(pid, signal.SIGKILL)                       # ... and never will
            else:
                t0 = time.monotonic()
                with pytest.raises(AssertionError, match="503 for"), httpx.Client(base_url=base) as client:
                    check(client, *PINNED)                         # waits for its ack: answered 503
            rest = [line for line in lines if line.startswith("data: ")]
        for t in threads:
            t.join(BOUND)
        answered = time.monotonic() - t0
        why = "engine core exited (exit code -9)" if how == "sigkill" else "engine stopped after an error: TypeError"
        assert rest[-1] == "data: [DONE]" and '"error"' in rest[-2] and why in rest[-2], rest[-2:]
        assert all(a.status_code == 503 and why in a.json()["error"]["message"] for a in answers.values()), answers
        assert len(answers) == len(threads) and answered < 5, answered
        _until(lambda: _refused(base), "the server stops", timeout=15)
        assert srv.async_llm.dead is not None


def _refused(base: str) -> bool:
    """The port refuses connections: the server has stopped. A connection reset mid-request is a
    server still stopping (uvicorn closes what it accepted): asked again."""
    try:
        httpx.get(f"{base}/health", timeout=2)
    except httpx.ConnectError:
        return True
    except (httpx.ReadError, httpx.RemoteProtocolError):
        return False
    return False


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


@pytest.mark.deep      # a process and a model load more
def test_the_cli_exits_1_when_its_engine_core_dies_so_that_a_supervisor_restarts_it():
    import os
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path
    proc = subprocess.Popen([sys.executable, "-m", "l10_server", "--port", "0", "--max-num-seqs", "8"],
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line = ""
        while "serving" not in line:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "the server exited before its start line"
        base = re.search(r"at (http://\S+)/v1", line).group(1)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        core = next(int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes())
        body = {"prompt": PROMPT, "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=BOUND) as r:
            lines = r.iter_lines()
            next(lines)
            os.kill(core, signal.SIGKILL)
            rest = [e for e in lines if e.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and "engine core exited" in rest[-2]
        assert proc.wait(timeout=30) == 1
        assert "answered 503, exiting with status 1" in proc.stderr.read()
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



@pytest.mark.parametrize("stream", [False, True])
def test_an_error_after_the_engine_took_the_request_leaves_nothing_in_flight(tiny_server, monkeypatch, stream):
    """Whatever raises between the engine core's ack and the response (here a planted bug in the
    formatter; a client gone before a stream's generator ever ran is the same path) closes the
    submission: the request is aborted and counted out, so --max-pending does not fill up."""
    from l10_server.responses import Formatter
    base, srv = tiny_server
    real = Formatter.accepted

    def buggy(self, prompts, ids):
        if self.top_n == 3:                                   # only this test's requests
            raise RuntimeError("a formatter bug")
        return real(self, prompts, ids)
    monkeypatch.setattr(Formatter, "accepted", buggy)
    body = {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True, "logprobs": 3, "stream": stream}
    r = httpx.post(f"{base}/v1/completions", json=body, timeout=BOUND)
    assert r.status_code == 500 and "a formatter bug" in r.json()["error"]["message"]
    wait_idle(base)
    assert srv.async_llm.pending == 0 and not srv.async_llm.subs
