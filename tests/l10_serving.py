"""A server on 127.0.0.1 for the stage 10 tests (serve.running_in_thread: a thread of this process,
a socket bound to port 0), and its /metrics read back."""
from __future__ import annotations

import contextlib
import time


@contextlib.contextmanager
def running_server(model: str = "tiny-qwen3", *, max_pending: int = 1024, **llm_kw):
    """Yields (base_url, server). The engine core (its own process) runs the latest stage's LLM: on a
    CPU with the PyTorch attention and ops (the server's ``--impl auto``), on a GPU with the Triton
    kernels; ``llm_kw`` (any LLM option, e.g. ``speculative_config``) goes over those defaults."""
    import torch
    from l10_server.serve import impl_options, make_server, running_in_thread
    cuda = torch.cuda.is_available()
    kw = dict(impl_options("cuda" if cuda else "cpu"), **(dict(num_gpu_blocks_override=512) if cuda else {}))
    # log_level "critical": uvicorn does not format a failing request's traceback in the server's
    # thread. On CPython 3.11 (<= 3.11.7 here) two threads formatting tracebacks at once can raise
    # "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905) inside pytest's
    # own report of a failed test: an INTERNALERROR instead of a failure (seen with lesson 10's stub).
    server = make_server(model, {**kw, **llm_kw}, model, max_pending=max_pending, log_level="critical")
    with running_in_thread(server) as base:
        yield base, server


def metrics(base: str) -> dict[str, float]:
    """/metrics, parsed by prometheus_client's parser: sample name without its ``vllm:``/``tll:``
    prefix -> value; a label other than model_name and engine joins the name (``_bucket{le=0.5}``,
    ``request_success_total{finished_reason=length}``)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text):
        for s in family.samples:
            extra = ",".join(f"{k}={v}" for k, v in s.labels.items() if k not in ("model_name", "engine"))
            out[s.name.split(":", 1)[-1] + (f"{{{extra}}}" if extra else "")] = s.value
    return out


def wait_idle(base: str, timeout: float = 30.0) -> dict[str, float]:
    """Poll /metrics until nothing runs, waits or holds a block (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(base)
        if m["num_requests_running"] == m["num_requests_waiting"] == m["kv_blocks_used"] == m["num_requests_pending"] == 0:
            return m
        if time.monotonic() > deadline:
            busy = {k: m[k] for k in ("num_requests_running", "num_requests_waiting", "kv_blocks_used",
                                      "num_requests_pending")}
            raise AssertionError(f"the server did not go idle in {timeout} s: {busy}")
        time.sleep(0.05)


def offline_llm(**kw):
    """The oracle: the latest stage's LLM in this process, built as ``running_server`` builds the
    server's (the same defaults: on a CPU the PyTorch attention and ops, float32)."""
    import torch
    from l10_server.serve import impl_options
    from l5_scheduler.stages import latest
    cuda = torch.cuda.is_available()
    opts = dict(impl_options("cuda" if cuda else "cpu"), **(dict(num_gpu_blocks_override=512) if cuda else {}))
    return latest("stage").LLM("tiny-qwen3", **{**opts, **kw})
