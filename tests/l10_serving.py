"""A server on 127.0.0.1 for the stage 10 tests: in this process, on a thread, on a socket bound
to port 0 (a free port, with no race between choosing it and binding it)."""
from __future__ import annotations

import contextlib
import socket
import threading
import time


@contextlib.contextmanager
def running_server(model: str = "tiny-qwen3", *, max_pending: int = 1024, **llm_kw):
    """Yields (base_url, server). The engine core (its own process) runs stage 9's LLM: on a CPU with
    the PyTorch attention and ops (the server's ``--impl auto``), on a GPU with the Triton kernels."""
    import torch
    from l10_server.serve import make_server
    kw = {} if torch.cuda.is_available() else dict(impl="torch", fused_ops=False, gemv=False, split_kv=False)
    if torch.cuda.is_available():
        kw["num_gpu_blocks_override"] = 512
    server = make_server(model, {**kw, **llm_kw}, model, max_pending=max_pending)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        server.async_llm.shutdown()


def metrics(base: str) -> dict[str, float]:
    import httpx
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return {line.split()[0].removeprefix("tll:"): float(line.split()[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def wait_idle(base: str, timeout: float = 30.0) -> dict[str, float]:
    """Poll /metrics until nothing runs, waits or holds a block (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(base)
        if m["num_requests_running"] == m["num_requests_waiting"] == m["kv_blocks_used"] == m["num_requests_pending"] == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not go idle in {timeout} s: {m}")
        time.sleep(0.05)
