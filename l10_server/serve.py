"""Start the server: the LLM from the flags, the AsyncLLM around its engine, the app, uvicorn.

``python -m l10_server`` (``__main__.py``) parses the flags and calls ``run``; tests call
``make_server`` and run it on a socket they bound (port 0: a free port, no race).

The engine is the latest stage's ``LLM`` (``l5_scheduler.stages.latest("stage")``, found by
folder: this package names no stage after its own), built in the engine core process
(engine_core.py) from the keyword arguments the flags give, so every stage's option works here.

On a machine without CUDA, ``--impl auto`` serves with the PyTorch attention and torch ops: the
Triton interpreter runs the kernels hundreds of times slower, which no client would wait for.
``--impl triton`` runs them anyway (lessons, checks); so does any kernel flag given explicitly
(``--fused-ops``): a flag given wins over the server's defaults, and one that the configuration
ignores (``--split-kv`` with the PyTorch attention) says so on stderr.
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
    """uvicorn's server, plus: one start line once the socket is bound; on Ctrl-C / SIGTERM the
    requests in flight are aborted first (each stream ends with finish_reason "abort"), so the
    graceful shutdown that follows does not wait for them to run to max_tokens; and when the engine
    core dies, the server stops too (``run`` then exits 1), as vLLM's does: the clients in flight are
    answered (503) before it goes, and a supervisor starts a fresh process, the one state known good."""

    def __init__(self, config, async_llm: AsyncLLM, describe: str):
        super().__init__(config)
        self.async_llm, self.describe = async_llm, describe
        self.t0 = None                             # run(): when the process began loading the model
        async_llm.on_dead = self.engine_died

    def engine_died(self, why: str) -> None:
        print(f"l10_server: {why}; {self.async_llm.pending} sequence(s) in flight answered 503, exiting with "
              "status 1 (a supervisor restarts the server)", file=sys.stderr, flush=True)
        self.should_exit = True

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


def describe(llm, name: str, engine: str = "") -> str:
    """The start line's description; ``engine``: the stage package whose ``LLM`` it is."""
    eng = llm.llm_engine
    cfg, p, runner = eng.config, next(llm.model.parameters()), eng.runner
    impl = "PyTorch attention" if runner.cache.impl == "torch" else "Triton kernels"
    impl += ", CUDA graphs" if getattr(runner, "graphs", None) else ""
    kv = getattr(getattr(eng, "args", None), "kv_cache_dtype", "auto")     # the options it was built from
    steps = f"{engine}'s engine, {type(eng.step_order).__name__}" if engine else type(eng.step_order).__name__
    return (f"{name} on {p.device.type} ({str(p.dtype).replace('torch.', '')}, {impl}) | {steps} | KV "
            f"{cfg.num_blocks} blocks x {cfg.block_size} tokens{'' if kv == 'auto' else f' ({kv})'} | max_model_len "
            f"{cfg.max_model_len} | max_num_seqs {cfg.max_num_seqs}")


def make_server(model: str | None, llm_kwargs: dict, name: str | None = None, *, host: str = "127.0.0.1",
                port: int = 8000, max_pending: int = 1024, log_level: str = "warning") -> Server:
    """Start the engine core (it loads the model: this blocks until it is ready) and the app."""
    name = name or model or "tiny-qwen3"
    async_llm = AsyncLLM(model, llm_kwargs, max_pending=max_pending, served_name=name)
    app = build_app(async_llm, name, async_llm.info["max_model_len"])
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5,
                            lifespan="on")
    return Server(config, async_llm, async_llm.info["describe"])


#: the server's defaults under the PyTorch reference (``--impl torch``, or auto on a CPU): no Triton at all
TORCH_IMPL = dict(impl="torch", fused_ops=False, gemv=False, split_kv=False)


def impl_options(device: str, impl: str = "auto") -> dict:
    """The server's LLM(...) defaults for ``--impl``: auto is Triton on cuda and the PyTorch reference on a CPU."""
    if impl == "auto":
        impl = "triton" if device.startswith("cuda") else "torch"
    return dict(TORCH_IMPL) if impl == "torch" else {}


def ignored(kw: dict, given: dict, device: str) -> list[str]:
    """A note for each flag given whose value this configuration (``kw``: what LLM(...) gets) cannot
    honour: the value asks for something that will not run here."""
    cpu, torch_attn = not device.startswith("cuda"), kw.get("impl", "triton") == "torch"

    def on(name, default=True):                             # the value the engine will use
        return kw.get(name, default)

    attn = f"the PyTorch attention (--impl {'torch' if given.get('impl') == 'torch' else 'auto on a CPU'})"
    graphs = "there are no CUDA graphs on a CPU" if cpu else f"{attn} runs without CUDA graphs" if torch_attn else None
    why = {
        "split_kv": (True, f"{attn} does not split the keys" if torch_attn else None),
        "gemv": (True, "the GEMV is one of the fused ops, which are off (--no-fused-ops)"
                 if not on("fused_ops") else None),
        "norm_prologue": (True, "the norm prologue lives in the fused ops' GEMV, which is off"
                          if not (on("fused_ops") and on("gemv")) else None),
        "pdl": (True, "PDL needs a Hopper GPU" if cpu else
                "PDL chains the fused ops' kernels, which are off (--no-fused-ops)" if not on("fused_ops") else None),
        "enforce_eager": (False, graphs),
        "prefill_graphs": (True, graphs or ("--enforce-eager turns CUDA graphs off" if on("enforce_eager", False)
                                            else None)),
        "gpu_memory_utilization": (None, "a CPU's pool is --num-gpu-blocks-override blocks (256 by default)"
                                   if cpu else None),
    }
    notes = []
    for name, (asks, reason) in why.items():
        if name in given and reason is not None and (asks is None or given[name] == asks):
            value = given[name]
            flag = "--" + ("no-" if value is False else "") + name.replace("_", "-")
            notes.append(f"{flag}{'' if isinstance(value, bool) else f' {value}'} ignored: {reason}.")
    return notes


def llm_options(given: dict, device: str | None = None) -> tuple[dict, list[str]]:
    """The LLM(...) keyword arguments for the engine options the flags gave (``model`` apart): the
    server's defaults for the device (``impl_options``), the flags given over them; and the notes
    of ``ignored``. ``device``: where to serve when ``--device`` was not given (default: cuda if present)."""
    device = given.get("device") or device
    if device is None:
        from plumbing.runtime import default_device          # (loads torch)
        device = default_device()
    kw = dict(impl_options(device, given.get("impl", "auto")), **{k: v for k, v in given.items() if k != "model"})
    kw["device"] = device
    if kw.get("impl") == "auto":                             # decided here, where the notes are
        kw["impl"] = "triton" if device.startswith("cuda") else "torch"
    return kw, ignored(kw, given, device)


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


def run(args, given: dict) -> None:
    """``given``: the engine options the flags gave (``__main__.given_options``, checked)."""
    t0 = time.perf_counter()
    kw, notes = llm_options(given)
    for line in notes:
        print(f"note: {line}", file=sys.stderr, flush=True)
    server = make_server(given.get("model"), kw, args.served_model_name, host=args.host, port=args.port,
                         max_pending=args.max_pending, log_level=args.log_level)
    server.t0 = t0
    server.run()
    print(f"l10_server: stopped after {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if server.async_llm.dead is not None:           # the engine core died: a supervisor restarts us
        sys.exit(1)
