"""What the GPU benchmarks share: a random-weight checkpoint of a real shape, workloads, syncs, and
the copy bandwidth and matmul rate measured on the machine (every roofline divides by these)."""
from __future__ import annotations

import gc
import os
import random
import sys
import time

import torch

from l1_dense.config import PRESETS


def build_checkpoint(path: str, preset: str = "Qwen/Qwen3-0.6B") -> str:
    """A random-weight HF checkpoint of the preset's shape (bf16 safetensors), built once."""
    if os.path.exists(os.path.join(path, "model.safetensors")):
        return path
    from transformers import AutoModelForCausalLM, Qwen3Config
    c = PRESETS[preset]
    cfg = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                      num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim,
                      max_position_embeddings=c.max_position_embeddings, rope_theta=c.rope_theta,
                      tie_word_embeddings=c.tie_word_embeddings, eos_token_id=151645, bos_token_id=None)
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(path)
    print(f"built a random {preset}-shaped checkpoint in {path}")
    del model
    return path


def workload(n, lo, hi, vocab, seed):
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi)) for _ in range(n)]


def timed(device, fn) -> float:
    """Milliseconds of one ``fn()``: from a CUDA graph with L2 flushed on a GPU (kernel_bench.graph_ms),
    wall time on a CPU (the interpreter: a smoke test, not performance)."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from kernel_bench import graph_ms
    return graph_ms(fn)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def ceilings(device):
    """Copy bandwidth (GB/s, read + write) and bf16 matmul rate (TFLOP/s), measured here."""
    if device != "cuda":
        return None, None
    import triton
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    bw = 2 * x.numel() / (triton.testing.do_bench(lambda: y.copy_(x), return_mode="median") * 1e-3) / 1e9
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    tf = 2 * 8192**3 / (triton.testing.do_bench(lambda: a @ a, return_mode="median") * 1e-3) / 1e12
    del x, y, a
    free()
    return bw, tf


def bench_device(quick: bool, out: str) -> str:
    """"cuda", or "cpu" for a --quick smoke test (a full run on a CPU exits: its numbers mean
    nothing); makes the output folder."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not quick:
        sys.exit("no GPU: run with --quick to smoke-test the script (CPU numbers are not performance)")
    os.makedirs(out, exist_ok=True)
    return device


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None (and a note) when it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the PNG (pip install matplotlib)")
        return None
    return plt
