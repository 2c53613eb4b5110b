"""Start the server: the LLM from the flags, the AsyncLLM around its engine, the app, uvicorn.

``python -m l10_server`` (``__main__.py``) parses the flags and calls ``run``; tests call
``make_server`` and run it on a socket they bound (port 0: a free port, no race).

The engine is stage 9's ``LLM`` (with ``--kv-cache-dtype auto``, stage 8's engine: stage 7's
runner, stage 6's prefix cache, stage 5's loop), built in the engine core process
(engine_core.py) from the same keyword arguments, so every earlier stage's option works here.

On a machine without CUDA, ``--impl auto`` serves with the PyTorch attention and torch ops: the
Triton interpreter runs the kernels hundreds of times slower, which no client would wait for.
``--impl triton`` runs them anyway (lessons, checks).
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time

import uvicorn

from .api import build_app
from .async_llm import AsyncLLM


class Server(uvicorn.Server):
    """uvicorn's server, plus: one start line once the socket is bound, and on Ctrl-C / SIGTERM the
    requests in flight are aborted first (each stream ends with finish_reason "abort"), so the
    graceful shutdown that follows does not wait for them to run to max_tokens."""

    def __init__(self, config, async_llm: AsyncLLM, describe: str):
        super().__init__(config)
        self.async_llm, self.describe = async_llm, describe
        self.t0 = None                             # run(): when the process began loading the model

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            ready = f" (ready {time.perf_counter() - self.t0:.1f} s after start)" if self.t0 is not None else ""
            print(f"l10_server: serving {self.describe} at http://{host}:{port}/v1{ready}", file=sys.stderr,
                  flush=True)

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn re-raises a caught SIGTERM/SIGINT once it has shut down (so the exit status says
        "killed"); a stop that was asked for and done cleanly exits 0 here, after the last log line."""
        if threading.current_thread() is not threading.main_thread():
            yield                                  # tests run the server on a thread: no signals there
            return
        old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig, frame):
        if not self.should_exit:
            n = self.async_llm.pending
            print(f"l10_server: shutting down, aborting {n} prompt(s) in flight", file=sys.stderr, flush=True)
            self.async_llm.shutdown(wait=False)
        super().handle_exit(sig, frame)


def describe(llm, name: str) -> str:
    eng = llm.llm_engine
    cfg, p, runner = eng.config, next(llm.model.parameters()), eng.runner
    impl = "PyTorch attention" if runner.cache.impl == "torch" else "Triton kernels"
    impl += ", CUDA graphs" if getattr(runner, "graphs", None) else ""
    return (f"{name} on {p.device.type} ({str(p.dtype).replace('torch.', '')}, {impl}) | KV {cfg.num_blocks} blocks "
            f"x {cfg.block_size} tokens | max_model_len {cfg.max_model_len} | max_num_seqs {cfg.max_num_seqs}")


def make_server(model: str | None, llm_kwargs: dict, name: str | None = None, *, host: str = "127.0.0.1",
                port: int = 8000, max_pending: int = 1024, log_level: str = "warning") -> Server:
    """Start the engine core (it loads the model: this blocks until it is ready) and the app."""
    async_llm = AsyncLLM(model, llm_kwargs, max_pending=max_pending)
    name = name or model or "tiny-qwen3"
    app = build_app(async_llm, name, async_llm.info["max_model_len"])
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                            lifespan="on")
    return Server(config, async_llm, async_llm.info["describe"])


#: ``--impl torch``: the reference attention and the skeleton's torch ops, no Triton at all
TORCH_IMPL = dict(impl="torch", fused_ops=False, gemv=False, split_kv=False)


def impl_options(device: str, impl: str = "auto") -> dict:
    """The LLM(...) options of ``--impl``: auto is Triton on cuda and the PyTorch reference on a CPU."""
    if impl == "auto":
        impl = "triton" if device.startswith("cuda") else "torch"
    return dict(TORCH_IMPL) if impl == "torch" else {}


def llm_options(args) -> dict:
    """The LLM(...) keyword arguments the flags ask for."""
    from plumbing.runtime import default_device
    device = args.device or default_device()
    kw = dict(device=device, dtype=args.dtype, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
              num_gpu_blocks_override=args.num_gpu_blocks_override, seed=args.seed,
              enable_prefix_caching=args.enable_prefix_caching, enforce_eager=args.enforce_eager,
              kv_cache_dtype=args.kv_cache_dtype)
    return dict(kw, **impl_options(device, args.impl))


@contextlib.contextmanager
def running_in_thread(server: Server, timeout: float = 60.0):
    """Run ``server`` on a thread of this process on 127.0.0.1, on a socket bound to port 0 (a free
    port, with no race between choosing it and binding it); yields its base URL. Tests, benchmarks
    and the lesson's wall use it; on exit the server stops and its engine core with it."""
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start in {timeout:.0f} s")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        server.async_llm.shutdown()


def run(args) -> None:
    t0 = time.perf_counter()
    server = make_server(args.model, llm_options(args), args.served_model_name, host=args.host, port=args.port,
                         max_pending=args.max_pending, log_level=args.log_level)
    server.t0 = t0
    server.run()
    print(f"l10_server: stopped after {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
