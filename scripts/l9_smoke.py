"""Stage 9 smoke test: stage 8's run with an fp8 KV cache (``--kv-cache-dtype``, vLLM's flag).

    python scripts/l9_smoke.py                                          # "auto": the model's dtype, = stage 8
    python scripts/l9_smoke.py --kv-cache-dtype fp8                     # e4m3, vLLM's per-tensor scale (1.0)
    python scripts/l9_smoke.py --kv-cache-dtype fp8_per_token_head      # e4m3, a scale per token and head
    python scripts/l9_smoke.py --model tiny-qwen2-hybrid --kv-cache-dtype fp8   # windows kept

With ``auto`` the tokens must equal stage 8's (and transformers'). fp8 cannot promise that: its
agreement with the oracle is measured by ``scripts/l9_accuracy.py`` and reported on the chain's
fp8 line. Adds a ``kv cache`` line (storage dtype, scales, pool blocks, bytes) to stage 8's
``window`` line. Every l8_smoke flag works here.
"""
from l7_smoke import parser, run
from l8_smoke import observer as window_observer
from plumbing.cli import run_main


def observer(engine):
    after, window_lines, window_extra = window_observer(engine)
    cache, kv = engine.runner.cache, engine.scheduler.kv
    dtype = str(cache.K[0].dtype).replace("torch.", "")
    scales = getattr(cache, "per_token", None)
    kind = "none (the model's dtype)" if scales is None else "per token and head" if scales else "per tensor"

    def extra():
        return dict(window_extra(), kv_cache_dtype=dtype, kv_scales=kind, kv_cache_bytes=cache.nbytes,
                    bytes_per_block=cache.bytes_per_block)

    def lines():
        return window_lines() + [f"kv cache   : {dtype}, scales {kind}; pool {kv.num_blocks} blocks of "
                                 f"{cache.bytes_per_block} bytes = {kv.num_blocks * cache.bytes_per_block / 2**20:.3f} MiB"]
    return after, lines, extra


def main(argv=None):
    args = parser("l9_fp8_kv", __doc__).parse_args(argv)
    run(args, "l9_fp8_kv", observer)


if __name__ == "__main__":
    run_main(main)
