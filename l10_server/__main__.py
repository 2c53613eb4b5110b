"""``python -m l10_server``: an OpenAI-compatible server for the engine (``make serve``).

    python -m l10_server                                   # the built-in tiny Qwen3, offline
    python -m l10_server --model PATH --host 127.0.0.1 --port 8000 --max-num-seqs 64
    python -m l10_server --kv-cache-dtype fp8 --no-enable-prefix-caching --enforce-eager
    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'

The engine is the latest stage's ``LLM`` (l5_scheduler/stages.py: found by folder), and every one
of its options is a flag, generated from the stages' declarations (``lN_*/options.py``,
plumbing/options.py): ``--kv-cache-dtype fp8``, ``--no-enable-prefix-caching``, ... (``--help``
lists them). Only the server's own flags (host, port, name, queue, log level) are written here.
Flags and their values are checked before torch loads. Ctrl-C or SIGTERM aborts the requests in flight and stops.
"""
from __future__ import annotations

import argparse
import sys

from plumbing.errors import UserError

#: the server's defaults for engine options (the declarations' hold otherwise)
SERVER_DEFAULTS = {"impl": "auto"}

EPILOG = ("--impl auto (the default): Triton kernels on cuda, the PyTorch reference on a CPU, where the Triton "
          "interpreter is too slow to serve from. Under the PyTorch reference (auto on a CPU, or --impl torch) the "
          "server's defaults also turn --fused-ops, --gemv and --split-kv off; a flag you give wins, and one this "
          "configuration ignores says so on stderr.")


def engine_options() -> tuple:
    """Every option of the engine the server builds: the latest stage's (light: no torch)."""
    from l5_scheduler.stages import latest
    return latest("options").ENGINE_OPTIONS


def parser() -> argparse.ArgumentParser:
    from plumbing.options import add_flags
    p = argparse.ArgumentParser(prog="python -m l10_server", description=__doc__.splitlines()[0], epilog=EPILOG)
    g = p.add_argument_group("server options")
    g.add_argument("--served-model-name", default=None, help="the name clients pass as model (default: --model)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000, help="0: any free port (the start line says which)")
    g.add_argument("--max-pending", type=int, default=1024,
                   help="sequences (prompts x n) in flight, running + waiting, before new requests get 429")
    g.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    add_flags(p, engine_options(), SERVER_DEFAULTS)
    return p


def given_options(args) -> dict:
    """The engine options the flags gave (not the defaults), each checked against its declaration:
    a bad value is one UserError here, before torch loads."""
    from plumbing.options import given_flags, resolve
    options = engine_options()
    given = given_flags(args, options)
    resolve({o.name: o for o in options}, dict(SERVER_DEFAULTS, **given))
    return given


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    if args.max_pending < 1:
        raise UserError(f"--max-pending must be a positive integer, got {args.max_pending}.")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in [0, 65535], got {args.port}.")
    given = given_options(args)
    from .serve import run
    run(args, given)


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
