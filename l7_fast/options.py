"""The options stage 7 adds (declared once, here; plumbing/options.py). Each turns one of its
parts on or off, so a learner can measure what each is worth (benchmarks/bench_l7.py)."""
from plumbing.options import Option
from l6_prefix_cache.options import ENGINE_OPTIONS as BEFORE

OPTIONS = (
    Option("enforce_eager", False, "no CUDA graphs: every step launches its kernels one by one (vLLM's name)",
           "model", "graphs"),
    Option("prefill_graphs", True, "CUDA graphs for one request's short prefill too, not only decode steps",
           "kernels", "graphs"),
    Option("fused_ops", True, "fused Triton kernels for norms, RoPE + K/V write and SiLU (off: the skeleton's "
           "torch ops)", "kernels", "ops"),
    Option("gemv", True, "a Triton GEMV for every matmul of steps of a few tokens (off: cuBLAS)", "kernels", "ops"),
    Option("norm_prologue", True, "in those steps, each add + RMSNorm inside the next GEMV (off: its own kernel)",
           "kernels", "ops"),
    Option("pdl", True, "programmatic dependent launch on Hopper: the next kernel starts while one drains",
           "kernels", "ops"),
    Option("split_kv", True, "decode steps split each sequence's keys over more programs (flash-decoding)",
           "kernels", "runner"),
    Option("async_scheduling", True, "schedule and launch step n+1 before step n's tokens reach the host "
           "(vLLM's name)", "scheduler", "step"),
)

ENGINE_OPTIONS = BEFORE + OPTIONS            # the options of the engine up to this stage
