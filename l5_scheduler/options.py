"""The options stage 5 adds: the model, the engine's limits, the kernels' path (vLLM's names).

Each is declared once, here; ``LLM(**options)``, the smoke scripts' flags and the server's flags
are generated from these declarations (plumbing/options.py). A later stage declares its own
options in its own ``options.py``.
"""
from __future__ import annotations

from plumbing.cli import DTYPE_NAMES
from plumbing.errors import UserError
from plumbing.options import Option, positive


def _dtype(v):
    """A dtype name, 'auto' (None: the same), or a torch dtype (LLM(dtype=torch.bfloat16)) -> a name."""
    if isinstance(v, str):
        if v not in DTYPE_NAMES + ("auto",):
            raise UserError(f"dtype {v!r} unsupported: use one of {', '.join(DTYPE_NAMES)} or 'auto'.")
        return v
    from plumbing.cli import dtype_name_of
    name = dtype_name_of(v)
    if name is None:
        raise UserError(f"dtype {v} unsupported: use one of {', '.join(DTYPE_NAMES)}.")
    return name


def _device(v: str) -> str:
    if not (v == "cpu" or v.startswith("cuda")):
        raise UserError(f"unknown device {v!r}: use cuda or cpu.")
    return v


def _utilization(v: float) -> float:
    if not 0 < v <= 1:
        raise UserError(f"gpu_memory_utilization must be in (0, 1], got {v!r}.")
    return v


OPTIONS = (
    Option("model", None, "checkpoint directory, hub id, or a built-in tiny model: tiny-qwen3 (default), "
           "tiny-llama, tiny-qwen2, tiny-mistral, tiny-qwen2-hybrid", "model", "model", kind=str),
    Option("device", None, "cuda or cpu (default: cuda when available)", "model", "model", kind=str, check=_device),
    Option("dtype", "auto", "the model's dtype: bfloat16, float16, float32 or auto (bfloat16 on cuda, float32 "
           "on cpu)", "model", "model", kind=object, check=_dtype, none_ok=True),
    Option("seed", None, "the sampler's seed for requests without their own (None: a fresh one)", "model",
           "sampler", kind=int),
    Option("max_model_len", None, "longest prompt + output (default: the model's context, capped at the pool)",
           "model", "sizes", kind=int, check=positive("max_model_len")),
    Option("block_size", 16, "tokens per KV block", "cache", "sizes", check=positive("block_size")),
    Option("num_gpu_blocks_override", None, "KV pool size in blocks of every layer (default: what fits in "
           "memory on cuda, 256 on cpu)", "cache", "sizes", kind=int, check=positive("num_gpu_blocks_override")),
    Option("gpu_memory_utilization", 0.9, "the share of the GPU's memory the engine may use", "cache", "sizes",
           check=_utilization),
    Option("max_num_batched_tokens", None, "token budget per step (default 8192)", "scheduler", "sizes", kind=int,
           check=positive("max_num_batched_tokens")),
    Option("max_num_seqs", None, "cap on running requests (default min(256, the budget))", "scheduler", "sizes",
           kind=int, check=positive("max_num_seqs")),
    Option("impl", "triton", "attention path: triton (stage 3's kernel) or torch (its PyTorch reference); auto: "
           "triton on cuda, torch on cpu", "kernels", "kv_cache", choices=("triton", "torch", "auto")),
    Option("check", False, "check every step's layout (host syncs: tests and debugging)", "debug", "runner"),
    Option("keep_logits", False, "keep every sampled token's logits on the CPU (checks, not serving)", "debug",
           "engine"),
)

ENGINE_OPTIONS = OPTIONS                     # the options of the engine up to this stage
