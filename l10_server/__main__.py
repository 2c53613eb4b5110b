"""``python -m l10_server``: an OpenAI-compatible server for the engine (``make serve``).

    python -m l10_server                                   # the built-in tiny Qwen3, offline
    python -m l10_server --model PATH --host 127.0.0.1 --port 8000 --max-num-seqs 64
    curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
         -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'

Flags are checked before torch loads. Ctrl-C or SIGTERM aborts the requests in flight and stops.
"""
from __future__ import annotations

import argparse
import sys

from plumbing.cli import DTYPE_NAMES, positive_or_none
from plumbing.errors import UserError

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_per_token_head")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m l10_server", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint directory, hub id, or tiny-qwen3 (default), tiny-llama, "
                                                 "tiny-qwen2, tiny-mistral, tiny-qwen2-hybrid")
    p.add_argument("--served-model-name", default=None, help="the name clients pass as model (default: --model)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (the start line says which)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=DTYPE_NAMES, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    p.add_argument("--impl", default="auto", choices=("auto", "triton", "torch"),
                   help="auto: Triton kernels on cuda, the PyTorch reference on cpu (the interpreter is too slow)")
    p.add_argument("--max-pending", type=int, default=1024,
                   help="prompts in flight (running + waiting) before new requests get 429")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"))
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    for flag in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks_override",
                 "max_pending"):
        positive_or_none("--" + flag.replace("_", "-"), getattr(args, flag))
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in [0, 65535], got {args.port}.")
    if args.impl == "torch" and args.kv_cache_dtype != "auto":
        raise UserError("--kv-cache-dtype fp8 needs the Triton kernels: use --impl triton (or auto on a GPU).")
    from .serve import run
    run(args)


if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
