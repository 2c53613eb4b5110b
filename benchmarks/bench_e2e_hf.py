"""bench_e2e.py's peer: transformers' continuous batching (the manager behind ``generate_batch``),
fed the same requests with the same per-request max_new_tokens, or ``generate_batch`` itself for a
fixed output length (it takes one length only)."""
from __future__ import annotations

import time

import torch

from benchmarks.bench_common import free, sync


def hf_config(text: str) -> dict:
    """``a=True,b=3`` -> {"a": True, "b": 3}; a value that is no literal stays a string."""
    import ast
    out = {}
    for item in filter(None, text.split(",")):
        key, _, val = item.partition("=")
        try:
            out[key.strip()] = ast.literal_eval(val.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = val.strip()
    return out


def run_hf(path, work, device, fixed=None, timeout=None, cb=None):
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging
    logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    gen = GenerationConfig(max_new_tokens=max(m for _, m in work) if fixed is None else fixed, do_sample=False,
                           eos_token_id=-1, pad_token_id=0)
    results, extra = {}, {}
    if cb:                                                  # HF's ContinuousBatchingConfig, as given
        from transformers.generation import ContinuousBatchingConfig
        extra = dict(continuous_batching_config=ContinuousBatchingConfig(**cb))
        print(f"HF: ContinuousBatchingConfig({', '.join(f'{k}={v!r}' for k, v in cb.items())})")
    sync()
    t0 = time.perf_counter()
    if fixed is not None:                                   # generate_batch: one output length for all
        res = model.generate_batch([p for p, _ in work], generation_config=gen, progress_bar=True, **extra)
        results = {k: v for k, v in res.items()}
    else:                                                   # the same manager, one max_new_tokens per request
        with model.continuous_batching_context_manager(generation_config=gen, block=True, timeout=5, **extra) as manager:
            for i, (p, m) in enumerate(work):
                manager.add_request(input_ids=p, request_id=f"req_{i}", max_new_tokens=m)
            while len(results) < len(work):
                r = manager.get_result(timeout=1)
                if r is not None and r.is_finished():
                    results[r.request_id] = r
                if timeout and time.perf_counter() - t0 > timeout:
                    print(f"HF: stopped after {timeout} s with {len(results)}/{len(work)} requests done")
                    break
    sync()
    dt = time.perf_counter() - t0
    tokens = sum(len(r.generated_tokens) for r in results.values())
    del model
    free()
    return dict(seconds=dt, output_tokens=tokens, tok_per_s=tokens / dt, finished=len(results),
                transformers=__import__("transformers").__version__, hf_config=cb or "transformers' defaults")


def run_peer(path, work, device, variant, fixed, timeout, cb=None) -> dict:
    r = run_hf(path, work, device, fixed, timeout, cb)
    r.update(engine="HF generate_batch" if fixed else "HF continuous batching", variant=variant)
    print(f"HF    {variant}: {r['output_tokens']} tokens in {r['seconds']:.1f} s = {r['tok_per_s']:.0f} tok/s "
          f"({r['finished']}/{len(work)} finished)")
    return r
